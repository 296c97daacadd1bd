/* SPDX-License-Identifier: MIT */
/*
 * Which tensors a view converts (rules, then the kind's default), and the
 * dispatch from a view to the builder of its plan.
 */
#include <errno.h>
#include <fnmatch.h>
#include <string.h>

#include "quant/quant_ct.h"
#include "view/view_internal.h"

/*
 * Module names (the path component before ".weight") of 2-D weights that
 * loaders build as embeddings, never as nn.Linear: quantising them would
 * give the loader a packed weight where it expects a full matrix. Linear
 * layers inside embedding blocks ("time_embedding.linear_1") are not in the
 * list on purpose. lm_head stays in full precision as bitsandbytes'
 * integrations keep it.
 */
static const char *const not_linear[] = {
	"embed_tokens",
	"embeddings",
	"word_embeddings",
	"position_embeddings",
	"token_type_embeddings",
	"wte",
	"wpe",
	"shared",
	"embed_positions",
	"relative_attention_bias",
	"position_embedding",
	"token_embedding",
	"embed_in",
	"embed_out",
	"embedding",
	"lm_head",
	"tok_embeddings",
};

static bool module_is_linear(const struct castfs_tensor *t)
{
	static const char suffix[] = ".weight";
	const size_t slen = sizeof(suffix) - 1;
	const char *mod_end, *mod;

	if (t->name_len <= slen ||
	    memcmp(t->name + t->name_len - slen, suffix, slen) != 0)
		return false;
	mod_end = t->name + t->name_len - slen;
	mod = mod_end;
	while (mod > t->name && mod[-1] != '.')
		mod--;
	for (size_t i = 0; i < sizeof(not_linear) / sizeof(not_linear[0]);
	     i++) {
		size_t n = strlen(not_linear[i]);

		if ((size_t)(mod_end - mod) == n &&
		    memcmp(mod, not_linear[i], n) == 0)
			return false;
	}
	return true;
}

bool castfs_view_is_ct(const struct castfs_view *v)
{
	return v->kind == CASTFS_VIEW_CT_FP8 || v->kind == CASTFS_VIEW_CT_W4 ||
	       v->kind == CASTFS_VIEW_CT_NVFP4;
}

bool castfs_view_linear_weight(const struct castfs_tensor *t)
{
	return t->ndim == 2 && module_is_linear(t);
}

static bool rule_matches(const struct castfs_rule *r,
			 const struct castfs_tensor *t)
{
	if (r->min_rank >= 0 && t->ndim < (uint32_t)r->min_rank)
		return false;
	if (r->max_rank >= 0 && t->ndim > (uint32_t)r->max_rank)
		return false;
	if (r->dtype_mask && !(r->dtype_mask & (1u << t->dtype)))
		return false;
	/* Names holding NUL cannot be matched by a glob: only "any" rules. */
	if (r->pattern && (strlen(t->name) != t->name_len ||
			   fnmatch(r->pattern, t->name, 0) != 0))
		return false;
	return true;
}

static bool default_converts(const struct castfs_view *v,
			     const struct castfs_tensor *t)
{
	switch (v->kind) {
	case CASTFS_VIEW_CAST:
	case CASTFS_VIEW_GGUF:
		return true;
	case CASTFS_VIEW_BNB4:
	case CASTFS_VIEW_INT8:
	case CASTFS_VIEW_COMFY_FP8:
		return t->ndim == 2 && module_is_linear(t);
	case CASTFS_VIEW_CT_FP8:
	case CASTFS_VIEW_CT_W4:
	case CASTFS_VIEW_CT_NVFP4:
		return t->ndim == 2 && module_is_linear(t) &&
		       castfs_view_ct_fits(v, t);
	}
	return false;
}

bool castfs_view_converts(const struct castfs_view *v,
			  const struct castfs_tensor *t)
{
	/* Only IEEE-like floats can be converted, whatever the rules say. */
	if (!castfs_dtype_is_castable(t->dtype))
		return false;
	if (v->kind != CASTFS_VIEW_CAST && (t->ndim != 2 || t->nelems == 0))
		return false; /* the bnb layouts are defined for matrices */
	if ((castfs_view_is_ct(v) || v->kind == CASTFS_VIEW_COMFY_FP8) &&
	    !castfs_ct_dtype_ok(t->dtype))
		return false; /* scales are kept in the weight's dtype */
	/* llm-compressor refuses groups cut by the row: so does castfs. */
	if (v->kind == CASTFS_VIEW_CT_W4 && t->shape[1] % CASTFS_CT_W4_GROUP)
		return false;
	if (v->kind == CASTFS_VIEW_CT_NVFP4 &&
	    t->shape[1] % CASTFS_CT_NVFP4_GROUP)
		return false;
	for (size_t i = 0; i < v->nrules; i++) {
		if (rule_matches(&v->rules[i], t))
			return v->rules[i].convert;
	}
	return default_converts(v, t);
}

/* A quantized source: every view is computed from dequantized values. */
static int plan_quantized(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc *q,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_plan **out, struct castfs_diag *d)
{
	if (!castfs_view_dequantizes(v))
		return castfs_diag_set(d, -ENOTSUP,
				       "view '%s' is not offered for a "
				       "quantized source",
				       v->name);
	return castfs_view_plan_deq(v, h, q, o, out, d);
}

