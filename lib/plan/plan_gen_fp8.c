/* SPDX-License-Identifier: MIT */
/*
 * The FP8 block dequantizer: each F8_E4M3 element times the scale of its
 * block in one fp32 multiply (DeepSeek's weight_dequant kernel, and
 * transformers' CPU dequantization), then the view's cast of that fp32
 * value. A range reads only its elements and the scale rows they need.
 */
#include <errno.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"
#include "quant/quant_round.h"

/* Elements per round: their codes and fp32 values use 5/8 of the
 * scratch; the scale rows they need (bounded at plan time) the rest. */
#define DEQ_CHUNK (128u << 10)

/*
 * E8M0: 2^(b - 127), exactly as torch's float8_e8m0fnu -> float32: the
 * byte is the fp32 exponent field; 0 is 2^-127 (an fp32 subnormal), 0xFF
 * is NaN.
 */
static float e8m0_value(uint8_t b)
{
	if (b == 0xFF)
		return castfs_f32_from_bits(0x7FC00000u);
	if (b == 0)
		return castfs_f32_from_bits(0x00400000u);
	return castfs_f32_from_bits((uint32_t)b << 23);
}

/* @s rounded to dtype @dt and back (RNE, as torch's .to(dt)). */
static float scale_rounded(float s, enum castfs_dtype dt)
{
	castfs_convert_fn to = castfs_convert_get(CASTFS_DTYPE_F32, dt, 0);
	castfs_convert_fn back = castfs_convert_get(dt, CASTFS_DTYPE_F32, 0);
	uint8_t half[2];

	if (!to || !back)
		return s; /* unreachable: every ISA has both */
	to(half, &s, 1);
	back(&s, half, 1);
	return s;
}

static float scale_at(const struct castfs_qtensor *q, const uint8_t *row,
		      uint64_t b)
{
	float s;

	if (q->scale_dtype == CASTFS_DTYPE_F8_E8M0)
		return e8m0_value(row[b]);
	if (q->scale_dtype == CASTFS_DTYPE_BF16)
		return castfs_f32_from_bits(
			(uint32_t)castfs_load_le16(row + 2 * b) << 16);
	if (q->scale_dtype == CASTFS_DTYPE_F16)
		return castfs_qr_f16_value(castfs_load_le16(row + 2 * b));
	s = castfs_f32_from_bits(castfs_load_le32(row + 4 * b));
	if (q->scale_round)
		s = scale_rounded(s, (enum castfs_dtype)q->scale_round);
	return s;
}

static size_t scale_size(const struct castfs_qtensor *q)
{
	if (q->scale_dtype == CASTFS_DTYPE_F8_E8M0)
		return 1;
	return q->scale_dtype == CASTFS_DTYPE_BF16 ||
			       q->scale_dtype == CASTFS_DTYPE_F16 ?
		       2 :
		       4;
}

/*
 * A BF16 scale (compressed-tensors): the decompressor multiplies in the
 * scale's dtype, so the exact fp32 product (4 x 8 significant bits) is
 * rounded to bf16, to nearest even, as torch's bf16 multiply rounds it.
 */
static float round_bf16(float f)
{
	uint32_t u = castfs_f32_bits(f);

	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return f; /* NaN: kept, the view's cast makes it canonical */
	u += 0x7FFFu + ((u >> 16) & 1u);
	return castfs_f32_from_bits(u & 0xFFFF0000u);
}

/*
 * Multiply the @n values @f of matrix elements [@in, @in + @n) by their
 * block's scale; @raw holds the scale rows from grid row @g0 on.
 */
static void deq_scale(const struct castfs_qtensor *q, float *f, uint64_t in,
		      size_t n, const uint8_t *raw, uint64_t g0)
{
	uint64_t r = in / q->cols, c = in % q->cols;
	size_t i = 0, ssz = scale_size(q);

	while (i < n) {
		const uint8_t *row = raw + (r / q->brows - g0) * q->scols * ssz;
		uint64_t b = c / q->bcols;
		size_t run = (size_t)CASTFS_MIN((uint64_t)(n - i),
						(b + 1) * q->bcols - c);
		float s = scale_at(q, row, b);

		run = (size_t)CASTFS_MIN((uint64_t)run, q->cols - c);
		/* One fp32 multiply per element, as the references do. */
		for (size_t j = 0; j < run; j++)
			f[i + j] = f[i + j] * s;
		if (q->prod_round == CASTFS_DTYPE_BF16) {
			for (size_t j = 0; j < run; j++)
				f[i + j] = round_bf16(f[i + j]);
		}
		i += run;
		c += run;
		if (c == q->cols) {
			c = 0;
			r++;
		}
	}
}

