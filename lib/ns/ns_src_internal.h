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
 * leaving the root, a directory) the link's own, and then only the read
 * (and search) the link's path allows (ns_src_link_hide()).
 */
int ns_src_open_in(struct castfs_ns *ns, const char *path, int flags);
int ns_src_stat_in(struct castfs_ns *ns, const char *path, struct stat *st);

/*
 * ns_src_link_hide - cut from @st, the stat of the regular file that link
 * @path reaches, the classes (0700, 0070, 0007) in which some user may be
 * unable to search a directory the link leads through below those of its
 * own path (castfs reads the target; the kernel, which checks the link's
 * own path, never walks the rest). A walk that fails cuts all. The bits
 * cut are kept in st_rdev, 0 in a regular file's stat otherwise: every
 * node derived from @st carries them, and they are part of its id
 * (ns_node_id()), so the view of a target reached through such a link is
 * not the inode of the view of the target reached directly.
 */
void ns_src_link_hide(struct castfs_ns *ns, const char *path, struct stat *st);

/*
 * ns_src_dir_hide - cut from @st, the stat of a file a node shows from
 * inside directory @dir where the node itself lies outside it (the kernel
 * never searches @dir on the way: a model folder's DIR.<q>.gguf beside
 * it), the classes in which some user may be unable to search @dir, as
 * ns_src_link_hide() does, adding them to st_rdev.
 */
void ns_src_dir_hide(struct stat *st, const struct stat *dir);

/* ns_src_stat - lstat-like stat of @path. Returns 0 or -errno. */
int ns_src_stat(struct castfs_ns *ns, const char *path, struct stat *st);

/* ---- watching sources for writers (ns_src.c) ---- */

/* ns_guard_watch - start watching @fd. 0: watched; -EAGAIN: a writer has
 * the file open; 1: cannot watch (no guard or unsupported). */
int ns_guard_watch(struct castfs_ns *ns, int fd);

/* ns_guard_unwatch - undo ns_guard_watch() when it returned 0. */
void ns_guard_unwatch(struct castfs_ns *ns, int fd);

/*
 * ns_guard_read_begin - bracket a one-off read of source @fd (a header, a
 * text) with the guard: -EAGAIN if a writer has it open now, -ESTALE if
 * one came as watching began; 0: watched; 1: cannot be watched (the caller
 * compares the identity again after the read). ns_guard_read_end() takes
 * what it returned (0 or 1): false if a writer came during the read, whose
 * result must be dropped.
 */
int ns_guard_read_begin(struct castfs_ns *ns, int fd);
bool ns_guard_read_end(struct castfs_ns *ns, int fd, int begun);

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

/* The pack extensions, standard first: they win when both exist. */
#define NS_PACK_EXTS 2u

/* ns_packed_path - "@path" + pack extension @i (< NS_PACK_EXTS),
 * malloc'ed into *@out, for a @path ending in ".safetensors". Returns 0,
 * -ENOENT (another name, or @i past the last) or -ENOMEM. */
int ns_packed_path(const char *path, size_t i, char **out);

/* ns_packed_find - the pack standing in for checkpoint @path (which ends
 * in ".safetensors"): "@path.zst", else "@path.zstg", malloc'ed into
 * *@packed with its identity in @st. Returns 0, -ENOENT or -ENOMEM. */
int ns_packed_find(struct castfs_ns *ns, const char *path, char **packed,
		   struct stat *st);

/*
 * ns_packed_shown - the name entry @name of directory @dfd is shown under:
 * "X.safetensors" (in @buf, @len bytes) for the pack that stands in for
 * it (ns_packed_stands_in()), else @name itself. Does not check that the
 * pack is usable.
 */
const char *ns_packed_shown(int dfd, const char *name, char *buf, size_t len);

/*
 * ns_packed_stands_in - whether entry @name of directory @dfd is the pack
 * a lookup of "X.safetensors" opens (ns_packed_find's rule: no plain
 * X.safetensors beside it, and for "X.safetensors.zstg" no
 * "X.safetensors.zst"); then "X.safetensors" is in @buf (@len bytes).
 * Does not check that the pack is usable.
 */
bool ns_packed_stands_in(int dfd, const char *name, char *buf, size_t len);

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

/* ---- directory snapshots, for the rescan after lost events
 * (ns_snap.c) ---- */

/* Entries kept in all snapshots together (16 bytes each: 16 MiB). A
 * listing that would pass it keeps no snapshot; its directory is then
 * rescanned whole. */
#define NS_SNAP_MAX_ENTRIES (1u << 20)

struct ns_snap;

/* ns_snaps_init / ns_snaps_fini - the mount's snapshot table. init
 * returns 0 or -ENOMEM; without it no snapshot is kept. */
int ns_snaps_init(struct castfs_ns *ns);
void ns_snaps_fini(struct castfs_ns *ns);

/* ns_snap_now - CLOCK_MONOTONIC in nanoseconds (snapshot stamps). */
int64_t ns_snap_now(void);

/*
 * ns_snap_begin - start the snapshot of source directory @dir (stamped
 * now: call it before the directory is read). Returns NULL without
 * memory or table (nothing is kept then). ns_snap_add() adds entry
 * @name of directory @dfd (@st as fstatat gave it; a failure marks the
 * snapshot not to be kept), and for a pack that stands in for
 * X.safetensors also X.safetensors with the pack's identity;
 * ns_snap_commit() puts it in place of @dir's snapshot and takes
 * ownership; ns_snap_abort() drops it. NULL is accepted by all three.
 * One thread builds one snapshot; commit is thread-safe.
 */
struct ns_snap *ns_snap_begin(struct castfs_ns *ns, const char *dir);
void ns_snap_add(struct ns_snap *s, int dfd, const char *name,
		 const struct stat *st);
void ns_snap_commit(struct castfs_ns *ns, struct ns_snap *s);
void ns_snap_abort(struct ns_snap *s);

/* ns_snap_has - whether @dir's snapshot holds @name (false when the
 * directory has none, or another name shares @name's hash). Thread-safe. */
bool ns_snap_has(struct castfs_ns *ns, const char *dir, const char *name);

/*
 * ns_snap_rescan - read source directory @dir again (readdir and one
 * fstatat per entry), make that its snapshot, and report through
 * @changed each entry name that its previous snapshot lacks or holds
 * with another identity; with no previous snapshot, or one stamped at
 * or after @since (CLOCK_MONOTONIC ns: when events may have begun to be
 * lost), every entry. When the set of names changed, the directory's
 * listing is reported changed (ns_listing_changed()). Counts in stats.
 * Returns 0 (compared), 1 (every entry reported), or -errno when @dir
 * cannot be read (nothing reported). @changed is called with no lock
 * held. Thread-safe.
 */
int ns_snap_rescan(struct castfs_ns *ns, const char *dir, int64_t since,
		   void (*changed)(void *ctx, const char *name), void *ctx);

#endif
