/* SPDX-License-Identifier: MIT */
/*
 * The one way a quantiser reads a quantized source: the elements of its
 * qtensor (q->deq) are those of the source weight's dequantizer qtensor
 * (q->deq_qt, the record the cast views use) computed by that
 * dequantizer's op (q->deq_op), exactly the values the cast views compute
 * before their final cast. Every quantiser (bitsandbytes, compressed-
 * tensors) calls castfs_deq_load() and then rounds to its src_dtype
 * (BF16), so that a view of a quantized source is that view of its bf16
 * view, whatever the source kind.
 */
#include <errno.h>

#include "plan/plan_internal.h"

int castfs_deq_load(const struct castfs_plan *p,
		    const struct castfs_reader *src,
		    const struct castfs_qtensor *q, uint64_t k, size_t n,
		    float *f, uint8_t *work, size_t wlen)
{
	const struct castfs_qtensor *dq = &p->qtensors[q->deq_qt];
	size_t codes = (n + 63) / 64 * 64;

	if (q->deq_op == CASTFS_OP_DEQ_Q4)
		return castfs_q4_dequant(src, dq, k, n, f, work, wlen);
	if (q->deq_op == CASTFS_OP_DEQ_W4)
		return castfs_w4_dequant(src, dq, k, n, f, work, wlen);
	if (q->deq_op != CASTFS_OP_DEQ_FP8 || wlen <= codes)
		return -ENOTSUP; /* unreachable: the view and callers see to it */
	/* n code bytes (at most), then the scale rows */
	return castfs_fp8_dequant(src, dq, k, n, f, work, work + codes,
				  wlen - codes);
}

uint64_t castfs_deq_src_off(const struct castfs_plan *p,
			    const struct castfs_qtensor *q, uint64_t k)
{
	const struct castfs_qtensor *dq = &p->qtensors[q->deq_qt];

	k = k < dq->nelems ? k : dq->nelems;
	if (q->deq_op == CASTFS_OP_DEQ_Q4) /* two codes a byte */
		return dq->src_off + k / 2;
	if (q->deq_op == CASTFS_OP_DEQ_W4)
		return castfs_w4_src_off(dq, k);
	/* DEQ_FP8: one F8 byte per element, or half one */
	return dq->src_off + (dq->code_dtype == CASTFS_DTYPE_U8 ? k / 2 : k);
}
