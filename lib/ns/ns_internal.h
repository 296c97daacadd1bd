/* SPDX-License-Identifier: MIT */
/*
 * Private to ns/, the bottom of the namespace (ns_node.c): the mount's
 * state, nodes and their stable ids, the node table, listings and the
 * helpers every kind shares. The levels above, each in its own header:
 * ns_src_internal.h (source access), ns_ckpt_internal.h (the checkpoint
 * cache), ns_file_internal.h (open files), ns_kind_internal.h (the kinds),
 * and ns.c on top (the facade). A level includes only those below it.
 */
#ifndef CASTFS_NS_INTERNAL_H
#define CASTFS_NS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "format/st_header.h"
#include "ns/ns.h"
#include "ns/stats.h"
#include "source/zst.h"

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
	NS_PACKED, /* X.safetensors shown for the pack X.safetensors.zst */
	NS_MGGUF, /* DIR.<q>.gguf of a causal-LM folder (ns_mdgguf.c) */
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
	/* This daemon answered an opendir of it (ns_node_listed_once()). */
	bool listed;
	uint32_t aux; /* kind-specific */
	const struct castfs_view *view; /* views, tensor trees of views, MDIR */
	char *path; /* source-relative path of the underlying object ("" root) */
	char *sub; /* kind-specific sub-path, or NULL */
	struct stat st; /* the underlying source object at lookup */
	/* A fingerprint of the other sources the content depends on (the
	 * shards behind a rewritten index.json), or 0. Part of the id. */
	uint64_t dep;
};

struct cJSON;

/*
 * A listing under construction, with a set of the names it holds so that
 * ns_list_has() costs the same for the 100,000th entry as for the first:
 * open addressing, slots hold entry index + 1 (0 is empty), at most half
 * full.
 */
struct ns_list {
	struct castfs_dir *dir;
	size_t cap;
	uint64_t *set; /* names by hash (ns_node.c) */
	size_t nset; /* slots, a power of two */
	/* Set only in the listings /.castfs/refused makes (ns_ctl.c): the
	 * derived names too long to list go there (ns_list_too_long()). */
	struct cJSON *too_long;
};

/* ns_list_add - append an entry (name copied). Returns 0 or -ENOMEM. */
int ns_list_add(struct ns_list *l, const char *name, size_t len, mode_t type,
		uint64_t ino);

/* ns_list_shorten - entry @i is shown as the first @len bytes of its
 * name (a pack as the file it stands for): lookups of the set find it
 * under that name, unless an entry of that name came first. */
void ns_list_shorten(struct ns_list *l, size_t i, size_t len);

/* ns_list_has - true if @name is already listed (real entries win).
 * Constant time on average. */
bool ns_list_has(const struct ns_list *l, const char *name, size_t len);

/* ns_list_fini - free the name set; the listing (l->dir) stays. */
void ns_list_fini(struct ns_list *l);

/*
 * ns_list_dir - the listing of directory node @n: "." and "..", then
 * what @list adds. *@out is the caller's (castfs_dir_free()). Returns 0,
 * -ENOMEM, or @list's error.
 */
int ns_list_dir(struct castfs_ns *ns, const struct ns_node *n,
		int (*list)(struct castfs_ns *ns, const struct ns_node *dir,
			    struct ns_list *l),
		struct castfs_dir **out);

struct ns_ckpt; /* ns_ckpt_internal.h */
struct ns_ckfail; /* ns_ckpt_lru.c */
struct ns_dir_ext; /* ns_kind_internal.h */

/* What a checkpoint entry keeps for the levels above it, one slot each,
 * freed by the function registered in castfs_ns.ckpt_fini. */
enum ns_ckpt_slot {
	NS_CKPT_TREES, /* tensor trees (ns_tensors.c) */
	NS_CKPT_MDPLANS, /* plans with a model's own rules (ns_mdplan.c) */
	NS_CKPT_GGUF, /* DIR.<q>.gguf plans and refusals (ns_mdgguf.c) */
	NS_CKPT_XFUSE, /* a sharded model's nvfp4 pre-plan (ns_mdxshard.c) */
	NS_CKPT_SLOTS,
};

