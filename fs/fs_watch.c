/* SPDX-License-Identifier: MIT */
/*
 * The source watcher: an inotify thread over the source tree that tells
 * the kernel to drop what it cached about a changed entry (its dentry and
 * those of its views), so that rewritten, new and removed files show
 * without remounting despite the long entry and attribute timeouts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "fs_watchq.h"

/* Directories watched at most (one inotify watch each). */
#define WATCH_MAX_DIRS 65536u

#define WATCH_MASK                                                         \
	(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY | \
	 IN_CLOSE_WRITE | IN_ATTRIB | IN_ONLYDIR)

/* Paths handled between two drains of the inotify queue: small enough
 * that the kernel's queue (16384 events by default) never fills while
 * they are handled, large enough to amortise the read. */
#define WATCH_CHUNK 256u

/* The longest the watcher sleeps between two reads of an idle fd. */
#define WATCH_CALM_MS 1000

/* Events that leave a file's bytes as they were: its names may only be
 * expired (looked up again at the next use), not dropped (watch_notify). */
#define WATCH_META_ONLY (IN_ATTRIB | IN_ISDIR)

struct castfs_watch {
	struct castfs_fs *fs;
	int root_fd; /* the source directory */
	int ino_fd; /* inotify */
	int stop_fd; /* eventfd: written by castfs_watch_stop() */
	atomic_bool stopping;
	pthread_t thread;
	char **dirs; /* source-relative path of each watch descriptor */
	size_t ndirs_cap;
	size_t nwatched;
	bool full_logged;
	bool overflow; /* events were lost since the last rescan */
	/* CLOCK_MONOTONIC ns before the last read that found the inotify
	 * queue empty: every change made before it was read. */
	int64_t calm_ns;
	/* calm_ns when events began to be lost: directory snapshots taken
	 * before it are trusted by the rescan (castfs_ns_rescan()). */
	int64_t loss_since;
	bool no_expire; /* the kernel cannot expire an entry: drop it */
	struct castfs_watchq q; /* changed paths not handled yet */
};

static void watch_log(struct castfs_watch *w, const char *msg)
{
	castfs_fs_log(w->fs, msg);
}

/* Open source directory @rel beneath the root, never through a link. */
static int open_dir(struct castfs_watch *w, const char *rel, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_DIRECTORY | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	long fd;

	do {
		fd = syscall(SYS_openat2, w->root_fd, rel[0] ? rel : ".", &how,
			     sizeof(how));
	} while (fd < 0 && errno == EAGAIN);
	return fd < 0 ? -errno : (int)fd;
}

/* Remember that watch descriptor @wd is directory @rel (copied). */
static int dirs_set(struct castfs_watch *w, int wd, const char *rel)
{
	char *copy = strdup(rel);

	if (!copy)
		return -ENOMEM;
	if ((size_t)wd >= w->ndirs_cap) {
		size_t cap = (size_t)wd * 2 + 64;
		char **n = realloc(w->dirs, cap * sizeof(*n));

		if (!n) {
			free(copy);
			return -ENOMEM;
		}
		memset(n + w->ndirs_cap, 0, (cap - w->ndirs_cap) * sizeof(*n));
		w->dirs = n;
		w->ndirs_cap = cap;
	}
	if (!w->dirs[wd])
		w->nwatched++;
	free(w->dirs[wd]);
	w->dirs[wd] = copy;
	return 0;
}

static void dirs_drop(struct castfs_watch *w, int wd)
{
	if (wd < 0 || (size_t)wd >= w->ndirs_cap || !w->dirs[wd])
		return;
	free(w->dirs[wd]);
	w->dirs[wd] = NULL;
	w->nwatched--;
}

static const char *dirs_get(const struct castfs_watch *w, int wd)
{
	return wd >= 0 && (size_t)wd < w->ndirs_cap ? w->dirs[wd] : NULL;
}

