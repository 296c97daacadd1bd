/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes 4-bit source weights in a view: "P" with the true shape
 * and the values bnb's dequantize_4bit gives (in its quant_state dtype),
 * cast to the view's dtype (CASTFS_OP_DEQ_Q4). Its companions are left
 * out by the caller. The views that quantise again (nf4, int8, the
 * compressed-tensors ones) quantise the bf16 view's values of a weight
 * they convert (castfs_view_requant) and keep the others as bf16.
 */
#include <errno.h>

#include "kernels/convert.h"
#include "view/view_internal.h"

/* The quantised-tensor record of 4-bit weight @w described by @s. */
static void q4_qtensor(const struct castfs_header *h,
		       const struct castfs_tensor *w,
		       const struct castfs_q4src *s, struct castfs_qtensor *qt)
{
	const struct castfs_tensor *abs = &h->tensors[s->absmax];

	*qt = (struct castfs_qtensor){
		.src_off = h->data_start + w->begin,
		.nelems = s->nelems,
		.rows = s->ndim > 1 ? s->nelems / s->shape[s->ndim - 1] : 1,
		.cols = s->shape[s->ndim - 1],
		.blocksize = s->blocksize,
		.src_dtype = CASTFS_DTYPE_U8,
		.qtype = s->qtype,
		.nested = s->nested,
		.scale_off = h->data_start + abs->begin,
		.scale_dtype = (uint8_t)abs->dtype,
		.out_round = s->dtype,
		/* bnb's C kernel decodes FP4 code 8 as -0.0; an odd last
		 * dimension takes its Python fallback, whose table has +0.0
		 * (docs/FORMATS.md, "bitsandbytes 4-bit sources"). */
		.fp4_negzero = s->qtype == CASTFS_Q_FP4 &&
			       s->shape[s->ndim - 1] % 2 == 0,
	};
	if (s->nested) {
		qt->nabs_off =
			h->data_start + h->tensors[s->nested_absmax].begin;
		qt->nmap_off =
			h->data_start + h->tensors[s->nested_quant_map].begin;
		qt->nested_block = s->nested_blocksize;
		qt->noffset = s->offset;
	}
}

int castfs_view_add_bnb4(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *w,
			 const struct castfs_q4src *s, struct castfs_diag *d)
{
	enum castfs_dtype dt = v->dtype;
	unsigned flags = v->cvt_flags;
	struct castfs_qtensor qt;

	q4_qtensor(h, w, s, &qt);
	if (v->kind != CASTFS_VIEW_CAST) {
		/* The view's rules see the bf16 view's weight. */
		struct castfs_tensor wb = *w;

		wb.dtype = CASTFS_DTYPE_BF16;
		wb.ndim = s->ndim;
		wb.shape = s->shape;
		wb.nelems = s->nelems;
		if (s->ndim == 2 && castfs_view_converts(v, &wb))
			return castfs_view_requant(pb, v, h, &wb, &qt,
						   CASTFS_OP_DEQ_Q4, d);
		dt = CASTFS_DTYPE_BF16; /* kept as the bf16 view has it */
		flags = 0;
	}
	return castfs_view_add_dequant(pb, v, &qt, CASTFS_OP_DEQ_Q4, w->name,
				       w->name_len, dt, flags, s->ndim,
				       s->shape, d);
}
