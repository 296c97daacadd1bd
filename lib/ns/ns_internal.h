/* SPDX-License-Identifier: MIT */
/*
 * Private to lib/: namespace nodes, the per-kind operation table, the
 * checkpoint cache and source access helpers.
 */
#ifndef CASTFS_NS_INTERNAL_H
#define CASTFS_NS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "ns/ns.h"
#include "format/st_header.h"
#include "ns/stats.h"

enum ns_kind {
	NS_DIR, /* a source directory (the root too) */
	NS_FILE, /* a source file, passed through */
	NS_LINK, /* a source symlink, shown as a link, never followed */
	NS_VIEW, /* X.<view>.safetensors */
	NS_CTL_DIR, /* /.castfs */
	NS_CTL_FILE, /* /.castfs/<file>; aux = which */
	NS_TDIR, /* a directory of a tensor tree; sub = its path */
	NS_TFILE, /* a file of a tensor tree; sub = its path */
	NS_MDIR, /* DIR.<view>/ and its sub-directories */
	NS_MFILE, /* a file inside a model-directory view */
	NS_KIND_COUNT,
};

/*
 * A node. Immutable once interned except nlookup (under the table lock):
 * a node describes one identity of one object, so when a source file
 * changes a lookup makes a new node and the old one goes stale.
 */
struct ns_node {
	uint64_t id;
	uint64_t parent; /* the directory it was looked up in */
	uint64_t nlookup;
	struct ns_node *hnext;
	uint8_t kind; /* enum ns_kind */
	uint32_t aux; /* kind-specific */
	const struct castfs_view *view; /* views, tensor trees of views, MDIR */
	char *path; /* source-relative path of the underlying object ("" root) */
	char *sub; /* kind-specific sub-path, or NULL */
	struct stat st; /* the underlying source object at lookup */
	/* A fingerprint of the other sources the content depends on (the
	 * shards behind a rewritten index.json), or 0. Part of the id. */
	uint64_t dep;
};

/* A listing under construction. */
struct ns_list {
	struct castfs_dir *dir;
	size_t cap;
};

/* ns_list_add - append an entry (name copied). Returns 0 or -ENOMEM. */
int ns_list_add(struct ns_list *l, const char *name, size_t len, mode_t type,
		uint64_t ino);

/* ns_list_has - true if @name is already listed (real entries win). */
bool ns_list_has(const struct ns_list *l, const char *name, size_t len);

/*
 * What a kind does. lookup fills @child's kind, view, path, sub, aux and
 * st (strings malloc'ed; the core interns or frees them). Unset entries
 * mean the operation does not apply (ENOTDIR, EISDIR, ENODATA...).
 */
struct ns_kind_ops {
	int (*lookup)(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child);
	int (*list)(struct castfs_ns *ns, const struct ns_node *dir,
		    struct ns_list *l);
	int (*getattr)(struct castfs_ns *ns, const struct ns_node *n,
		       struct stat *st);
	int (*open)(struct castfs_ns *ns, const struct ns_node *n,
		    struct castfs_file **out);
	ssize_t (*getxattr)(struct castfs_ns *ns, const struct ns_node *n,
			    const char *name, char *buf, size_t len);
	ssize_t (*listxattr)(struct castfs_ns *ns, const struct ns_node *n,
			     char *buf, size_t len);
};

extern const struct ns_kind_ops ns_dir_ops, ns_file_ops, ns_link_ops,
	ns_view_ops, ns_ctl_dir_ops, ns_ctl_file_ops, ns_tdir_ops, ns_tfile_ops,
	ns_mdir_ops, ns_mfile_ops;

struct ns_tree; /* a tensor tree (ns_tensors.c) */

/* The checkpoint cache entry: one identity of one *.safetensors file. */
struct ns_ckpt {
	_Atomic uint64_t refs;
	struct ns_ckpt *hnext; /* under the cache lock */
	size_t nviews;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
	char *path;
	struct castfs_header *h; /* NULL when rejected */
	bool quant; /* holds FP8 block weights (ns_ckpt_offers()) */
	int err;
	char reason[256];
	pthread_mutex_t lock; /* guards plans and trees */
	struct castfs_plan **plans; /* per view index, built on first need */
	/* Tensor trees: [0] the source's, [1 + view index] the views';
	 * allocated and built by ns_tensors.c on first need. */
	struct ns_tree **trees;
	/* Plans of views with a model's own rules (ns_mdplan.c). */
	struct ns_mdplan *mdplans;
};

#define NS_HASH_BUCKETS 4096u
/* Forgotten nodes kept for NFS handles before they are all freed. */
#define NS_FORGOTTEN_MAX 32768u

