/* SPDX-License-Identifier: MIT */
/*
 * The one way a quantiser reads a quantized source: the elements of its
 * qtensor (deq_op set) are those of the source weight's dequantizer qtensor
 * (q->deq_qt, the record the cast views use) computed by that
 * dequantizer's op (q->deq_op), exactly the values the cast views compute
 * before their final cast. Every quantiser (bitsandbytes, compressed-
 * tensors) calls castfs_deq_load() and then rounds to its src_dtype
 * (BF16), so that a view of a quantized source is that view of its bf16
 * view, whatever the source kind.
 */
#include <errno.h>

#include "common/compiler.h"
#include "plan/plan_internal.h"
#include "quant/quant_round.h"

/* Elements a cast of a packed source dequantizes per round: their fp32
 * values fill the scratch's first MiB; the dequantizer reads codes and
 * scales into the rest, in rounds that fit it. */
#define DEQ_CHUNK (256u << 10)
_Static_assert(DEQ_CHUNK * 4u < CASTFS_SCRATCH_LEN,
	       "the scratch holds a round");

int castfs_gen_deq_packed(const struct castfs_read_env *env,
			  const struct castfs_extent *e, uint64_t first,
			  uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	float *f = (float *)(void *)env->s->buf;
	uint8_t *work = env->s->buf + DEQ_CHUNK * 4u;
	size_t wlen = env->s->len - DEQ_CHUNK * 4u;
	int (*deq)(const struct castfs_reader *, const struct castfs_qtensor *,
		   uint64_t, size_t, float *, uint8_t *,
		   size_t) = e->op == CASTFS_OP_DEQ_Q4 ? castfs_q4_dequant :
							 castfs_w4_dequant;
	castfs_convert_fn enc;

	enc = castfs_convert_get(CASTFS_DTYPE_F32, e->dst_dtype, e->flags);
	if (!enc)
		return -ENOTSUP; /* unreachable: the plan checked the pair */
	while (count) {
		uint64_t n = CASTFS_MIN(count, (uint64_t)DEQ_CHUNK);
		int rc = deq(env->src, q, first, (size_t)n, f, work, wlen);

		if (rc)
			return rc;
		enc(dst, f, (size_t)n);
		dst += n * e->unit;
		first += n;
		count -= n;
	}
	return 0;
}

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

int castfs_deq_load_bf16(const struct castfs_plan *p,
			 const struct castfs_reader *src,
			 const struct castfs_qtensor *q, uint64_t k, size_t n,
			 float *f, uint8_t *work, size_t wlen)
{
	int rc = castfs_deq_load(p, src, q, k, n, f, work, wlen);

	for (size_t i = 0; !rc && i < n; i++)
		f[i] = castfs_qr_round(f[i], CASTFS_DTYPE_BF16);
	return rc;
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
