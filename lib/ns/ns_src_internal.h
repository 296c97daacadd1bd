/* SPDX-License-Identifier: MIT */
/*
 * Private to ns/, level 2 (ns_src.c): reading the source tree, and the
 * guard that reports writers of an open source.
 */
#ifndef CASTFS_NS_SRC_INTERNAL_H
#define CASTFS_NS_SRC_INTERNAL_H

#include "ns/ns_internal.h"

/* ---- source access: every path is relative to the root and
 * resolved with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, so nothing outside
 * the source root is ever reached through a link. ---- */

/* ns_src_open - open @path with @flags (O_RDONLY, O_DIRECTORY, O_PATH...).
 * Returns the fd or a negative errno. */
int ns_src_open(struct castfs_ns *ns, const char *path, int flags);

/*
 * ns_src_open_in / ns_src_stat_in - the same, but symbolic links are
 * followed while they stay inside the root (RESOLVE_BENEATH: absolute
 * links and escapes through ".." fail without reaching outside). For the
 * content views are computed from: a checkpoint or a model file may be a
 * link to a blob, as in the Hugging Face cache. ns_src_stat_in gives the
 * target's identity only when it is a regular file; otherwise (dangling,
 * leaving the root, a directory) the link's own.
 */
int ns_src_open_in(struct castfs_ns *ns, const char *path, int flags);
int ns_src_stat_in(struct castfs_ns *ns, const char *path, struct stat *st);

/* ns_src_stat - lstat-like stat of @path. Returns 0 or -errno. */
int ns_src_stat(struct castfs_ns *ns, const char *path, struct stat *st);

/* ---- watching sources for writers (ns_src.c) ---- */

/* ns_guard_watch - start watching @fd. 0: watched; -EAGAIN: a writer has
 * the file open; 1: cannot watch (no guard or unsupported). */
int ns_guard_watch(struct castfs_ns *ns, int fd);

/* ns_guard_unwatch - undo ns_guard_watch() when it returned 0. */
void ns_guard_unwatch(struct castfs_ns *ns, int fd);

/* The largest text source (config.json, index.json) castfs reads. */
#define NS_TEXT_MAX (64u << 20)

/*
 * ns_src_read_text - the whole of source file @path (at most @max bytes,
 * else -EFBIG), which must be identity @ident if set (else -ESTALE),
 * malloc'ed and NUL-terminated into *@out, its length in *@len. Returns 0
 * or a negative errno; a missing file is -ESTALE.
 */
int ns_src_read_text(struct castfs_ns *ns, const char *path,
		     const struct stat *ident, size_t max, char **out,
		     size_t *len);

/* ---- packed sources (ns_pack_src.c) ---- */

/* ns_packed_name - true if @name ends in ".safetensors.zst" (a standard
 * pack) or ".safetensors.zstg" (a grouped one). */
bool ns_packed_name(const char *name);

/* ns_packed_ext_len - the length of @name's pack extension (".zst" 4,
 * ".zstg" 5), or 0 if it names no pack. */
size_t ns_packed_ext_len(const char *name);

/* ns_packed_find - the pack standing in for checkpoint @path (which ends
 * in ".safetensors"): "@path.zst", else "@path.zstg", malloc'ed into
 * *@packed with its identity in @st. Returns 0, -ENOENT or -ENOMEM. */
int ns_packed_find(struct castfs_ns *ns, const char *path, char **packed,
		   struct stat *st);

/*
 * ns_packed_shown - the name entry @name of directory @dfd is shown under:
 * "X.safetensors" (in @buf, @len bytes) for "X.safetensors.zst" when no
 * plain X.safetensors is beside it, else @name itself. Does not check
 * that the pack is usable.
 */
const char *ns_packed_shown(int dfd, const char *name, char *buf, size_t len);

/*
 * A small source text read and parsed once per identity of the file
 * (ns_mdtext.c, level 2: the checkpoint cache and the model-directory
 * kinds both keep texts in one): results kept by path and identity, at most 4096 files
 * (then the cache starts again). A parse error is kept like a result;
 * transient errors (ns_err_transient()) are not.
 */
struct ns_mdtext;

/* The parse of a text into @out (the cache's result size): 0 or -errno,
 * @out filled either way (a refusal's reason is a result too). */
typedef int (*ns_mdtext_parse_fn)(const char *text, size_t len, void *out);

/* ns_mdtext_new / ns_mdtext_free - an empty cache of results of @size
 * bytes made by @parse; free accepts NULL. new returns 0 or -ENOMEM. */
int ns_mdtext_new(size_t size, ns_mdtext_parse_fn parse,
		  struct ns_mdtext **out);
void ns_mdtext_free(struct ns_mdtext *c);

/* A result's reference to what it owns, taken (hold) for each copy
 * handed out and given back (release) when an entry is dropped. */
typedef void (*ns_mdtext_ref_fn)(void *result);

/* ns_mdtext_new_owned - ns_mdtext_new() of results that own memory
 * shared between the cache and the callers it hands copies to: each copy
 * is @hold'ed under the cache's lock (the caller releases it), each
 * dropped entry @release'd. @release must accept a zeroed result. */
int ns_mdtext_new_owned(size_t size, ns_mdtext_parse_fn parse,
			ns_mdtext_ref_fn hold, ns_mdtext_ref_fn release,
			struct ns_mdtext **out);

/*
 * ns_mdtext_get - the result for source file @path, parsed now or kept:
 * copied to @out (the cache's size; zeroed after a read error) with the
 * parse's return, or the error of the stat or read. Thread-safe.
 */
int ns_mdtext_get(struct castfs_ns *ns, struct ns_mdtext *c, const char *path,
		  void *out);

/* ns_mdtext_get_at - ns_mdtext_get() of @path as identity @st, which the
 * caller took: a file that is no longer @st is -ESTALE (not kept). */
int ns_mdtext_get_at(struct castfs_ns *ns, struct ns_mdtext *c,
		     const char *path, const struct stat *st, void *out);

/* ns_mdtext_forget - drop what @c holds for @path, whatever its identity
 * (a rewrite that kept size and mtime). Thread-safe. */
void ns_mdtext_forget(struct ns_mdtext *c, const char *path);

#endif
