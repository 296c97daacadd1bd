/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors "pack-quantized" int4 (W4A16) as a quantized source:
 * "M.weight_packed" I32 [rows, ceil(cols / 8)] (eight 4-bit codes a word,
 * element i at bits 4i of its row's words, stored as code + 8), its
 * "M.weight_scale" [rows, groups] (BF16, F16 or F32; one group = the
 * row for the channel strategy) and "M.weight_shape" I64/I32 [2], whose
 * DATA (side data, format/st_side.h) holds the true [rows, cols]; an
 * asymmetric weight (W4A16_ASYM) adds "M.weight_zero_point" I32
 * [ceil(rows / 8), groups], its codes packed the same way along the rows
 * (docs/FORMATS.md, "compressed-tensors pack-quantized int4").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "format/st_side.h"
#include "view/qsrc_internal.h"

static int w4_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		     const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': compressed-tensors "
			       "pack-quantized %s; castfs does not dequantize "
			       "this layout: no views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

/* The [rows, cols] "M.weight_shape" @ws holds, from its side data. */
static bool w4_shape(const struct castfs_header *h,
		     const struct castfs_tensor *ws, uint64_t shape[2])
{
	size_t len = 0;
	const uint8_t *p = ws ? castfs_header_side(h, ws, &len) : NULL;
	size_t el = ws && ws->dtype == CASTFS_DTYPE_I64 ? 8 : 4;

	if (!p || ws->nelems != 2 || len != 2 * el)
		return false;
	for (int i = 0; i < 2; i++) {
		int64_t v = el == 8 ? (int64_t)castfs_load_le64(p + 8 * i) :
				      (int32_t)castfs_load_le32(p + 4 * i);

		if (v <= 0 || v > (1ll << 40))
			return false;
		shape[i] = (uint64_t)v;
	}
	return true;
}

/* Why weight @w with scale @s and true @shape is not the symmetric int4
 * group/channel layout; NULL when it is (@qi filled). */
static const char *w4_check(const struct castfs_tensor *w,
			    const struct castfs_tensor *s,
			    const uint64_t shape[2], struct castfs_qinfo *qi)
{
	uint64_t rows = shape[0], cols = shape[1], g;

	if (w->ndim != 2 || w->shape[0] != rows ||
	    w->shape[1] != cols / 8 + (cols % 8 != 0))
		return "weight_packed whose shape is not that of 4-bit codes "
		       "of its weight_shape";
	/* Other bit widths pack [cols] into another word count only from
	 * 32 columns on: below, the header cannot tell them apart. */
	if (cols < 32)
		return "weight of fewer than 32 columns";
	if (s->dtype != CASTFS_DTYPE_BF16 && s->dtype != CASTFS_DTYPE_F16 &&
	    s->dtype != CASTFS_DTYPE_F32)
		return "weight_scale of a dtype other than BF16/F16/F32";
	if (s->ndim != 2 || s->shape[0] != rows || s->shape[1] == 0 ||
	    cols % s->shape[1])
		return "weight_scale that is not per channel or per group";
	/* compressed-tensors requires groups that divide the row: the
	 * group is then the one size giving this many scales a row. */
	g = cols / s->shape[1];
	if (g > UINT32_MAX)
		return "weight_scale that is not per channel or per group";
	qi->brows = 1;
	qi->bcols = (uint32_t)g;
	return NULL;
}

/*
 * Why zero point @zp does not fit weight @w of true @shape with scale @s
 * under @flags (a directory's W4SYM / W4ASYM); NULL when it does.
 */
static const char *w4_zp_check(const struct castfs_tensor *zp,
			       const struct castfs_tensor *s,
			       const uint64_t shape[2], unsigned flags)
{
	if (!zp && (flags & CASTFS_QSRC_W4ASYM))
		return "weight without the weight_zero_point its "
		       "config.json (symmetric: false) requires";
	if (!zp)
		return NULL;
	if (flags & CASTFS_QSRC_W4SYM)
		return "weight_zero_point of a weight its config.json "
		       "declares symmetric";
	if (zp->dtype != CASTFS_DTYPE_I32 || zp->ndim != 2 ||
	    zp->shape[0] != shape[0] / 8 + (shape[0] % 8 != 0) ||
	    zp->shape[1] != s->shape[1])
		return "weight_zero_point that is not I32 [ceil(rows / 8), "
		       "groups] (4-bit codes packed along the rows)";
	return NULL;
}

/* Mark @t of @h, if any, as a tensor this header alone does not serve. */
static void w4_hold(const struct castfs_header *h, struct castfs_qsrc *q,
		    const struct castfs_tensor *t)
{
	if (t && q->t[t - h->tensors].role == CASTFS_QR_PLAIN)
		q->t[t - h->tensors].role = CASTFS_QR_SCALE;
}

/*
 * XSHARD: whether weight @t lacks a companion that may be in another
 * shard (its scale, its weight_shape, or under W4ASYM its zero point);
 * then it and its companions here are held and counted in nxshard (only
 * the composite header, view/qsrc_xshard.h, is ever served).
 */
static bool w4_elsewhere(const struct castfs_header *h, struct castfs_qsrc *q,
			 const struct castfs_tensor *t,
			 const struct castfs_tensor *const c[3])
{
	if (!(q->flags & CASTFS_QSRC_XSHARD) ||
	    (c[0] && c[1] && (c[2] || !(q->flags & CASTFS_QSRC_W4ASYM))))
		return false;
	w4_hold(h, q, t);
	for (int i = 0; i < 3; i++)
		w4_hold(h, q, c[i]);
	q->nxshard++;
	return true;
}

/* "M.weight_packed" @t: pair it with its scale and shape into @q. */
static int w4_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		   const struct castfs_tensor *t, struct castfs_diag *d)
{
	size_t strip = strlen("_packed");
	const struct castfs_tensor *s, *ws, *zp, *gi, *w;
	struct castfs_qinfo qi = { .role = CASTFS_QR_CTW4 };
	uint64_t shape[2];
	const char *why;
	int err = 0;

	s = castfs_qsrc_sibling(h, t, strip, "_scale", &err);
	ws = castfs_qsrc_sibling(h, t, strip, "_shape", &err);
	zp = castfs_qsrc_sibling(h, t, strip, "_zero_point", &err);
	gi = castfs_qsrc_sibling(h, t, strip, "_g_idx", &err);
	w = castfs_qsrc_sibling(h, t, strip, "", &err);
	if (err)
		return err;
	if (gi)
		return w4_reject(d, gi, "activation ordering (g_idx)");
	if (w4_elsewhere(h, q, t,
			 (const struct castfs_tensor *const[3]){ s, ws, zp }))
		return 0;
	if (w)
		return w4_reject(d, w, "weight beside its weight_packed");
	if (!s || !w4_shape(h, ws, shape))
		return w4_reject(d, t,
				 "weight without its weight_scale or a "
				 "readable I64/I32 [2] weight_shape");
	why = w4_check(t, s, shape, &qi);
	if (!why)
		why = w4_zp_check(zp, s, shape, q->flags);
	if (why)
		return w4_reject(d, t, why);
	if (zp) {
		qi.zp = (uint32_t)(zp - h->tensors) + 1;
		q->t[zp - h->tensors].role = CASTFS_QR_SCALE;
	}
	qi.scale = (uint32_t)(s - h->tensors);
	q->t[t - h->tensors] = qi;
	q->t[s - h->tensors].role = CASTFS_QR_SCALE;
	q->t[ws - h->tensors].role = CASTFS_QR_SCALE;
	q->nctw4++;
	return 0;
}

