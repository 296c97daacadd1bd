/* SPDX-License-Identifier: MIT */
/* The daemon's shared state: what main sets up and every op reads. */
#ifndef CASTFS_FS_H
#define CASTFS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "ns/ns.h"
#include "ns/stats.h"
#include "view/view.h"

struct castfs_fs {
	struct castfs_ns *ns;
	struct castfs_stats *stats;
	struct castfs_views views;
	struct fuse_session *se;
	pthread_key_t tls; /* per-thread struct fs_thread */
	struct castfs_fh_table *files; /* fh -> struct castfs_file */
	struct castfs_fh_table *dirs; /* fh -> struct castfs_dir */
	double timeout; /* entry and attr timeouts, seconds */
	unsigned read_ahead_kb;
	/* -o noxattr: getxattr and listxattr answer ENOSYS, after which the
	 * kernel answers every xattr call itself (EOPNOTSUPP) without a
	 * round trip: `ls -l` asks two per entry. */
	bool noxattr;
	bool debug;
	struct castfs_pt *pt; /* -o passthrough (fs_pt.c), or NULL */
	/* The -o config text the views came from (NULL: none), kept for the
	 * supervisor's crash restarts (castfs_sv_child_keep_config()). */
	char *config_text;
	size_t config_len;
	bool config_kept; /* config_text is the snapshot, not the file's */
};

/*
 * File handles (fs_fh.c): the fh the kernel holds for an open file or
 * directory is a number, never a pointer, so that it means something to
 * the next daemon after a restart. Every function is thread-safe.
 */
struct castfs_fh_table;

/* castfs_fh_table_new - an empty table whose numbers carry a random
 * per-daemon prefix; get, adopt and swap hand out objects through @hold
 * (one more share of an object, taken under the table's lock). Returns 0
 * or -ENOMEM. */
int castfs_fh_table_new(void *(*hold)(void *), struct castfs_fh_table **out);

/* castfs_fh_table_free - free @t, calling @free_obj on every object still
 * in it; NULL is accepted. */
void castfs_fh_table_free(struct castfs_fh_table *t, void (*free_obj)(void *));

/* castfs_fh_add - a new fh for @obj (the table does not own it until
 * castfs_fh_table_free). Returns the fh, or 0 when out of memory. */
uint64_t castfs_fh_add(struct castfs_fh_table *t, void *obj);

/* castfs_fh_get - the object of @fh, or NULL when this daemon does not
 * know @fh (an open of a previous daemon, or none), with a share of it
 * (@hold's) that the caller drops. Not borrowed: a request the supervisor
 * had resent (FUSE_NOTIFY_RESEND sends again every request being
 * answered) is answered twice, and the kernel takes the first answer and
 * may send the RELEASE while the other copy still runs. */
void *castfs_fh_get(struct castfs_fh_table *t, uint64_t fh);

/* castfs_fh_adopt - make @obj the object of foreign @fh unless another
 * thread did first. Returns the object now in the table (@obj, or the
 * other thread's) with a share of it for the caller, or NULL when out of
 * memory; *@took says whether the table took @obj (else the caller frees
 * it: the other thread's may be the same pointer, a shared listing). */
void *castfs_fh_adopt(struct castfs_fh_table *t, uint64_t fh, void *obj,
		      bool *took);

/* castfs_fh_swap - make @obj the object of @fh if it is still @old;
 * returns the object @fh has now (@obj, or what another thread put there;
 * NULL when @fh is gone) with a share for the caller; *@took as for
 * castfs_fh_adopt(). */
void *castfs_fh_swap(struct castfs_fh_table *t, uint64_t fh, void *old,
		     void *obj, bool *took);

/* castfs_fh_remove - take @fh out; returns its object (now the caller's)
 * or NULL when unknown. */
void *castfs_fh_remove(struct castfs_fh_table *t, uint64_t fh);

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

/* castfs_fs_config_read - the text of config file @path (at most 16 MiB,
 * malloc'ed and NUL-terminated) into *@text, its length in *@len.
 * castfs_fs_views_parse - the built-in views plus those of config text
 * @json (NULL: none). Both return 0 or a negative errno, @d says why. */
int castfs_fs_config_read(const char *path, char **text, size_t *len,
			  struct castfs_diag *d);
