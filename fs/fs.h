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

/* castfs_fs_log - report an event: stderr in the foreground, else syslog
 * (fs_log.c). Thread-safe. */
void castfs_fs_log(void *ctx, const char *msg);

/* castfs_fs_log_init - log to stderr (@in_foreground) or to syslog from
 * now on; call once at start-up, before any thread logs. */
void castfs_fs_log_init(bool in_foreground);

/*
 * castfs_fs_views_load - the built-in views plus those of JSON file
 * @config (may be NULL) into @vs (fs_config.c). Returns 0, -errno of
 * reading the file, or castfs_views_load()'s error; @d says why.
 */
int castfs_fs_views_load(struct castfs_views *vs, const char *config,
			 struct castfs_diag *d);

/* castfs_mount_device - "major:minor" of the filesystem mounted at
 * @mountpoint per /proc/self/mountinfo (malloc'ed), or NULL (fs_mount.c). */
char *castfs_mount_device(const char *mountpoint);

/* castfs_fs_set_read_ahead - raise the read-ahead of the mount at
 * @mountpoint to @kb (the INIT reply can only lower it). Best effort:
 * without root nothing changes. */
void castfs_fs_set_read_ahead(const char *mountpoint, unsigned kb);

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
