/* SPDX-License-Identifier: MIT */
/*
 * AVX2 loops of the scaled-fp8 views (quant_ct.c's castfs_ct_kernels):
 * 8 lanes per step, each lane the scalar reference's float32 operations
 * in its order (an IEEE division or product, the dtype rounding, the zero
 * point, a NaN-keeping clamp) and the E4M3 narrowing of convert_scalar.c;
 * 16-bit weights are widened in registers (ct_widen8), not in a buffer.
 */
#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant_ct_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include <immintrin.h>

/* No "fma": nothing here may be contracted (quant_internal.h). */
#define AVX2 __attribute__((target("avx2,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline)) AVX2

static inline AVX2 __m256i set1u(uint32_t v)
{
	return _mm256_set1_epi32((int)v);
}

/*
 * @v rounded to @dt and widened back, as castfs_qr_round(): BF16 by the
 * integer round-to-nearest-even with NaN to +NaN (0x7FC00000); F16 by
 * F16C, which rounds to nearest even with subnormals, overflows to Inf
 * and keeps a NaN's sign and top payload bits, quieted, as the scalar
 * algorithm does (test_ct_kernels checks every case against it).
 */
AVX2_INLINE __m256 ct_round8(__m256 v, enum castfs_dtype dt)
{
	__m256i u = _mm256_castps_si256(v), r;
	__m256 nan;

	if (dt == CASTFS_DTYPE_F16)
		return _mm256_cvtph_ps(
			_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
	if (dt != CASTFS_DTYPE_BF16)
		return v;
	r = _mm256_and_si256(_mm256_srli_epi32(u, 16), set1u(1));
	r = _mm256_add_epi32(_mm256_add_epi32(u, set1u(0x7fff)), r);
	r = _mm256_and_si256(r, set1u(0xffff0000u));
	nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
	return _mm256_blendv_ps(_mm256_castsi256_ps(r),
				_mm256_castsi256_ps(set1u(0x7fc00000u)), nan);
}

/*
 * castfs_qr_e4m3() of 8 lanes, one code per 32-bit lane; with @nan_free
 * (no lane is NaN or beyond +-448, or the caller sets those lanes after),
 * without the NaN step.
 */
AVX2_INLINE __m256i ct_e4m3_8(__m256 q, bool nan_free)
{
	__m256i u = _mm256_castps_si256(q);
	__m256i sign = _mm256_and_si256(u, set1u(0x80000000u));
	__m256i a = _mm256_xor_si256(u, sign);
	__m256 a_f = _mm256_castsi256_ps(a);
	__m256i sub = _mm256_castps_si256(
		_mm256_add_ps(a_f, _mm256_castsi256_ps(set1u(141u << 23))));
	__m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), set1u(1));
	__m256i nrm =
		_mm256_add_epi32(_mm256_add_epi32(a, odd),
				 set1u(((uint32_t)(7 - 127) << 23) + 0x7ffffu));
	__m256i r;

	sub = _mm256_sub_epi32(sub, set1u(141u << 23));
	nrm = _mm256_srli_epi32(nrm, 20);
	r = _mm256_blendv_epi8(nrm, sub,
			       _mm256_cmpgt_epi32(set1u(121u << 23), a));
	if (!nan_free)
		r = _mm256_blendv_epi8(
			r, set1u(0x7f),
			_mm256_cmpgt_epi32(a, set1u((1087u << 20) - 1)));
	return _mm256_or_si256(r, _mm256_srli_epi32(sign, 24));
}

/*
 * ct_code8() of a BF16 weight, given the quotient (or product) @q: its
 * BF16 rounding makes every NaN +NaN, code 0x7F whatever else happens, so
 * the rounding and the narrowing skip their NaN steps (a NaN's bits may
 * carry into anything there) and one blend sets those lanes at the end.
 */
AVX2_INLINE __m256i ct_code8_bf16(__m256 q, bool mul)
{
	__m256i u = _mm256_castps_si256(q), r;
	__m256i nan = _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_UNORD_Q));

	r = _mm256_and_si256(_mm256_srli_epi32(u, 16), set1u(1));
	r = _mm256_add_epi32(_mm256_add_epi32(u, set1u(0x7fff)), r);
	q = _mm256_castsi256_ps(_mm256_and_si256(r, set1u(0xffff0000u)));
	if (!mul)
		q = _mm256_add_ps(q, _mm256_setzero_ps());
	q = _mm256_min_ps(_mm256_set1_ps(CASTFS_CT_F8_MAX), q);
	q = _mm256_max_ps(_mm256_set1_ps(-CASTFS_CT_F8_MAX), q);
	return _mm256_blendv_epi8(ct_e4m3_8(q, true), set1u(0x7f), nan);
}

