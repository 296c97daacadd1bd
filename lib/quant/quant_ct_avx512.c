/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 loops of the scaled-fp8 views (quant_ct.c's castfs_ct_kernels):
 * quant_ct_avx2.c's lanes, 16 per step, the tail by masked loads and
 * stores, the codes narrowed to bytes by vpmovdb.
 */
#include <math.h>

#include "common/bytes.h"
#include "quant/quant_ct_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include <immintrin.h>

/*
 * GCC 12's _mm512_undefined_*() initialise a variable with itself, which
 * -Winit-self reports as (maybe-)uninitialized (GCC PR 105593, fixed in 13).
 */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512

static inline AVX512 __m512i set1u(uint32_t v)
{
	return _mm512_set1_epi32((int)v);
}

/* castfs_qr_round() of 16 lanes, as ct_round8() in quant_ct_avx2.c. */
AVX512_INLINE __m512 ct_round16(__m512 v, enum castfs_dtype dt)
{
	__m512i u = _mm512_castps_si512(v), r;
	__mmask16 nan;

	if (dt == CASTFS_DTYPE_F16)
		return _mm512_cvtph_ps(
			_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
	if (dt != CASTFS_DTYPE_BF16)
		return v;
	r = _mm512_and_si512(_mm512_srli_epi32(u, 16), set1u(1));
	r = _mm512_add_epi32(_mm512_add_epi32(u, set1u(0x7fff)), r);
	r = _mm512_and_si512(r, set1u(0xffff0000u));
	nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
	r = _mm512_mask_mov_epi32(r, nan, set1u(0x7fc00000u));
	return _mm512_castsi512_ps(r);
}

/* castfs_qr_e4m3() of 16 lanes, one code per 32-bit lane. */
AVX512_INLINE __m512i ct_e4m3_16(__m512 q)
{
	__m512i u = _mm512_castps_si512(q);
	__m512i sign = _mm512_and_si512(u, set1u(0x80000000u));
	__m512i a = _mm512_xor_si512(u, sign);
	__m512i sub = _mm512_castps_si512(
		_mm512_add_ps(_mm512_castsi512_ps(a),
			      _mm512_castsi512_ps(set1u(141u << 23))));
	__m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), set1u(1));
	__m512i r =
		_mm512_add_epi32(_mm512_add_epi32(a, odd),
				 set1u(((uint32_t)(7 - 127) << 23) + 0x7ffffu));

	r = _mm512_srli_epi32(r, 20);
	sub = _mm512_sub_epi32(sub, set1u(141u << 23));
	r = _mm512_mask_mov_epi32(
		r, _mm512_cmplt_epi32_mask(a, set1u(121u << 23)), sub);
	r = _mm512_mask_mov_epi32(
		r, _mm512_cmpge_epi32_mask(a, set1u(1087u << 20)), set1u(0x7f));
	return _mm512_or_si512(r, _mm512_srli_epi32(sign, 24));
}

/* 16 codes (ct_code8() of quant_ct_avx2.c) of the lanes in @k. */
AVX512_INLINE void ct_codes16(uint8_t *dst, const float *x, __mmask16 k,
			      __m512 s, enum castfs_dtype dt, bool mul)
{
	__m512 hi = _mm512_set1_ps(CASTFS_CT_F8_MAX);
	__m512 lo = _mm512_set1_ps(-CASTFS_CT_F8_MAX);
	__m512 v = _mm512_maskz_loadu_ps(k, x), q;

	/* A NaN s gives its own NaN (see comfy_f8_q()). */
	if (mul)
		q = ct_round16(_mm512_mask_mov_ps(
				       _mm512_mul_ps(v, s),
				       _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q),
				       s),
			       dt);
	else
		q = _mm512_add_ps(ct_round16(_mm512_div_ps(v, s), dt),
				  _mm512_setzero_ps());
	/* ct_clamp_f8()'s ordered comparisons: a NaN fails both. */
	q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(q, hi, _CMP_GT_OQ), hi);
	q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(q, lo, _CMP_LT_OQ), lo);
	_mm512_mask_cvtepi32_storeu_epi8(dst, k, ct_e4m3_16(q));
}

AVX512_INLINE void ct_loop(uint8_t *dst, const float *x, size_t n, float s,
			   enum castfs_dtype dt, bool mul)
{
	__m512 sv = _mm512_set1_ps(s);
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		ct_codes16(dst + i, x + i, 0xffff, sv, dt, mul);
	if (i < n)
		ct_codes16(dst + i, x + i, (__mmask16)((1u << (n - i)) - 1u),
			   sv, dt, mul);
}

static AVX512 void ct_f8_codes_avx512(uint8_t *dst, const float *x, size_t n,
				      float scale, enum castfs_dtype dt)
{
	/* One loop per dtype: the rounding's branch leaves the loop. */
	if (dt == CASTFS_DTYPE_BF16)
		ct_loop(dst, x, n, scale, CASTFS_DTYPE_BF16, false);
	else if (dt == CASTFS_DTYPE_F16)
		ct_loop(dst, x, n, scale, CASTFS_DTYPE_F16, false);
	else
		ct_loop(dst, x, n, scale, CASTFS_DTYPE_F32, false);
}

static AVX512 void comfy_codes_avx512(uint8_t *dst, const float *x, size_t n,
				      float inv, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_BF16)
		ct_loop(dst, x, n, inv, CASTFS_DTYPE_BF16, true);
	else if (dt == CASTFS_DTYPE_F16)
		ct_loop(dst, x, n, inv, CASTFS_DTYPE_F16, true);
	else
		ct_loop(dst, x, n, inv, CASTFS_DTYPE_F32, true);
}

/* castfs_ct_absmax(): the same integer max of |x|'s bits, 32 per step. */
static AVX512 float ct_absmax_avx512(const float *x, size_t n)
{
	__m512i m0 = _mm512_setzero_si512(), m1 = m0, abs = set1u(0x7fffffffu);
	size_t i = 0;
	int32_t m;

	for (; i + 32 <= n; i += 32) {
		m0 = _mm512_max_epi32(
			m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
		m1 = _mm512_max_epi32(
			m1,
			_mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs));
	}
	for (; i < n; i += 16) {
		__mmask16 k = n - i >= 16 ? 0xffff :
					    (__mmask16)((1u << (n - i)) - 1u);

		m0 = _mm512_max_epi32(
			m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i),
					     abs));
	}
	m = _mm512_reduce_max_epi32(_mm512_max_epi32(m0, m1));
	return m > 0x7f800000 ? NAN : castfs_f32_from_bits((uint32_t)m);
}

const struct castfs_ct_kernels castfs_ct_avx512 = {
	.f8_codes = ct_f8_codes_avx512,
	.comfy_codes = comfy_codes_avx512,
	.absmax = ct_absmax_avx512,
	/* Memory-bound: the AVX2 loop (every AVX-512 CPU runs AVX2). */
	.absmax16 = castfs_ct_absmax16_avx2,
};
#endif
