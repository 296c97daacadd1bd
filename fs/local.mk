# SPDX-License-Identifier: MIT
bin_PROGRAMS += fs/castfs
fs_castfs_SOURCES = fs/main.c fs/fs.h fs/fs_ops.c fs/fs_mount.c fs/fs_lease.c fs/cli.h \
	fs/fs_watch.c

fs_castfs_CFLAGS = $(AM_CFLAGS) $(FUSE_CFLAGS)
fs_castfs_LDADD = $(LIBCASTFS_LIBS) $(FUSE_LIBS)