#define NS_HASH_BUCKETS 4096u
/* Remembered failures of evicted checkpoint entries, at most. */
#define NS_CKFAIL_MAX 4096u
/* Slots counting the tensor-tree directories the kernel holds (by hash). */
#define NS_LIVE_SLOTS 65536u
/* Forgotten nodes kept for NFS handles before they are all freed. */
#define NS_FORGOTTEN_MAX 32768u
/* Bits of the set of (directory, name) pairs a lookup answered: 4 MiB,
 * two bits a name in one 64-bit word (a blocked Bloom filter), so that
 * with a million names held well under one name in 100 that was never
 * looked up still passes (one in nine with one bit in 1 MiB: 0.75
 * million notifications too many when 100,000 listed checkpoints are
 * touched). */
#define NS_SEEN_BITS (1u << 25)

/* A chain of the node table, and a bit per node of it, set by six bits
 * of its id's hash that the bucket's index does not use: a new id, which
 * every lookup of a name not looked up yet interns, is found missing
 * without a walk of nodes that are all cache misses. */
struct ns_bucket {
	struct ns_node *head;
	uint64_t tags;
};

struct castfs_ns {
	int root_fd;
	char *source;
	const struct castfs_views *views;
	char *config_json;
	struct castfs_stats *stats;
	void (*log)(void *ctx, const char *msg);
	void *log_ctx;
	/* castfs_ns_opts.listing_changed; ns_listing_changed(). */
	void (*listing_changed)(void *ctx, uint64_t dir);
	void *listing_ctx;
	const struct castfs_source_guard *guard;
	pthread_mutex_t lock; /* the node table */
	/* Buckets (a power of two, at least NS_HASH_BUCKETS), doubled when
	 * the table holds twice as many nodes: a lookup walks a short chain
	 * with a million nodes as with a hundred. */
	struct ns_bucket *nodes;
	size_t nbuckets;
	size_t nnodes;
	size_t nforgotten; /* nodes with nlookup 0 still in the table */
	/* Per source path, the nodes with nlookup > 0 that have it, exactly
	 * (ns_live.c; ns_node_path_live()). */
	struct ns_live *live;
	/* The same for tensor-tree directories (NS_TDIR) by the (dev, ino)
	 * of their checkpoint, and how many there are in all: the kernel
	 * may cache the listing of each (ns_node_tree_live()). */
	_Atomic uint32_t *tlive;
	_Atomic size_t ntlive;
	/* Their ids, per slot of @tlive (ns_dircache.c), so that a changed
	 * file's are found without walking the node table; NULL until the
	 * first. Once an id could not be kept (no memory) @tids_broken is
	 * set and the table is walked. Under @lock. */
	struct ns_tids *tids;
	bool tids_broken;
	/* Every (directory, name) a lookup was asked for (marked before
	 * it looks at the source: ns_lookup_how()), by hash, never
	 * cleared: a name not in it has no dentry in the kernel, so the
	 * watcher tells the kernel nothing about it (ns_name_seen()). NULL
	 * for a daemon that took over a connection: the kernel may hold
	 * names an earlier daemon answered. */
	_Atomic uint64_t *seen;
	pthread_mutex_t ck_lock; /* the checkpoint cache */
	/* Broadcast when an entry's parse ends: lookups of the same
	 * identity wait for the one parse instead of making their own. */
	pthread_cond_t ck_loaded;
	/* Buckets by identity (a power of two, at least NS_HASH_BUCKETS),
	 * doubled when the cache holds twice as many entries, like the node
	 * table's: 100,000 checkpoints listed are 100,000 entries. */
	struct ns_ckpt **ckpts;
	/* The same entries chained by path, so that the watcher drops a
	 * changed file's entries without walking the whole cache. */
	struct ns_ckpt **ckpaths;
	size_t ck_nbuckets; /* of each */
	size_t ck_count; /* entries in the table (in_table) */
	/* Valid entries in the table, most recently used first, and what
	 * they are estimated to hold; evicted past ck_budget once unused
	 * (ns_ckpt.c). Under ck_lock; ck_bytes also read without it. */
	struct ns_ckpt *ck_lru, *ck_lru_tail;
	_Atomic size_t ck_bytes;
	/* Bumped by every source change reported (ns_ctl_src_changed()) and
	 * every verdict the checkpoint cache learns (ns_ctl_ck_changed()):
	 * a kept control file made before a bump is made again. */
	_Atomic uint64_t ctl_src_gen, ctl_ck_gen;
	struct ns_ctlshares *ctlshares; /* kept control files */
	size_t ck_entries; /* in the list */
	/* Each directory's config.json, parsed once per identity
	 * (ns_mdconfig.c). */
	struct ns_mdtext *dir_config;
	/* Each model.safetensors.index.json's shard names, parsed once per
	 * identity (ns_mdgguf_shards.c). */
	struct ns_mdtext *shard_ix;
	/* DIR.<q>.gguf builds running at once, at most GGUF_BUILDS_MAX
	 * (ns_mdgguf.c): each parses a tokenizer.json with cJSON (~100 MB
	 * for Llama 3's), and `ls -l` of a folder's parent asks for every
	 * view at once on the workers, seven builds peaking at 668 MB. */
	pthread_mutex_t gguf_gate_lock;
	pthread_cond_t gguf_gate_free;
	unsigned gguf_builds;
	size_t ck_budget;
	/* No trim below this many bytes: the last pass found the cold end
	 * of the list held (ns_ckpt_lru.c, trim_backoff_locked); 0 when it
	 * did not. */
	_Atomic size_t ck_trim_floor;
	/* Views known not to build, of evicted entries (ns_ckpt_lru.c): so
	 * that an entry parsed again neither rebuilds nor lists them. Under
	 * ck_lock; at most NS_CKFAIL_MAX, then all dropped. */
	struct ns_ckfail *ckfails[NS_HASH_BUCKETS];
	size_t nckfails;
	struct ns_mdcache *md; /* rewritten model-directory JSON */
	struct castfs_zcache *zcache; /* decoded frames of packed sources */
	struct ns_dirshares *dirshares; /* kept listings (ns_dirshare.c) */
	/* Freed with each checkpoint entry: what each slot holds. */
	void (*ckpt_fini[NS_CKPT_SLOTS])(struct ns_ckpt *ck);
	/* The names a source directory shows besides its entries. */
	const struct ns_dir_ext *const *dir_exts;
	/* What each listed source directory held (ns_snap.c). */
	struct ns_snaps *snaps;
};

