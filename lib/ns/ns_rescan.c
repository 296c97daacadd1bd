/* SPDX-License-Identifier: MIT */
/*
 * The rescan after lost change events (castfs_ns_rescan): each watched
 * directory is compared with its snapshot (ns_snap.c), so that the cost
 * in kernel notifications follows what changed, not what the mount holds.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "ns/ns_kind_internal.h"

struct rescan {
	struct castfs_ns *ns;
	const char *dir; /* being rescanned */
	void (*cb)(void *ctx, uint64_t parent, const char *name);
	void *ctx;
	uint64_t *done; /* hashes of the directories rescanned, sorted */
	size_t ndone;
};

static uint64_t dir_hash(const char *dir, size_t len)
{
	return castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, dir, len));
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Entry @name of the directory being rescanned changed. */
static void entry_changed(void *c, const char *name)
{
	struct rescan *r = c;
	char *path = ns_path_join(r->dir, name, strlen(name));

	if (path)
		castfs_ns_invalidate(r->ns, path, r->cb, r->ctx);
	free(path);
}

/* A node at @path needs nothing when its directory was rescanned and
 * still has it: then it was reported if it changed. A hash collision
 * between two directories only costs a wrong "rescanned", answered by
 * the snapshot lookup of the right directory. */
static bool vouched(void *c, const char *path)
{
	struct rescan *r = c;
	const char *slash = strrchr(path, '/');
	size_t dlen = slash ? (size_t)(slash - path) : 0;
	uint64_t h = dir_hash(path, dlen);
	char *dir;
	bool has;

	if (!r->ndone || !bsearch(&h, r->done, r->ndone, sizeof(h), u64_cmp))
		return false;
	dir = strndup(path, dlen);
	if (!dir)
		return false;
	has = ns_snap_has(r->ns, dir, slash ? slash + 1 : path);
	free(dir);
	return has;
}

void castfs_ns_rescan(struct castfs_ns *ns, char *const *dirs, size_t n,
		      int64_t since, const atomic_bool *stop,
		      void (*cb)(void *ctx, uint64_t parent, const char *name),
		      void *ctx)
{
	struct rescan r = { .ns = ns, .cb = cb, .ctx = ctx };

	r.done = malloc(n * sizeof(*r.done) + 1);
	for (size_t i = 0; i < n && !atomic_load(stop); i++) {
		if (!dirs[i])
			continue;
		r.dir = dirs[i];
		/* A directory that cannot be read is not vouched for: its
		 * held names go below. */
		if (ns_snap_rescan(ns, dirs[i], since, entry_changed, &r) >=
			    0 &&
		    r.done)
			r.done[r.ndone++] = dir_hash(dirs[i], strlen(dirs[i]));
	}
	if (atomic_load(stop))
		goto out;
	if (r.done)
		qsort(r.done, r.ndone, sizeof(*r.done), u64_cmp);
	castfs_ns_invalidate_held(ns, vouched, &r, cb, ctx);
out:
	free(r.done);
}
