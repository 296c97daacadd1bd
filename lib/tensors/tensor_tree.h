/* SPDX-License-Identifier: MIT */
/*
 * Tensor trees: the reversible mapping of dotted tensor names onto paths
 * ("a.b.0.weight" -> "a/b/0/weight", docs/TENSOR_TREE.md) and a sorted
 * index of one header's tensors by path that answers lookups and listings.
 */
#ifndef CASTFS_TENSOR_TREE_H
#define CASTFS_TENSOR_TREE_H

#include <stdbool.h>
#include <stddef.h>

#include "format/st_header.h"

/*
 * The longest path component castfs makes: 255 (NAME_MAX) less room for
 * the longest leaf suffix (".info").
 */
#define CASTFS_TPATH_COMPONENT_MAX 250u

/*
 * castfs_tpath_encode - the tree path of tensor name @name (@len bytes, may
 * hold NULs): the name is split at every '.', each part is escaped into a
 * valid, dot-free path component of at most CASTFS_TPATH_COMPONENT_MAX
 * bytes, and the components are joined with '/'.
 * @out: on success a malloc'ed NUL-terminated path (caller frees); its
 *	length to *@out_len.
 * Returns 0 or -ENOMEM. Thread-safe.
 */
int castfs_tpath_encode(const char *name, size_t len, char **out,
			size_t *out_len);

/*
 * castfs_tpath_decode - the tensor name of tree path @path (@len bytes).
 * Only paths castfs_tpath_encode() makes are accepted (so the mapping is
 * one-to-one). @out: on success a malloc'ed name, NUL-terminated but may
 * hold NULs; its length to *@out_len. Returns 0, -EINVAL or -ENOMEM.
 */
int castfs_tpath_decode(const char *path, size_t len, char **out,
			size_t *out_len);

/* One tensor of a tree. */
struct castfs_ttree_entry {
	const char *path; /* encoded, NUL-terminated */
	size_t path_len;
	const struct castfs_tensor *t; /* borrowed from the header */
};

/* The index of one header's tensors by path. Immutable once built. */
struct castfs_ttree {
	size_t n;
	struct castfs_ttree_entry *e; /* sorted by path (bytewise) */
};

/*
 * castfs_ttree_build - index the tensors of @h by path. @h is borrowed and
 * must outlive the tree. Returns 0 or -ENOMEM. Thread-safe.
 */
int castfs_ttree_build(const struct castfs_header *h,
		       struct castfs_ttree **out);

/* castfs_ttree_free - release @tt; NULL is accepted. */
void castfs_ttree_free(struct castfs_ttree *tt);

/* castfs_ttree_find - the tensor at exactly @path (@len bytes), or NULL. */
const struct castfs_ttree_entry *
castfs_ttree_find(const struct castfs_ttree *tt, const char *path, size_t len);

/* castfs_ttree_is_dir - true if some tensor lies below directory @dir
 * (@len bytes; "" is the root). */
bool castfs_ttree_is_dir(const struct castfs_ttree *tt, const char *dir,
			 size_t len);

/*
 * castfs_ttree_children - call @cb once per child of directory @dir (@len
 * bytes; "" is the root): with @leaf NULL for a sub-directory @name, with
 * the tensor for a tensor @name. A name may come twice, once as each (a
 * tensor "a.b" next to "a.b.c"). Stops at and returns the first non-zero
 * value @cb returns; else 0.
 */
int castfs_ttree_children(const struct castfs_ttree *tt, const char *dir,
			  size_t len,
			  int (*cb)(void *ctx, const char *name, size_t len,
				    const struct castfs_ttree_entry *leaf),
			  void *ctx);

#endif
