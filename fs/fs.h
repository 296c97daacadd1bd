/* SPDX-License-Identifier: MIT */
/* The daemon's shared state: what main sets up and every op reads. */
#ifndef CASTFS_FS_H
#define CASTFS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "ns/ns.h"
#include "ns/stats.h"
#include "view/view.h"

struct castfs_fs {
	struct castfs_ns *ns;
	struct castfs_stats *stats;
	struct castfs_views views;
	struct fuse_session *se;
	pthread_key_t tls; /* per-thread struct fs_thread */
	double timeout; /* entry and attr timeouts, seconds */
	unsigned read_ahead_kb;
	bool debug;
};

/* The low-level operations (fs_ops.c). */
extern const struct fuse_lowlevel_ops castfs_fs_ops;

/* castfs_fs_thread_key_init - create the per-thread buffer key. */
int castfs_fs_thread_key_init(struct castfs_fs *fs);

/*
 * castfs_fs_lease_init - install the lease-break signal handler and return
 * the source guard for castfs_ns_opts, or NULL (castfs then relies on
 * source size and mtime). Call once, before any source is opened.
 */
const struct castfs_source_guard *castfs_fs_lease_init(void);

/* castfs_fs_log - report an event: stderr in the foreground, else syslog. */
void castfs_fs_log(void *ctx, const char *msg);

/* The source watcher (fs_watch.c). */
struct castfs_watch;

/*
 * castfs_watch_start - watch every directory of @source (up to a bound)
 * with inotify and, on each change, invalidate the namespace's cache and
 * the kernel's entries for the changed name and its views. Call once
 * fs->se is mounted (and after daemonizing: it starts a thread).
 * Returns 0 or -errno; *@out is set on success.
 */
int castfs_watch_start(struct castfs_fs *fs, const char *source,
		       struct castfs_watch **out);

/*
 * castfs_watch_stop - stop the thread and release @w (NULL is accepted).
 * Call after the loop ends and before fuse_session_unmount(). Returns 0,
 * or -EBUSY when the thread is stuck in a kernel notification (waiting on
 * a lock held by a request the stopped loop will never answer): then @w
 * is left to it, and the caller must not free what the thread uses — the
 * session and the namespace — but end the process once unmounted.
 */
int castfs_watch_stop(struct castfs_watch *w);

#endif
