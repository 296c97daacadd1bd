/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 loops of the scaled-fp8 views (quant_ct.c's castfs_ct_kernels):
 * quant_ct_avx2.c's lanes, 16 per register and 64 per step, the tail by
 * masked loads and stores. AVX-512 F/BW/VL only, what the dispatcher checks.
 */
#include <math.h>

#include "common/bytes.h"
#include "quant/quant_ct_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include "quant/quant_avx512_util.h"

/* No "fma": nothing here may be contracted (quant_internal.h). */
#define AVX512 CASTFS_Q_AVX512_WIDE
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512

static inline AVX512 __m512i set1u(uint32_t v)
{
	return _mm512_set1_epi32((int)v);
}

/* The lanes of a tail of @left elements (all 16 from 16 up). */
static inline __mmask16 ct_mask16(size_t left)
{
	return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* castfs_qr_e4m3() of 16 lanes, as ct_e4m3_8() in quant_ct_avx2.c. */
AVX512_INLINE __m512i ct_e4m3_16(__m512 q, bool nan_free)
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
	if (!nan_free)
		r = _mm512_mask_mov_epi32(
			r, _mm512_cmpge_epi32_mask(a, set1u(1087u << 20)),
			set1u(0x7f));
	return _mm512_or_si512(r, _mm512_srli_epi32(sign, 24));
}

/* ct_code8_bf16() of 16 lanes: every NaN quotient is code 0x7F. */
AVX512_INLINE __m512i ct_code16_bf16(__m512 q, bool mul)
{
	__m512i u = _mm512_castps_si512(q), r;
	__mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);

	r = _mm512_and_si512(_mm512_srli_epi32(u, 16), set1u(1));
	r = _mm512_add_epi32(_mm512_add_epi32(u, set1u(0x7fff)), r);
	q = _mm512_castsi512_ps(_mm512_and_si512(r, set1u(0xffff0000u)));
	if (!mul)
		q = _mm512_add_ps(q, _mm512_setzero_ps());
	q = _mm512_min_ps(_mm512_set1_ps(CASTFS_CT_F8_MAX), q);
	q = _mm512_max_ps(_mm512_set1_ps(-CASTFS_CT_F8_MAX), q);
	return _mm512_mask_mov_epi32(ct_e4m3_16(q, true), nan, set1u(0x7f));
}

/* castfs_qr_round() of 16 lanes to F16 (F16C's rounding, as ct_round8()),
 * or of F32 (nothing to do). */
AVX512_INLINE __m512 ct_round16(__m512 v, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F16)
		return _mm512_cvtph_ps(
			_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
	return v;
}

/* The E4M3 codes of 16 elements, as ct_code8() in quant_ct_avx2.c. */
AVX512_INLINE __m512i ct_code16(__m512 v, __m512 s, enum castfs_dtype dt,
				bool mul)
{
	__m512 q;

	if (dt == CASTFS_DTYPE_BF16)
		return ct_code16_bf16(
			mul ? _mm512_mul_ps(v, s) : _mm512_div_ps(v, s), mul);
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
	q = _mm512_min_ps(_mm512_set1_ps(CASTFS_CT_F8_MAX), q);
	q = _mm512_max_ps(_mm512_set1_ps(-CASTFS_CT_F8_MAX), q);
	return ct_e4m3_16(q, false);
}

/* Four registers of 16 codes (each < 256) stored as 64 bytes in order. */
AVX512_INLINE void ct_store64(uint8_t *dst, __m512i a, __m512i b, __m512i c,
			      __m512i d)
{
	__m512i r = _mm512_packus_epi16(_mm512_packus_epi32(a, b),
					_mm512_packus_epi32(c, d));

	/* The packs work per 128-bit lane: lane k holds 4 codes of a, of
	 * b, of c, of d, each from their 4k-th on. */
	r = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
						       2, 6, 10, 14, 3, 7, 11,
						       15),
				     r);
	_mm512_storeu_si512(dst, r);
}

/* The codes of float32 @x[0..@n). */
AVX512_INLINE void ct_loop(uint8_t *dst, const float *x, size_t n, float s,
			   enum castfs_dtype dt, bool mul)
{
	__m512 sv = _mm512_set1_ps(s);
	size_t i = 0;

	for (; i + 64 <= n; i += 64)
		ct_store64(dst + i,
			   ct_code16(_mm512_loadu_ps(x + i), sv, dt, mul),
			   ct_code16(_mm512_loadu_ps(x + i + 16), sv, dt, mul),
			   ct_code16(_mm512_loadu_ps(x + i + 32), sv, dt, mul),
			   ct_code16(_mm512_loadu_ps(x + i + 48), sv, dt, mul));
	for (; i < n; i += 16) {
		__mmask16 k = ct_mask16(n - i);

		_mm512_mask_cvtepi32_storeu_epi8(
			dst + i, k,
			ct_code16(_mm512_maskz_loadu_ps(k, x + i), sv, dt,
				  mul));
	}
}