int castfs_fs_views_parse(struct castfs_views *vs, const char *json, size_t len,
			  struct castfs_diag *d);

/* castfs_mount_device - "major:minor" of the filesystem mounted at
 * @mountpoint per /proc/self/mountinfo (malloc'ed), or NULL (fs_mount.c). */
char *castfs_mount_device(const char *mountpoint);

/* castfs_fs_io_attach - read @se's requests into buffers mapped before
 * their first read (fs_io.c says why), amend the INIT reply, and let @pt
 * (may be NULL) see the INIT request and amend replies. Call once the
 * session has its fd, before the INIT request is processed. Returns 0 or
 * a negative errno. */
int castfs_fs_io_attach(struct fuse_session *se, struct castfs_pt *pt);

/* castfs_fs_io_saw - note a request processed without being read through
 * the session (the supervisor's copy of INIT), as castfs_fs_io_attach()'s
 * reads do. */
void castfs_fs_io_saw(const void *buf, size_t len);

/*
 * Kernel passthrough of unconverted files (fs_pt.c). All thread-safe.
 */
struct castfs_pt;

/* castfs_pt_new - passthrough asked for, not yet negotiated; counted in
 * @stats. 0 or -ENOMEM. */
int castfs_pt_new(struct castfs_stats *stats, struct castfs_pt **out);

/* castfs_pt_free - NULL is accepted; backing ids end with the
 * connection. */
void castfs_pt_free(struct castfs_pt *pt);

/* castfs_pt_set_journal - read and append the supervisor's journal of
 * backing ids, memfd @fd (fs_pt.c says why). Call before serving. */
void castfs_pt_set_journal(struct castfs_pt *pt, int fd);

/* castfs_pt_attach - the connection's /dev/fuse fd, for the ioctls. */
void castfs_pt_attach(struct castfs_pt *pt, int dev_fd);

/* castfs_pt_saw_init - the kernel's INIT offered protocol @major.@minor
 * and @flags2 (0 without FUSE_INIT_EXT): whether passthrough is on. */
void castfs_pt_saw_init(struct castfs_pt *pt, uint32_t major, uint32_t minor,
			uint32_t flags2);

/* castfs_pt_amend_init - the INIT reply's fuse_init_out, @len bytes: ask
 * for passthrough when it is on (fs_io.c finds the reply). */
void castfs_pt_amend_init(struct castfs_pt *pt, void *out, size_t len);

/* castfs_pt_amend_reply - the writev hook: add the backing id to the
 * open reply castfs_pt_open() prepared in this thread. */
void castfs_pt_amend_reply(struct castfs_pt *pt, struct iovec *iov, int count);

/*
 * castfs_pt_open - prepare the open reply of node @id, whose bytes are
 * those of source fd @src_fd (-1: not passed through), to be passed
 * through: 1 when this thread's next open reply carries the node's backing
 * id (send it next, or call castfs_pt_open_abandon()), 0 when it is served
 * by the daemon, or a negative errno for this open (EMFILE, ENOMEM).
 */
int castfs_pt_open(struct castfs_pt *pt, uint64_t id, int src_fd);

/* castfs_pt_open_abandon - the prepared reply is not sent. */
void castfs_pt_open_abandon(void);

/* castfs_pt_forget - node @id was forgotten: unless @ns holds it again,
 * its backing id is closed (no inode of it is open any more). Costs a
 * hash probe for a node without one. */
void castfs_pt_forget(struct castfs_pt *pt, struct castfs_ns *ns, uint64_t id);

/* castfs_fs_set_read_ahead - raise the read-ahead of the mount at
 * @mountpoint to @kb (the INIT reply can only lower it). Best effort:
 * without root nothing changes. */
void castfs_fs_set_read_ahead(const char *mountpoint, unsigned kb);

/*
 * castfs_fs_listing_changed - castfs_ns_opts.listing_changed: drop the
 * kernel's cached listing of directory @dir (fs_dircache.c). Inside a
 * castfs_fs_listing_batch() of the calling thread, deferred to its end
 * (once per directory); else sent at once. Thread-safe.
 */
void castfs_fs_listing_changed(void *ctx, uint64_t dir);

