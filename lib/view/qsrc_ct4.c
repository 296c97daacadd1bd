/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors FP4 checkpoints as quantized sources: a U8
 * "M.weight_packed" of E2M1 pairs with its "M.weight_scale", as
 * nvfp4-pack-quantized (an F8_E4M3 scale per 16 and an F32 global
 * divisor) or mxfp4-pack-quantized (a U8 exponent per 32) writes them
 * (docs/FORMATS.md, "compressed-tensors NVFP4 / MXFP4"). Anything else
 * beside a packed FP4 weight is refused by name.
 */
#include <errno.h>
#include <string.h>

#include "view/qsrc_internal.h"

/* The tensors of one packed weight's module. */
struct ct4_mod {
	const struct castfs_tensor *w, *s, *g, *ig;
};

static int ct4_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		      const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': compressed-tensors FP4 %s; "
			       "castfs does not dequantize this layout: no "
			       "views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

/* The sibling @leaf of "M.weight_packed" @w, or NULL (-ENOMEM: *@err). */
static const struct castfs_tensor *ct4_sib(const struct castfs_header *h,
					   const struct castfs_tensor *w,
					   const char *leaf, int *err)
{
	return castfs_qsrc_sibling(h, w, strlen("weight_packed"), leaf, err);
}

/* Look up @m's companions; refuse those of layouts castfs does not
 * follow (asymmetric, activation order, int4 packing). */
static int ct4_find(const struct castfs_header *h, struct ct4_mod *m,
		    struct castfs_diag *d)
{
	static const struct {
		const char *leaf, *why;
	} refused[] = {
		{ "weight_zero_point",
		  "weight with a zero point (asymmetric)" },
		{ "weight_g_idx", "weight with activation ordering (g_idx)" },
		{ "weight_shape", "weight with a weight_shape (int packing)" },
		{ "weight", "packed weight beside an unpacked one" },
	};
	int err = 0;

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		if (ct4_sib(h, m->w, refused[i].leaf, &err))
			return ct4_reject(d, m->w, refused[i].why);
		if (err)
			return err;
	}
	m->s = ct4_sib(h, m->w, "weight_scale", &err);
	if (!err)
		m->g = ct4_sib(h, m->w, "weight_global_scale", &err);
	if (!err)
		m->ig = ct4_sib(h, m->w, "input_global_scale", &err);
	return err;
}

/* An F32 [1]: the only global-scale shape whose division torch computes
 * in fp32 (a 0-d tensor would leave the bf16 scale's dtype). */
static bool ct4_one(const struct castfs_tensor *t)
{
	return t->dtype == CASTFS_DTYPE_F32 && t->ndim == 1 && t->shape[0] == 1;
}

/* Which of the two layouts @m is (*@rule, *@group), or why none. */
static int ct4_layout(const struct ct4_mod *m, uint8_t *rule, uint32_t *group,
		      struct castfs_diag *d)
{
	if (m->s->dtype == CASTFS_DTYPE_F8_E4M3) {
		if (!m->g || !ct4_one(m->g))
			return ct4_reject(d, m->w,
					  "NVFP4 weight without an F32 [1] "
					  "weight_global_scale in this file");
		*rule = CASTFS_QRULE_NVFP4;
		*group = 16;
		return 0;
	}
	if (m->s->dtype == CASTFS_DTYPE_U8) {
		if (m->g)
			return ct4_reject(d, m->w,
					  "MXFP4 weight with a global scale");
		*rule = CASTFS_QRULE_MXFP4;
		*group = 32;
		return 0;
	}
	/* compressed-tensors decodes an MX scale with .to(int32): an
	 * F8_E8M0 tensor would be read by value, not as its exponent. */
	return ct4_reject(d, m->s,
			  "weight_scale that is neither F8_E4M3 (NVFP4) nor "
			  "U8 exponents (MXFP4)");
}

/* Whether @m's shapes are [rows, cols / 2] and [rows, cols / @group]. */
static bool ct4_shapes_ok(const struct ct4_mod *m, uint32_t group)
{
	const struct castfs_tensor *w = m->w, *s = m->s;

	if (w->ndim != 2 || s->ndim != 2 || w->nelems == 0 ||
	    w->shape[1] > UINT64_MAX / 2)
		return false;
	return (2 * w->shape[1]) % group == 0 && s->shape[0] == w->shape[0] &&
	       s->shape[1] == 2 * w->shape[1] / group;
}

/* Whether tensor @t of @h is still unclaimed by another layout. */
static bool ct4_free(const struct castfs_header *h, const struct castfs_qsrc *q,
		     const struct castfs_tensor *t)
{
	return q->t[t - h->tensors].role == CASTFS_QR_PLAIN;
}

/* Mark @t of @h, if any, as a tensor this header alone does not serve. */
static void ct4_hold(const struct castfs_header *h, struct castfs_qsrc *q,
		     const struct castfs_tensor *t)
{
	if (t && ct4_free(h, q, t))
		q->t[t - h->tensors].role = CASTFS_QR_SCALE;
}

/*
 * XSHARD: @m lacks a companion that may be in another shard of its
 * folder (transformers' sharder splits a module by size). Counted in
 * nxshard, so only the composite header (view/qsrc_xshard.h), scanned
 * strictly, is ever served. Returns 1 when @m is not such a module.
 */