/* ct_loop() with the weight dtype @dt a constant: one loop per dtype,
 * so that the rounding's branch leaves the loop. */
static inline AVX512 void ct_by_dtype(uint8_t *dst, const float *x, size_t n,
				      float s, enum castfs_dtype dt, bool mul)
{
	if (dt == CASTFS_DTYPE_BF16)
		ct_loop(dst, x, n, s, CASTFS_DTYPE_BF16, mul);
	else if (dt == CASTFS_DTYPE_F16)
		ct_loop(dst, x, n, s, CASTFS_DTYPE_F16, mul);
	else
		ct_loop(dst, x, n, s, CASTFS_DTYPE_F32, mul);
}

/* 16 BF16 (F16 when @dt is) values widened to float32, exactly, as
 * ct_widen8() in quant_ct_avx2.c. */
AVX512_INLINE __m512 ct_widen16(__m256i h, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(
		_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 codes of the 16-bit elements at @p (32 bytes). */
AVX512_INLINE __m512i ct_code16_at(const uint8_t *p, __m512 s,
				   enum castfs_dtype dt)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);

	return ct_code16(ct_widen16(h, dt), s, dt, false);
}

/* ct_loop() of 16-bit elements. */
AVX512_INLINE void ct_loop16(uint8_t *dst, const uint8_t *p, size_t n, float s,
			     enum castfs_dtype dt)
{
	__m512 sv = _mm512_set1_ps(s);
	size_t i = 0;

	for (; i + 64 <= n; i += 64)
		ct_store64(dst + i, ct_code16_at(p + 2 * i, sv, dt),
			   ct_code16_at(p + 2 * i + 32, sv, dt),
			   ct_code16_at(p + 2 * i + 64, sv, dt),
			   ct_code16_at(p + 2 * i + 96, sv, dt));
	for (; i < n; i += 16) {
		__mmask16 k = ct_mask16(n - i);
		__m256i h = _mm256_maskz_loadu_epi16(k, p + 2 * i);

		_mm512_mask_cvtepi32_storeu_epi8(dst + i, k,
						 ct_code16(ct_widen16(h, dt),
							   sv, dt, false));
	}
}

/* castfs_ct_f8_codes16(): one loop per dtype, as ct_by_dtype(). */
static AVX512 void ct_f8_codes16_avx512(uint8_t *dst, const void *x, size_t n,
					float scale, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F16)
		ct_loop16(dst, x, n, scale, CASTFS_DTYPE_F16);
	else
		ct_loop16(dst, x, n, scale, CASTFS_DTYPE_BF16);
}

static AVX512 void ct_f8_codes_avx512(uint8_t *dst, const float *x, size_t n,
				      float scale, enum castfs_dtype dt)
{
	ct_by_dtype(dst, x, n, scale, dt, false);
}

static AVX512 void comfy_codes_avx512(uint8_t *dst, const float *x, size_t n,
				      float inv, enum castfs_dtype dt)
{
	ct_by_dtype(dst, x, n, inv, dt, true);
}

/*
 * The AVX512_BF16 variant of the BF16 codes16 loop: vcvtne2ps2bf16 rounds
 * two quotient registers to BF16 in one instruction (RNE, as
 * castfs_qr_bf16_bits(), but subnormal inputs flushed to zero), then the
 * E4M3 narrowing runs on 32 16-bit lanes. A quotient below 2^-126 gives
 * E4M3 magnitude 0 either way (BF16 keeps it, E4M3 flushes it below 2^-10),
 * so the flush only loses the sign, which is taken from the quotient:
 * the scalar's BF16 rounding plus the zero point is negative exactly when
 * q < -2^-134 (half the least BF16 subnormal ties to -0.0, then +0.0).
 */
#define AVX512BF16                                                         \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2," \
			      "f16c")))
#define AVX512BF16_INLINE \
	static inline __attribute__((always_inline)) AVX512BF16

static inline AVX512BF16 __m512i set1w(uint16_t v)
{
	return _mm512_set1_epi16((short)v);
}

/* RNE of @m >> @k per 16-bit lane, @k in 1..15. */
AVX512BF16_INLINE __m512i ct_rne_srlv16(__m512i m, __m512i k)
{
	__m512i bias = _mm512_srlv_epi16(set1w(0x7fff),
					 _mm512_sub_epi16(set1w(16), k));
	__m512i odd = _mm512_and_si512(_mm512_srlv_epi16(m, k), set1w(1));

	return _mm512_srlv_epi16(
		_mm512_add_epi16(_mm512_add_epi16(m, bias), odd), k);
}

