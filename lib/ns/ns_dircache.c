/* SPDX-License-Identifier: MIT */
/*
 * Listings the kernel may cache (FOPEN_CACHE_DIR): which directories, and
 * telling the daemon when one of them may list something else. A source
 * directory's listing and a model-directory view's are functions of the
 * source tree, whose every change the watcher reports
 * (castfs_ns_invalidate()); a tensor tree's directory's is a function of
 * its checkpoint's header, whose change the watcher reports too, even an
 * in-place rewrite that keeps the size and mtime the tree's ids hash
 * (ns_tree_listings_changed()). /.castfs is listed per open.
 * docs/ARCHITECTURE.md, "The daemon".
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "ns/ns.h"
#include "ns/ns_internal.h"

static bool kind_cacheable(uint8_t kind)
{
	return kind == NS_DIR || kind == NS_MDIR || kind == NS_TDIR;
}

int castfs_ns_dir_cacheable(struct castfs_ns *ns, uint64_t id)
{
	struct ns_node n;
	bool dir, cacheable;

	/* An id of a previous daemon (not in the table yet): listed the
	 * usual way, which resolves it. */
	if (ns_node_get(ns, id, &n))
		return 0;
	dir = S_ISDIR(n.st.st_mode) || n.kind == NS_CTL_DIR ||
	      n.kind == NS_TDIR || n.kind == NS_MDIR;
	/* A tree directory's st is its checkpoint's (a regular file). */
	cacheable = kind_cacheable(n.kind) &&
		    (S_ISDIR(n.st.st_mode) || n.kind == NS_TDIR);
	ns_node_put_copy(&n);
	if (!dir)
		return -ENOTDIR;
	if (!cacheable)
		return 0;
	return ns_node_listed_once(ns, id) ? 1 : 2;
}

/* Whether @node is one of those cacheable_ids() collects: with @st, the
 * tree directories the kernel holds of identity @st's file. */
static bool id_wanted(const struct ns_node *node, const struct stat *st)
{
	if (!st)
		return kind_cacheable(node->kind);
	return node->kind == NS_TDIR && node->nlookup &&
	       node->st.st_dev == st->st_dev && node->st.st_ino == st->st_ino;
}

/* Ids of every cacheable directory in the node table (the kernel may hold
 * a listing of any of them, and of no other), or with @st only the tree
 * directories of @st's file. */
static ssize_t cacheable_ids(struct castfs_ns *ns, const struct stat *st,
			     uint64_t **out)
{
	uint64_t *v = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&ns->lock);
	for (size_t b = 0; b < ns->nbuckets; b++) {
		for (struct ns_node *node = ns->nodes[b].head; node;
		     node = node->hnext) {
			if (!id_wanted(node, st))
				continue;
			if (n == cap) {
				size_t ncap = cap * 2 + 64;
				uint64_t *nv = realloc(v, ncap * sizeof(*nv));

				if (!nv) {
					pthread_mutex_unlock(&ns->lock);
					free(v);
					return -ENOMEM;
				}
				v = nv;
				cap = ncap;
			}
			v[n++] = node->id;
		}
	}
	pthread_mutex_unlock(&ns->lock);
	*out = v;
	return (ssize_t)n;
}

void ns_listings_all_changed(struct castfs_ns *ns)
{
	uint64_t *ids;
	ssize_t n;

	ns_dirshare_drop(ns, 0, true);
	ns_ctl_src_changed(ns);
	if (!ns->listing_changed)
		return;
	n = cacheable_ids(ns, NULL, &ids);
	if (n < 0) {
		/* Cannot say which: the root at least, as before caching. */
		ns_listing_changed(ns, CASTFS_NS_ROOT_ID);
		return;
	}
	for (ssize_t i = 0; i < n; i++)
		ns_listing_changed(ns, ids[i]);
	free(ids);
}

/* The held tree directories of each slot: ids, a swap-removed array. */
struct ns_tids {
	uint64_t *v;
	uint32_t n, cap;
};

void ns_tids_add(struct castfs_ns *ns, size_t slot, uint64_t id)
{
	struct ns_tids *t;

	if (!ns->tids_broken && !ns->tids)
		ns->tids = calloc(NS_LIVE_SLOTS, sizeof(*ns->tids));
	if (!ns->tids) {
		ns->tids_broken = true;
		return;
	}
	t = &ns->tids[slot];
	if (t->n == t->cap) {
		uint32_t cap = t->cap * 2 + 4;
		uint64_t *v = realloc(t->v, cap * sizeof(*v));

		if (!v) {
			ns->tids_broken = true; /* the walk, from now on */
			return;
		}
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n++] = id;
}

void ns_tids_del(struct castfs_ns *ns, size_t slot, uint64_t id)
{
	struct ns_tids *t;

	if (!ns->tids)
		return;
	t = &ns->tids[slot];
	for (uint32_t i = 0; i < t->n; i++) {
		if (t->v[i] == id) {
			t->v[i] = t->v[--t->n];
			return;
		}
	}
}

void ns_tids_fini(struct castfs_ns *ns)
{
	for (size_t i = 0; ns->tids && i < NS_LIVE_SLOTS; i++)
		free(ns->tids[i].v);
	free(ns->tids);
	ns->tids = NULL;
}

/* cacheable_ids() of @st's tree directories from their slot's ids:
 * -EAGAIN when there is no index to trust (walk the table then). */
static ssize_t slot_ids(struct castfs_ns *ns, const struct stat *st,
			uint64_t **out)
{
	const struct ns_tids *t;
	uint64_t *v;
	size_t n = 0;

	pthread_mutex_lock(&ns->lock);
	if (ns->tids_broken || !ns->tids) {
		pthread_mutex_unlock(&ns->lock);
		return -EAGAIN;
	}
	t = &ns->tids[ns_node_tree_slot(ns, st)];
	v = malloc((t->n + 1) * sizeof(*v));
	for (uint32_t i = 0; v && i < t->n; i++) {
		const struct ns_node *node = ns_node_find_locked(ns, t->v[i]);

		if (node && id_wanted(node, st))
			v[n++] = node->id;
	}
	pthread_mutex_unlock(&ns->lock);
	if (!v)
		return -ENOMEM;
	*out = v;
	return (ssize_t)n;
}

void ns_tree_listings_changed(struct castfs_ns *ns, const struct stat *st)
{
	uint64_t *ids;
	ssize_t n;

	if (!ns->listing_changed || !ns_node_tree_live(ns, st))
		return;
	n = slot_ids(ns, st, &ids);
	if (n == -EAGAIN)
		n = cacheable_ids(ns, st, &ids);
	if (n < 0) {
		/* Cannot say which: every listing, as after lost events. */
		ns_listings_all_changed(ns);
		return;
	}
	for (ssize_t i = 0; i < n; i++)
		ns_listing_changed(ns, ids[i]);
	free(ids);
}
