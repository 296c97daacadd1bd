/* SPDX-License-Identifier: MIT */
/*
 * Private to ns/, level 5: the kinds of node (the mirrored tree and
 * single-file views in ns_tree.c, tensor trees, model-directory views, the
 * control directory) and what the facade (ns.c) needs of them.
 */
#ifndef CASTFS_NS_KIND_INTERNAL_H
#define CASTFS_NS_KIND_INTERNAL_H

#include "ns/ns_file_internal.h"

/*
 * What a kind does. lookup fills @child's kind, view, path, sub, aux and
 * st (strings malloc'ed; the core interns or frees them). Unset entries
 * mean the operation does not apply (ENOTDIR, EISDIR, ENODATA...).
 */
struct ns_kind_ops {
	int (*lookup)(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child);
	/* Optional: lookup of a name a listing of @dir showed as derived
	 * (castfs_dirent.derived), which skips the source's entries. */
	int (*lookup_derived)(struct castfs_ns *ns, const struct ns_node *dir,
			      const char *name, struct ns_node *child);
	int (*list)(struct castfs_ns *ns, const struct ns_node *dir,
		    struct ns_list *l);
	/* Optional: the listing for an open handle, when the kind keeps
	 * listings to share (else ns_list_dir() with list). */
	int (*opendir)(struct castfs_ns *ns, const struct ns_node *dir,
		       struct castfs_dir **out);
	int (*getattr)(struct castfs_ns *ns, const struct ns_node *n,
		       struct stat *st);
	/* Optional: getattr of a node its lookup made just now, whose st is
	 * the source's identity as the lookup found it (no stat again). */
	int (*getattr_new)(struct castfs_ns *ns, const struct ns_node *n,
			   struct stat *st);
	int (*open)(struct castfs_ns *ns, const struct ns_node *n,
		    struct castfs_file **out);
	ssize_t (*getxattr)(struct castfs_ns *ns, const struct ns_node *n,
			    const char *name, char *buf, size_t len);
	ssize_t (*listxattr)(struct castfs_ns *ns, const struct ns_node *n,
			     char *buf, size_t len);
};

extern const struct ns_kind_ops ns_kind_dir, ns_kind_file, ns_kind_link,
	ns_kind_view, ns_kind_ctl_dir, ns_kind_ctl_file, ns_kind_tdir,
	ns_kind_tfile, ns_kind_mdir, ns_kind_mfile, ns_kind_packed,
	ns_kind_mgguf;

/*
 * The names a source directory shows besides its own entries, one table
 * per kind that adds some (tensor trees, model-directory views): the
 * directory kind (ns_tree.c) asks each of castfs_ns.dir_exts, in order,
 * which the facade sets, so no kind names another.
 */
struct cJSON;

struct ns_dir_ext {
	/* Its names stand for source entries (a pack for the plain file it
	 * is shown as): looked up before views, as the listing shows them,
	 * so that a file wins over the view of its name. */
	bool before_views;
	/* @name of source dir @dir as one of this kind's names; -ENOENT if
	 * it is none. */
	int (*lookup)(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child);
	/* Add the names this kind derives from source entry @name (of type
	 * @type) of @dir; @st is its identity when it is a valid checkpoint
	 * (@ckpt true). */
	int (*list)(struct castfs_ns *ns, const struct ns_node *dir,
		    const char *name, mode_t type, bool ckpt,
		    const struct stat *st, struct ns_list *l);
	/* Optional: entry @i of @l, a source entry just listed, is shown
	 * under another name (renamed in place). Returns 0 or -ENOMEM. */
	int (*show)(struct castfs_ns *ns, const struct ns_node *dir,
		    struct ns_list *l, size_t i);
	/* Optional: append to JSON array @arr, as {"path", "views",
	 * "reason"} objects, why this kind shows none of the names it would
	 * derive from source directory @path (its views that fail, for
	 * /.castfs/refused). Returns 0 or -ENOMEM. */
	int (*refusals)(struct castfs_ns *ns, const char *path,
			struct cJSON *arr);
};

extern const struct ns_dir_ext ns_packed_dir_ext, ns_tensors_dir_ext,
	ns_modeldir_dir_ext, ns_mdgguf_dir_ext;

/* ---- /.castfs/refused (ns_ctl.c, ns_tree.c) ---- */

/* ns_refusal_add - add view @vname of source @path to JSON array @arr
 * with @reason: to its last object when that one is @path's with the
 * same reason, else as a new {"path", "views", "reason"} (@path escaped
 * here, @reason with castfs_escape_text()). Returns 0 or -ENOMEM, and
 * then @arr holds what it held. */