/* Watch directory @rel (open as @fd). Returns 0, 1 at the limit, -errno. */
static int watch_one(struct castfs_watch *w, const char *rel, int fd)
{
	char proc[64];
	int wd;

	if (w->nwatched >= WATCH_MAX_DIRS) {
		if (!w->full_logged)
			watch_log(w, "watching the first 65536 source "
				     "directories only: changes deeper show "
				     "when entry timeouts expire");
		w->full_logged = true;
		return 1;
	}
	/* Through the fd: the directory we opened beneath the root. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	wd = inotify_add_watch(w->ino_fd, proc, WATCH_MASK);
	if (wd < 0)
		return -errno;
	return dirs_set(w, wd, rel);
}

/* Append the sub-directories of @fd (directory @rel) to @queue. */
static int queue_subdirs(int fd, const char *rel, char ***queue, size_t *n,
			 size_t *cap)
{
	DIR *dp = fdopendir(fd);
	struct dirent *de;
	int rc = 0;

	if (!dp) {
		close(fd);
		return -errno;
	}
	while (!rc && (de = readdir(dp))) {
		char *p;

		if (de->d_type != DT_DIR || !strcmp(de->d_name, ".") ||
		    !strcmp(de->d_name, ".."))
			continue;
		if (*n == *cap) {
			size_t ncap = *cap * 2 + 16;
			char **q = realloc(*queue, ncap * sizeof(*q));

			if (!q) {
				rc = -ENOMEM;
				break;
			}
			*queue = q;
			*cap = ncap;
		}
		if (asprintf(&p, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) <
		    0) {
			rc = -ENOMEM;
			break;
		}
		(*queue)[(*n)++] = p;
	}
	closedir(dp);
	return rc;
}

/* Watch @rel and every directory below it, breadth first. Symbolic links
 * are never followed. Errors on one directory skip it (it may be gone). */
static void watch_tree(struct castfs_watch *w, const char *rel)
{
	size_t n = 0, cap = 16, i;
	char **queue = malloc(cap * sizeof(*queue));

	if (!queue || !(queue[n] = strdup(rel))) {
		free(queue);
		return;
	}
	n++;
	for (i = 0; i < n; i++) {
		int fd = open_dir(w, queue[i], O_RDONLY | O_NOFOLLOW);

		if (fd >= 0 && watch_one(w, queue[i], fd) == 0)
			queue_subdirs(fd, queue[i], &queue, &n, &cap);
		else if (fd >= 0)
			close(fd);
	}
	for (i = 0; i < n; i++)
		free(queue[i]);
	free(queue);
}

static void inval_entry(void *ctx, uint64_t parent, const char *name)
{
	struct castfs_watch *w = ctx;

	if (atomic_load(&w->stopping))
		return;
	/* -ENOENT: nothing cached under that name, the common case. */
	fuse_lowlevel_notify_inval_entry(w->fs->se, parent, name, strlen(name));
}

/*
 * Expire (parent, name) in the kernel: the next use of the name looks it
 * up again, and drops the dentry then if the node id moved (it does when
 * the mtime moved). Unlike inval_entry() nothing is evicted now, so no
 * FORGET comes back per name. Only for changes that left the bytes as
 * they were (watch_notify): an entry whose id stays would otherwise keep
 * its page cache. A kernel without FUSE_EXPIRE_ONLY gets inval_entry().
 */
static void expire_entry(void *ctx, uint64_t parent, const char *name)
{
	struct castfs_watch *w = ctx;
	int rc;

	if (atomic_load(&w->stopping))
		return;
	if (!w->no_expire) {
		rc = fuse_lowlevel_notify_expire_entry(w->fs->se, parent, name,
						       strlen(name),
						       FUSE_LL_EXPIRE_ONLY);
		if (rc != -ENOSYS)
			return;
		w->no_expire = true;
	}
	inval_entry(ctx, parent, name);
}

/* Source path @rel changed with inotify events @mask: forget it, here
 * and in the kernel. */
static void changed(struct castfs_watch *w, const char *rel, uint32_t mask)
{
	bool meta_only = !(mask & ~(uint32_t)WATCH_META_ONLY);

	castfs_ns_invalidate(w->fs->ns, rel,
			     meta_only ? expire_entry : inval_entry, w);
}

/* Events were lost: watch the directories made meanwhile, compare every
 * watched directory with what its last listing found and invalidate what
 * differs (every entry where there is no such snapshot), then every name
 * the kernel may still hold that no rescanned directory has any more (a
 * deleted source is in no listing). */
static void overflowed(struct castfs_watch *w)
{
	watch_log(w, "inotify queue overflowed: rescanning every directory");
	watch_tree(w, "");
	castfs_ns_rescan(w->fs->ns, w->dirs, w->ndirs_cap, w->loss_since,
			 &w->stopping, inval_entry, w);
}

/* Events are being lost from now on (the kernel's queue or ours). */
static void lost(struct castfs_watch *w)
{
	if (!w->overflow)
		w->loss_since = w->calm_ns;
	w->overflow = true;
}

/* Take in one event: watch a new directory at once (its own events
 * would be missed meanwhile), queue a changed path for later. */
static void take_event(struct castfs_watch *w, const struct inotify_event *e)
{
	const char *dir = dirs_get(w, e->wd);

	if (e->mask & IN_Q_OVERFLOW) {
		lost(w);
		return;
	}
	if (e->mask & IN_IGNORED) {
		dirs_drop(w, e->wd); /* removed, or its filesystem unmounted */
		return;
	}
	if (!dir || !e->len || w->overflow)
		return; /* the directory itself; or all rescanned anyway */
	/* A directory made or moved here: watch it (a moved one keeps its
	 * watch descriptor, which then gets its new path). */
	if ((e->mask & IN_ISDIR) && (e->mask & (IN_CREATE | IN_MOVED_TO))) {
		char *rel;

		if (asprintf(&rel, "%s%s%s", dir, dir[0] ? "/" : "", e->name) >=
		    0)
			watch_tree(w, rel);
		free(rel);
	}
	/* Too many waiting, or no memory for one more: rescan instead. */
	if (castfs_watchq_add(&w->q, dir, e->name, e->mask) < 0)
		lost(w);
}

/* Read every event the kernel has queued (the fd does not block).
 * Returns false when the fd failed for good. */
static bool drain(struct castfs_watch *w)
{
	/* Aligned as the kernel's records need (inotify(7)). */
	char buf[65536]
		__attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		int64_t before = castfs_fs_now_ns();
		ssize_t n = read(w->ino_fd, buf, sizeof(buf));
		const char *p = buf;

		if (n < 0 && errno == EAGAIN)
			w->calm_ns = before;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR;
		while (p < buf + n) {
			const struct inotify_event *e =
				(const struct inotify_event *)(const void *)p;

			take_event(w, e);
			p += sizeof(*e) + e->len;
		}
	}
}

