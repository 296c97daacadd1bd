/* SPDX-License-Identifier: MIT */
/*
 * Quantized sources: pair FP8 block weights with their scales, and refuse
 * every other quantized layout by name so that no view ever casts a packed
 * weight without its scale (docs/FORMATS.md, "Quantized sources").
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"

#include "view/qsrc.h"
#include "view/qsrc_internal.h"
#include "view/view_internal.h"

/* The largest scale row the FP8 generator reads at once (bytes). */
#define QSRC_SCALE_ROW_MAX (16u << 10)

static bool ends_with(const struct castfs_tensor *t, const char *suf)
{
	size_t n = strlen(suf);

	return t->name_len >= n &&
	       memcmp(t->name + t->name_len - n, suf, n) == 0;
}

/* The last dotted component of @t's name. */
static const char *last_comp(const struct castfs_tensor *t, size_t *len)
{
	const char *p = t->name + t->name_len;

	while (p > t->name && p[-1] != '.')
		p--;
	*len = (size_t)(t->name + t->name_len - p);
	return p;
}

static bool comp_is(const struct castfs_tensor *t, const char *word)
{
	size_t len;
	const char *c = last_comp(t, &len);

	return len == strlen(word) && memcmp(c, word, len) == 0;
}

const struct castfs_tensor *castfs_qsrc_sibling(const struct castfs_header *h,
						const struct castfs_tensor *t,
						size_t strip, const char *add,
						int *err)
{
	size_t base = t->name_len - strip, alen = strlen(add);
	const struct castfs_tensor *s;
	char *buf = malloc(base + alen + 1);

	if (!buf) {
		if (err)
			*err = -ENOMEM;
		return NULL;
	}
	memcpy(buf, t->name, base);
	memcpy(buf + base, add, alen);
	s = castfs_header_find(h, buf, base + alen);
	free(buf);
	return s;
}

bool castfs_qsrc_leaf(const struct castfs_tensor *t, const char *leaf,
		      size_t *mod)
{
	size_t n = strlen(leaf);

	if (t->name_len < n || memcmp(t->name + t->name_len - n, leaf, n))
		return false;
	if (t->name_len > n && t->name[t->name_len - n - 1] != '.')
		return false;
	*mod = t->name_len - n;
	return true;
}

