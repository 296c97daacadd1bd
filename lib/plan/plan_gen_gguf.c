/* SPDX-License-Identifier: MIT */
/*
 * The generator of GGUF quantised blocks: source elements of whole blocks
 * are read, widened to float32 and quantised by ggml's reference rules
 * (quant/quant_gguf.h, quant/quant_gguf_k.h); Q8_0 / Q4_0 of BF16 / F16
 * sources widen inside the SIMD quantiser instead. A block depends on its own
 * elements only (32, or 256 for the K-quants), so any range is computed
 * alone. The elements of a quantized source's weight are those of its
 * bf16 view (castfs_deq_load() rounded to bf16), for the blocks and for
 * the plain types (CASTFS_OP_DEQ_BF16) alike.
 */
#include <errno.h>

#include "common/compiler.h"
#include "plan/plan_internal.h"
#include "quant/quant_gguf_k.h"
#include "quant/quant_round.h"

uint64_t castfs_gguf_deq_elem(const struct castfs_qtensor *q,
			      const struct castfs_extent *e, uint64_t unit)
{
	return (e->src_off - q->src_off) / 2 + unit * q->blocksize;
}

/*
 * Elements [@k, @k + @n) of dequantizing qtensor @q as the bf16 view serves
 * them, widened to fp32 into @x; the rest of the scratch behind @x (the
 * caller keeps @n <= len / 8, so at least as much as @x) holds the codes
 * and scales while they load.
 */
static int deq_load_bf16(const struct castfs_read_env *env,
			 const struct castfs_qtensor *q, uint64_t k, size_t n,
			 float *x)
{
	uint8_t *work = (uint8_t *)(x + n);
	size_t wlen = env->s->len - n * sizeof(float);
	return castfs_deq_load_bf16(env->plan, env->src, q, k, n, x, work,
				    wlen);
}

/* Quantises @n blocks from block @first of extent @e into @dst, with @x
 * (the scratch behind it: chunk sizes keep it there) for the values. */
typedef int (*gguf_chunk_fn)(const struct castfs_read_env *env,
			     const struct castfs_extent *e,
			     const struct castfs_qtensor *q, uint64_t first,
			     size_t n, float *x, uint8_t *dst);

/* A dequantized weight's blocks: the bf16 view's elements quantised. */
static int chunk_deq(const struct castfs_read_env *env,
		     const struct castfs_extent *e,
		     const struct castfs_qtensor *q, uint64_t first, size_t n,
		     float *x, uint8_t *dst)
{
	int rc = deq_load_bf16(env, q, castfs_gguf_deq_elem(q, e, first),
			       n * q->blocksize, x);

	return rc ? rc : castfs_gguf_quantize(q->qtype, dst, x, n);
}

/*
 * @n blocks of source elements @raw (of @q->src_dtype) quantised into
 * @dst: BF16 and F16 straight into the Q8_0 / Q4_0 kernels, which widen in
 * registers (the same bytes, one pass over memory fewer); otherwise
 * widened into @x first.
 */
static int quantize_raw(const struct castfs_qtensor *q, uint8_t *dst,
			uint8_t *raw, float *x, size_t n)
{
	bool f16 = q->src_dtype == CASTFS_DTYPE_F16;
	castfs_convert_fn widen, to16, from16;
	size_t nel = n * q->blocksize;
	int rc = -ENOTSUP;

	if (f16 || q->src_dtype == CASTFS_DTYPE_BF16)
		rc = castfs_gguf_quantize16(q->qtype, dst, raw, n, f16);
	if (rc != -ENOTSUP)
		return rc;
	widen = castfs_convert_get(q->src_dtype, CASTFS_DTYPE_F32, 0);
	to16 = castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F16, 0);
	from16 = castfs_convert_get(CASTFS_DTYPE_F16, CASTFS_DTYPE_F32, 0);
	if (!widen || !to16 || !from16)
		return -EIO; /* unreachable: checked by the caller */
	if (q->via_f16 && q->src_dtype == CASTFS_DTYPE_F64) {
		/* numpy rounds a double to half once (convert.py); the
		 * halves in x's bytes, widened into raw's (2n, 4n <= 8n) */
		castfs_convert_get(CASTFS_DTYPE_F64, CASTFS_DTYPE_F16,
				   CASTFS_CVT_ONE_ROUNDING)(x, raw, nel);
		from16(raw, x, nel);
		return castfs_gguf_quantize(q->qtype, dst, (const float *)raw,
					    n);
	}
	widen(x, raw, nel);
	if (q->via_f16) { /* through raw's bytes, read already */
		to16(raw, x, nel);
		from16(x, raw, nel);
	}
	return castfs_gguf_quantize(q->qtype, dst, x, n);
}

