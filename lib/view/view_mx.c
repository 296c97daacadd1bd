/* SPDX-License-Identifier: MIT */
/*
 * gpt-oss MXFP4 experts in a view: the tensor transformers' bf16 GptOss
 * model has, "P" = convert_moe_packed_tensors(P_blocks, P_scales), that is
 * the dequantized [E, R, 32 G] matrix transposed to [E, 32 G, R]
 * (CASTFS_OP_DEQ_MXFP4). Its scales are left out by the caller.
 */
#include <errno.h>

#include "kernels/convert.h"
#include "view/view_internal.h"

int castfs_view_add_mxfp4(struct castfs_pb *pb, const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_tensor *t,
			  const struct castfs_qinfo *qi, struct castfs_diag *d)
{
	const struct castfs_tensor *s = &h->tensors[qi->scale];
	/* The views that quantise matrices keep fused 3-D experts, as they
	 * keep fused FP8 experts: in BF16, transformers' own dtype. */
	enum castfs_dtype dt = v->kind == CASTFS_VIEW_CAST ? v->dtype :
							     CASTFS_DTYPE_BF16;
	unsigned flags = v->kind == CASTFS_VIEW_CAST ? v->cvt_flags : 0;
	uint64_t rows = t->shape[1], cols = t->shape[2] * CASTFS_MX_BLOCK;
	uint64_t shape[3] = { t->shape[0], cols, rows };
	struct castfs_qtensor qt = {
		.src_off = h->data_start + t->begin,
		.nelems = t->shape[0] * rows * cols,
		.rows = rows,
		.cols = cols,
		.src_dtype = (uint8_t)t->dtype,
		.scale_off = h->data_start + s->begin,
		.srows = rows,
		.scols = t->shape[2],
		.brows = 1,
		.bcols = CASTFS_MX_BLOCK,
		.scale_dtype = (uint8_t)s->dtype,
	};

	return castfs_view_add_dequant(pb, v, &qt, CASTFS_OP_DEQ_MXFP4, t->name,
				       t->name_len - (sizeof("_blocks") - 1),
				       dt, flags, 3, shape, d);
}