/* The tensor of module @t (its name up to the last dot) called @leaf. */
static const struct castfs_tensor *module_tensor(const struct castfs_header *h,
						 const struct castfs_tensor *t,
						 const char *leaf, int *err)
{
	size_t len;

	last_comp(t, &len);
	if (len == t->name_len)
		return NULL; /* a top-level name has no module */
	return castfs_qsrc_sibling(h, t, len, leaf, err);
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

static bool is_fp8(enum castfs_dtype dt)
{
	return dt == CASTFS_DTYPE_F8_E4M3 || dt == CASTFS_DTYPE_F8_E5M2;
}

/* Whether @s is a per-tensor scale (transformers' weight_block_size null). */
static bool per_tensor(const struct castfs_tensor *s)
{
	return s->ndim == 0 || (s->ndim == 1 && s->shape[0] == 1);
}

/*
 * Whether @s (as many dimensions as its weight) has one scale per matrix:
 * [1, 1], or [E, 1, 1] for fused experts. transformers' own per-tensor
 * quantisation (weight_block_size null) writes [1, 1], and its dequantizer
 * derives the block from the grid, so the block is the whole matrix,
 * whatever the config's block size says.
 */
static bool per_matrix(const struct castfs_tensor *s)
{
	return s->ndim >= 2 && s->shape[s->ndim - 2] == 1 &&
	       s->shape[s->ndim - 1] == 1;
}

/*
 * Whether scale @s fits weight @w in the FP8 block layout: one scale per
 * bm x bn block (@q's block size), partial edge blocks included
 * ([ceil(out/bm), ceil(in/bn)], with a leading expert dimension for fused
 * experts), one scale per matrix, or a single per-tensor scale. Fills @qi's
 * block size.
 */
static bool fp8_pair_ok(const struct castfs_qsrc *q,
			const struct castfs_tensor *w,
			const struct castfs_tensor *s, struct castfs_qinfo *qi)
{
	uint64_t rows, cols;

	if (w->dtype != CASTFS_DTYPE_F8_E4M3 || w->nelems == 0 ||
	    (w->ndim != 2 && w->ndim != 3))
		return false;
	/* BF16/F16: Qwen3-32B-FP8 and Qwen3-4B-2507-FP8 store their block
	 * scales so; transformers widens them to fp32 like any scale. */
	if (s->dtype != CASTFS_DTYPE_F32 && s->dtype != CASTFS_DTYPE_F8_E8M0 &&
	    s->dtype != CASTFS_DTYPE_BF16 && s->dtype != CASTFS_DTYPE_F16)
		return false;
	if (s->dtype == CASTFS_DTYPE_BF16 || s->dtype == CASTFS_DTYPE_F16)
		qi->rule = CASTFS_QRULE_WIDE;
	rows = w->shape[w->ndim - 2];
	cols = w->shape[w->ndim - 1];
	if (w->ndim == 2 && per_tensor(s)) {
		if (rows > UINT32_MAX || cols > UINT32_MAX)
			return false;
		qi->brows = (uint32_t)rows;
		qi->bcols = (uint32_t)cols;
		return true;
	}
	if (s->ndim != w->ndim || (w->ndim == 3 && s->shape[0] != w->shape[0]))
		return false;
	if (per_matrix(s)) {
		if (rows > UINT32_MAX || cols > UINT32_MAX)
			return false;
		qi->brows = (uint32_t)rows;
		qi->bcols = (uint32_t)cols;
		return true;
	}
	if (s->shape[s->ndim - 2] != ceil_div(rows, q->brows) ||
	    s->shape[s->ndim - 1] != ceil_div(cols, q->bcols))
		return false;
	if (s->shape[s->ndim - 1] * 4 > QSRC_SCALE_ROW_MAX)
		return false;
	qi->brows = q->brows;
	qi->bcols = q->bcols;
	return true;
}

static int reject(struct castfs_diag *d, const struct castfs_tensor *t,
		  const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': %s; castfs does not dequantize "
			       "this layout: no views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

/* @si is a weight_scale_inv-like tensor: pair it with its weight. */
static int pair_fp8(const struct castfs_header *h, struct castfs_qsrc *q,
		    size_t si, const struct castfs_tensor *w,
		    struct castfs_diag *d)
{
	const struct castfs_tensor *s = &h->tensors[si];
	size_t wi = (size_t)(w - h->tensors);
	struct castfs_qinfo qi = { .role = CASTFS_QR_FP8_BLOCK };

	if (!fp8_pair_ok(q, w, s, &qi))
		return castfs_diag_set(
			d, -ENOTSUP,
			"tensor '%.*s': FP8 scale whose dtype or shape is "
			"not the %ux%u block (or per-tensor) layout of its "
			"weight; castfs does not dequantize this layout: no "
			"views",
			(int)(s->name_len > 120 ? 120 : s->name_len), s->name,
			q->brows, q->bcols);
	if (q->t[wi].role != CASTFS_QR_PLAIN)
		return reject(d, w, "FP8 weight with two scales");
	qi.scale = (uint32_t)si;
	q->t[wi] = qi;
	q->t[si].role = CASTFS_QR_SCALE;
	q->nfp8++;
	return 0;
}

/*
 * FP8 block scales: "P_scale_inv" (DeepSeek-V3, transformers) for weight
 * "P", and "M.scale" (DeepSeek-V4) for an F8 "M.weight". Returns 1 when
 * @i is no such scale.
 */
static int try_fp8_scale(const struct castfs_header *h, struct castfs_qsrc *q,
			 size_t i, struct castfs_diag *d)
{
	const struct castfs_tensor *t = &h->tensors[i], *w;
	int err = 0;

	if (ends_with(t, "_scale_inv")) {
		w = castfs_qsrc_sibling(h, t, strlen("_scale_inv"), "", &err);
		if (err)
			return err;
		if (!w && (q->flags & CASTFS_QSRC_XSHARD)) {
			q->nxshard++; /* its weight may be in another shard */
			return 0;
		}
		if (!w)
			return reject(d, t,
				      "FP8 scale without its weight in "
				      "this file");
		return pair_fp8(h, q, i, w, d);
	}
	if (!ends_with(t, ".scale"))
		return 1;
	w = castfs_qsrc_sibling(h, t, strlen(".scale"), ".weight", &err);
	if (err)
		return err;
	if (!w && (q->flags & CASTFS_QSRC_XSHARD) &&
	    (t->dtype == CASTFS_DTYPE_F32 ||
	     t->dtype == CASTFS_DTYPE_F8_E8M0)) {
		/* Its F8 weight may be in another shard: the composite
		 * header tells (a module's own scale stays plain there). */
		q->nxshard++;
		return 0;
	}
	if (!w || !is_fp8(w->dtype))
		return 1; /* a module's own "scale" parameter */
	return pair_fp8(h, q, i, w, d);
}

/* Companion names of layouts castfs does not dequantize (yet). */
static const struct {
	const char *leaf;
	const char *layout;
} foreign[] = {
	{ "absmax", "bitsandbytes 4-bit" },
	{ "quant_map", "bitsandbytes 4-bit" },
	{ "nested_absmax", "bitsandbytes 4-bit" },
	{ "nested_quant_map", "bitsandbytes 4-bit" },
	{ "comfy_quant", "ComfyUI mixed precision" },
	{ "scaled_fp8", "ComfyUI scaled fp8" },
	{ "weight_packed", "compressed-tensors packed" },
	{ "weight_global_scale", "compressed-tensors FP4" },
	{ "input_global_scale", "compressed-tensors FP4" },
	{ "weight_zero_point", "compressed-tensors" },
	{ "weight_g_idx", "compressed-tensors" },
	{ "weight_scale_2", "ModelOpt/ComfyUI NVFP4" },
	{ "qweight", "GPTQ/AWQ" },
	{ "qzeros", "GPTQ/AWQ" },
	{ "g_idx", "GPTQ" },
	{ "W_q", "HQQ" },
	{ "q_invperm", "EXL2" },
	{ "q_scale_max", "EXL2" },
	{ "q_groups", "EXL2" },
	{ "trellis", "EXL3" },
};

/* A weight that holds codes, not values: integers and fp8. */
static bool coded(enum castfs_dtype dt)
{
	return !castfs_dtype_is_castable(dt) || is_fp8(dt);
}

/* Whether leaf @c (@len bytes) names a scale-like companion. */
static bool scale_like(const char *c, size_t len)
{
	/* "scb" too: a lower-cased LLM.int8 file is not a cast either. */
	static const char *const words[] = { "SCB", "scb", "weight_format" };

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		if (len == strlen(words[i]) && memcmp(c, words[i], len) == 0)
			return true;
	}
	for (size_t k = 0; k + 5 <= len; k++) {
		if (memcmp(c + k, "scale", 5) == 0)
			return true;
	}
	return false;
}

/* Reject @t if its name is that of a layout castfs does not know. */
static int check_named(const struct castfs_header *h,
		       const struct castfs_tensor *t, struct castfs_diag *d)
{
	const struct castfs_tensor *w;
	int err = 0;

	for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
		if (comp_is(t, foreign[i].leaf))
			return reject(d, t, foreign[i].layout);
	}
	if (memmem(t->name, t->name_len, ".quant_state.", 13))
		return reject(d, t, "bitsandbytes 4-bit");
	if (ends_with(t, "_blocks") && t->dtype == CASTFS_DTYPE_U8 &&
	    castfs_qsrc_sibling(h, t, strlen("_blocks"), "_scales", &err))
		return reject(d, t, "MXFP4 (gpt-oss)");
	/* optimum-quanto's QTensors save "M.weight._data" (codes) beside
	 * "M.weight._scale" (and "._shift"): no "M.weight" to pair with. */
	if (!err && ends_with(t, "._data") &&
	    castfs_qsrc_sibling(h, t, strlen("_data"), "_scale", &err))
		return reject(d, t, "optimum-quanto");
	/* Generic words, refused only in the pair that names the layout:
	 * AQLM's "codebooks" beside its integer "codes", Marlin's packed
	 * I32 "B" beside its scales "s". */
	if (!err && comp_is(t, "codebooks") &&
	    (w = castfs_qsrc_sibling(h, t, strlen("codebooks"), "codes",
				     &err)) &&
	    !castfs_dtype_is_castable(w->dtype))
		return reject(d, t, "AQLM");
	if (!err && comp_is(t, "B") && t->dtype == CASTFS_DTYPE_I32 &&
	    castfs_qsrc_sibling(h, t, strlen("B"), "s", &err))
		return reject(d, t, "Marlin");
	return err;
}

