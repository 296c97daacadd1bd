/* SPDX-License-Identifier: MIT */
/*
 * Views: named recipes that say what each tensor of a checkpoint becomes
 * (a plain cast, a bitsandbytes 4-bit or 8-bit layout, or left as it is),
 * and the plan of the converted file built from a source header.
 */
#ifndef CASTFS_VIEW_H
#define CASTFS_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "format/dtype.h"
#include "plan/plan.h"
#include "format/st_header.h"

enum castfs_view_kind {
	CASTFS_VIEW_CAST, /* floating tensors cast to one dtype */
	CASTFS_VIEW_BNB4, /* bitsandbytes nf4/fp4 Linear4bit layout */
	CASTFS_VIEW_INT8, /* bitsandbytes LLM.int8 Linear8bitLt layout */
	CASTFS_VIEW_CT_FP8, /* compressed-tensors float-quantized FP8 */
	CASTFS_VIEW_CT_W4, /* compressed-tensors pack-quantized int4 (W4A16) */
	CASTFS_VIEW_CT_NVFP4, /* compressed-tensors nvfp4-pack-quantized */
	CASTFS_VIEW_COMFY_FP8, /* ComfyUI scaled fp8 (comfy_quant), 1 file */
	CASTFS_VIEW_GGUF, /* a GGUF file (X.<q>.gguf), view_gguf.c */
};

/*
 * A rule: tensors matching every given condition are converted (@convert)
 * or kept as they are. The first matching rule of a view decides; tensors
 * no rule matches get the view kind's default (docs/FORMATS.md, "Rules").
 */
struct castfs_rule {
	char *pattern; /* fnmatch(3) glob on the tensor name; NULL: any */
	int min_rank; /* -1: any */
	int max_rank; /* -1: any */
	uint32_t dtype_mask; /* bit (1 << dtype); 0: any */
	bool convert;
};

#define CASTFS_VIEW_NAME_MAX 32

struct castfs_deqfuse; /* view/view_internal.h */

struct castfs_view {
	char name[CASTFS_VIEW_NAME_MAX];
	enum castfs_view_kind kind;
	enum castfs_dtype dtype; /* CAST: the target dtype */
	unsigned cvt_flags; /* CAST: CASTFS_CVT_* */
	uint8_t qtype; /* BNB4: CASTFS_Q_NF4 or CASTFS_Q_FP4 */
	bool nested; /* BNB4: double quantisation */
	uint32_t blocksize; /* BNB4: 64 by default */
	uint32_t ct_block; /* CT_FP8: 0 per channel, else N x N blocks */
	uint8_t gguf_type; /* GGUF: enum castfs_ggml_type of big tensors */
	size_t nrules;
	struct castfs_rule *rules;
	bool listed; /* shown by readdir (lookups resolve any view) */
	/* 0 where the view converts as the built-in of its name does; else
	 * castfs_view_fingerprint(), which node ids then hash (ns_node.c):
	 * a view redefined by a config and `castfs reload` gets new ids, so
	 * the kernel never mixes its cached pages of the old bytes with the
	 * new ones. */
	uint64_t id_salt;
	const char *summary; /* one line for --help and /.castfs/config */
	char *owned_summary; /* set when summary came from a config file */
	/* Set only on the copy of an nvfp4 view that builds a plan of a
	 * quantized source (view/view_deq.c): its fused groups are looked
	 * up in that source's bf16 view. NULL otherwise. */
	const struct castfs_deqfuse *deqfuse;
	/* Set only on the copy of an nvfp4 view that plans one shard of a
	 * sharded model (ns/ns_mdxshard.c): every shard's tensors, offsets
	 * in the composite source (view/qsrc_xshard.h), where the fused
	 * siblings of the shard's weights are found. NULL otherwise. */
	const struct castfs_header *fuse_h;
};

/*
 * castfs_view_converts - true if @v converts tensor @t (rules, then the
 * kind's default). Pure function.
 */
bool castfs_view_converts(const struct castfs_view *v,
			  const struct castfs_tensor *t);

/*
 * castfs_view_fingerprint - a hash of what shapes @v's bytes (kind, dtype,
 * flags, quantiser parameters, rules; not its name, listing or summary),
 * never 0. Stable across builds: node ids depend on it.
 */
uint64_t castfs_view_fingerprint(const struct castfs_view *v);

/* castfs_view_is_ct - true for the compressed-tensors views. */
bool castfs_view_is_ct(const struct castfs_view *v);

/* The group size of the W4A16 view: columns per int4 weight_scale. */
#define CASTFS_CT_W4_GROUP 128u

/* The group size of the nvfp4 view: columns per F8_E4M3 weight_scale. */
#define CASTFS_CT_NVFP4_GROUP 16u

/*
 * castfs_view_ct_converts - castfs_view_converts() for a tensor of header
 * @h, which also has its fused siblings: an nvfp4 weight is converted only
 * when every sibling of its fused group (q/k/v_proj, gate/up_proj,
 * q_a_proj/kv_a_proj_with_mqa, w1/w3) are in @h and the converted ones
 * share one dtype (its global scale needs them all: a shard's @h is the
 * header of every shard, struct castfs_view fuse_h, where its groups may
 * cross shards); a fp8_scaled weight only when its name ends in
 * ".weight". Pure function.
 */
