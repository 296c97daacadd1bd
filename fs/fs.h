/* SPDX-License-Identifier: MIT */
/* The daemon's shared state: what main sets up and every op reads. */
#ifndef CASTFS_FS_H
#define CASTFS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "ns.h"
#include "stats.h"
#include "view.h"

struct castfs_fs {
	struct castfs_ns *ns;
	struct castfs_stats *stats;
	struct castfs_views views;
	struct fuse_session *se;
	pthread_key_t tls; /* per-thread struct fs_thread */
	double timeout;	   /* entry and attr timeouts, seconds */
	unsigned read_ahead_kb;
	bool debug;
};

/* The low-level operations (fs_ops.c). */
extern const struct fuse_lowlevel_ops castfs_fs_ops;

/* castfs_fs_thread_key_init - create the per-thread buffer key. */
int castfs_fs_thread_key_init(struct castfs_fs *fs);

/* castfs_fs_log - report an event: stderr in the foreground, else syslog. */
void castfs_fs_log(void *ctx, const char *msg);

#endif
