// SPDX-License-Identifier: MIT
/*
 * Source access: every path is relative to the root and opened so that
 * nothing outside it is reached, and the guard that reports writers of an
 * open source (leases, fs/fs_lease.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ns/ns_src_internal.h"

/* ---- source access ---- */

/* openat2 below the root; EAGAIN means a rename raced the path walk. */
static int src_openat2(struct castfs_ns *ns, const char *path, int flags,
		       uint64_t resolve)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | resolve,
	};
	long fd;

	if (path[0] == '\0')
		path = ".";
	do {
		fd = syscall(SYS_openat2, ns->root_fd, path, &how, sizeof(how));
	} while (fd < 0 && errno == EAGAIN);
	return fd < 0 ? -errno : (int)fd;
}

int ns_src_open(struct castfs_ns *ns, const char *path, int flags)
{
	return src_openat2(ns, path, flags, RESOLVE_NO_SYMLINKS);
}

int ns_src_open_in(struct castfs_ns *ns, const char *path, int flags)
{
	/* Links are followed while they stay below the root. */
	return src_openat2(ns, path, flags, 0);
}

int ns_src_stat_in(struct castfs_ns *ns, const char *path, struct stat *st)
{
	struct stat target;
	int fd, rc = ns_src_stat(ns, path, st);

	if (rc || !S_ISLNK(st->st_mode))
		return rc;
	fd = ns_src_open_in(ns, path, O_PATH);
	if (fd < 0)
		return 0; /* dangling, or leaving the root: the link itself */
	rc = fstat(fd, &target) < 0 ? -errno : 0;
	close(fd);
	if (!rc && S_ISREG(target.st_mode)) {
		*st = target;
		ns_src_link_hide(ns, path, st);
	}
	return rc;
}

int ns_src_stat(struct castfs_ns *ns, const char *path, struct stat *st)
{
	int fd, rc = 0;

	/* The root itself: one call, not three (the watcher stats a
	 * changed file's directory for each event). */
	if (!path[0])
		return fstat(ns->root_fd, st) < 0 ? -errno : 0;
	/* A name right under the root: one call, not three (a lookup stats
	 * its entry twice). Without a slash or a dot name, and not
	 * following the name itself, it cannot leave the root either. */
	if (!strchr(path, '/') && strcmp(path, ".") && strcmp(path, ".."))
		return fstatat(ns->root_fd, path, st, AT_SYMLINK_NOFOLLOW) < 0 ?
			       -errno :
			       0;
	fd = ns_src_open(ns, path, O_PATH | O_NOFOLLOW);
	if (fd < 0)
		return fd == -ELOOP ? -ENOENT : fd;
	if (fstat(fd, st) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Read all @len bytes of @fd into a new buffer *@out (NUL-terminated). */
static int read_whole(struct castfs_ns *ns, int fd, size_t len, char **out)
{
	struct castfs_fd_reader fr;
	char *buf = malloc(len + 1);
	int rc = buf ? 0 : -ENOMEM;

	castfs_fd_reader_init(&fr, fd);
	if (!rc && len)
		rc = castfs_reader_read(&fr.r, buf, len, 0);
	if (rc) {
		free(buf);
		return rc;
	}
	castfs_stats_count(ns->stats, CASTFS_SCTR_TEXTS_READ, 1);
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/*
 * Read @len bytes of @fd (identity @st) as one version: under the source
 * guard as headers are (ck_load()): a file open for writing is not read,
 * and a writer arriving during the read fails it. Without a guard (no
 * lease for this file), the identity is compared again after the read:
 * a change that completed meanwhile is seen, one still under way is not.
 */
static int read_one_version(struct castfs_ns *ns, int fd, const struct stat *st,
			    char **out)
{
	int rc, begun = ns_guard_read_begin(ns, fd);
	struct stat after;
	bool quiet;

	if (begun < 0)
		return -ESTALE; /* being written: a text of no version yet */
	rc = read_whole(ns, fd, (size_t)st->st_size, out);
	quiet = ns_guard_read_end(ns, fd, begun);
	if (!rc && (!quiet || (begun && (fstat(fd, &after) < 0 ||
					 !ns_same_file(&after, st))))) {
		free(*out);
		rc = -ESTALE;
	}
	return rc;
}

int ns_src_read_text(struct castfs_ns *ns, const char *path,
		     const struct stat *ident, size_t max, char **out,
		     size_t *len)
{
	struct stat st;
	int rc, fd = ns_src_open_in(ns, path, O_RDONLY);

	if (fd < 0)
		return fd == -ENOENT || fd == -ELOOP ? -ESTALE : fd;
	rc = fstat(fd, &st) < 0 ? -errno : 0;
	if (!rc && ident && !ns_same_file(&st, ident))
		rc = -ESTALE;
	if (!rc && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max))
		rc = -EFBIG;
	if (!rc)
		rc = read_one_version(ns, fd, &st, out);
	if (!rc)
		*len = (size_t)st.st_size;
	close(fd);
	return rc;
}

/* ---- watching sources for writers ---- */

int ns_guard_watch(struct castfs_ns *ns, int fd)
{
	int rc;

	if (!ns->guard)
		return 1;
	rc = ns->guard->watch(ns->guard->ctx, fd);
	if (rc == -EAGAIN)
		return rc;
	return rc ? 1 : 0;
}

void ns_guard_unwatch(struct castfs_ns *ns, int fd)
{
	ns->guard->unwatch(ns->guard->ctx, fd);
}

int ns_guard_read_begin(struct castfs_ns *ns, int fd)
{
	int watch = ns_guard_watch(ns, fd);

	if (watch != 0)
		return watch;
	if (!ns->guard->enter(ns->guard->ctx, fd)) {
		ns_guard_unwatch(ns, fd);
		return -ESTALE;
	}
	return 0;
}

bool ns_guard_read_end(struct castfs_ns *ns, int fd, int begun)
{
	bool quiet;

	if (begun != 0)
		return true;
	quiet = ns->guard->leave(ns->guard->ctx, fd);
	ns_guard_unwatch(ns, fd);
	return quiet;
}
