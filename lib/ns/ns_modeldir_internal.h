/* SPDX-License-Identifier: MIT */
/*
 * Private to the model-directory namespace code (ns_modeldir.c, the kinds
 * and hooks; ns_mdjson.c, the source scans and the rewritten JSON).
 */
#ifndef CASTFS_NS_MODELDIR_INTERNAL_H
#define CASTFS_NS_MODELDIR_INTERNAL_H

#include "modeldir/modeldir.h"
#include "ns/ns_kind_internal.h"

/* What an NS_MFILE is (its aux). */
enum md_file {
	MF_SHARD, /* a converted *.safetensors under its own name; its dep
		    * is the keep set of its model (ns_md_keep_of()) */
	MF_INDEX, /* a rewritten *.safetensors.index*.json in DIR.<view>/ */
	MF_CONFIG, /* config.json with the view's dtype / quantization_config */
	MF_VINDEX, /* X.safetensors.index.<view>.json next to the source */
};

/* The entries of one source directory that a model view cares about. */
struct ns_md_dir {
	bool config; /* a regular config.json */
	bool pipeline; /* a regular model_index.json */
	size_t nweights; /* regular *.safetensors, valid or not */
	char **weights;
	size_t nindex; /* regular *.safetensors.index*.json */
	char **indexes;
	uint64_t fp; /* fingerprint of the identities of the weights, the
		      * indexes and config.json */
};

/* md_dir_scan - read source directory @path into @s. Returns 0 or a
 * negative errno; ns_md_dir_fini() releases @s either way. */
int ns_md_dir_scan(struct castfs_ns *ns, const char *path, struct ns_md_dir *s);
void ns_md_dir_fini(struct ns_md_dir *s);

/*
 * ns_md_dir_indexes - the names in source directory @path that are
 * indexes (s->indexes, s->nindex; nothing else of @s is filled), for the
 * watcher: it asks once per changed entry, so the names of the last
 * directory asked about are kept while that directory keeps its identity
 * and @rescan is false (pass true when the changed entry is itself an
 * index name: only such a change alters the list). Names only, no stat:
 * a name too many costs an invalidation of nothing. Returns 0 or a
 * negative errno; ns_md_dir_fini() releases @s either way. Thread-safe.
 */
int ns_md_dir_indexes(struct castfs_ns *ns, const char *path, bool rescan,
		      struct ns_md_dir *s);

/* md_dir_weights - true when @s holds weights (an index or a
 * *.safetensors): its config.json is a model's. */
bool ns_md_dir_weights(const struct ns_md_dir *s);

/* md_is_model - whether source directory @path holds a model that gets
 * views: a pipeline (model_index.json), or a config.json without
 * quantization_config next to an index or a valid *.safetensors.
 * Returns 0 (answer in *@yes) or a negative errno: -ESTALE while its
 * config.json is being written (a lookup fails, not ENOENT). */
int ns_md_is_model(struct castfs_ns *ns, const char *path, bool *yes);

/* ns_md_casts_only - whether the model in source directory @path is an
 * FP8 block model (only views that castfs_view_dequantizes() accepts). */
bool ns_md_casts_only(struct castfs_ns *ns, const char *path);

/*
 * ns_md_quant_refusal - whether the transformers folder @path gets no
 * bitsandbytes views (compressed-tensors ones with @ct;
 * castfs_md_quantisable()): true with the reason in @why (@len bytes)
 * when @why is not NULL. A pipeline's root (model_index.json, no
 * config.json) is refused when one of its components is, with the
 * component named.
 */
bool ns_md_quant_refusal(struct castfs_ns *ns, const char *path, bool ct,
			 char *why, size_t len);

/* ns_md_view_refused - ns_md_quant_refusal() for the kind of view @v
 * (never for casts). */
bool ns_md_view_refused(struct castfs_ns *ns, const char *path,
			const struct castfs_view *v);

/* md_keep_of - the keep set (castfs_md_keep_id()) that view @v applies in
 * source directory @dir: that of the model_type of its config.json for
 * bitsandbytes views, else 0; or a transient error (-ESTALE: config.json
 * being written), never 0 for a config it could not read now. */
int ns_md_keep_of(struct castfs_ns *ns, const char *dir,
		  const struct castfs_view *v);

/* md_shard_plan - the plan of checkpoint @ck through @v with keep set
 * @keep (0: the plain view plan of the checkpoint cache), built once and
 * owned by @ck. Returns 0 or the builder's error. */
int ns_md_shard_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		     const struct castfs_view *v, int keep,
		     const struct castfs_plan **out);

/* What the nvfp4 file of every shard of a sharded model reads of the
 * whole model, built once per identity of the shards and kept in the
 * first shard's checkpoint entry (ns_mdxshard.c): every shard's tensors
 * (the fuse_h of struct castfs_view) and, of a quantized model, their
 * bf16 view (castfs_view_deqfuse_new()). It borrows nothing from the
 * other shards' entries, which may be freed while it is kept: @all owns
 * its names and shapes (castfs_qsrc_xshard_all()), and its metadata is
 * the first shard's, whose entry keeps it. */
struct ns_md_fuse {
	struct ns_md_fuse *next;
	uint64_t dep; /* every shard's identity (ns_gguf_shards_dep()) */
	struct castfs_header *all;
	struct castfs_deqfuse *deq; /* NULL: no quantized weight */
};

/* ns_md_plan_of - the plan of @h in view @v with keep set @keep, cached
 * in @ck (which owns it) under (@v, @keep, @dep): @h is @ck's header (dep
 * 0) or the composite header of @ck's shard (dep: the identities of every
 * shard, ns_gguf_shards_dep()). @h NULL: only a cached plan (-ENOENT if
 * none). @fuse (borrowed for the call, or NULL): the whole model, where
 * an nvfp4 view finds fused siblings. Returns 0 or the builder's error.
 * Takes @ck's lock. */