/* ---- node ids and the node table ---- */

/* ns_node_id - the stable id of a node description. */
uint64_t ns_node_id(const struct ns_node *n);

/*
 * ns_node_get - a copy of node @id (strings duplicated, release with
 * ns_node_put_copy()) that the caller can use without the table lock.
 * Returns 0, -ESTALE (not in the table) or -ENOMEM.
 */
int ns_node_get(struct castfs_ns *ns, uint64_t id, struct ns_node *out);

/* ns_node_listed_once - whether node @id was marked listed before; marks
 * it (false for an id not in the table). Thread-safe. */
bool ns_node_listed_once(struct castfs_ns *ns, uint64_t id);

/* ns_node_put_copy - free the strings of a copy; the struct stays. */
void ns_node_put_copy(struct ns_node *n);

/* ns_node_intern - intern @desc (taking its strings, freed on error) with
 * one more lookup; its id to *@id. Returns 0 or -ENOMEM. */
int ns_node_intern(struct castfs_ns *ns, struct ns_node *desc, uint64_t *id);

/* ns_node_ref - one more kernel reference to node @id; false if it is
 * not in the table. */
bool ns_node_ref(struct castfs_ns *ns, uint64_t id);

/* ns_node_forget - drop @nlookup kernel references to node @id; forgotten
 * nodes are kept (bounded) for file handles. Returns a malloc'ed copy of
 * the node's path when this forget left no node the kernel still holds
 * with that path (ns_node_path_live()), for the caller to let go of what
 * it caches for it; NULL otherwise (or on -ENOMEM). Thread-safe. */