/* LLM.int8 codes as float32 (exact). */
static void int8_to_f32(void *restrict dst, const void *restrict src, size_t n)
{
	const int8_t *c = src;
	float *f = dst;

	for (size_t i = 0; i < n; i++)
		f[i] = (float)c[i];
}

/*
 * bitsandbytes' int8_vectorwise_dequant: A * stats * 7.874015718698502e-3,
 * the second product in fp32 with the constant rounded to fp32 (torch's
 * float tensor times a Python float), after the row scale's.
 */
static void int8_rcp(float *f, size_t n)
{
	const float rcp = (float)7.874015718698502e-3;

	for (size_t i = 0; i < n; i++)
		f[i] = f[i] * rcp;
}

/*
 * How many of the @n elements from matrix element @in fit one round: they
 * stay in their matrix and their scale rows fit @slen bytes.
 */
static size_t deq_span(const struct castfs_qtensor *q, uint64_t in, size_t n,
		       size_t slen)
{
	uint64_t mat = q->rows * q->cols, g0 = in / q->cols / q->brows;
	uint64_t groups = slen / (q->scols * scale_size(q)), end = mat;

	if (groups < q->srows - g0)
		end = (g0 + groups) * q->brows * q->cols;
	return (size_t)CASTFS_MIN((uint64_t)n, CASTFS_MIN(end, mat) - in);
}

/* One round: elements [@k, @k + @n) of one matrix, scale rows in @sbuf. */
static int deq_round(const struct castfs_reader *src,
		     const struct castfs_qtensor *q, uint64_t k, size_t n,
		     float *f, uint8_t *codes, uint8_t *sbuf)
{
	castfs_convert_fn dec =
		castfs_convert_get(CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F32, 0);
	uint64_t mat = q->rows * q->cols, m = k / mat, in = k % mat;
	uint64_t g0 = in / q->cols / q->brows;
	uint64_t g1 = (in + n - 1) / q->cols / q->brows;
	size_t ssz = scale_size(q);
	int rc;

	if (!dec)
		return -ENOTSUP; /* unreachable: every ISA has it */
	if (q->code_dtype == CASTFS_DTYPE_I8)
		dec = int8_to_f32;
	rc = castfs_reader_read(src, codes, n, q->src_off + k);
	if (!rc)
		rc = castfs_reader_read(
			src, sbuf, (size_t)((g1 - g0 + 1) * q->scols * ssz),
			q->scale_off + (m * q->srows + g0) * q->scols * ssz);
	if (rc)
		return rc;
	dec(f, codes, n);
	deq_scale(q, f, in, n, sbuf, g0);
	if (q->code_dtype == CASTFS_DTYPE_I8)
		int8_rcp(f, n);
	return 0;
}

int castfs_fp8_dequant(const struct castfs_reader *src,
		       const struct castfs_qtensor *q, uint64_t k, size_t n,
		       float *f, uint8_t *codes, uint8_t *sbuf, size_t slen)
{
	uint64_t mat = q->rows * q->cols;

	if (q->code_dtype == CASTFS_DTYPE_U8)
		return castfs_fp4_dequant(src, q, k, n, f, codes, sbuf, slen);
	while (n) {
		size_t r = deq_span(q, k % mat, n, slen);
		int rc = deq_round(src, q, k, r, f, codes, sbuf);

		if (rc)
			return rc;
		f += r;
		k += r;
		n -= r;
	}
	return 0;
}

int castfs_gen_deq_fp8(const struct castfs_read_env *env,
		       const struct castfs_extent *e, uint64_t first,
		       uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	uint64_t k = e->src_off - q->src_off + first;
	uint8_t *codes = env->s->buf, *sbuf = env->s->buf + 5 * DEQ_CHUNK;
	float *f = (float *)(void *)(env->s->buf + DEQ_CHUNK);
	castfs_convert_fn enc;

	enc = castfs_convert_get(CASTFS_DTYPE_F32, e->dst_dtype, e->flags);
	if (!enc)
		return -ENOTSUP; /* unreachable: the plan checked the pair */
	while (count) {
		size_t n = (size_t)CASTFS_MIN(count, DEQ_CHUNK);
		int rc = castfs_fp8_dequant(env->src, q, k, n, f, codes, sbuf,
					    env->s->len - 5 * DEQ_CHUNK);

		if (rc)
			return rc;
		enc(dst, f, n);
		dst += n * e->unit;
		k += n;
		count -= n;
	}
	return 0;
}