/* Stored elements, read behind @x and quantised. */
static int chunk_src(const struct castfs_read_env *env,
		     const struct castfs_extent *e,
		     const struct castfs_qtensor *q, uint64_t first, size_t n,
		     float *x, uint8_t *dst)
{
	size_t in_sz = castfs_dtype_bits(q->src_dtype) / 8;
	size_t nel = n * q->blocksize;
	uint8_t *raw = (uint8_t *)(x + nel);
	/* e->src_off is the extent's first element: a tensor with permuted
	 * rows has one extent per row (modeldir_gguf.c) */
	int rc = castfs_reader_read(env->src, raw, nel * in_sz,
				    e->src_off + first * q->blocksize * in_sz);

	return rc ? rc : quantize_raw(q, dst, raw, x, n);
}

/* Blocks [@first, @first + @count) of @e into @dst, @chunk at a time. */
static int gguf_blocks(const struct castfs_read_env *env,
		       const struct castfs_extent *e,
		       const struct castfs_qtensor *q, uint64_t first,
		       uint64_t count, uint8_t *dst, size_t chunk,
		       gguf_chunk_fn fn)
{
	float *x = (float *)(void *)env->s->buf;

	while (count) {
		size_t n = (size_t)CASTFS_MIN(count, chunk);
		int rc = fn(env, e, q, first, n, x, dst);

		if (rc)
			return rc;
		dst += n * e->unit;
		first += n;
		count -= n;
	}
	return 0;
}

int castfs_gen_gguf_blocks(const struct castfs_read_env *env,
			   const struct castfs_extent *e, uint64_t first,
			   uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	size_t in_sz = castfs_dtype_bits(q->src_dtype) / 8;
	size_t qk = q->blocksize;
	/* float32 values first, the source bytes (or a dequantizer's codes
	 * and scales, deq_load_bf16()) behind them */
	size_t per_block = qk * (sizeof(float) + in_sz);
	size_t chunk;

	if (castfs_qtensor_deq(q)) {
		chunk = qk ? env->s->len / 8 / qk : 0;
		if (!chunk || q->src_dtype != CASTFS_DTYPE_BF16)
			return -EIO; /* unreachable: the plan made it so */
		return gguf_blocks(env, e, q, first, count, dst, chunk,
				   chunk_deq);
	}
	chunk = per_block ? env->s->len / per_block : 0;
	if (!castfs_convert_get(q->src_dtype, CASTFS_DTYPE_F32, 0) || !chunk)
		return -EIO;
	return gguf_blocks(env, e, q, first, count, dst, chunk, chunk_src);
}

int castfs_gen_deq_bf16(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	size_t chunk = env->s->len / 8;
	float *x = (float *)(void *)env->s->buf;
	/* bf16-exact fp32 values: F32 -> F16 / BF16 / F32 of them is the
	 * cast of the bf16 element (one rounding, never two) */
	castfs_convert_fn enc =
		castfs_convert_get(CASTFS_DTYPE_F32, e->dst_dtype, 0);

	if (!enc || !castfs_qtensor_deq(q) || q->blocksize != 1)
		return -EIO; /* unreachable: the plan made it so */
	while (count) {
		size_t n = (size_t)CASTFS_MIN(count, chunk);
		int rc = deq_load_bf16(env, q,
				       castfs_gguf_deq_elem(q, e, first), n, x);

		if (rc)
			return rc;
		enc(dst, x, n);
		dst += n * e->unit;
		first += n;
		count -= n;
	}
	return 0;
}