/*
 * The E4M3 magnitude codes of BF16 magnitudes @a <= 448 (0x43E0): below
 * 2^-6 (0x3C80) E4M3 is subnormal, the code RNE(|v| * 2^9), i.e. the 8-bit
 * significand shifted right by 125 - exponent (capped at 15, which gives 0,
 * as for a = 0); above, the BF16 bits rebiased and RNE-shifted by 4.
 */
AVX512BF16_INLINE __m512i ct_e4m3_bf16x32(__m512i a)
{
	__m512i odd = _mm512_and_si512(_mm512_srli_epi16(a, 4), set1w(1));
	__m512i r = _mm512_srli_epi16(
		_mm512_add_epi16(
			_mm512_add_epi16(a, set1w((uint16_t)(7 - (120 << 7)))),
			odd),
		4);
	__m512i k = _mm512_min_epu16(_mm512_sub_epi16(set1w(125),
						      _mm512_srli_epi16(a, 7)),
				     set1w(15));
	__m512i m =
		_mm512_or_si512(_mm512_and_si512(a, set1w(0x7f)), set1w(0x80));

	return _mm512_mask_mov_epi16(r,
				     _mm512_cmplt_epu16_mask(a, set1w(0x3c80)),
				     ct_rne_srlv16(m, k));
}

/*
 * Whether @s may be divided by as a product by r = 1/s (rounded to
 * float32): s a positive BF16 value (low 16 bits zero) with 1/s normal.
 * Then every BF16 x gets the division's code from x * r:
 * - x / s = (m / n) 2^k with integers m < 256 and 128 <= n < 256 lies more
 *   than 2^-16 of its binade's width from every BF16 tie (on a tie, m / n
 *   would be a 9-bit odd significand times a power of two, yet n's odd
 *   part divides m < 256), while both float32 results lie within 2^-21 of
 *   that width of it (two roundings of relative error 2^-24): the same
 *   BF16 rounding wherever x / s is normal (above 448 both clamp);
 * - where it is not, the magnitude's code is 0 either way (below 2^-10)
 *   and the sign (q < -2^-134, ct_code32_bf16()) agrees: x / s is exactly
 *   -2^-134 or more than 2^-143 from it, and both float32 results lie
 *   within 2^-149 of x / s (exactly -2^-134 there).
 * test_ct_kernels checks it over every BF16 x at thousands of scales.
 */
static inline bool ct_recip_exact(float s)
{
	return (castfs_f32_bits(s) & 0xffffu) == 0 && s >= 0x1p-125f &&
	       s <= 0x1p125f;
}

/* The codes (in 16-bit lanes) of the 32 BF16 elements @lo, @hi over @s
 * (by its reciprocal @r when @mul). */
AVX512BF16_INLINE __m512i ct_code32_bf16(__m256i lo, __m256i hi, __m512 s,
					 __m512 r, bool mul)
{
	__m512 xl = ct_widen16(lo, CASTFS_DTYPE_BF16);
	__m512 xh = ct_widen16(hi, CASTFS_DTYPE_BF16);
	__m512 ql = mul ? _mm512_mul_ps(xl, r) : _mm512_div_ps(xl, s);
	__m512 qh = mul ? _mm512_mul_ps(xh, r) : _mm512_div_ps(xh, s);
	__m512 neg0 = _mm512_set1_ps(-0x1p-134f);
	__mmask32 neg =
		_mm512_kunpackw(_mm512_cmp_ps_mask(qh, neg0, _CMP_LT_OQ),
				_mm512_cmp_ps_mask(ql, neg0, _CMP_LT_OQ));
	__m512i a = _mm512_and_si512((__m512i)_mm512_cvtne2ps_pbh(qh, ql),
				     set1w(0x7fff));
	__mmask32 nan = _mm512_cmpgt_epu16_mask(a, set1w(0x7f80));
	__m512i r16 = ct_e4m3_bf16x32(_mm512_min_epu16(a, set1w(0x43e0)));

	r16 = _mm512_mask_mov_epi16(r16, neg,
				    _mm512_or_si512(r16, set1w(0x80)));
	return _mm512_mask_mov_epi16(r16, nan, set1w(0x7f));
}

