// SPDX-License-Identifier: MIT
/* The daemon's log sink: stderr in the foreground, else syslog. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

#include "common/escape.h"
#include "fs.h"

/* Set once at start-up, before any thread logs. */
static bool foreground;

void castfs_fs_log_init(bool in_foreground)
{
	foreground = in_foreground;
	if (!foreground)
		openlog("castfs", LOG_PID, LOG_DAEMON);
}

/* Messages quote names from the source tree escaped already (ns_logf(),
 * the parser's reasons); what a message quotes raw is escaped here, but
 * not those escapes again: a newline in a name cannot forge a line, nor a
 * control sequence reach the terminal (common/escape.h). */
void castfs_fs_log(void *ctx, const char *msg)
{
	char safe[4096];

	(void)ctx;
	castfs_escape_text_buf(safe, sizeof(safe), msg, strlen(msg));
	if (foreground)
		fprintf(stderr, "castfs: %s\n", safe);
	else
		syslog(LOG_WARNING, "%s", safe);
}