static int ct4_elsewhere(const struct castfs_header *h, struct castfs_qsrc *q,
			 const struct ct4_mod *m)
{
	if (!(q->flags & CASTFS_QSRC_XSHARD) ||
	    (m->s && (m->s->dtype != CASTFS_DTYPE_F8_E4M3 || m->g)))
		return 1;
	ct4_hold(h, q, m->w);
	ct4_hold(h, q, m->s);
	ct4_hold(h, q, m->ig);
	q->nxshard++;
	return 0;
}

/* Pair packed weight @m->w with its companions in @q. */
static int ct4_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		    const struct ct4_mod *m, struct castfs_diag *d)
{
	struct castfs_qinfo qi = { .role = CASTFS_QR_FP8_BLOCK, .brows = 1 };
	uint32_t group = 0;
	int rc = ct4_elsewhere(h, q, m);

	if (rc != 1)
		return rc;
	if (!m->s)
		return ct4_reject(d, m->w,
				  "packed weight without its weight_scale in "
				  "this file");
	rc = ct4_layout(m, &qi.rule, &group, d);
	if (rc)
		return rc;
	if (!ct4_shapes_ok(m, group))
		return ct4_reject(d, m->s,
				  qi.rule == CASTFS_QRULE_NVFP4 ?
					  "scale whose shape is not [rows, "
					  "cols / 16] of its packed weight" :
					  "scale whose shape is not [rows, "
					  "cols / 32] of its packed weight");
	if (m->ig && !ct4_one(m->ig))
		return ct4_reject(d, m->ig, "input_global_scale not F32 [1]");
	if (!ct4_free(h, q, m->w) || !ct4_free(h, q, m->s) ||
	    (m->g && !ct4_free(h, q, m->g)))
		return ct4_reject(d, m->w, "weight or scale claimed twice");
	qi.bcols = group;
	qi.scale = (uint32_t)(m->s - h->tensors);
	qi.gscale = m->g ? (uint32_t)(m->g - h->tensors) : 0;
	q->t[m->w - h->tensors] = qi;
	q->t[qi.scale].role = CASTFS_QR_SCALE;
	if (m->g)
		q->t[qi.gscale].role = CASTFS_QR_SCALE;
	if (m->ig)
		q->t[m->ig - h->tensors].role = CASTFS_QR_SCALE;
	q->nfp8++;
	q->nct4++;
	return 0;
}

int castfs_qsrc_ct4(const struct castfs_header *h, struct castfs_qsrc *q,
		    struct castfs_diag *d)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		struct ct4_mod m = { .w = &h->tensors[i] };
		size_t mod;

		if (m.w->dtype != CASTFS_DTYPE_U8 ||
		    !castfs_qsrc_leaf(m.w, "weight_packed", &mod) || mod == 0)
			continue;
		rc = ct4_find(h, &m, d);
		if (!rc)
			rc = ct4_pair(h, q, &m, d);
	}
	return rc ? rc : castfs_qsrc_ct4_orphans(h, q, false, d);
}

/*
 * XSHARD: whether orphan @t (companion @k of ct4_orphans' leaves) may be
 * an FP4 companion whose weight is in another shard: the global scales,
 * or a weight_scale of an FP4 dtype (compressed-tensors FP8 scales are
 * F32/BF16 and keep being refused here).
 */
static bool ct4_fp4_companion(const struct castfs_tensor *t, size_t k)
{
	return k < 2 || t->dtype == CASTFS_DTYPE_F8_E4M3 ||
	       t->dtype == CASTFS_DTYPE_U8;
}

int castfs_qsrc_ct4_orphans(const struct castfs_header *h,
			    struct castfs_qsrc *q, bool strict,
			    struct castfs_diag *d)
{
	/* The global scales belong to FP4 weights only; a weight_scale may
	 * be a plain tensor of a file that declares nothing. */
	static const char *const leaves[] = { "weight_global_scale",
					      "input_global_scale",
					      "weight_scale" };
	size_t nleaves = strict ? 3 : 2, mod;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (q->t[i].role != CASTFS_QR_PLAIN)
			continue;
		for (size_t k = 0; k < nleaves; k++) {
			if (!castfs_qsrc_leaf(t, leaves[k], &mod))
				continue;
			if ((q->flags & CASTFS_QSRC_XSHARD) &&
			    ct4_fp4_companion(t, k)) {
				q->t[i].role = CASTFS_QR_SCALE;
				q->nxshard++;
				break;
			}
			return ct4_reject(d, t,
					  "companion whose weight is not in "
					  "this file (a module split across "
					  "shards)");
		}
	}
	return 0;
}

const struct castfs_tensor *castfs_qsrc_weight(const struct castfs_tensor *t,
					       const struct castfs_qinfo *qi,
					       struct castfs_tensor *tmp,
					       uint64_t tmp_shape[2])
{
	if (qi->role != CASTFS_QR_FP8_BLOCK ||
	    (qi->rule != CASTFS_QRULE_NVFP4 && qi->rule != CASTFS_QRULE_MXFP4))
		return t;
	*tmp = *t;
	tmp->name_len -= strlen("_packed");
	tmp_shape[0] = t->shape[0];
	tmp_shape[1] = 2 * t->shape[1];
	tmp->shape = tmp_shape;
	tmp->nelems = 2 * t->nelems;
	tmp->dtype = CASTFS_DTYPE_BF16;
	return tmp;
}
