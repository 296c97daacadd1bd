/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors "float-quantized" FP8 as a quantized source: an
 * F8_E4M3 "M.weight" with its "M.weight_scale" (F32 or BF16; one scale,
 * one per output channel, or one per 128x128 block) becomes an FP8 block
 * weight whose product is rounded to the scale's dtype, as the
 * decompressor computes it (docs/FORMATS.md, "compressed-tensors FP8").
 * A static "M.input_scale" is an activation's: left out.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "view/qsrc_internal.h"
#include "view/view_internal.h"

static bool ct_ends(const struct castfs_tensor *t, const char *suf)
{
	size_t n = strlen(suf);

	return t->name_len >= n &&
	       memcmp(t->name + t->name_len - n, suf, n) == 0;
}

static uint64_t ct_cdiv(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

/* The elements per scale of weight @w for scale @s, or false. */
static bool ct_grid(const struct castfs_tensor *w,
		    const struct castfs_tensor *s, struct castfs_qinfo *qi)
{
	uint64_t rows = w->shape[0], cols = w->shape[1];

	if (rows > UINT32_MAX || cols > UINT32_MAX)
		return false;
	if (s->nelems == 1 && s->ndim <= 2) { /* strategy "tensor" */
		qi->brows = (uint32_t)rows;
		qi->bcols = (uint32_t)cols;
		return true;
	}
	if (s->ndim != 2)
		return false;
	if (s->shape[0] == rows && s->shape[1] == 1) { /* "channel" */
		qi->brows = 1;
		qi->bcols = (uint32_t)cols;
		return true;
	}
	if (s->shape[0] == ct_cdiv(rows, CASTFS_FP8_BLOCK) &&
	    s->shape[1] == ct_cdiv(cols, CASTFS_FP8_BLOCK) &&
	    s->shape[1] * 4 <= (16u << 10)) { /* "block", 128 x 128 */
		qi->brows = qi->bcols = CASTFS_FP8_BLOCK;
		return true;
	}
	return false;
}

/*
 * Whether the grid @qi found for scale @s is one the config's strategies
 * @strat decompress (0: no config): compressed-tensors multiplies by the
 * scale broadcast to the weight for "tensor" and "channel", and to the
 * [rows/128, cols/128] blocks for "block", so one value serves all three,
 * one per row only the first two and a block grid only "block"; anything
 * else fails in its decompressor (bug hunt: castfs served the scale's own
 * layout).
 */
static bool ct_strategy_ok(unsigned strat, const struct castfs_tensor *s,
			   const struct castfs_qinfo *qi)
{
	if (!strat || s->nelems == 1)
		return true;
	if (qi->brows == 1) /* one per row */
		return strat & (CASTFS_QSTRAT_TENSOR | CASTFS_QSTRAT_CHANNEL);
	return strat & CASTFS_QSTRAT_BLOCK;
}

static int ct_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		     const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': compressed-tensors FP8 %s; "
			       "castfs does not dequantize this layout: no "
			       "views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

/* @si is "M.weight_scale" beside F8_E4M3 "M.weight" @w: pair them. */
static int ct_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		   size_t si, const struct castfs_tensor *w,
		   struct castfs_diag *d)
{
	const struct castfs_tensor *s = &h->tensors[si];
	struct castfs_qinfo qi = { .role = CASTFS_QR_FP8_BLOCK };
	size_t wi = (size_t)(w - h->tensors);

	if (s->dtype != CASTFS_DTYPE_F32 && s->dtype != CASTFS_DTYPE_BF16)
		return ct_reject(d, s, "scale of a dtype other than F32/BF16");
	if (w->ndim != 2 || w->nelems == 0 || !ct_grid(w, s, &qi))
		return ct_reject(d, s,
				 "scale whose shape is not per-tensor, "
				 "per-channel or per 128x128 block");
	if (!ct_strategy_ok(q->ct_strategies, s, &qi))
		return ct_reject(d, s,
				 "scale whose shape the config's strategy "
				 "does not decompress");
	if (q->t[wi].role != CASTFS_QR_PLAIN)
		return ct_reject(d, w, "weight with two scales");
	qi.scale = (uint32_t)si;
	q->t[wi] = qi;
	q->t[si].role = CASTFS_QR_SCALE;
	q->nfp8++;
	return 0;
}

int castfs_qsrc_ctfp8(const struct castfs_header *h, struct castfs_qsrc *q,
		      size_t i, struct castfs_diag *d)
{
	const struct castfs_tensor *t = &h->tensors[i], *w, *s;
	bool input = ct_ends(t, ".input_scale");
	int err = 0;

	if (!input && !ct_ends(t, ".weight_scale"))
		return 1;
	w = castfs_qsrc_sibling(
		h, t, input ? strlen(".input_scale") : strlen(".weight_scale"),
		".weight", &err);
	if (!err && !w && (q->flags & CASTFS_QSRC_XSHARD) &&
	    (t->dtype == CASTFS_DTYPE_F32 || t->dtype == CASTFS_DTYPE_BF16)) {
		/* Its weight may be in another shard: the composite header
		 * pairs them (qsrc_xshard.c). */
		q->t[i].role = CASTFS_QR_SCALE;
		q->nxshard++;
		return 0;
	}
	if (err || !w || w->dtype != CASTFS_DTYPE_F8_E4M3)
		return err ? err : 1;
	if (!input)
		return ct_pair(h, q, i, w, d);
	/* An activation's static scale: not part of the weight's value. */
	s = castfs_qsrc_sibling(h, t, strlen(".input_scale"), ".weight_scale",
				&err);
	if (err || !s)
		return err ? err : 1;
	if (t->nelems != 1)
		return ct_reject(d, t, "input_scale that is not one value");
	q->t[i].role = CASTFS_QR_SCALE;
	return 0;
}