struct castfs_ns {
	int root_fd;
	char *source;
	const struct castfs_views *views;
	char *config_json;
	struct castfs_stats *stats;
	void (*log)(void *ctx, const char *msg);
	void *log_ctx;
	const struct castfs_source_guard *guard;
	pthread_mutex_t lock; /* the node table */
	struct ns_node *nodes[NS_HASH_BUCKETS];
	size_t nforgotten; /* nodes with nlookup 0 still in the table */
	pthread_mutex_t ck_lock; /* the checkpoint cache */
	struct ns_ckpt *ckpts[NS_HASH_BUCKETS];
	struct ns_mdcache *md; /* rewritten model-directory JSON */
};

/* ---- source access (ns_src.c): every path is relative to the root and
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

/* ns_path_join - "@dir/@name" (or @name for the root), malloc'ed; NULL on
 * -ENOMEM. */
char *ns_path_join(const char *dir, const char *name, size_t name_len);

/* ns_same_file - true if @a and @b are the same identity of one file. */
bool ns_same_file(const struct stat *a, const struct stat *b);

/* ns_view_stat - attributes of a computed file of @size derived from the
 * source object @src (owner, times; read-only, no exec bits). */
void ns_view_stat(const struct stat *src, uint64_t size, uint64_t ino,
		  struct stat *st);

/* ns_dir_stat - attributes of a virtual directory derived from @src. */
void ns_dir_stat(const struct stat *src, uint64_t ino, struct stat *st);

/* ns_split_view_name - "X.<view>.safetensors" -> base "X.safetensors"
 * (malloc'ed into *@base) and the view. Returns 0 or -ENOENT. */
int ns_split_view_name(struct castfs_ns *ns, const char *name, char **base,
		       const struct castfs_view **view);

/* ---- the checkpoint cache (ns_ckpt.c) ---- */

/* ns_ckpt_get - the cache entry of source file @path with identity @st,
 * reading and validating its header on first need. A rejected file gives
 * an entry with h == NULL and err/reason set. Returns 0 or -ENOMEM. */
int ns_ckpt_get(struct castfs_ns *ns, const char *path, const struct stat *st,
		struct ns_ckpt **out);

/* ns_ckpt_put - drop a reference; NULL is accepted. */
void ns_ckpt_put(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_plan - the plan of @ck through @view, built once and cached in
 * @ck. The plan lives as long as @ck. Returns 0 or the builder's error. */
int ns_ckpt_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		 const struct castfs_view *view, const struct castfs_plan **out,
		 struct castfs_diag *d);

/* ns_ckpt_valid - the checkpoint at @path if it is a valid safetensors
 * file (a held reference in *@out), else -ENOENT (missing or rejected) or
 * another errno. */
int ns_ckpt_valid(struct castfs_ns *ns, const char *path, struct stat *st,
		  struct ns_ckpt **out);

/* ns_ckpt_rejected_json - a malloc'ed JSON array of the rejected source
 * files still present: [{"path":..., "error":..., "reason":...}]. */
char *ns_ckpt_rejected_json(struct castfs_ns *ns);

/* ns_ckpt_drop_path - forget cache entries of @path (source changed). */
void ns_ckpt_drop_path(struct castfs_ns *ns, const char *path);

/* ns_ckpt_drop_dir - forget cache entries of the files directly in
 * directory @dir ("" for the root): their config.json changed, and with
 * it whether they are quantized. */
void ns_ckpt_drop_dir(struct castfs_ns *ns, const char *dir);

/* ns_ckpt_offers - whether valid checkpoint @ck has view @v: a quantized
 * source has the views castfs_view_dequantizes() accepts, computed from
 * its dequantized weights (docs/FORMATS.md, "Quantized sources"). */
bool ns_ckpt_offers(const struct ns_ckpt *ck, const struct castfs_view *v);

/* ---- tensor trees (ns_tensors.c) and model-directory views
 * (ns_modeldir.c): the hooks the source directories call. ---- */

/* ns_tensors_lookup - @name in source dir @dir as a tensor-tree root
 * ("X.safetensors.tensors", "X.<view>.safetensors.tensors"); -ENOENT if
 * it is none. */
int ns_tensors_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child);

/* ns_tensors_list - add the tensor-tree root of valid checkpoint @name
 * (identity @st). */
int ns_tensors_list(struct castfs_ns *ns, const struct ns_node *dir,
		    const char *name, const struct stat *st, struct ns_list *l);

/* ns_tensors_ckpt_fini - free the tensor trees cached in @ck. */
void ns_tensors_ckpt_fini(struct ns_ckpt *ck);

/* ns_modeldir_ckpt_fini - free the model-directory plans cached in @ck. */
void ns_modeldir_ckpt_fini(struct ns_ckpt *ck);