int ns_md_plan_of(struct castfs_ns *ns, struct ns_ckpt *ck,
		  const struct castfs_header *h, const struct ns_md_fuse *fuse,
		  uint64_t dep, const struct castfs_view *v, int keep,
		  const struct castfs_plan **out);

/* The shards a DIR.<view>/ file of an FP8 block shard whose scales cross
 * shards reads (ns_mdxshard.c): every shard of its folder's index, held,
 * and its own part number. */
struct ns_md_xshard {
	struct ns_gguf_shards s;
	size_t self;
	uint64_t dep; /* keep set and every shard's identity: a node's dep */
};

/*
 * ns_md_xshard_wants - whether the DIR.<view>/ file of checkpoint @ck in
 * view @v reads other shards of its folder: FP8 block scales there
 * (ck->xshard), or nvfp4, whose fused groups (gate/up, q/k/v) may be
 * cut by a shard boundary and take one global scale over the whole group
 * (of a quantized model: over the bf16 view of every shard). Pure
 * function.
 */
bool ns_md_xshard_wants(const struct ns_ckpt *ck, const struct castfs_view *v);

/* ns_md_xshard_plan - the plan of checkpoint @ck (ns_md_xshard_wants()) in view @v
 * with keep @keep over the composite source of its folder's shards
 * (part j: x->s.paths[j], identity x->s.st[j], held x->s.ck[j]), cached
 * in @ck under the identities of every shard. @x is filled on success
 * and on error (ns_md_xshard_fini() either way). Returns 0, -ESTALE (a
 * shard changed), -ENOENT (no index names @ck, a shard is rejected),
 * -ENOTSUP (the composite is refused) or the builder's error. */
int ns_md_xshard_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		      const struct castfs_view *v, int keep,
		      struct ns_md_xshard *x, const struct castfs_plan **out);

/* ns_md_xshard_dep - the dep of the DIR.<view>/ node of checkpoint @ck
 * (ck->xshard) with keep set @keep: the identities of every shard of its
 * folder's index mixed in, so that a changed shard is a new node, never
 * a mix of two versions. Returns 0 or the error of reading the index. */
int ns_md_xshard_dep(struct castfs_ns *ns, const struct ns_ckpt *ck, int keep,
		     uint64_t *dep);

/* ns_md_xshard_fini - drop what @x holds. */
void ns_md_xshard_fini(struct castfs_ns *ns, struct ns_md_xshard *x);

/* md_json_size - the size of rewritten JSON node @n (MF_INDEX,
 * MF_CONFIG, MF_VINDEX), built once per identity and cached. Returns 0,
 * -ESTALE (a source changed since the lookup) or the build's error. */
int ns_md_json_size(struct castfs_ns *ns, const struct ns_node *n,
		    uint64_t *size);

/* md_json_plan - a plan of the bytes ns_md_json_size() measured; the caller
 * owns *@out. Same errors. */
int ns_md_json_plan(struct castfs_ns *ns, const struct ns_node *n,
		    struct castfs_plan **out);

/* md_json_forget - drop cached JSON of sources in directory @dir, and its
 * parsed config.json. */
void ns_md_json_forget(struct castfs_ns *ns, const char *dir);

/*
 * ns_md_read - the whole of source file @path (at most 64 MiB), which
 * must be identity @ident if that is not NULL, malloc'ed and
 * NUL-terminated into *@out (length *@len; the caller frees). Returns 0,
 * -ESTALE (gone or another identity), -EFBIG (not a regular file, or too
 * big), -ENOMEM or the errno of open/read.
 */
int ns_md_read(struct castfs_ns *ns, const char *path, const struct stat *ident,
	       char **out, size_t *len);

/* ns_md_ixc_new - a cache of index checks (ns_mdindex.c). */
int ns_md_ixc_new(struct ns_mdtext **out);

/*
 * ns_md_ixc_check - whether source index @path would be rewritten
 * (castfs_md_index_check(), which gives *@longest if @longest is not
 * NULL), from cache @c. Returns 0, -EINVAL (refused, over the cap of JSON
 * values too; the reason copied to @why, @len bytes, if @why is not NULL)
 * or the error of the stat or read.
 * Thread-safe.
 */
int ns_md_ixc_check(struct castfs_ns *ns, struct ns_mdtext *c, const char *path,
		    size_t *longest, char *why, size_t len);

/* ns_md_index_forget - ns_mdtext_forget() of index @path in the mount's
 * caches (its check and its parsed shard names). */
void ns_md_index_forget(struct castfs_ns *ns, const char *path);

/*
 * ns_md_index_ok - ns_md_ixc_check() of index @path with the mount's
 * cache; a weights index that names a shard not there (nor packed), a
 * shard castfs rejects, or more shards than it reads is refused too
 * (-EINVAL, "shard X is missing", "shard X: <why>" in @why), checked at
 * each call since the shard may come back. Same returns, and the length
 * of the longest shard name into *@longest if @longest is not NULL.
 * Thread-safe.
 */
int ns_md_index_ok(struct castfs_ns *ns, const char *path, size_t *longest,
		   char *why, size_t len);

/*
 * ns_md_index_refusal - whether source directory @path would hold a model
 * with views (see ns_md_is_model()) but one of its weight files is
 * rejected or one of its indexes is refused: then true, with "<file
 * name>: <reason>" in @why (@len bytes), and the directory has no
 * DIR.<view>/. Thread-safe.
 */
bool ns_md_index_refusal(struct castfs_ns *ns, const char *path, char *why,
			 size_t len);

#endif
