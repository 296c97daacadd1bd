/* SPDX-License-Identifier: MIT */
/*
 * What the path of a link inside the root hides: a view of a link's
 * target is read by castfs itself, so the kernel never searches the
 * directories the link leads through, as it does when it follows the
 * link in the mount (default_permissions). Those directories are walked
 * here as the kernel walks them, and the classes of the target's mode
 * (owner, group, others) in which some user could not search one of them
 * are cut from the stat every node derived from the target is made of.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ns/ns_src_internal.h"

/* As the kernel's MAXSYMLINKS. */
#define LINK_HOPS_MAX 40u

struct link_walk {
	const char *own; /* the link's directory: the kernel searches it */
	size_t own_len;
	char cur[PATH_MAX]; /* the directory reached, no links ("" root) */
	struct stat cur_st; /* its stat, when not on the link's own path */
	char rest[PATH_MAX]; /* what is left to walk */
	uid_t uid; /* the target's owner and group */
	gid_t gid;
	mode_t cut;
	unsigned hops;
};

/*
 * The classes of a file owned by @uid:@gid in which some user may be
 * unable to search directory @d. The owner of @d gets its owner bits,
 * whatever class of the file it is in; anyone not known to be in or out
 * of @d's group needs both its group and its other bits.
 */
static mode_t search_cut(const struct stat *d, uid_t uid, gid_t gid)
{
	bool ux = d->st_mode & S_IXUSR, gx = d->st_mode & S_IXGRP,
	     ox = d->st_mode & S_IXOTH;
	bool d_owner = d->st_uid == uid || ux;
	mode_t cut = 0;

	if (d->st_uid == uid ? !ux : !(gx && ox))
		cut |= 0700;
	if (!d_owner || !(d->st_gid == gid ? gx : gx && ox))
		cut |= 0070;
	if (!d_owner || !(d->st_gid == gid || gx) || !ox)
		cut |= 0007;
	return cut;
}

/* True if the walk is at the link's own directory or one above it,
 * which the kernel searches on its way to the link anyway. */
static bool on_own_path(const struct link_walk *w)
{
	size_t n = strlen(w->cur);

	return n == 0 || (n <= w->own_len && !memcmp(w->own, w->cur, n) &&
			  (w->own[n] == '\0' || w->own[n] == '/'));
}

/* Pop the first component of w->rest into @name (empty ones skipped).
 * Returns its length, 0 at the end. */
static size_t pop_name(struct link_walk *w, char name[NAME_MAX + 1])
{
	char *p = w->rest, *slash;
	size_t n;

	while (*p == '/')
		p++;
	slash = strchr(p, '/');
	n = slash ? (size_t)(slash - p) : strlen(p);
	if (n > NAME_MAX)
		n = 0; /* ENAMETOOLONG for the kernel too: nothing reached */
	memcpy(name, p, n);
	name[n] = '\0';
	memmove(w->rest, p + n, strlen(p + n) + 1);
	return n;
}

/* Link @path's text, then what was left, as what is left to walk. */
static int follow(struct castfs_ns *ns, struct link_walk *w, const char *path)
{
	char text[PATH_MAX];
	size_t rest_len = strlen(w->rest);
	ssize_t got;
	int fd;

	if (++w->hops > LINK_HOPS_MAX)
		return -ELOOP;
	fd = ns_src_open(ns, path, O_PATH | O_NOFOLLOW);
	if (fd < 0)
		return fd;
	got = readlinkat(fd, "", text, sizeof(text));
	close(fd);
	if (got <= 0 || text[0] == '/')
		return got < 0 ? -errno : -EXDEV; /* never followed */
	if ((size_t)got + 1 + rest_len >= sizeof(w->rest))
		return -ENAMETOOLONG;
	memmove(w->rest + got + 1, w->rest, rest_len + 1);
	memcpy(w->rest, text, (size_t)got);
	w->rest[got] = '/';
	return 0;
}

/* Go up from w->cur; leaving the root is never followed. */
static int walk_up(struct castfs_ns *ns, struct link_walk *w)
{
	char *slash = strrchr(w->cur, '/');

	if (!w->cur[0])
		return -EXDEV;
	if (slash)
		*slash = '\0';
	else
		w->cur[0] = '\0';
	return on_own_path(w) ? 0 : ns_src_stat(ns, w->cur, &w->cur_st);
}

/* Look @name up in w->cur; a regular file at the end into @st. */
static int walk_name(struct castfs_ns *ns, struct link_walk *w,
		     const char *name, struct stat *st)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof(path), "%s%s%s", w->cur,
			 w->cur[0] ? "/" : "", name);
	int rc;

	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	rc = ns_src_stat(ns, path, st);
	if (rc)
		return rc;
	if (S_ISLNK(st->st_mode))
		return follow(ns, w, path);
	if (S_ISDIR(st->st_mode)) {
		memcpy(w->cur, path, (size_t)n + 1);
		w->cur_st = *st;
		return 0;
	}
	return w->rest[strspn(w->rest, "/")] ? -ENOTDIR : 1;
}

/* The walk of link @path to @target: its cut into w->cut. */
static int walk(struct castfs_ns *ns, struct link_walk *w, const char *path,
		const struct stat *target)
{
	char name[NAME_MAX + 1];
	struct stat st = { 0 };
	int rc = follow(ns, w, path);

	while (!rc) {
		if (!pop_name(w, name))
			return -ENOENT; /* a directory, or a name too long */
		/* Every lookup, "." and ".." too, searches the directory. */
		if (!on_own_path(w))
			w->cut |= search_cut(&w->cur_st, w->uid, w->gid);
		if (!strcmp(name, "."))
			continue;
		rc = !strcmp(name, "..") ? walk_up(ns, w) :
					   walk_name(ns, w, name, &st);
	}
	if (rc < 0)
		return rc;
	return st.st_dev == target->st_dev && st.st_ino == target->st_ino ?
		       0 :
		       -ESTALE; /* renamed meanwhile */
}

void ns_src_dir_hide(struct stat *st, const struct stat *dir)
{
	mode_t cut = search_cut(dir, st->st_uid, st->st_gid) & st->st_mode &
		     0777;

	st->st_mode &= ~cut;
	st->st_rdev |= (dev_t)cut;
}

void ns_src_link_hide(struct castfs_ns *ns, const char *path, struct stat *st)
{
	const char *slash = strrchr(path, '/');
	struct link_walk *w = calloc(1, sizeof(*w));
	mode_t cut = 0777; /* what cannot be walked shows nobody */

	if (w) {
		w->own = path;
		w->own_len = slash ? (size_t)(slash - path) : 0;
		memcpy(w->cur, path, w->own_len);
		w->uid = st->st_uid;
		w->gid = st->st_gid;
		if (walk(ns, w, path, st) == 0)
			cut = w->cut;
		free(w);
	}
	cut &= st->st_mode & 0777;
	st->st_mode &= ~cut;
	st->st_rdev = (dev_t)cut;
}
