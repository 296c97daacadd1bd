/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 quantiser kernels: 16 elements per step, bit-identical to
 * quant_scalar.c (max is exact and order-free; the 4-bit code is found by
 * a branch-free binary search over the same float32 midpoints; int8 rounds
 * half to even explicitly, as rintf does in the default rounding mode).
 */
#include <math.h>

#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include "quant/quant_avx512_util.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* Largest finite |x| of 16 lanes folded into @acc; NaN and Inf skipped. */
static inline AVX512 __m512 absmax_step(__m512 acc, __m512 x)
{
	const __m512 fmax = _mm512_set1_ps(FLT_MAX);
	__m512 a = _mm512_abs_ps(x);
	__mmask16 finite = _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ);

	return _mm512_mask_max_ps(acc, finite, acc, a);
}

static AVX512 float absmax_block(const float *x, size_t m)
{
	__m512 acc = _mm512_setzero_ps();
	size_t i;

	for (i = 0; i + 16 <= m; i += 16)
		acc = absmax_step(acc, _mm512_loadu_ps(x + i));
	if (i < m) {
		__mmask16 k = (__mmask16)((1u << (m - i)) - 1);

		acc = absmax_step(acc, _mm512_maskz_loadu_ps(k, x + i));
	}
	return _mm512_reduce_max_ps(acc);
}

static AVX512 void absmax_avx512(float *restrict amax, const float *restrict x,
				 size_t n, size_t bs)
{
	for (size_t b = 0; b < n; b += bs)
		*amax++ = absmax_block(x + b, n - b < bs ? n - b : bs);
}

/* One binary-search step: move up @step where s exceeds mid[p + step - 1]. */
static inline AVX512 __m512i q4_step(__m512i p, __m512 s, __m512 mid, int step)
{
	__m512i idx = _mm512_add_epi32(p, _mm512_set1_epi32(step - 1));
	__m512 t = _mm512_permutexvar_ps(idx, mid);
	__mmask16 up = _mm512_cmp_ps_mask(s, t, _CMP_GT_OQ);

	return _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(step));
}

/* 16 codes of @x, packed into 8 bytes at @dst (even lanes high nibble). */
static inline AVX512 void q4_16(uint8_t *dst, const float *x, __m512 scale,
				__m512 mid, __m512i order)
{
	__m512 v = _mm512_loadu_ps(x);
	__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
	__m512 s = _mm512_maskz_mul_ps((__mmask16)~nan, v, scale);
	__m512i p = _mm512_setzero_si512();
	__m512i c, pair;

	p = q4_step(p, s, mid, 8);
	p = q4_step(p, s, mid, 4);
	p = q4_step(p, s, mid, 2);
	p = q4_step(p, s, mid, 1);
	c = _mm512_permutexvar_epi32(p, order);
	/* Each 64-bit lane holds codes 2j (low) and 2j + 1 (high). */
	pair = _mm512_or_si512(_mm512_slli_epi64(c, 4),
			       _mm512_srli_epi64(c, 32));
	_mm_storel_epi64((__m128i *)(void *)dst, _mm512_cvtepi64_epi8(pair));
}

static AVX512 void q4_avx512(uint8_t *restrict dst, const float *restrict x,
			     size_t n, size_t bs, enum castfs_qtype qt)
{
	const void *ord = castfs_q4_order[qt];
	const __m512 mid = _mm512_loadu_ps(castfs_q4_mids[qt].f);
	const __m512i order =
		_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)ord));

	for (size_t b = 0; b < n; b += bs) {
		size_t m = n - b < bs ? n - b : bs, i;
		float sc = castfs_q_scale(absmax_block(x + b, m));
		__m512 scale = _mm512_set1_ps(sc);

		for (i = 0; i + 16 <= m; i += 16)
			q4_16(dst + (b + i) / 2, x + b + i, scale, mid, order);
		if (i < m)
			castfs_q4_encode_block(dst + (b + i) / 2, x + b + i,
					       m - i, sc, qt);
	}
}

/* castfs_i8_code on 16 lanes: round half even, clamp, NaN 0, Inf +-127. */
static AVX512 void i8_avx512(int8_t *restrict dst, const float *restrict x,
			     size_t n, float scale)
{
	const __m512 lim = _mm512_set1_ps(127.0f);
	const __m512 nlim = _mm512_set1_ps(-127.0f);
	const __m512 inf = _mm512_set1_ps(INFINITY), zero = _mm512_setzero_ps();
	const __m512 vs = _mm512_set1_ps(scale);
	size_t i;

	for (i = 0; i + 16 <= n; i += 16) {
		__m512 v = _mm512_loadu_ps(x + i);
		__m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, vs),
						_MM_FROUND_TO_NEAREST_INT |
							_MM_FROUND_NO_EXC);
		__mmask16 is_inf =
			_mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_EQ_OQ);
		__mmask16 pos = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
		__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);

		r = _mm512_min_ps(_mm512_max_ps(r, nlim), lim);
		r = _mm512_mask_mov_ps(r, is_inf,
				       _mm512_mask_mov_ps(nlim, pos, lim));
		r = _mm512_mask_mov_ps(r, nan, zero);
		_mm_storeu_si128((__m128i *)(void *)(dst + i),
				 _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
	}
	castfs_i8_scalar(dst + i, x + i, n - i, scale);
}

const struct castfs_quant_kernels castfs_quant_avx512 = {
	.absmax = absmax_avx512,
	.q4 = q4_avx512,
	.i8 = i8_avx512,
	.absmax16 = castfs_absmax16_avx512,
	.q4_16 = castfs_q4_16_avx512,
	.q8 = castfs_q8_avx512,
};

#endif