/* Handle what was drained: a rescan after lost events, else up to
 * WATCH_CHUNK queued paths. The listings they change are told to the
 * kernel once the chunk is applied (castfs_fs_listing_batch()). Returns
 * whether paths still wait. */
static bool handle_some(struct castfs_watch *w)
{
	const struct castfs_watchq_item *it;
	bool more = true;

	if (w->overflow) {
		/* The paths that wait stay: a snapshot taken after such a
		 * change already shows it, so the rescan would not. */
		w->overflow = false;
		overflowed(w);
		return w->q.head < w->q.n;
	}
	castfs_fs_listing_batch(w->fs, true);
	for (unsigned i = 0; more && i < WATCH_CHUNK; i++) {
		if (atomic_load(&w->stopping) ||
		    !(it = castfs_watchq_pop(&w->q)))
			more = false;
		else
			changed(w, it->rel, it->mask);
	}
	castfs_fs_listing_batch(w->fs, false);
	return more;
}

static void *watch_main(void *arg)
{
	struct castfs_watch *w = arg;
	struct pollfd p[2] = { { w->ino_fd, POLLIN, 0 },
			       { w->stop_fd, POLLIN, 0 } };
	bool busy = false;

	/* Between chunks the fd is drained again, so that a long burst
	 * waits in the (deduplicating) queue, not in the kernel's, which
	 * would overflow and cost a rescan of everything. */
	while (!atomic_load(&w->stopping)) {
		/* Idle, the fd is read at least once a second anyway: so
		 * that a directory snapshot taken in a quiet moment counts
		 * as taken before the next loss (calm_ns). */
		if (!busy && poll(p, 2, WATCH_CALM_MS) < 0 && errno != EINTR)
			break;
		if (!drain(w))
			break;
		busy = handle_some(w);
	}
	return NULL;
}

static void watch_free(struct castfs_watch *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->ndirs_cap; i++)
		free(w->dirs[i]);
	free(w->dirs);
	castfs_watchq_fini(&w->q);
	if (w->ino_fd >= 0)
		close(w->ino_fd);
	if (w->stop_fd >= 0)
		close(w->stop_fd);
	if (w->root_fd >= 0)
		close(w->root_fd);
	free(w);
}

int castfs_watch_start(struct castfs_fs *fs, const char *source,
		       struct castfs_watch **out)
{
	struct castfs_watch *w = calloc(1, sizeof(*w));
	sigset_t all, old;
	int rc;

	if (!w)
		return -ENOMEM;
	w->fs = fs;
	w->root_fd = open(source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	w->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	w->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (w->root_fd < 0 || w->ino_fd < 0 || w->stop_fd < 0) {
		rc = -errno;
		goto out_free;
	}
	watch_tree(w, "");
	/* With every signal blocked, as libfuse starts its workers: a
	 * SIGTERM taken here (the main thread stopped, say) would end the
	 * session while nothing woke its loop, and the daemon never left. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = -pthread_create(&w->thread, NULL, watch_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		goto out_free;
	*out = w;
	return 0;

out_free:
	watch_free(w);
	return rc;
}

int castfs_watch_stop(struct castfs_watch *w)
{
	struct timespec until;
	uint64_t one = 1;

	if (!w)
		return 0;
	atomic_store(&w->stopping, true);
	if (write(w->stop_fd, &one, sizeof(one)) < 0)
		watch_log(w, "watcher: cannot wake the thread");
	/*
	 * A notification can wait for a directory lock held by a request
	 * the loop will no longer answer; the unmount that follows aborts
	 * it. Do not wait for that: leave the thread (and its state) be.
	 */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	if (pthread_timedjoin_np(w->thread, NULL, &until) != 0) {
		watch_log(w, "watcher: thread still busy at unmount");
		/* Detached, it may finish during the exit that follows
		 * without being a leaked thread (ThreadSanitizer reports
		 * one, and its exit status then reads as a crash). */
		pthread_detach(w->thread);
		return -EBUSY;
	}
	watch_free(w);
	return 0;
}
