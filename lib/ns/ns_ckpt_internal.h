/* SPDX-License-Identifier: MIT */
/*
 * Private to ns/, level 3 (ns_ckpt.c): the checkpoint cache, which owns
 * each parsed checkpoint and all its plans. What the levels above cache
 * per checkpoint lives in its slots and is freed by the function they
 * registered (castfs_ns.ckpt_fini), so the cache never names them.
 */
#ifndef CASTFS_NS_CKPT_INTERNAL_H
#define CASTFS_NS_CKPT_INTERNAL_H

#include "ns/ns_src_internal.h"

/* The checkpoint cache entry: one identity of one *.safetensors file. */
struct ns_ckpt {
	_Atomic uint64_t refs;
	struct ns_ckpt *hnext; /* under the cache lock */
	struct ns_ckpt *pnext; /* chain by path, under the cache lock */
	size_t nviews;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
	struct timespec ctime; /* a rewrite that put mtime back */
	char *path;
	struct castfs_header *h; /* NULL when rejected */
	bool quant; /* holds FP8 block weights (ns_ckpt_offers()) */
	/* A shard of a sharded FP8 block folder with FP8 weights or scales
	 * whose partner is in another shard: it has no single-file views;
	 * its DIR.<view>/ file is planned with its siblings (ns_mdxshard.c). */
	bool xshard;
	/* The FP8 weight_block_size of its directory's config.json (0, 0:
	 * none); its plans pair scales with it (ns_ckpt_qopts()). */
	uint32_t qbrows, qbcols;
	/* CASTFS_QSRC_W4SYM / W4ASYM from the same config.json, or 0: the
	 * composite header of an xshard shard is scanned with them too. */
	unsigned qw4flags;
	/* The layouts (CASTFS_QK_*) and compressed-tensors FP8 strategies
	 * that config.json declares, which the composite header of an
	 * xshard shard is checked against too (0: none declared). */
	unsigned qdeclared, qct_strategies;
	/* A packed source's seek table (decoded reads go through it), or
	 * NULL for a plain file; path is then the pack on disk. */
	struct castfs_zst_index *zix;
	int err;
	bool loading; /* being parsed; under the cache lock */
	bool in_table; /* holds the table's reference; under the cache lock */
	/* The kernel forgot the last node of its source while a reference
	 * (a release still on its way) held it: the put that leaves the
	 * table's alone evicts it (ns_ckpt_put_last()). Under the cache
	 * lock. */
	bool idle_wanted;
	/* In the LRU list (valid entries in the table), its neighbours and
	 * the bytes it is estimated to hold (counted in ns->ck_bytes while
	 * in the list); all under the cache lock. */
	bool in_lru;
	struct ns_ckpt *lru_prev, *lru_next;
	size_t bytes;
	size_t base_bytes; /* of those, its parsed header's */
	char reason[256];
	pthread_mutex_t lock; /* guards plans and trees */
	struct castfs_plan **plans; /* per view index, built on first need */
	int *plan_err; /* per view index: why its plan cannot be built */
	/* What the levels above keep per checkpoint (enum ns_ckpt_slot),
	 * under @lock; freed by castfs_ns.ckpt_fini[slot]. */
	void *slot[NS_CKPT_SLOTS];
	void (*const *fini)(struct ns_ckpt *ck); /* the mount's ckpt_fini */
};

/* ---- the checkpoint cache ---- */

/* ns_ckpt_get - the cache entry of source file @path with identity @st,
 * reading and validating its header on first need. A rejected file gives
 * an entry with h == NULL and err/reason set; so does a transient failure
 * (ESTALE, ENOMEM, EAGAIN, EINTR, EMFILE, ENFILE), which is not kept in
 * the cache. Concurrent first calls for one identity share one parse: the
 * others wait for it. Returns 0 or -ENOMEM. Thread-safe. */
int ns_ckpt_get(struct castfs_ns *ns, const char *path, const struct stat *st,
		struct ns_ckpt **out);

/* ns_ckpt_put - drop a reference; NULL is accepted. When the cache then
 * holds more than its budget, entries nothing uses (no reference, no node
 * the kernel holds) are evicted, least recently used first. One of the
 * last two references is dropped under the cache lock (an entry a forget
 * found in use is evicted then): must not be called with the cache lock
 * or any entry's own lock held. */