char *ns_node_forget(struct castfs_ns *ns, uint64_t id, uint64_t nlookup);

/* ns_node_path_live - whether a node the kernel holds (nlookup > 0) has
 * source path the first @len bytes of @path, exactly (true for every path
 * only after an entry could not be allocated). Takes a leaf lock;
 * thread-safe. */
bool ns_node_path_live(const struct castfs_ns *ns, const char *path,
		       size_t len);

/* ns_live_new / ns_live_free - the exact set of held source paths with
 * their counts (ns_live.c): new returns NULL without memory; free accepts
 * NULL. ns_live_add - one more holder of @path (without memory the set
 * answers true for every path from then on). ns_live_sub - one fewer;
 * true when that was the last one. ns_live_has - whether the first @len
 * bytes of @path have a holder. All thread-safe (a leaf
 * lock). */
struct ns_live *ns_live_new(void);
void ns_live_free(struct ns_live *l);
void ns_live_add(struct ns_live *l, const char *path);
bool ns_live_sub(struct ns_live *l, const char *path);
bool ns_live_has(struct ns_live *l, const char *path, size_t len);

/* ns_node_tree_live - false when the kernel holds no tensor-tree
 * directory (NS_TDIR node) of the checkpoint of identity @st (its dev and
 * ino), so holds no cached listing of one; may say true for one it does
 * not hold (counts are kept per hash slot, NS_LIVE_SLOTS of them: a
 * false true costs one listing notification). Lock-free. */
bool ns_node_tree_live(const struct castfs_ns *ns, const struct stat *st);

/* ns_name_seen_init - start the set of answered names (empty). Returns 0
 * or -ENOMEM. Without it ns_name_seen() is always true. */
int ns_name_seen_init(struct castfs_ns *ns);

/* ns_name_seen_add - remember that a lookup of @name in @parent was
 * answered (before the reply reaches the kernel). Lock-free. */
void ns_name_seen_add(struct castfs_ns *ns, uint64_t parent, const char *name);

/* ns_name_seen - false only when no lookup of @name in @parent was ever
 * answered by this daemon (a hash collision says true: one notification
 * too many). Always true for a daemon that took over a connection.
 * Lock-free. */
bool ns_name_seen(const struct castfs_ns *ns, uint64_t parent,
		  const char *name);

/* ns_name_seen_hash / ns_name_seen_bits - ns_name_seen() in two steps:
 * the hash of (@parent, @name) into @b, with its word prefetched, then
 * the test. Hashing a batch before testing it overlaps the batch's cache
 * misses (the watcher tests ~77 names per changed checkpoint). Lock-free. */
void ns_name_seen_hash(const struct castfs_ns *ns, uint64_t parent,
		       const char *name, uint32_t b[2]);
bool ns_name_seen_bits(const struct castfs_ns *ns, const uint32_t b[2]);

/* ns_node_add_root - the root node, from ns->root_fd. Returns 0, -ENOMEM
 * or fstat's errno (explained in @d). */
int ns_node_add_root(struct castfs_ns *ns, struct castfs_diag *d);

/* A node's place: the directory it was looked up in and its source path. */
struct ns_place {
	uint64_t parent;
	char *path;
};

/* ns_node_held - whether node @id has a lookup not yet forgotten. */
bool ns_node_held(struct castfs_ns *ns, uint64_t id);

/* ns_node_count - how many nodes the table holds (*@n) and how many of
 * them the kernel forgot (*@forgotten). Thread-safe. */
