/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors pack-quantized int4 source weights in a view:
 * "M.weight" with its weight_shape, the decompressor's values (in the
 * scale's dtype) cast to the view's dtype (CASTFS_OP_DEQ_W4). Its scale,
 * shape and zero-point tensors are left out by the caller. The views that quantise
 * again quantise the bf16 view's values of a weight they convert
 * (castfs_view_requant) and keep the others as bf16.
 */
#include <errno.h>

#include "format/st_side.h"
#include "kernels/convert.h"
#include "view/view_internal.h"

int castfs_view_add_ctw4(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *w,
			 const struct castfs_qinfo *qi, struct castfs_diag *d)
{
	const struct castfs_tensor *s = &h->tensors[qi->scale];
	uint64_t cols = (uint64_t)qi->bcols * s->shape[1];
	uint64_t shape[2] = { w->shape[0], cols };
	unsigned flags = v->cvt_flags;
	struct castfs_qtensor qt = {
		.src_off = h->data_start + w->begin,
		.nelems = shape[0] * cols,
		.rows = shape[0],
		.cols = cols,
		.src_dtype = CASTFS_DTYPE_I32,
		.scale_off = h->data_start + s->begin,
		.srows = s->shape[0],
		.scols = s->shape[1],
		.brows = 1,
		.bcols = qi->bcols,
		.scale_dtype = (uint8_t)s->dtype,
		.out_round = (uint8_t)s->dtype,
	};
	enum castfs_dtype dt = v->dtype;

	if (qi->zp) { /* asymmetric: its packed zero points */
		qt.w4_zp = true;
		qt.zp_off = h->data_start + h->tensors[qi->zp - 1].begin;
	}
	if (v->kind != CASTFS_VIEW_CAST) {
		/* The view's rules see the bf16 view's "M.weight". */
		struct castfs_tensor wb = *w;

		wb.name_len -= sizeof("_packed") - 1;
		wb.dtype = CASTFS_DTYPE_BF16;
		wb.ndim = 2;
		wb.shape = shape;
		wb.nelems = qt.nelems;
		if (castfs_view_converts(v, &wb))
			return castfs_view_requant(pb, v, h, &wb, &qt,
						   CASTFS_OP_DEQ_W4, d);
		dt = CASTFS_DTYPE_BF16; /* kept as the bf16 view has it */
		flags = 0;
	}
	return castfs_view_add_dequant(pb, v, &qt, CASTFS_OP_DEQ_W4, w->name,
				       w->name_len - (sizeof("_packed") - 1),
				       dt, flags, 2, shape, d);
}
