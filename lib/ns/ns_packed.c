/* SPDX-License-Identifier: MIT */
/*
 * Packed sources: X.safetensors.zst (the seekable zstd format, lib/source/)
 * is shown as X.safetensors, its original bytes, and gets every view and
 * tensor tree through the checkpoint cache, which reads it through the
 * seek table. Node paths keep the shown name "dir/X.safetensors"; the
 * checkpoint's path is the file on disk. One rule picks the file behind
 * X.safetensors everywhere: the plain file, else X.safetensors.zst, else
 * X.safetensors.zstg (ns_packed_find()); a loser is shown as itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_kind_internal.h"

/* The packed checkpoint behind @n, still the identity @n was made from. */
static int packed_ck(struct castfs_ns *ns, const struct ns_node *n,
		     struct ns_ckpt **ck)
{
	struct stat st;
	int rc = ns_ckpt_valid(ns, n->path, &st, ck);

	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st) || !(*ck)->zix) {
		ns_ckpt_put(ns, *ck);
		return -ESTALE;
	}
	return 0;
}

static int packed_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, struct ns_node *child)
{
	size_t len = strlen(name);
	struct ns_ckpt *ck;
	char *path;
	int rc;

	/* "X.safetensors": only when X.safetensors.zst is a usable pack. */
	if (!ns_has_st_ext(name, len))
		return -ENOENT;
	path = ns_path_join(dir->path, name, len);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_valid(ns, path, &child->st, &ck);
	if (!rc) {
		if (!ck->zix)
			rc = -ENOENT; /* a plain file appeared meanwhile */
		ns_ckpt_put(ns, ck);
	}
	if (rc) {
		free(path);
		return rc;
	}
	child->kind = NS_PACKED;
	child->path = path;
	return 0;
}

static int packed_show(struct castfs_ns *ns, const struct ns_node *dir,
		       struct ns_list *l, size_t i)
{
	struct castfs_dirent *e = &l->dir->ents[i];
	size_t shown = strlen(e->name) - ns_packed_ext_len(e->name);
	struct ns_node node = { .kind = NS_PACKED };
	struct ns_ckpt *ck;
	char *path;
	int rc;

	if ((e->type != S_IFREG && e->type != S_IFLNK) ||
	    !ns_packed_name(e->name) || ns_list_has(l, e->name, shown))
		return 0; /* a plain X.safetensors wins over its pack */
	path = ns_path_join(dir->path, e->name, shown);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_valid(ns, path, &node.st, &ck);
	free(path);
	if (rc)
		return rc == -ENOMEM ? rc : 0; /* rejected: shown as itself */
	/* The checkpoint is the pack a lookup of the shown name opens
	 * (ns_packed_find(): .zst before .zstg); any other pack of that
	 * name is shown as itself. */
	if (ck->zix &&
	    ns_packed_ext_len(ck->path) == ns_packed_ext_len(e->name)) {
		e = &l->dir->ents[i];
		ns_list_shorten(l, i, shown);
		e->type = S_IFREG;
		e->ino = ns_node_id(&node);
	}
	ns_ckpt_put(ns, ck);
	return 0;
}

static int packed_getattr(struct castfs_ns *ns, const struct ns_node *n,
			  struct stat *st)
{
	struct ns_ckpt *ck;
	int rc = packed_ck(ns, n, &ck);

	if (rc)
		return rc;
	ns_view_stat(&n->st, castfs_zst_index_size(ck->zix), n->id, st);
	ns_ckpt_put(ns, ck);
	return 0;
}

/* The original bytes: one COPY extent read through the seek table. */
static int packed_open(struct castfs_ns *ns, const struct ns_node *n,
		       struct castfs_file **out)
{
	struct castfs_plan *plan;
	struct ns_ckpt *ck;
	int rc = packed_ck(ns, n, &ck);

	if (rc)
		return rc;
	rc = castfs_plan_new_range(0, castfs_zst_index_size(ck->zix), &plan);
	if (!rc)
		rc = ns_file_new_plan(ns, n->path, &n->st, ck, plan, plan,
				      CASTFS_STATS_PASSTHROUGH, out);
	ns_ckpt_put(ns, ck);
	return rc;
}

const struct ns_kind_ops ns_kind_packed = {
	.getattr = packed_getattr,
	.open = packed_open,
};

/* A pack is looked up by the name it is shown under, and a listing shows
 * it under that name. */
const struct ns_dir_ext ns_packed_dir_ext = {
	.before_views = true,
	.lookup = packed_lookup,
	.show = packed_show,
};