bool castfs_view_ct_converts(const struct castfs_view *v,
			     const struct castfs_header *h,
			     const struct castfs_tensor *t);

/*
 * castfs_view_linear_weight - true if @t is a 2-D "*.weight" of a module
 * whose name is not one loaders build as an embedding (or lm_head): the
 * weights the quantised views convert by default. Pure function.
 */
bool castfs_view_linear_weight(const struct castfs_tensor *t);

/*
 * castfs_view_dequantizes - whether @v is offered for a quantized source
 * (one with FP8 block weights), computed from its dequantized weights.
 * Pure function.
 */
bool castfs_view_dequantizes(const struct castfs_view *v);

/*
 * castfs_view_plan - the plan of checkpoint @h seen through view @v.
 * @h must stay valid while the plan is built (not afterwards).
 * Returns 0, -EINVAL (the header cannot be laid out: diag says why),
 * -E2BIG, -EOVERFLOW or -ENOMEM. Thread-safe.
 */
int castfs_view_plan(const struct castfs_view *v, const struct castfs_header *h,
		     struct castfs_plan **out, struct castfs_diag *d);

struct castfs_qsrc_opts;

/*
 * castfs_view_plan_opts - castfs_view_plan() of a checkpoint whose
 * quantized layout is described by @o (view/qsrc.h: the FP8 block size
 * its directory's config.json gives; NULL: none). @o is read during the
 * call only. Same results, errors and thread-safety.
 */
int castfs_view_plan_opts(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_plan **out, struct castfs_diag *d);

/*
 * castfs_view_deqfuse_new - what the nvfp4 plans of every shard of a
 * quantized sharded model share: the bf16 view (plan and header) of
 * @v->fuse_h, every shard's tensors, in which each shard's build finds
 * its fused siblings and how to read them. Built once per folder and set
 * as the deqfuse of the view copies that plan the shards (with the same
 * fuse_h), it spares each shard a whole-model bf16 plan; the plans are
 * byte for byte those built without it. @v: an nvfp4 view with fuse_h;
 * @o as castfs_view_plan_opts(). On success *@out is the caller's (free
 * with castfs_view_deqfuse_free()), or NULL when fuse_h has no quantized
 * weight (its shards then need none). Borrows @v->fuse_h only during the
 * call. Returns 0, -EINVAL (not an nvfp4 view with fuse_h) or the
 * builder's error (then *@out is untouched). Thread-safe.
 */
int castfs_view_deqfuse_new(const struct castfs_view *v,
			    const struct castfs_qsrc_opts *o,
			    struct castfs_deqfuse **out, struct castfs_diag *d);

/* castfs_view_deqfuse_plan - the bf16 plan @f holds (to count the memory
 * it keeps); borrowed until castfs_view_deqfuse_free(). */
const struct castfs_plan *
castfs_view_deqfuse_plan(const struct castfs_deqfuse *f);

/* castfs_view_deqfuse_free - free what castfs_view_deqfuse_new() made;
 * NULL is accepted. */
void castfs_view_deqfuse_free(struct castfs_deqfuse *f);

/* The set of views a mount knows: built-ins plus those of a config file. */
struct castfs_views {
	size_t n;
	struct castfs_view *v;
};

/* castfs_views_builtin - fill @vs with the built-in views. 0 or -ENOMEM. */
int castfs_views_builtin(struct castfs_views *vs);

/*
 * castfs_views_load - add or override views from a JSON config (see
 * docs/CONFIG.md). Returns 0, -EINVAL with the reason in @d, or -ENOMEM;
 * on error @vs is unchanged.
 */
int castfs_views_load(struct castfs_views *vs, const char *json, size_t len,
		      struct castfs_diag *d);

/* castfs_view_name_valid - 1-31 characters of [a-z0-9_-]: no dots, so that
 * "X.<view>.safetensors" parses one way only. */
bool castfs_view_name_valid(const char *name, size_t len);

/* castfs_view_builtin - the built-in definition of view @name, whatever a
 * config made of it, or NULL. Static; thread-safe. */
const struct castfs_view *castfs_view_builtin(const char *name);

/* castfs_views_find - the view called @name (@len bytes), else the GGUF
 * view "@name.gguf" ("q8_0" finds "q8_0.gguf"), or NULL. */
const struct castfs_view *castfs_views_find(const struct castfs_views *vs,
					    const char *name, size_t len);

/*
 * castfs_views_select - list exactly the views named in comma-separated
 * @list (the mount option -o views=); every view still resolves on lookup.
 * Returns 0, or -EINVAL for an unknown name (then nothing changes).
 */
int castfs_views_select(struct castfs_views *vs, const char *list,
			struct castfs_diag *d);

/* castfs_views_json - a malloc'ed JSON array describing every view, or
 * NULL on -ENOMEM. */
char *castfs_views_json(const struct castfs_views *vs);

/* What /.castfs/config shows: the effective options of a mount. */
struct castfs_config_info {
	const char *source, *mountpoint, *config_file;
	const struct castfs_views *views;
	unsigned threads;
	double timeout;
	unsigned read_ahead_kb;
};

/* castfs_config_render - @info as malloc'ed JSON, or NULL on -ENOMEM. */
char *castfs_config_render(const struct castfs_config_info *info);

/* castfs_views_fini - release what castfs_views_builtin/load allocated. */
void castfs_views_fini(struct castfs_views *vs);

#endif