void ns_ckpt_put(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_charge - count @bytes more held by @ck (a tree or plan the
 * levels above built and keep in its slots) against the cache budget,
 * evicting unused entries if it is now exceeded. Call without @ck->lock
 * or the cache lock held. Thread-safe. */
void ns_ckpt_charge(struct castfs_ns *ns, struct ns_ckpt *ck, size_t bytes);

/* ns_ckpt_idle_path - the kernel holds no node of source path @path any
 * more: evict its valid entries that no open file or request uses, mark
 * those still in use for the put that leaves them unused, and give the
 * memory back to the system. Thread-safe. */
void ns_ckpt_idle_path(struct castfs_ns *ns, const char *path);

/* ns_ckpt_put_last - ns_ckpt_put() of one of the last two references to
 * @ck: under the cache lock, evicting it when a forget of its source
 * found it in use (idle_wanted) and no node shows the source again. */
void ns_ckpt_put_last(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_plan_cost - the bytes @p holds: its extents and its arena
 * (header text, names, kept bytes, quantiser records). */
size_t ns_ckpt_plan_cost(const struct castfs_plan *p);

/* ns_ckpt_plan - the plan of @ck through @view, built once and cached in
 * @ck. The plan lives as long as @ck. Returns 0 or the builder's error. */
int ns_ckpt_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		 const struct castfs_view *view, const struct castfs_plan **out,
		 struct castfs_diag *d);

/* ns_ckpt_view_fails - true if the plan of @ck through the view of index
 * @idx (ns_view_index()) is known not to build: such a view is not listed.
 * Never builds anything. Thread-safe. */
bool ns_ckpt_view_fails(struct ns_ckpt *ck, int idx);

/* ns_ckpt_valid - the checkpoint at @path if it is a valid safetensors
 * file (a held reference in *@out), else -ENOENT (missing or rejected) or
 * another errno. */
int ns_ckpt_valid(struct castfs_ns *ns, const char *path, struct stat *st,
		  struct ns_ckpt **out);

/* ns_ckpt_rejected - whether source file @path (or, when it is not there,
 * its pack) is a checkpoint castfs rejects: true with the reason in @why
 * (@len bytes). A file that is not there and a transient failure are
 * not. Thread-safe. */
bool ns_ckpt_rejected(struct castfs_ns *ns, const char *path, char *why,
		      size_t len);

/* ns_ckpt_loaded - the valid entry of identity @st if the cache has it
 * parsed (a held reference in *@out), else -ENOENT: never reads the
 * source, so a caller whose lookup just found @st needs no stat again.
 * Thread-safe. */
int ns_ckpt_loaded(struct castfs_ns *ns, const struct stat *st,
		   struct ns_ckpt **out);

/* ns_ckpt_rejected_json - a malloc'ed JSON array of the rejected source
 * files still present: [{"path":..., "error":..., "reason":...}]. */
char *ns_ckpt_rejected_json(struct castfs_ns *ns);

/* ns_ckpt_view_refusals - append to JSON array @arr one {"path", "views",
 * "reason"} per checkpoint in the cache and errno of its single-file views
 * whose plan could not be built (those names are not listed and answer
 * ENOENT: /.castfs/refused says why). A checkpoint the cache evicted shows
 * again once its views are next asked for. Returns 0 or -ENOMEM (@arr
 * then holds what was added). Thread-safe. */
struct cJSON;
int ns_ckpt_view_refusals(struct castfs_ns *ns, struct cJSON *arr);

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

struct castfs_qsrc_opts;

/* ns_ckpt_qopts - fill @o with what @ck's directory says about its
 * quantized layout (for castfs_view_plan_opts()); returns @o. */
const struct castfs_qsrc_opts *ns_ckpt_qopts(const struct ns_ckpt *ck,
					     struct castfs_qsrc_opts *o);

/* ns_ckpt_has_view - 0 when @path is a valid checkpoint (its identity to
 * @st) that offers @view (any view when NULL); -ENOENT when it is missing,
 * rejected or does not offer it; another errno on failure. Holds nothing. */
int ns_ckpt_has_view(struct castfs_ns *ns, const char *path,
		     const struct castfs_view *view, struct stat *st);

struct castfs_md_quant;

struct castfs_md_config;

/* ns_dir_config_init - the cache of parsed config.json files behind
 * ns_dir_config() and ns_ckpt_dir_quant() (ns_mdconfig.c; freed by
 * ns_ckpt_cache_fini()). Returns 0 or -ENOMEM. */
int ns_dir_config_init(struct castfs_ns *ns);

/*
 * ns_dir_config - the parsed config.json of source directory @dir, read
 * and parsed once per identity of the file. Returns 0 (the result in
 * *@out) or the error of the stat, read or parse. Thread-safe.
 */
int ns_dir_config(struct castfs_ns *ns, const char *dir,
		  struct castfs_md_config *out);

/* ns_ckpt_dir_quant - the quantization_config of the config.json in
 * source directory @dir, zeroed when there is none or it cannot be read;
 * from the same parse as ns_dir_config(). Returns 0, or a transient error
 * (-ESTALE while it is being written, -ENOMEM...). Thread-safe. */
int ns_ckpt_dir_quant(struct castfs_ns *ns, const char *dir,
		      struct castfs_md_quant *q);

/* ns_dir_config_forget - drop what is kept of @dir's config.json (the
 * watcher saw it change). Thread-safe. */
void ns_dir_config_forget(struct castfs_ns *ns, const char *dir);

/* ns_ckpt_packed_stat - the identity of the usable pack standing in for
 * the missing checkpoint @path; -ENOENT when there is none. */
int ns_ckpt_packed_stat(struct castfs_ns *ns, const char *path,
			struct stat *st);

/* ---- the budget (ns_ckpt_lru.c), all under ns->ck_lock where _locked ---- */

/* ns_ckpt_unref - drop a reference without looking at the budget: for
 * callers holding the cache lock. NULL is accepted. */
void ns_ckpt_unref(struct ns_ckpt *ck);

/* ns_ckpt_unlink_locked - take @ck out of the table (both chains and the
 * LRU list); the caller then drops the table's reference. */
void ns_ckpt_unlink_locked(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_free_plans - free @ck's first @nviews plans (NULL after) and
 * its slots' contents, which borrow them (the registered fini); the
 * caller owns @ck alone, or holds its lock with no other reference. */
void ns_ckpt_free_plans(struct ns_ckpt *ck, size_t nviews);

/* ns_ckpt_lru_add_locked - a valid entry just entered: most recently used,
 * holding @bytes. */
void ns_ckpt_lru_add_locked(struct castfs_ns *ns, struct ns_ckpt *ck,
			    size_t bytes);

/* ns_ckpt_lru_touch_locked - @ck was used: most recently used now. */
void ns_ckpt_lru_touch_locked(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_lru_del_locked - @ck leaves the LRU list (if in it), and its
 * bytes the count. */
void ns_ckpt_lru_del_locked(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_path_bucket - the bucket of ns->ckpaths that chains @path.
 * Caller holds ck_lock (the table may grow). */
size_t ns_ckpt_path_bucket(const struct castfs_ns *ns, const char *path);

/* ns_ckpt_cache_init - the checkpoint cache's empty table (freed by
 * ns_ckpt_cache_fini()). Returns 0 or -ENOMEM. */
int ns_ckpt_cache_init(struct castfs_ns *ns);

/* ns_ckpt_fails_restore_locked - fresh entry @ck (its identity set, not
 * parsed yet) takes back the view failures remembered when an entry of
 * the same identity was evicted. */
void ns_ckpt_fails_restore_locked(struct castfs_ns *ns, struct ns_ckpt *ck);

/* ns_ckpt_fails_fini - forget every remembered failure (at unmount, or
 * when a config.json changed). Caller holds the cache lock or is alone. */
void ns_ckpt_fails_fini(struct castfs_ns *ns);

/* ns_ckpt_header_cost - the bytes parsed header @h is estimated to hold. */
size_t ns_ckpt_header_cost(const struct castfs_header *h);

/* ns_ckpt_usage - the cache's valid entries (*@entries) and the bytes
 * they are estimated to hold (*@bytes). Thread-safe. */
void ns_ckpt_usage(struct castfs_ns *ns, size_t *entries, size_t *bytes);

/* ns_ckpt_over_budget - whether the cache holds more than its budget.
 * Lock-free; thread-safe. */
bool ns_ckpt_over_budget(const struct castfs_ns *ns);

/* ns_ckpt_trim - evict entries nothing uses (held by the table alone, no
 * node the kernel holds has their path), least recently used first,
 * until the cache is within its budget (looking at a bounded number); free them
 * outside the lock and give the memory back to the system. Call without
 * the cache lock. Thread-safe. */
void ns_ckpt_trim(struct castfs_ns *ns);

/* ns_ckpt_cache_fini - drop every cache entry (at unmount). */
void ns_ckpt_cache_fini(struct castfs_ns *ns);

#endif