void ns_node_count(struct castfs_ns *ns, size_t *n, size_t *forgotten);

/*
 * ns_node_places - snapshot of the (parent, source path) of every node
 * that is not inside a tensor tree (those go with their tree's root), for
 * a caller that must tell the kernel to forget names it may hold without
 * holding ns->lock meanwhile. @*out is malloc'd (free each path and the
 * array). Returns the count, or -ENOMEM. Thread-safe.
 */
ssize_t ns_node_places(struct castfs_ns *ns, struct ns_place **out);

/*
 * ns_err_transient - whether @err says nothing about the file itself
 * (ESTALE, ENOMEM, EAGAIN, EINTR, EMFILE, ENFILE: being written or changed
 * while read, out of memory or descriptors, a signal): such failures are
 * retried by the next lookup, never cached as the file's outcome.
 */
bool ns_err_transient(int err);

/*
 * ns_err_unlisted - the error a view's lookup, getattr and open answer
 * when its build failed with @err, for views listed only where they
 * build (every single-file view, GGUF files, DIR.<q>.gguf): a refusal
 * (-EINVAL, -ENOTSUP, -E2BIG, ...) is -ENOENT, like
 * any name a listing does not show (the reason is in the log and
 * /.castfs/); transient errors and -EIO (the source failed) are kept, and
 * 0 stays 0. Pure; thread-safe.
 */
int ns_err_unlisted(int err);

/* ns_ctl_src_changed - the source tree changed (the watcher's word, a
 * rescan): the kept control files are made again at their next open. */
static inline void ns_ctl_src_changed(struct castfs_ns *ns)
{
	atomic_fetch_add(&ns->ctl_src_gen, 1);
}

/* ns_ctl_ck_changed - the checkpoint cache learned a rejection or a view
 * that does not build: likewise. */
static inline void ns_ctl_ck_changed(struct castfs_ns *ns)
{
	atomic_fetch_add(&ns->ctl_ck_gen, 1);
}

/* ---- shared listings of source directories and model-directory views
 * (ns_dirshare.c) ---- */

/* ns_dirshares_init / _fini - the table of kept listings; fini after every
 * handle is closed. init returns 0 or -ENOMEM. */
int ns_dirshares_init(struct castfs_ns *ns);
void ns_dirshares_fini(struct castfs_ns *ns);

/*
 * ns_dirshare_open - the listing of directory @n for an open handle (as
 * ns_list_dir() with @list): the one kept since the directory last changed
 * (by the watcher's word, or the times of @st, the directory's stat taken
 * now) if any, else made and kept for the next opens until
 * ns_dirshare_drop() or the last handle's castfs_dir_free(). Made per open
 * where no listing_changed callback says when a listing goes stale.
 * Returns what ns_list_dir() returns. Thread-safe.
 */
int ns_dirshare_open(struct castfs_ns *ns, const struct ns_node *n,
		     const struct stat *st,
		     int (*list)(struct castfs_ns *ns,
				 const struct ns_node *dir, struct ns_list *l),
		     struct castfs_dir **out);

/* ns_dirshare_drop - directory @id (every directory if @all) may list
 * something else: its kept listing stays with the handles holding it and
 * is made again for the next open. Thread-safe. */
void ns_dirshare_drop(struct castfs_ns *ns, uint64_t id, bool all);

/* ns_dirshare_release - drop one owner of kept listing @dir; true if it
 * was the last (the caller frees the entries). Thread-safe. */
bool ns_dirshare_release(struct castfs_dir *dir);

/* ns_listing_changed - tell the daemon (castfs_ns_opts.listing_changed)
 * that directory @dir may list something else now. Call it with no
 * namespace lock held. */
static inline void ns_listing_changed(struct castfs_ns *ns, uint64_t dir)
{
	ns_ctl_src_changed(ns);
	ns_dirshare_drop(ns, dir, false);
	if (ns->listing_changed)
		ns->listing_changed(ns->listing_ctx, dir);
}