int ns_refusal_add(struct cJSON *arr, const char *path, const char *vname,
		   const char *reason);

/* ns_list_too_long - @name (@len bytes, past NAME_MAX) that view @vname
 * of entry @src of source directory @dir would have: not listed in @l,
 * and, when @l is a listing /.castfs/refused makes (l->too_long), said
 * there with its length. @reason, when not NULL, says why instead.
 * Returns 0 or -ENOMEM. */
int ns_list_too_long(struct ns_list *l, const char *dir, const char *src,
		     const char *vname, const char *name, size_t len,
		     const char *reason);

/* ns_list_derived - list @name (@len bytes), the name view @vname gives
 * entry @src of source directory @dir, as an entry of @type and node id
 * @id: past NAME_MAX through ns_list_too_long() instead, and not at all
 * when a source entry of that name is listed (it wins). Every listing of
 * derived names goes through here, so the NAME_MAX rule is in one place.
 * Returns 0 or -ENOMEM. */
int ns_list_derived(struct ns_list *l, const char *dir, const char *src,
		    const char *vname, const char *name, size_t len,
		    mode_t type, uint64_t id);

/* ns_tree_too_long - list source directory @path as a listing would,
 * into nothing, adding to JSON array @arr the names it leaves out for
 * NAME_MAX (ns_list_too_long()). Keeps no listing and no snapshot.
 * Returns 0, -ENOMEM, or the error opening @path. */
int ns_tree_too_long(struct castfs_ns *ns, const char *path, struct cJSON *arr);

/* ---- what the facade sets up ---- */

/* ns_tensors_init - register what the tensor trees keep per checkpoint. */
void ns_tensors_init(struct castfs_ns *ns);

/* ns_mdgguf_init - register what DIR.<q>.gguf keeps per checkpoint
 * (ns_mdgguf.c). */
void ns_mdgguf_init(struct castfs_ns *ns);

/* ---- the shards of DIR.<q>.gguf (ns_mdgguf_shards.c) ---- */

struct ns_shard_names; /* an index's parsed shard names, shared */

/* What a sharded folder's GGUF file reads: its shards' names (sorted,
 * borrowed from the mount's cache of parsed indexes), paths and
 * identities, their checkpoint entries (NULL until
 * ns_gguf_shards_hold()), and the index text (NULL until
 * ns_gguf_shards_text()). */
struct ns_gguf_shards {
	char *index;
	size_t index_len;
	char *const *names;
	size_t n;
	char **paths;
	struct stat *st;
	struct ns_ckpt **ck;
	struct ns_shard_names *sn; /* the reference that keeps names */
	char *index_path;
	struct stat ist;
};

/* ns_gguf_shards_init / ns_gguf_shards_cache_fini - the mount's cache of
 * parsed indexes (ns->shard_ix): each model.safetensors.index.json is
 * read and parsed once per identity, not per lookup. init returns 0 or
 * -ENOMEM; fini accepts an ns without one. */
int ns_gguf_shards_init(struct castfs_ns *ns);
void ns_gguf_shards_cache_fini(struct castfs_ns *ns);

/* ns_gguf_shards_forget - drop what the cache holds for index @path
 * (a rewrite that kept its size and mtime). Thread-safe. */
void ns_gguf_shards_forget(struct castfs_ns *ns, const char *path);

/* ns_gguf_shards_read - the shards index @index (identity @ist, else
 * -ESTALE) of @folder names, parsed once per identity, into @s with the
 * identity of every one. Returns 0, -EINVAL or -ENOENT with the reason in
 * @d (an index castfs does not read, a missing shard), or another errno;
 * on error @s holds nothing. Thread-safe. */
int ns_gguf_shards_read(struct castfs_ns *ns, const char *folder,
			const char *index, const struct stat *ist,
			struct ns_gguf_shards *s, struct castfs_diag *d);

/* ns_gguf_shards_text - read the index text of @s into s->index (a
 * plan's builder needs it whole) if it is still the identity
 * ns_gguf_shards_read() saw: 0, -ESTALE or the read's error. */
int ns_gguf_shards_text(struct castfs_ns *ns, struct ns_gguf_shards *s);

/* ns_gguf_shards_dep - @dep (the text files') mixed with the names and
 * identities of the shards of @s: a node's dep. Never 0. */
uint64_t ns_gguf_shards_dep(const struct ns_gguf_shards *s, uint64_t dep);