/*
 * castfs_fs_listing_batch - @begin: defer this thread's listing changes
 * (the watcher, over one batch of events); !@begin: send them now.
 */
void castfs_fs_listing_batch(struct castfs_fs *fs, bool begin);

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

/* ---- supervision (fs_super.c; docs/RELIABILITY.md "Restarts") ---- */

/* What a supervised daemon inherits: the FUSE connection, the kernel's
 * FUSE_INIT (a memfd) and a pipe to say it serves. */
struct castfs_sv_child {
	int fuse_fd;
	int init_fd;
	int ready_fd;
	int pt_fd; /* memfd: the journal of passthrough backing ids, or -1 */
	/* memfd: the -o config text the serving daemon started with, or -1
	 * (a supervisor of an older binary) */
	int cfg_fd;
	/* started after the serving daemon died, not by a reload: it serves
	 * the config of cfg_fd, not the file's */
	bool crash_restart;
	const char *mountpoint; /* the real one, for /.castfs/config */
	bool successor; /* another daemon served the connection before */
};

/* castfs_sv_child_env - fill @c from the environment the supervisor set.
 * Returns 1 (a supervised daemon), 0 (not one) or -EINVAL (garbled). */
int castfs_sv_child_env(struct castfs_sv_child *c);

/*
 * castfs_sv_child_config - for a crash restart, the config text the
 * daemon that died served (malloc'ed into *@text, *@len bytes): a crash
 * never brings in an edit of the file a reload was refused for, or was
 * never asked to read. Returns 0, 1 when there is none to use (not a
 * crash restart, no snapshot: read the file), or -errno.
 */
int castfs_sv_child_config(const struct castfs_sv_child *c, char **text,
			   size_t *len);

/* castfs_sv_child_keep_config - record @text (@len bytes; NULL: no
 * config) as what this daemon serves, for the crash restarts after it.
 * Call once it serves. */
void castfs_sv_child_keep_config(const struct castfs_sv_child *c,
				 const char *text, size_t len);

/*
 * castfs_sv_child_attach - make @se serve the inherited connection: mount
 * "/dev/fd/N" (no second mount), attach its I/O (castfs_fs_io_attach, with
 * @pt) and feed @se the kernel's FUSE_INIT, which initialises it without a
 * second handshake. Returns 0 or -errno.
 */
int castfs_sv_child_attach(struct fuse_session *se,
			   const struct castfs_sv_child *c,
			   struct castfs_pt *pt);

/* castfs_sv_child_ready - tell the supervisor this daemon serves (it then
 * retires the daemon this one replaces). */
void castfs_sv_child_ready(const struct castfs_sv_child *c);

struct castfs_sv_opts {
	int argc;
	char **argv; /* our command line, to start each daemon with */
	const char *mnt_arg; /* the element of @argv naming the mount point */
	const char *mountpoint; /* its real path */
	bool foreground;
};

/*
 * castfs_supervise - own the connection of mounted session @se and run
 * daemons on it until the mount ends: restart one that dies (the kernel
 * resends what it had in flight), replace it on SIGHUP (`castfs reload`),
 * back off and then answer EIO when they keep failing. Daemonizes unless
 * @o->foreground. Returns 0 when unmounted or stopped (SIGTERM, SIGINT),
 * -EIO when the first daemon did not start or any daemon failed (a crash
 * or an error exit; not an outside SIGKILL), or -errno of the setup. Call
 * once, single-threaded; the caller unmounts @se afterwards.
 */
int castfs_supervise(struct fuse_session *se, const struct castfs_sv_opts *o);

/* castfs_sv_reload - ask the supervisor of the mount at @mountpoint to
 * replace its daemon. Returns 0, -ESRCH (no supervisor: -o nosupervise or
 * not a castfs mount) or -errno. */
int castfs_sv_reload(const char *mountpoint);

/* castfs_fs_handles_init, castfs_fs_handles_fini - the fh tables of @fs
 * (fs_ops.c). init returns 0 or -ENOMEM; fini closes what is still open. */
int castfs_fs_handles_init(struct castfs_fs *fs);
void castfs_fs_handles_fini(struct castfs_fs *fs);

/* castfs_fs_now_ns - the monotonic clock in nanoseconds. */
static inline int64_t castfs_fs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