/* ns_listings_all_changed - ns_listing_changed() for every directory the
 * kernel may cache a listing of (ns_dircache.c): after lost events, when
 * what changed is not known. Takes the table lock; call without it. */
void ns_listings_all_changed(struct castfs_ns *ns);

/* ns_node_find_locked - the node of @id, or NULL. Caller holds ns->lock. */
struct ns_node *ns_node_find_locked(struct castfs_ns *ns, uint64_t id);

/* ns_node_tree_slot - the slot of ns->tlive of the checkpoint of @st. */
size_t ns_node_tree_slot(const struct castfs_ns *ns, const struct stat *st);

/* ns_tids_add / ns_tids_del - tree directory @id in slot @slot (of
 * ns->tlive) became held by the kernel / is no longer; ns_tids_fini -
 * free the index. Caller holds ns->lock (fini: no other thread). */
void ns_tids_add(struct castfs_ns *ns, size_t slot, uint64_t id);
void ns_tids_del(struct castfs_ns *ns, size_t slot, uint64_t id);
void ns_tids_fini(struct castfs_ns *ns);

/* ns_tree_listings_changed - ns_listing_changed() for every tensor-tree
 * directory the kernel holds of the checkpoint of identity @st (dev and
 * ino: every path it was reached by, hard links and HF-cache links too):
 * after the watcher saw the file change, which may keep its size and
 * mtime, hence the directories' ids. Costs nothing when the kernel holds
 * no tree of it (ns_node_tree_live()), else a look at the ids of its
 * slot (ns_tids_add()). Takes the table lock; call without it. */
void ns_tree_listings_changed(struct castfs_ns *ns, const struct stat *st);

/* ns_node_table_fini - free every node. */
void ns_node_table_fini(struct castfs_ns *ns);

/* ---- helpers every kind shares ---- */

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

/* ns_parent_path - the directory part of @path ("" for a top-level
 * name), malloc'ed; NULL on -ENOMEM. */
char *ns_parent_path(const char *path);

/* ns_split_gguf_name - "X.<q>.gguf" (@len bytes) as the GGUF view
 * "<q>.gguf" of the mount, with the length of X in *@base_len; NULL when
 * @name is no such name. */
const struct castfs_view *ns_split_gguf_name(struct castfs_ns *ns,
					     const char *name, size_t len,
					     size_t *base_len);

/* ns_has_st_ext - true if @name (@len bytes) ends in ".safetensors" with
 * a non-empty stem. */
bool ns_has_st_ext(const char *name, size_t len);

/* ns_xattr_put - @n bytes of attribute value @val into @buf the
 * getxattr way: @len 0 asks for the size; -ERANGE when it does not fit. */
ssize_t ns_xattr_put(const void *val, size_t n, char *buf, size_t len);

/* ns_view_getxattr / ns_view_listxattr - user.castfs.view and
 * user.castfs.source of a node computed through a view. */
ssize_t ns_view_getxattr(struct castfs_ns *ns, const struct ns_node *n,
			 const char *name, char *buf, size_t len);
ssize_t ns_view_listxattr(struct castfs_ns *ns, const struct ns_node *n,
			  char *buf, size_t len);

/*
 * ns_logf - report an event about source path @path through the mount's
 * log callback, if any, as "PATH: message". @path is escaped here
 * (castfs_escape(): reversibly); names the message quotes must be escaped
 * already (reasons quote them so: the parser's \xHH), the sink does not
 * escape them again.
 */
void ns_logf(struct castfs_ns *ns, const char *path, const char *fmt, ...)
	CASTFS_PRINTF(3, 4);

/* ns_view_index - position of @v in the mount's view set (for stats). */
int ns_view_index(const struct castfs_ns *ns, const struct castfs_view *v);

/* ns_node_id - the stable id of a node description. */
uint64_t ns_node_id(const struct ns_node *n);

#endif