/* ns_modeldir_lookup - @name in source dir @dir as a model-directory view
 * "DIR.<view>"; -ENOENT if it is none. */
int ns_modeldir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child);

/* ns_modeldir_list - add the virtual siblings of entry @name (of type
 * @type) of @dir: the listed views of a sub-directory that holds a model,
 * the variant spellings of a "*.safetensors.index.json". */
int ns_modeldir_list(struct castfs_ns *ns, const struct ns_node *dir,
		     const char *name, mode_t type, struct ns_list *l);

/* ns_modeldir_init / ns_modeldir_fini - the model-directory JSON cache of
 * @ns. init returns 0 or -ENOMEM; fini accepts an ns without one. */
int ns_modeldir_init(struct castfs_ns *ns);
void ns_modeldir_fini(struct castfs_ns *ns);

/* ns_modeldir_invalidate - report the model-directory view entries that
 * depend on source path @rel (see castfs_ns_invalidate()). */
void ns_modeldir_invalidate(struct castfs_ns *ns, const char *rel,
			    void (*cb)(void *ctx, uint64_t parent,
				       const char *name),
			    void *ctx);

/* ---- watching sources for writers (ns_file.c) ---- */

/* ns_guard_watch - start watching @fd. 0: watched; -EAGAIN: a writer has
 * the file open; 1: cannot watch (no guard or unsupported). */
int ns_guard_watch(struct castfs_ns *ns, int fd);

/* ns_guard_unwatch - undo ns_guard_watch() when it returned 0. */
void ns_guard_unwatch(struct castfs_ns *ns, int fd);

/* ---- files (ns_file.c) ---- */

/* ns_file_new_plan - a file serving @plan, reading the source file
 * @path (identity @ident) when the plan needs it. Takes a reference on
 * @ck (may be NULL for plans of memory only) and ownership of @owned_plan
 * (freed at close; NULL when the plan is owned by @ck). */
int ns_file_new_plan(struct castfs_ns *ns, const char *path,
		     const struct stat *ident, struct ns_ckpt *ck,
		     const struct castfs_plan *plan,
		     struct castfs_plan *owned_plan, int view_idx,
		     struct castfs_file **out);

/* ns_file_new_layered - like ns_file_new_plan(), but the extents of
 * @owned_plan read the bytes of @base (a view of source @path, owned by
 * @ck) instead of the source: the tensor files of a view. Takes ownership
 * of @owned_plan. */
int ns_file_new_layered(struct castfs_ns *ns, const char *path,
			const struct stat *ident, struct ns_ckpt *ck,
			const struct castfs_plan *base,
			struct castfs_plan *owned_plan, int view_idx,
			struct castfs_file **out);

/* ns_file_new_source - a pass-through file of source @path (@ident). */
int ns_file_new_source(struct castfs_ns *ns, const char *path,
		       const struct stat *ident, struct castfs_file **out);

/* ns_file_new_mem - a file of @len bytes of @data (copied) generated for
 * this open: served with direct I/O (castfs_file_direct_io()). */
int ns_file_new_mem(struct castfs_ns *ns, const void *data, size_t len,
		    struct castfs_file **out);

/* ns_xattr_put - @n bytes of attribute value @val into @buf the
 * getxattr way: @len 0 asks for the size; -ERANGE when it does not fit. */
ssize_t ns_xattr_put(const void *val, size_t n, char *buf, size_t len);

/* ns_view_getxattr / ns_view_listxattr - user.castfs.view and
 * user.castfs.source of a node computed through a view. */
ssize_t ns_view_getxattr(struct castfs_ns *ns, const struct ns_node *n,
			 const char *name, char *buf, size_t len);
ssize_t ns_view_listxattr(struct castfs_ns *ns, const struct ns_node *n,
			  char *buf, size_t len);

/* ns_logf - report an event through the mount's log callback, if any. */
void ns_logf(struct castfs_ns *ns, const char *fmt, ...) CASTFS_PRINTF(2, 3);

/* ns_view_index - position of @v in the mount's view set (for stats). */
int ns_view_index(const struct castfs_ns *ns, const struct castfs_view *v);

/*
 * ns_resolve - make node @id known again by searching the tree for the
 * object whose id it is (breadth first, through listings, whose inode
 * numbers are the ids lookups give; bounded). For file handles of nodes
 * forgotten and freed, or made by an earlier daemon. Returns 0 (the node
 * is in the table, forgotten), -ESTALE (not found) or another errno.
 */
int ns_resolve(struct castfs_ns *ns, uint64_t id);

/* ns_node_id - the stable id of a node description. */
uint64_t ns_node_id(const struct ns_node *n);

#endif