/*
 * Reject @t, a module's "_extra_state", beside an fp8 or integer weight:
 * Transformer Engine keeps the module's FP8 scaling (scale, amax history)
 * pickled there, so the codes are not values, and nothing here reads a
 * pickle. Beside float weights it is run-time state, copied. The weights
 * TE's modules save: Linear and LayerNormLinear "weight", LayerNormMLP
 * "fc1_weight" / "fc2_weight", GroupedLinear "weight0"...
 */
static int check_te(const struct castfs_header *h,
		    const struct castfs_tensor *t, struct castfs_diag *d)
{
	static const char *const leaves[] = { "weight", "fc1_weight",
					      "fc2_weight", "weight0" };
	const struct castfs_tensor *w;
	int err = 0;

	for (size_t i = 0; !err && i < sizeof(leaves) / sizeof(leaves[0]);
	     i++) {
		w = module_tensor(h, t, leaves[i], &err);
		if (w && coded(w->dtype))
			return reject(d, t,
				      "Transformer Engine FP8 (its scales are "
				      "pickled in _extra_state)");
	}
	return err;
}

/* Reject @t if it is a scale-like companion of a coded weight. */
static int check_foreign(const struct castfs_header *h,
			 const struct castfs_tensor *t, struct castfs_diag *d)
{
	const struct castfs_tensor *w;
	const char *c;
	size_t len;
	int err = 0;

	c = last_comp(t, &len);
	if (scale_like(c, len)) {
		w = module_tensor(h, t, "weight", &err);
		if (w && coded(w->dtype))
			return reject(d, t,
				      "scale of a packed or 8-bit weight");
	}
	if (!err && comp_is(t, "_extra_state"))
		return check_te(h, t, d);
	return err;
}