/*
 * The E4M3 code of 8 elements: ct_f8_q() (x / s, rounded, + 0.0) or,
 * with @mul, comfy_f8_q() (x * s, rounded), clamped to +-448 with NaN
 * kept: min/max return their second operand when either is NaN.
 */
AVX2_INLINE __m256i ct_code8(__m256 v, __m256 s, enum castfs_dtype dt, bool mul)
{
	__m256 q;

	/* A NaN product is code 0x7F for BF16 whichever NaN it is. */
	if (dt == CASTFS_DTYPE_BF16)
		return ct_code8_bf16(
			mul ? _mm256_mul_ps(v, s) : _mm256_div_ps(v, s), mul);
	/* A NaN s gives its own NaN (see comfy_f8_q()): the compiler may
	 * swap a product's operands, and x86 returns the first NaN. */
	if (mul)
		q = ct_round8(
			_mm256_blendv_ps(_mm256_mul_ps(v, s), s,
					 _mm256_cmp_ps(s, s, _CMP_UNORD_Q)),
			dt);
	else
		q = _mm256_add_ps(ct_round8(_mm256_div_ps(v, s), dt),
				  _mm256_setzero_ps());
	q = _mm256_min_ps(_mm256_set1_ps(CASTFS_CT_F8_MAX), q);
	q = _mm256_max_ps(_mm256_set1_ps(-CASTFS_CT_F8_MAX), q);
	return ct_e4m3_8(q, false);
}

/* Four lanes of 8 codes (each < 256) stored as 32 bytes in order. */
AVX2_INLINE void ct_store32(uint8_t *dst, __m256i a, __m256i b, __m256i c,
			    __m256i d)
{
	__m256i r = _mm256_packus_epi16(_mm256_packus_epi32(a, b),
					_mm256_packus_epi32(c, d));

	/* The packs interleave the 128-bit halves: 4-byte groups 0 4 1 5.. */
	r = _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6,
							     3, 7));
	_mm256_storeu_si256((__m256i *)(void *)dst, r);
}

/* 32 codes of float32 elements. */
AVX2_INLINE void ct_codes32(uint8_t *dst, const float *x, __m256 s,
			    enum castfs_dtype dt, bool mul)
{
	ct_store32(dst, ct_code8(_mm256_loadu_ps(x), s, dt, mul),
		   ct_code8(_mm256_loadu_ps(x + 8), s, dt, mul),
		   ct_code8(_mm256_loadu_ps(x + 16), s, dt, mul),
		   ct_code8(_mm256_loadu_ps(x + 24), s, dt, mul));
}

/* The codes of @x[0..@n): the tail through a zero-padded bounce. */
AVX2_INLINE void ct_loop(uint8_t *dst, const float *x, size_t n, float s,
			 enum castfs_dtype dt, bool mul)
{
	__m256 sv = _mm256_set1_ps(s);
	size_t i = 0;

	for (; i + 32 <= n; i += 32)
		ct_codes32(dst + i, x + i, sv, dt, mul);
	if (i < n) {
		float t[32] = { 0 };
		uint8_t o[32];

		memcpy(t, x + i, (n - i) * sizeof(*t));
		ct_codes32(o, t, sv, dt, mul);
		memcpy(dst + i, o, n - i);
	}
}

/* ct_loop() with the weight dtype @dt a constant: one loop per dtype,
 * so that the rounding's branch leaves the loop. */
static inline AVX2 void ct_by_dtype(uint8_t *dst, const float *x, size_t n,
				    float s, enum castfs_dtype dt, bool mul)
{
	if (dt == CASTFS_DTYPE_BF16)
		ct_loop(dst, x, n, s, CASTFS_DTYPE_BF16, mul);
	else if (dt == CASTFS_DTYPE_F16)
		ct_loop(dst, x, n, s, CASTFS_DTYPE_F16, mul);
	else
		ct_loop(dst, x, n, s, CASTFS_DTYPE_F32, mul);
}

/*
 * 8 little-endian BF16 (F16 when @dt is) values at @p widened to float32
 * in registers, exactly: BF16 by a shift, F16 by F16C (subnormals exact;
 * a NaN stays a NaN of its sign, all that its code depends on).
 */