/* XSHARD: the companions whose weight_packed is not in this file are
 * held and counted (their weight may be in another shard). */
static void w4_orphans(const struct castfs_header *h, struct castfs_qsrc *q)
{
	static const char *const leaves[] = { "weight_scale", "weight_shape",
					      "weight_zero_point" };
	size_t mod;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		for (size_t k = 0; q->t[i].role == CASTFS_QR_PLAIN && k < 3;
		     k++) {
			if (!castfs_qsrc_leaf(t, leaves[k], &mod) ||
			    castfs_qsrc_sibling(h, t, t->name_len - mod,
						"weight_packed", NULL))
				continue;
			q->t[i].role = CASTFS_QR_SCALE;
			q->nxshard++;
		}
	}
}

int castfs_qsrc_ctw4(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d)
{
	int rc = 0;

	if ((q->flags & CASTFS_QSRC_XSHARD) &&
	    (q->flags & (CASTFS_QSRC_W4SYM | CASTFS_QSRC_W4ASYM)))
		w4_orphans(h, q);

	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		size_t mod;

		if (t->dtype == CASTFS_DTYPE_I32 &&
		    castfs_qsrc_leaf(t, "weight_packed", &mod) &&
		    q->t[i].role == CASTFS_QR_PLAIN)
			rc = w4_pair(h, q, t, d);
	}
	return rc;
}
