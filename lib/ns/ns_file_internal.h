/* SPDX-License-Identifier: MIT */
/*
 * Private to ns/, level 4 (ns_file.c): open files, each a snapshot of the
 * plan and the source it reads.
 */
#ifndef CASTFS_NS_FILE_INTERNAL_H
#define CASTFS_NS_FILE_INTERNAL_H

#include "ns/ns_ckpt_internal.h"

/* ---- files ---- */

/* ns_file_new_plan - a file serving @plan, reading the source file
 * @path (identity @ident) when the plan needs it. Takes a reference on
 * @ck (may be NULL for plans of memory only) and ownership of @owned_plan
 * (freed at close; NULL when the plan is owned by @ck). */
int ns_file_new_plan(struct castfs_ns *ns, const char *path,
		     const struct stat *ident, struct ns_ckpt *ck,
		     const struct castfs_plan *plan,
		     struct castfs_plan *owned_plan, int view_idx,
		     struct castfs_file **out);

/* ns_file_new_parts - like ns_file_new_plan(), but the plan's source is
 * composite (castfs_multi_reader): part k is source @paths[k] of identity
 * @idents[k] and checkpoint @cks[k] (a reference is taken on each), opened,
 * guarded and checked after every read like the one source of a plan, so a
 * change of any part fails the read with EIO. @n >= 1. Takes ownership of
 * @owned_plan, on failure too. */
int ns_file_new_parts(struct castfs_ns *ns, size_t n, char *const *paths,
		      const struct stat *idents, struct ns_ckpt *const *cks,
		      const struct castfs_plan *plan,
		      struct castfs_plan *owned_plan, int view_idx,
		      struct castfs_file **out);

/* ns_file_new_layered - like ns_file_new_plan(), but the extents of
 * @plan read the bytes of @base (a view of source @path, owned by @ck)
 * instead of the source: the tensor files of a view. Takes ownership of
 * @owned_plan (NULL when @plan is owned by @ck). */
int ns_file_new_layered(struct castfs_ns *ns, const char *path,
			const struct stat *ident, struct ns_ckpt *ck,
			const struct castfs_plan *base,
			const struct castfs_plan *plan,
			struct castfs_plan *owned_plan, int view_idx,
			struct castfs_file **out);

/* ns_file_new_source - a pass-through file of source @path (@ident). */
int ns_file_new_source(struct castfs_ns *ns, const char *path,
		       const struct stat *ident, struct castfs_file **out);

/* ns_file_new_mem - a file of @len bytes of @data (copied) generated for
 * this open: served with direct I/O (castfs_file_direct_io()). */
int ns_file_new_mem(struct castfs_ns *ns, const void *data, size_t len,
		    struct castfs_file **out);

#endif
