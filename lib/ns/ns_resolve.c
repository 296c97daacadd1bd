/* SPDX-License-Identifier: MIT */
/*
 * Finding a node from its id alone, for NFS file handles of nodes the
 * daemon has freed or never knew (after a restart): ids are hashes of what
 * a node shows, so the tree is searched for the object whose id it is:
 * listed names and the names lookups resolve without listing them
 * (unlisted views, tensor trees of views), breadth first, at most
 * RESOLVE_MAX_ENTRIES entries per pass (listed names, then all names).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_kind_internal.h"

/* The directory entries one search may visit before it gives up. */
#define RESOLVE_MAX_ENTRIES (1u << 20)

struct id_queue {
	uint64_t *v;
	size_t head, n, cap;
};

static int queue_push(struct id_queue *q, uint64_t id)
{
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 64;
		uint64_t *v = realloc(q->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		q->v = v;
		q->cap = cap;
	}
	q->v[q->n++] = id;
	return 0;
}

/*
 * Look @name up in @dir and forget it at once: the node stays in the
 * table, forgotten, which is where the kernel's own lookup finds it.
 */
static int touch(struct castfs_ns *ns, uint64_t dir, const char *name,
		 uint64_t *id)
{
	struct stat st;
	int rc = ns_lookup_how(ns, dir, name, id, &st, 0);

	if (!rc)
		castfs_ns_forget(ns, *id, 1);
	return rc;
}

/* Whether @name (in @dir) is @id; else queue it when it is a directory. */
static int try_name(struct castfs_ns *ns, uint64_t dir, const char *name,
		    uint64_t id, struct id_queue *q, bool *found)
{
	struct stat st;
	uint64_t got;

	if (ns_lookup_how(ns, dir, name, &got, &st, 0))
		return 0; /* no such view here */
	castfs_ns_forget(ns, got, 1);
	if (got == id)
		*found = true;
	else if (S_ISDIR(st.st_mode))
		return queue_push(q, got);
	return 0;
}

/*
 * What a listing does not show but lookups resolve: views -o views= does
 * not list (of a checkpoint, of a model directory) and the tensor trees of
 * views. Tried for every view, so they are found like listed names.
 */
static int search_unlisted(struct castfs_ns *ns, uint64_t dir,
			   const struct castfs_dirent *e, uint64_t id,
			   struct id_queue *q, bool *found)
{
	size_t len = strlen(e->name);
	bool ckpt = e->type == S_IFREG && len > 12 &&
		    strcmp(e->name + len - 12, ".safetensors") == 0;
	bool index = e->type == S_IFREG && len > 11 &&
		     strcmp(e->name + len - 11, ".index.json") == 0;
	char buf[600];
	int rc = 0;

	if (!ckpt && !index && e->type != S_IFDIR)
		return 0;
	for (size_t i = 0; !rc && !*found && i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];
		/* GGUF views carry their extension: "X.q8_0.gguf". */
		bool gguf = v->kind == CASTFS_VIEW_GGUF;

		if (index) { /* "X.index.<view>.json" (lookup_vindex()) */
			snprintf(buf, sizeof(buf), "%.*s.%s.json",
				 (int)(len - 5), e->name, v->name);
			rc = v->listed || gguf ?
				     0 :
				     try_name(ns, dir, buf, id, q, found);
			continue;
		}
		if (!ckpt) {
			snprintf(buf, sizeof(buf), "%s.%s", e->name, v->name);
			rc = v->listed ? 0 :
					 try_name(ns, dir, buf, id, q, found);
			continue;
		}
		snprintf(buf, sizeof(buf), "%.*s.%s%s", (int)(len - 12),
			 e->name, v->name, gguf ? "" : ".safetensors");
		if (!v->listed)
			rc = try_name(ns, dir, buf, id, q, found);
		if (gguf)
			continue; /* no tensor tree */
		strcat(buf, ".tensors");
		if (!rc && !*found)
			rc = try_name(ns, dir, buf, id, q, found);
	}
	return rc;
}

/* Search directory @dir's entries for @id; queue its sub-directories. */
static int search_dir(struct castfs_ns *ns, uint64_t dir, uint64_t id,
		      bool unlisted, struct id_queue *q, size_t *visited,
		      bool *found)
{
	struct castfs_dir *d;
	int rc = 0;

	if (ns_opendir_how(ns, dir, &d, false))
		return 0; /* gone since it was queued: nothing to search */
	for (size_t i = 2; !rc && !*found && i < d->n; i++, (*visited)++) {
		const struct castfs_dirent *e = &d->ents[i];
		uint64_t got;

		if (e->ino == id)
			*found = touch(ns, dir, e->name, &got) == 0 &&
				 got == id;
		else if (e->type == S_IFDIR &&
			 touch(ns, dir, e->name, &got) == 0)
			rc = queue_push(q, got);
		if (unlisted && !rc && !*found)
			rc = search_unlisted(ns, dir, e, id, q, found);
	}
	castfs_dir_free(d);
	return rc;
}

/* One breadth-first search; with @unlisted, names no listing shows too. */
static int search(struct castfs_ns *ns, uint64_t id, bool unlisted, bool *found)
{
	struct id_queue q = { 0 };
	size_t visited = 0;
	int rc = queue_push(&q, CASTFS_NS_ROOT_ID);

	/* Breadth first: the views and files next to sources come first. */
	while (!rc && !*found && q.head < q.n && visited < RESOLVE_MAX_ENTRIES)
		rc = search_dir(ns, q.v[q.head++], id, unlisted, &q, &visited,
				found);
	free(q.v);
	return rc;
}

int ns_resolve(struct castfs_ns *ns, uint64_t id)
{
	bool found = false;
	/* Listed names first: that pass looks up directories only, while
	 * trying unlisted names builds the plan of every view it tries. */
	int rc = search(ns, id, false, &found);

	if (!rc && !found)
		rc = search(ns, id, true, &found);
	if (rc)
		return rc;
	return found ? 0 : -ESTALE;
}
