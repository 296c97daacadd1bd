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

/* Directories watched at most (one inotify watch each). */
#define WATCH_MAX_DIRS 65536u

#define WATCH_MASK                                                         \
	(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY | \
	 IN_CLOSE_WRITE | IN_ATTRIB | IN_ONLYDIR)

/* Changed paths of one batch of events already handled (deduplication). */
#define WATCH_DEDUP 64u

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
	char *seen[WATCH_DEDUP];
	size_t nseen;
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

/* Source path @rel changed: forget it, here and in the kernel. Paths
 * already handled in this batch of events are skipped. */
static void changed(struct castfs_watch *w, const char *rel)
{
	char *copy;

	for (size_t i = 0; i < w->nseen; i++) {
		if (strcmp(w->seen[i], rel) == 0)
			return;
	}
	castfs_ns_invalidate(w->fs->ns, rel, inval_entry, w);
	if (w->nseen < WATCH_DEDUP && (copy = strdup(rel)))
		w->seen[w->nseen++] = copy;
}

static void seen_clear(struct castfs_watch *w)
{
	for (size_t i = 0; i < w->nseen; i++)
		free(w->seen[i]);
	w->nseen = 0;
}

/* Every entry of watched directory @rel changed. */
static void changed_all_in(struct castfs_watch *w, const char *rel)
{
	int fd = open_dir(w, rel, O_RDONLY | O_NOFOLLOW);
	struct dirent *de;
	DIR *dp;

	if (fd < 0 || !(dp = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(dp)) && !atomic_load(&w->stopping)) {
		char *p;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (asprintf(&p, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) <
		    0)
			break;
		castfs_ns_invalidate(w->fs->ns, p, inval_entry, w);
		free(p);
	}
	closedir(dp);
}

/* Events were lost: invalidate every entry of every watched directory,
 * then every name the kernel may still hold (a deleted source is in no
 * listing any more), and watch the directories made meanwhile. */
static void overflowed(struct castfs_watch *w)
{
	watch_log(w, "inotify queue overflowed: invalidating every entry");
	watch_tree(w, "");
	for (size_t wd = 0; wd < w->ndirs_cap; wd++) {
		char *rel = w->dirs[wd] ? strdup(w->dirs[wd]) : NULL;

		if (rel)
			changed_all_in(w, rel);
		free(rel);
	}
	if (!atomic_load(&w->stopping))
		castfs_ns_invalidate_all(w->fs->ns, inval_entry, w);
}

static void handle_event(struct castfs_watch *w, const struct inotify_event *e)
{
	const char *dir = dirs_get(w, e->wd);
	char *rel;

	if (e->mask & IN_Q_OVERFLOW) {
		overflowed(w);
		return;
	}
	if (e->mask & IN_IGNORED) {
		dirs_drop(w, e->wd); /* removed, or its filesystem unmounted */
		return;
	}
	if (!dir || !e->len)
		return; /* events on the watched directory itself */
	if (asprintf(&rel, "%s%s%s", dir, dir[0] ? "/" : "", e->name) < 0)
		return;
	/* A directory made or moved here: watch it (a moved one keeps its
	 * watch descriptor, which then gets its new path). */
	if ((e->mask & IN_ISDIR) && (e->mask & (IN_CREATE | IN_MOVED_TO)))
		watch_tree(w, rel);
	changed(w, rel);
	free(rel);
}

static void handle_batch(struct castfs_watch *w, const char *buf, ssize_t len)
{
	const char *p = buf;

	castfs_fs_listing_batch(w->fs, true);
	while (p < buf + len) {
		const struct inotify_event *e =
			(const struct inotify_event *)(const void *)p;

		handle_event(w, e);
		p += sizeof(*e) + e->len;
	}
	castfs_fs_listing_batch(w->fs, false);
	seen_clear(w);
}

static void *watch_main(void *arg)
{
	struct castfs_watch *w = arg;
	/* Aligned as the kernel's records need (inotify(7)). */
	char buf[65536]
		__attribute__((aligned(__alignof__(struct inotify_event))));
	struct pollfd p[2] = { { w->ino_fd, POLLIN, 0 },
			       { w->stop_fd, POLLIN, 0 } };

	while (!atomic_load(&w->stopping)) {
		ssize_t n;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		n = read(w->ino_fd, buf, sizeof(buf));
		if (n > 0)
			handle_batch(w, buf, n);
		else if (n < 0 && errno != EAGAIN && errno != EINTR)
			break;
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
	seen_clear(w);
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
	rc = -pthread_create(&w->thread, NULL, watch_main, w);
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
		return -EBUSY;
	}
	watch_free(w);
	return 0;
}