AVX2_INLINE __m256 ct_widen8(const uint8_t *p, enum castfs_dtype dt)
{
	__m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);

	if (dt == CASTFS_DTYPE_F16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(
		_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 32 codes of 16-bit elements at @p (64 bytes). */
AVX2_INLINE void ct_codes32_16(uint8_t *dst, const uint8_t *p, __m256 s,
			       enum castfs_dtype dt)
{
	ct_store32(dst, ct_code8(ct_widen8(p, dt), s, dt, false),
		   ct_code8(ct_widen8(p + 16, dt), s, dt, false),
		   ct_code8(ct_widen8(p + 32, dt), s, dt, false),
		   ct_code8(ct_widen8(p + 48, dt), s, dt, false));
}

/* ct_loop() of 16-bit elements: the tail through a zero-padded bounce. */
AVX2_INLINE void ct_loop16(uint8_t *dst, const uint8_t *p, size_t n, float s,
			   enum castfs_dtype dt)
{
	__m256 sv = _mm256_set1_ps(s);
	size_t i = 0;

	for (; i + 32 <= n; i += 32)
		ct_codes32_16(dst + i, p + 2 * i, sv, dt);
	if (i < n) {
		uint8_t t[64] = { 0 };
		uint8_t o[32];

		memcpy(t, p + 2 * i, (n - i) * 2);
		ct_codes32_16(o, t, sv, dt);
		memcpy(dst + i, o, n - i);
	}
}

/* castfs_ct_f8_codes16(): one loop per dtype, as ct_by_dtype(). */
static AVX2 void ct_f8_codes16_avx2(uint8_t *dst, const void *x, size_t n,
				    float scale, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F16)
		ct_loop16(dst, x, n, scale, CASTFS_DTYPE_F16);
	else
		ct_loop16(dst, x, n, scale, CASTFS_DTYPE_BF16);
}

static AVX2 void ct_f8_codes_avx2(uint8_t *dst, const float *x, size_t n,
				  float scale, enum castfs_dtype dt)
{
	ct_by_dtype(dst, x, n, scale, dt, false);
}

static AVX2 void comfy_codes_avx2(uint8_t *dst, const float *x, size_t n,
				  float inv, enum castfs_dtype dt)
{
	ct_by_dtype(dst, x, n, inv, dt, true);
}

/* castfs_ct_absmax(): the same integer max of |x|'s bits, 16 per step. */
static AVX2 float ct_absmax_avx2(const float *x, size_t n)
{
	__m256i m0 = _mm256_setzero_si256(), m1 = m0, abs = set1u(0x7fffffffu);
	__m128i h;
	size_t i = 0;
	int32_t m;

	for (; i + 16 <= n; i += 16) {
		__m256i a = _mm256_loadu_si256(
			(const __m256i *)(const void *)(x + i));
		__m256i b = _mm256_loadu_si256(
			(const __m256i *)(const void *)(x + i + 8));

		m0 = _mm256_max_epi32(m0, _mm256_and_si256(a, abs));
		m1 = _mm256_max_epi32(m1, _mm256_and_si256(b, abs));
	}
	m0 = _mm256_max_epi32(m0, m1);
	h = _mm_max_epi32(_mm256_castsi256_si128(m0),
			  _mm256_extracti128_si256(m0, 1));
	h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
	h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
	m = _mm_cvtsi128_si32(h);
	for (; i < n; i++) {
		int32_t a = (int32_t)(castfs_f32_bits(x[i]) & 0x7fffffffu);

		m = a > m ? a : m;
	}
	return m > 0x7f800000 ? NAN : castfs_f32_from_bits((uint32_t)m);
}

/* castfs_ct_absmax16(): an unsigned max of the 16-bit magnitudes. */
static AVX2 float ct_absmax16_avx2(const void *x, size_t n, bool f16)
{
	const uint8_t *p = x;
	__m256i m0 = _mm256_setzero_si256(), m1 = m0;
	__m256i abs = _mm256_set1_epi16(0x7fff);
	__m128i h;
	size_t i = 0;
	uint32_t m;

	for (; i + 32 <= n; i += 32) {
		__m256i a = _mm256_loadu_si256(
			(const __m256i *)(const void *)(p + 2 * i));
		__m256i b = _mm256_loadu_si256(
			(const __m256i *)(const void *)(p + 2 * i + 32));

		m0 = _mm256_max_epu16(m0, _mm256_and_si256(a, abs));
		m1 = _mm256_max_epu16(m1, _mm256_and_si256(b, abs));
	}
	m0 = _mm256_max_epu16(m0, m1);
	h = _mm_max_epu16(_mm256_castsi256_si128(m0),
			  _mm256_extracti128_si256(m0, 1));
	h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0x4e));
	h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0xb1));
	h = _mm_max_epu16(h, _mm_srli_epi32(h, 16));
	m = (uint32_t)_mm_cvtsi128_si32(h) & 0xffffu;
	for (; i < n; i++) {
		uint32_t a = castfs_load_le16(p + 2 * i) & 0x7fffu;

		m = a > m ? a : m;
	}
	return castfs_ct_from16(m, f16);
}

const struct castfs_ct_kernels castfs_ct_avx2 = {
	.f8_codes = ct_f8_codes_avx2,
	.f8_codes16 = ct_f8_codes16_avx2,
	.comfy_codes = comfy_codes_avx2,
	.absmax = ct_absmax_avx2,
	.absmax16 = ct_absmax16_avx2,
};
#endif
