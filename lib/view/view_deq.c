/* SPDX-License-Identifier: MIT */
/*
 * Cast views of a quantized source: every FP8 block weight becomes its
 * dequantized values in the view's dtype (CASTFS_OP_DEQ_FP8), its scale is
 * left out, and every other tensor is cast or copied as in any cast view.
 */
#include <errno.h>

#include "kernels/convert.h"
#include "view/view_internal.h"

/* The quantised-tensor record of FP8 block weight @w with scale @s. */
static void fp8_qtensor(const struct castfs_header *h,
			const struct castfs_tensor *w,
			const struct castfs_tensor *s,
			const struct castfs_qinfo *qi,
			struct castfs_qtensor *qt)
{
	*qt = (struct castfs_qtensor){
		.src_off = h->data_start + w->begin,
		.nelems = w->nelems,
		.rows = w->shape[w->ndim - 2],
		.cols = w->shape[w->ndim - 1],
		.src_dtype = (uint8_t)w->dtype,
		.scale_off = h->data_start + s->begin,
		.srows = s->ndim >= 2 ? s->shape[s->ndim - 2] : 1,
		.scols = s->ndim >= 2 ? s->shape[s->ndim - 1] : 1,
		.brows = qi->brows,
		.bcols = qi->bcols,
		.scale_dtype = (uint8_t)s->dtype,
	};
}

static int add_fp8(struct castfs_pb *pb, const struct castfs_view *v,
		   const struct castfs_header *h, const struct castfs_tensor *w,
		   const struct castfs_qinfo *qi, struct castfs_diag *d)
{
	unsigned flags = v->cvt_flags;
	struct castfs_qtensor qt;
	struct castfs_producer p;
	uint32_t idx;
	int rc;

	if (v->dtype != CASTFS_DTYPE_F8_E4M3 &&
	    v->dtype != CASTFS_DTYPE_F8_E5M2)
		flags &= ~(unsigned)CASTFS_CVT_SATURATE;
	if (!castfs_convert_get(CASTFS_DTYPE_F32, v->dtype, flags))
		return castfs_diag_set(d, -ENOTSUP,
				       "view '%s': no F32 -> %s kernel",
				       v->name, castfs_dtype_name(v->dtype));
	fp8_qtensor(h, w, &h->tensors[qi->scale], qi, &qt);
	rc = castfs_pb_add_qtensor(pb, &qt, &idx);
	if (rc)
		return rc;
	p = (struct castfs_producer){
		.op = CASTFS_OP_DEQ_FP8,
		.dst_dtype = (uint8_t)v->dtype,
		.flags = (uint8_t)flags,
		.unit = castfs_dtype_bits(v->dtype) / 8,
		.src_off = qt.src_off,
		.qt = idx,
	};
	return castfs_pb_add_tensor(pb, w->name, w->name_len, v->dtype, w->ndim,
				    w->shape, &p);
}

int castfs_view_plan_deq(const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_qsrc *q, struct castfs_plan **out,
			 struct castfs_diag *d)
{
	struct castfs_pb *pb;
	int rc = castfs_pb_new(&pb);

	if (rc)
		return rc;
	rc = castfs_view_copy_metadata(pb, h);
	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		switch ((enum castfs_qrole)q->t[i].role) {
		case CASTFS_QR_PLAIN:
			rc = castfs_view_cast_add(pb, v, h, t, d);
			break;
		case CASTFS_QR_FP8_BLOCK:
			rc = add_fp8(pb, v, h, t, &q->t[i], d);
			break;
		case CASTFS_QR_SCALE:
			break; /* folded into its weight */
		}
	}
	if (rc) {
		castfs_pb_free(pb);
		return rc;
	}
	return castfs_pb_finish_safetensors(pb, out, d);
}
