/* SPDX-License-Identifier: MIT */
/* The sub-commands of the castfs binary. */
#ifndef CASTFS_CLI_H
#define CASTFS_CLI_H

/* castfs info FILE...: header summary and tensor table. Exit status. */
int castfs_cli_info(int argc, char **argv);

/* castfs convert FILE --view V -o OUT: materialise a view. Exit status. */
int castfs_cli_convert(int argc, char **argv);

/* castfs_mount_device - "major:minor" of the filesystem mounted at
 * @mountpoint per /proc/self/mountinfo (malloc'ed), or NULL. */
char *castfs_mount_device(const char *mountpoint);

#endif
