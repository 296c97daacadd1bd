/* SPDX-License-Identifier: MIT */
/*
 * Mount plumbing: find our mount's device in /proc/self/mountinfo and
 * raise its read-ahead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] &&
		    s[3]) {
			*o++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 |
				      (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

char *castfs_mount_device(const char *mountpoint)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char line[8192], *found = NULL;

	if (!f)
		return NULL;
	/* The last match: a mount stacked on the same point hides earlier. */
	while (fgets(line, sizeof(line), f)) {
		char dev[64], mnt[4096];

		if (sscanf(line, "%*s %*s %63s %*s %4095s", dev, mnt) != 2)
			continue;
		unescape(mnt);
		if (strcmp(mnt, mountpoint) != 0)
			continue;
		free(found);
		found = strdup(dev);
	}
	fclose(f);
	return found;
}

/* Raise the mount's read-ahead. Written before the daemon answers INIT,
 * whose reply lowers it to its max_readahead: castfs_op_init() sends the
 * same value, so the window is the one asked for. */
void castfs_fs_set_read_ahead(const char *mountpoint, unsigned kb)
{
	char path[128], *dev = castfs_mount_device(mountpoint);
	FILE *f;

	if (!dev)
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", dev);
	free(dev);
	f = fopen(path, "w");
	if (!f)
		return; /* not root: the default read-ahead still works */
	fprintf(f, "%u\n", kb);
	fclose(f);
}