/* The BF16 codes loop, by the reciprocal when @mul. */
AVX512BF16_INLINE void ct_loop_bf16x32(uint8_t *dst, const uint8_t *p, size_t n,
				       float scale, bool mul)
{
	__m512 sv = _mm512_set1_ps(scale);
	__m512 rv = _mm512_set1_ps(mul ? 1.0f / scale : 1.0f);
	size_t i = 0;

	for (; i + 32 <= n; i += 32)
		_mm256_storeu_si256(
			(__m256i *)(void *)(dst + i),
			_mm512_cvtepi16_epi8(ct_code32_bf16(
				_mm256_loadu_si256(
					(const __m256i *)(const void *)(p +
									2 * i)),
				_mm256_loadu_si256(
					(const __m256i *)(const void *)(p +
									2 * i +
									32)),
				sv, rv, mul)));
	if (i < n) {
		__mmask32 k = (__mmask32)((1ull << (n - i)) - 1u);

		_mm512_mask_cvtepi16_storeu_epi8(
			dst + i, k,
			ct_code32_bf16(
				_mm256_maskz_loadu_epi16((__mmask16)k,
							 p + 2 * i),
				_mm256_maskz_loadu_epi16((__mmask16)(k >> 16),
							 p + 2 * i + 32),
				sv, rv, mul));
	}
}

/* ct_loop16() of BF16 elements, 32 codes per ct_code32_bf16(). */
static AVX512BF16 void ct_f8_codes16_avx512bf16(uint8_t *dst, const void *x,
						size_t n, float scale,
						enum castfs_dtype dt)
{
	if (dt != CASTFS_DTYPE_BF16)
		ct_f8_codes16_avx512(dst, x, n, scale, dt);
	else if (ct_recip_exact(scale))
		ct_loop_bf16x32(dst, x, n, scale, true);
	else
		ct_loop_bf16x32(dst, x, n, scale, false);
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
	for (; i < n; i += 16)
		m0 = _mm512_max_epi32(
			m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(
						     ct_mask16(n - i), x + i),
					     abs));
	m = _mm512_reduce_max_epi32(_mm512_max_epi32(m0, m1));
	return m > 0x7f800000 ? NAN : castfs_f32_from_bits((uint32_t)m);
}

/* The largest of the 32 unsigned 16-bit lanes of @v. */
static inline AVX512 uint32_t max_epu16(__m512i v)
{
	__m256i h = _mm256_max_epu16(_mm512_castsi512_si256(v),
				     _mm512_extracti64x4_epi64(v, 1));
	__m128i l = _mm_max_epu16(_mm256_castsi256_si128(h),
				  _mm256_extracti128_si256(h, 1));

	l = _mm_max_epu16(l, _mm_shuffle_epi32(l, 0x4e));
	l = _mm_max_epu16(l, _mm_shuffle_epi32(l, 0xb1));
	l = _mm_max_epu16(l, _mm_srli_epi32(l, 16));
	return (uint32_t)_mm_cvtsi128_si32(l) & 0xffffu;
}

/* castfs_ct_absmax16(): an unsigned max of the 16-bit magnitudes. */
static AVX512 float ct_absmax16_avx512(const void *x, size_t n, bool f16)
{
	const uint8_t *p = x;
	__m512i m0 = _mm512_setzero_si512(), m1 = m0;
	__m512i abs = _mm512_set1_epi16(0x7fff);
	size_t i = 0;

	for (; i + 64 <= n; i += 64) {
		m0 = _mm512_max_epu16(
			m0,
			_mm512_and_si512(_mm512_loadu_si512(p + 2 * i), abs));
		m1 = _mm512_max_epu16(
			m1, _mm512_and_si512(_mm512_loadu_si512(p + 2 * i + 64),
					     abs));
	}
	for (; i < n; i += 32) {
		__mmask32 k = n - i >= 32 ? (__mmask32)0xffffffffu :
					    (__mmask32)((1u << (n - i)) - 1u);

		m0 = _mm512_max_epu16(
			m0,
			_mm512_and_si512(_mm512_maskz_loadu_epi16(k, p + 2 * i),
					 abs));
	}
	return castfs_ct_from16(max_epu16(_mm512_max_epu16(m0, m1)), f16);
}

const struct castfs_ct_kernels castfs_ct_avx512 = {
	.f8_codes = ct_f8_codes_avx512,
	.f8_codes16 = ct_f8_codes16_avx512,
	.comfy_codes = comfy_codes_avx512,
	.absmax = ct_absmax_avx512,
	.absmax16 = ct_absmax16_avx512,
};

const struct castfs_ct_kernels castfs_ct_avx512bf16 = {
	.f8_codes = ct_f8_codes_avx512,
	.f8_codes16 = ct_f8_codes16_avx512bf16,
	.comfy_codes = comfy_codes_avx512,
	.absmax = ct_absmax_avx512,
	.absmax16 = ct_absmax16_avx512,
};
#endif