bool castfs_view_qsrc_quantized(const struct castfs_qsrc *q)
{
	return q->nfp8 || q->nmxfp4 || q->nbnb4 || q->nctw4;
}

/*
 * nvfp4 of a shard with no quantized weight in a quantized model's
 * folder (one holding only norms and embeddings, or weights its source
 * left unquantized): its fused siblings in other shards are quantized,
 * so it is planned as a quantized source is, against the bf16 view of
 * every shard, like its siblings and the folder's config.json. Sets
 * *@yes; errors of castfs_qsrc_scan_opts().
 */
static int fuses_quantized(const struct castfs_view *v,
			   const struct castfs_qsrc_opts *o, bool *yes)
{
	struct castfs_qsrc qa;
	int rc;

	*yes = false;
	if (v->kind != CASTFS_VIEW_CT_NVFP4 || !v->fuse_h)
		return 0;
	/* A bf16 view of fuse_h given with it: fuse_h is quantized
	 * (castfs_view_deqfuse_new() makes none otherwise). */
	*yes = v->deqfuse != NULL;
	if (v->deqfuse)
		return 0;
	rc = castfs_qsrc_scan_opts(v->fuse_h, o, &qa, NULL);
	if (rc)
		return rc;
	*yes = castfs_view_qsrc_quantized(&qa);
	castfs_qsrc_fini(&qa);
	return 0;
}

bool castfs_view_dequantizes(const struct castfs_view *v)
{
	switch (v->kind) {
	case CASTFS_VIEW_CAST:
	case CASTFS_VIEW_BNB4:
	case CASTFS_VIEW_INT8:
		return true;
	case CASTFS_VIEW_CT_FP8:
	case CASTFS_VIEW_CT_W4:
		return true; /* from the BF16 values (view_ct.c) */
	case CASTFS_VIEW_COMFY_FP8:
		return true; /* its per-tensor scale: of the bf16 values */
	case CASTFS_VIEW_CT_NVFP4:
		return true; /* its global scale: the bf16 view's siblings */
	case CASTFS_VIEW_GGUF:
		return true; /* of the bf16 view (view_gguf_deq.c) */
	}
	return false;
}

int castfs_view_plan(const struct castfs_view *v, const struct castfs_header *h,
		     struct castfs_plan **out, struct castfs_diag *d)
{
	return castfs_view_plan_opts(v, h, NULL, out, d);
}

int castfs_view_plan_opts(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_plan **out, struct castfs_diag *d)
{
	struct castfs_qsrc_opts plan_o = o ? *o :
					     (struct castfs_qsrc_opts){ 0 };
	struct castfs_qsrc q;
	bool fq = false;
	int rc;

	/* The directory's layout was checked when the checkpoint loaded. */
	plan_o.flags = 0;
	rc = castfs_qsrc_scan_opts(h, &plan_o, &q, d);

	/* Never a silent mis-cast: quantized layouts are recognised first. */
	if (rc)
		return rc;
	if (!castfs_view_qsrc_quantized(&q) && !plan_o.declared)
		rc = fuses_quantized(v, &plan_o, &fq);
	if (rc) {
		castfs_qsrc_fini(&q);
		return rc;
	}
	/* A shard of a quantized model's folder that holds none of its
	 * quantized weights (transformers' sharder put only norms or the
	 * lm_head there) is planned as its siblings are: its other tensors
	 * kept as stored, where it was cast as a plain file (a bug hunt). */
	if ((castfs_view_qsrc_quantized(&q) || fq || plan_o.declared) &&
	    v->kind != CASTFS_VIEW_GGUF) {
		rc = plan_quantized(v, h, &q, &plan_o, out, d);
		castfs_qsrc_fini(&q);
		return rc;
	}
	castfs_qsrc_fini(&q);
	switch (v->kind) {
	case CASTFS_VIEW_CAST:
		return castfs_view_plan_cast(v, h, out, d);
	case CASTFS_VIEW_BNB4:
	case CASTFS_VIEW_INT8:
		return castfs_view_plan_bnb(v, h, out, d);
	case CASTFS_VIEW_CT_FP8:
	case CASTFS_VIEW_CT_W4:
	case CASTFS_VIEW_CT_NVFP4:
	case CASTFS_VIEW_COMFY_FP8:
		return castfs_view_plan_ct(v, h, out, d);
	case CASTFS_VIEW_GGUF: /* reads a quantized source's bf16 view */
		return castfs_view_plan_gguf(v, h, &plan_o, out, d);
	}
	return castfs_diag_set(d, -EINVAL, "view '%s': unknown kind", v->name);
}

int castfs_view_build(const struct castfs_view *v,
		      const struct castfs_header *h, castfs_view_add_fn add,
		      struct castfs_plan **out, struct castfs_diag *d)
{
	struct castfs_pb *pb;
	int rc = castfs_pb_new(&pb);

	if (rc)
		return rc;
	rc = castfs_view_copy_metadata(pb, h);
	for (size_t i = 0; !rc && i < h->ntensors; i++)
		rc = add(pb, v, h, &h->tensors[i], d);
	if (rc) {
		castfs_pb_free(pb);
		return rc;
	}
	return castfs_pb_finish_safetensors(pb, out, d);
}
