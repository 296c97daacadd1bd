// SPDX-License-Identifier: MIT
/* The daemon's log sink: stderr in the foreground, else syslog. */
#include <stdbool.h>
#include <stdio.h>
#include <syslog.h>

#include "fs.h"

/* Set once at start-up, before any thread logs. */
static bool foreground;

void castfs_fs_log_init(bool in_foreground)
{
	foreground = in_foreground;
	if (!foreground)
		openlog("castfs", LOG_PID, LOG_DAEMON);
}

void castfs_fs_log(void *ctx, const char *msg)
{
	(void)ctx;
	if (foreground)
		fprintf(stderr, "castfs: %s\n", msg);
	else
		syslog(LOG_WARNING, "%s", msg);
}