/* ns_gguf_shards_hold - the checkpoint entry of every shard of @s into
 * s->ck (references held until ns_gguf_shards_fini()). -ESTALE when one
 * is no longer the identity in s->st; -ENOENT when one is rejected. */
int ns_gguf_shards_hold(struct castfs_ns *ns, struct ns_gguf_shards *s);

/* ns_gguf_shards_fini - drop what @s holds; @s is then empty. */
void ns_gguf_shards_fini(struct castfs_ns *ns, struct ns_gguf_shards *s);

/* ns_md_plans_init - register what model-directory views keep per
 * checkpoint (ns_mdplan.c). */
void ns_md_plans_init(struct castfs_ns *ns);

/* ns_md_xshard_init - register what the nvfp4 files of sharded models
 * keep per folder in their first shard's checkpoint (ns_mdxshard.c). */
void ns_md_xshard_init(struct castfs_ns *ns);

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

/* ---- control files made once per state (ns_ctlshare.c) ---- */

/* What a control file's text was made from: the source directories its
 * walk read, with their times, and the generations of the source tree's
 * reported changes and of the checkpoint cache's verdicts it saw. */
struct ns_ctlstamp {
	struct ns_ctldir *dirs;
	size_t n, cap;
	bool broken; /* a directory not recorded: never current */
	uint64_t src_gen, ck_gen;
};

/* ns_ctlstamp_dir - the walk read source directory @path of stat @st. */
void ns_ctlstamp_dir(struct ns_ctlstamp *s, const char *path,
		     const struct stat *st);

/* ns_ctlstamp_cache - call right before reading the checkpoint cache's
 * verdicts (rejections, refused views) into the text. */
void ns_ctlstamp_cache(struct castfs_ns *ns, struct ns_ctlstamp *s);

/* Makes a control file's text (malloc'ed; NULL: no memory), recording in
 * @s what it read. */
typedef char *(*ns_ctl_make_fn)(struct castfs_ns *ns, struct ns_ctlstamp *s);

/* Control files that may be shared (ns_ctl.c's expensive ones). */
#define NS_CTLSHARE_SLOTS 2

/* ns_ctlshares_init / _fini - the kept texts; fini after every handle is
 * closed. init returns 0 or -ENOMEM. */
int ns_ctlshares_init(struct castfs_ns *ns);
void ns_ctlshares_fini(struct castfs_ns *ns);

/*
 * ns_ctlshare_open - a handle of the control file of @slot (below
 * NS_CTLSHARE_SLOTS, or -1 for one made per open, like the live
 * counters): the text kept since what it was made from last changed,
 * else @make's, kept for the next opens. Concurrent opens of one slot
 * wait for one @make. Returns 0, -ENOMEM or ns_file_new_shared()'s
 * errors. Thread-safe.
 */
int ns_ctlshare_open(struct castfs_ns *ns, int slot, ns_ctl_make_fn make,
		     struct castfs_file **out);

/* ---- the facade (ns.c, ns_resolve.c) ---- */

/* How ns_lookup_how() looks up. */
enum {
	/* Search the tree for an unknown @parent (not the search itself, so
	 * that it never recurses). */
	NS_LOOKUP_RESOLVE = 1,
	/* The name is one castfs derives (castfs_ns_lookup_listed()). */
	NS_LOOKUP_DERIVED = 2,
	/* Only what the lookup parses and builds: no node, no name answered
	 * (castfs_ns_lookup_ahead()). */
	NS_LOOKUP_AHEAD = 4,
};

/* ns_lookup_how, ns_opendir_how - castfs_ns_lookup() and
 * castfs_ns_opendir(), which search the tree for an unknown id only when
 * @how has NS_LOOKUP_RESOLVE (@resolve). */
int ns_lookup_how(struct castfs_ns *ns, uint64_t parent, const char *name,
		  uint64_t *id, struct stat *st, unsigned how);
int ns_opendir_how(struct castfs_ns *ns, uint64_t id, struct castfs_dir **out,
		   bool resolve);

/*
 * ns_resolve - make node @id known again by searching the tree for the
 * object whose id it is (breadth first, through listings, whose inode
 * numbers are the ids lookups give; bounded). For file handles of nodes
 * forgotten and freed, or made by an earlier daemon. Returns 0 (the node
 * is in the table, forgotten), -ESTALE (not found) or another errno.
 */
int ns_resolve(struct castfs_ns *ns, uint64_t id);

#endif