/* STRICT: an F8 tensor left unpaired has its scale in another file. */
static int check_strict(const struct castfs_header *h, struct castfs_qsrc *q,
			struct castfs_diag *d)
{
	for (size_t i = 0; i < h->ntensors; i++) {
		if (q->t[i].role != CASTFS_QR_PLAIN ||
		    !is_fp8(h->tensors[i].dtype))
			continue;
		if (q->flags & CASTFS_QSRC_XSHARD)
			q->nxshard++; /* its scale may be in another shard */
		else
			return reject(d, &h->tensors[i],
				      "FP8 weight of a quantized model "
				      "without its scale in this file");
	}
	return 0;
}

cJSON *castfs_qsrc_json_loads(const uint8_t *js, size_t len)
{
	const char *end = NULL;
	size_t at = castfs_json_skip_ws(js, len, 0);
	cJSON *o;

	/* cJSON skips every byte up to 0x20 before a value and ignores what
	 * follows it; json.loads() allows only JSON whitespace around it. */
	if (castfs_utf8_bad(js, len) != len || at == len || js[at] < 0x20)
		return NULL;
	o = cJSON_ParseWithLengthOpts((const char *)js, len, &end, false);
	at = o && end ? (size_t)((const uint8_t *)end - js) : len;
	if (castfs_json_skip_ws(js, len, at) < len) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* The layout (CASTFS_QK_*) of quantized weight @t of @h, or 0. */
static unsigned kind_of(const struct castfs_header *h,
			const struct castfs_qinfo *t)
{
	switch (t->role) {
	case CASTFS_QR_MXFP4:
		return CASTFS_QK_MXFP4;
	case CASTFS_QR_BNB4:
		return CASTFS_QK_BNB4;
	case CASTFS_QR_CTW4:
		return CASTFS_QK_CT_W4;
	case CASTFS_QR_FP8_BLOCK:
		break;
	default:
		return 0;
	}
	switch (t->rule) {
	case CASTFS_QRULE_COMPUTE:
		return CASTFS_QK_COMFY;
	case CASTFS_QRULE_INT8:
		return CASTFS_QK_INT8;
	case CASTFS_QRULE_NVFP4:
		return CASTFS_QK_NVFP4;
	case CASTFS_QRULE_MXFP4:
		return CASTFS_QK_CT_MXFP4;
	default: /* F32, WIDE: by its scale's name */
		return ends_with(&h->tensors[t->scale], "weight_scale") ?
			       CASTFS_QK_CT_FP8 :
			       CASTFS_QK_FP8_BLOCK;
	}
}

static const char *kind_name(unsigned k)
{
	switch (k) {
	case CASTFS_QK_FP8_BLOCK:
		return "an FP8 block (weight_scale_inv)";
	case CASTFS_QK_CT_FP8:
		return "a compressed-tensors FP8 (weight_scale)";
	case CASTFS_QK_COMFY:
		return "a ComfyUI scaled fp8";
	case CASTFS_QK_INT8:
		return "a bitsandbytes LLM.int8";
	case CASTFS_QK_NVFP4:
		return "a compressed-tensors NVFP4";
	case CASTFS_QK_CT_MXFP4:
		return "a compressed-tensors MXFP4";
	case CASTFS_QK_MXFP4:
		return "a gpt-oss MXFP4";
	case CASTFS_QK_BNB4:
		return "a bitsandbytes 4-bit";
	default:
		return "a compressed-tensors int4";
	}
}

/*
 * Whether weight @qi of kind @k is one a folder declaring @declared reads:
 * of a declared kind, or, under quant_method "fp8", an F8 weight with one
 * per-tensor "weight_scale" (transformers' FP8Embedding of
 * modules_to_convert, AutoFP8's static checkpoints that vLLM's Fp8Config
 * reads; an F32 scalar's product is the fp32 one of both rules).
 */
static bool declared_reads(const struct castfs_header *h,
			   const struct castfs_qinfo *qi, unsigned k,
			   unsigned declared)
{
	if (k & declared)
		return true;
	return k == CASTFS_QK_CT_FP8 && (declared & CASTFS_QK_FP8_BLOCK) &&
	       h->tensors[qi->scale].nelems == 1 &&
	       h->tensors[qi->scale].dtype == CASTFS_DTYPE_F32;
}

/* Every quantized weight of @q must be of a layout in @declared (the
 * folder's config.json): the loader reads them by the config. */
static int check_declared(const struct castfs_header *h,
			  const struct castfs_qsrc *q, unsigned declared,
			  struct castfs_diag *d)
{
	for (size_t i = 0; declared && i < q->n; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		unsigned k = kind_of(h, &q->t[i]);

		if (k && !declared_reads(h, &q->t[i], k, declared))
			return castfs_diag_set(
				d, -ENOTSUP,
				"tensor '%.*s': %s weight, but config.json's "
				"quantization_config declares another layout: "
				"no views",
				(int)(t->name_len > 120 ? 120 : t->name_len),
				t->name, kind_name(k));
	}
	return 0;
}

/* Whether FP8 block weights (DeepSeek's or compressed-tensors') are
 * among @q's: then an F8 tensor left without a scale is no plain fp8
 * tensor, whatever the folder says (DeepSeek's fp8_cast_bf16.py copies
 * it as stored: a "bf16" file with F8 codes in it). */
static bool has_fp8_blocks(const struct castfs_qsrc *q)
{
	return q->nfp8 > q->ncomfy + q->nint8 + q->nct4;
}

int castfs_qsrc_scan(const struct castfs_header *h, unsigned flags,
		     struct castfs_qsrc *out, struct castfs_diag *d)
{
	const struct castfs_qsrc_opts o = { .flags = flags };

	return castfs_qsrc_scan_opts(h, &o, out, d);
}

int castfs_qsrc_scan_opts(const struct castfs_header *h,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_qsrc *out, struct castfs_diag *d)
{
	struct castfs_qsrc q = { .n = h->ntensors };
	unsigned flags = o ? o->flags : 0;
	int rc = 0;

	q.flags = flags;
	q.ct_strategies = o ? o->ct_strategies : 0;
	q.brows = o && o->brows ? o->brows : CASTFS_FP8_BLOCK;
	q.bcols = o && o->bcols ? o->bcols : CASTFS_FP8_BLOCK;

	q.t = calloc(q.n ? q.n : 1, sizeof(*q.t));
	if (!q.t)
		return -ENOMEM;
	/* ComfyUI's layouts name their tensors with words the checks below
	 * refuse: they are paired first (qsrc_comfy.c). */
	rc = castfs_qsrc_comfy(h, &q, d);
	if (!rc)
		rc = castfs_qsrc_int8(h, &q, d);
	if (!rc)
		rc = castfs_qsrc_ct4(h, &q, d);
	if (!rc)
		rc = castfs_qsrc_bnb4(h, &q, d);
	if (!rc)
		rc = castfs_qsrc_ctw4(h, &q, d);
	/* Names that only one layout uses first: the most precise reason. */
	for (size_t i = 0; !rc && i < q.n; i++) {
		if (q.t[i].role != CASTFS_QR_PLAIN)
			continue;
		rc = castfs_qsrc_mxfp4(h, &q, i, d);
		if (rc == 1)
			rc = check_named(h, &h->tensors[i], d);
	}
	for (size_t i = 0; !rc && i < q.n; i++) {
		if (q.t[i].role != CASTFS_QR_PLAIN)
			continue;
		rc = try_fp8_scale(h, &q, i, d);
		if (rc == 1)
			rc = castfs_qsrc_ctfp8(h, &q, i, d);
		if (rc == 1)
			rc = check_foreign(h, &h->tensors[i], d);
	}
	if (!rc && ((flags & CASTFS_QSRC_STRICT) ||
		    (!(flags & CASTFS_QSRC_XSHARD) && has_fp8_blocks(&q))))
		rc = check_strict(h, &q, d);
	if (!rc && o)
		rc = check_declared(h, &q, o->declared, d);
	if (!rc && (flags & CASTFS_QSRC_STRICT))
		rc = castfs_qsrc_ct4_orphans(h, &q, true, d);
	if (!rc && (flags & CASTFS_QSRC_MX))
		rc = castfs_qsrc_mx_orphans(h, &q, d);
	if (rc) {
		castfs_qsrc_fini(&q);
		return rc;
	}
	*out = q;
	return 0;
}

void castfs_qsrc_fini(struct castfs_qsrc *q)
{
	free(q->q4);
	q->q4 = NULL;
	q->nbnb4 = 0;
	q->nctw4 = 0;
	free(q->t);
	q->t = NULL;
	q->n = 0;
	q->nfp8 = 0;
	q->nmxfp4 = 0;
	q->ncomfy = 0;
	q->nint8 = 0;
	q->nct4 = 0;
}
