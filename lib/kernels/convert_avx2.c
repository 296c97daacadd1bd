/* SPDX-License-Identifier: MIT */
/*
 * AVX2 kernels: 8 elements per step, widened to float32 bits in a ymm and
 * narrowed again, with the same integer algorithms as convert_scalar.c.
 */
#include "common/compiler.h"
#include "kernels/convert_internal.h"

#if CASTFS_HAVE_X86_KERNELS
#include <immintrin.h>
#include <stdint.h>

#define AVX2 __attribute__((target("avx2,f16c,fma")))
#define STEP 8

/*
 * Lanes hold |x| as float bits, below 2^31, so signed compares and min act
 * as unsigned ones would: AVX2 has no unsigned compare.
 */
#define F32_ABS 0x7fffffff
#define F32_INF 0x7f800000
#define E4M3_MAX 0x43e00000 /* 448.0f */
#define E5M2_MAX 0x47600000 /* 57344.0f */

static inline AVX2 __m256i set1(uint32_t v)
{
	return _mm256_set1_epi32((int)v);
}

/* @v where @mask lanes are all ones, else @r. */
static inline AVX2 __m256i blend(__m256i r, __m256i mask, __m256i v)
{
	return _mm256_blendv_epi8(r, v, mask);
}

/* Lanes of @a (each below 2^31) that are < @v. */
static inline AVX2 __m256i less(__m256i a, uint32_t v)
{
	return _mm256_cmpgt_epi32(set1(v), a);
}

static inline AVX2 __m256i greater(__m256i a, uint32_t v)
{
	return _mm256_cmpgt_epi32(a, set1(v));
}

/* a + b as floats, on bit patterns: the fp8 subnormal rounding. */
static inline AVX2 __m256i fadd(__m256i a, uint32_t b)
{
	__m256 s = _mm256_add_ps(_mm256_castsi256_ps(a),
				 _mm256_castsi256_ps(set1(b)));
	return _mm256_castps_si256(s);
}

/* (a + bias + bit @lsb of a) >> @lsb: round-to-nearest-even by shifting. */
static inline AVX2 __m256i rne_shift(__m256i a, uint32_t bias, int lsb)
{
	__m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, lsb), set1(1));

	a = _mm256_add_epi32(_mm256_add_epi32(a, set1(bias)), odd);
	return _mm256_srli_epi32(a, lsb);
}

static inline AVX2 __m256i widen_f32(const void *p)
{
	return _mm256_loadu_si256(p);
}

/* vcvtph2ps is exact, and quiets NaN as widen_f16() does. */
static inline AVX2 __m256i widen_f16(const void *p)
{
	__m128i h = _mm_loadu_si128(p);

	return _mm256_castps_si256(_mm256_cvtph_ps(h));
}

static inline AVX2 __m256i widen_bf16(const void *p)
{
	__m128i h = _mm_loadu_si128(p);

	return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

static inline AVX2 __m256i widen_e4m3(const void *p)
{
	__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p));
	__m256i m = _mm256_and_si256(b, set1(0x7f));
	__m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, set1(0x80)), 24);
	__m256i r = _mm256_add_epi32(_mm256_slli_epi32(m, 20), set1(120 << 23));
	__m256 sub =
		_mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-9f));

	r = blend(r, less(m, 8), _mm256_castps_si256(sub));
	r = blend(r, _mm256_cmpeq_epi32(m, set1(0x7f)), set1(0x7ff00000));
	return _mm256_or_si256(r, sign);
}

/* e5m2 is the top byte of an f16. */
static inline AVX2 __m256i widen_e5m2(const void *p)
{
	__m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64(p));

	return _mm256_castps_si256(_mm256_cvtph_ps(_mm_slli_epi16(h, 8)));
}

static inline AVX2 void narrow_f32(void *p, __m256i u)
{
	_mm256_storeu_si256(p, u);
}

static inline AVX2 void narrow_f16(void *p, __m256i u)
{
	__m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(u),
				    _MM_FROUND_TO_NEAREST_INT);

	_mm_storeu_si128(p, h);
}

/* Lanes below 2^16, so unsigned saturation is a plain truncation. */
static inline AVX2 __m128i pack16(__m256i r)
{
	return _mm_packus_epi32(_mm256_castsi256_si128(r),
				_mm256_extracti128_si256(r, 1));
}

/* Integer RNE: there is no vcvtneps2bf16 before AVX-512 BF16 / AVX-NE. */
static inline AVX2 void narrow_bf16(void *p, __m256i u)
{
	__m256i r = rne_shift(u, 0x7fff, 16);
	__m256i a = _mm256_and_si256(u, set1(F32_ABS));
	__m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), set1(0x40));

	r = blend(r, greater(a, F32_INF), qnan);
	_mm_storeu_si128(p, pack16(r));
}

/* The finite part of fp8e4m3fn_from_fp32_value(), for |x| = @a < 480. */
static inline AVX2 __m256i e4m3_finite(__m256i a)
{
	__m256i r = rne_shift(a, ((uint32_t)(7 - 127) << 23) + 0x7ffff, 20);
	__m256i sub = _mm256_sub_epi32(fadd(a, 141u << 23), set1(141u << 23));

	return blend(r, less(a, 121u << 23), sub);
}

/* The finite part of fp8e5m2_from_fp32_value(), for |x| = @a < 65536. */
static inline AVX2 __m256i e5m2_finite(__m256i a)
{
	__m256i r = rne_shift(a, ((uint32_t)(15 - 127) << 23) + 0xfffff, 21);
	__m256i sub = _mm256_sub_epi32(fadd(a, 134u << 23), set1(134u << 23));

	return blend(r, less(a, 113u << 23), sub);
}

/* ORs the sign of @u into the fp8 codes @r and stores the low bytes. */
static inline AVX2 void store_fp8(void *p, __m256i r, __m256i u)
{
	__m256i sign = _mm256_srli_epi32(u, 31);
	__m128i h;

	r = _mm256_or_si256(r, _mm256_slli_epi32(sign, 7));
	h = pack16(r);
	_mm_storel_epi64(p, _mm_packus_epi16(h, h));
}

static inline AVX2 __m256i abs_bits(__m256i u)
{
	return _mm256_and_si256(u, set1(F32_ABS));
}

static inline AVX2 void narrow_e4m3(void *p, __m256i u)
{
	__m256i a = abs_bits(u);
	__m256i r = e4m3_finite(a);

	r = blend(r, greater(a, (1087u << 20) - 1), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX2 void narrow_e4m3_sat(void *p, __m256i u)
{
	__m256i a = abs_bits(u);
	__m256i r = e4m3_finite(_mm256_min_epi32(a, set1(E4M3_MAX)));

	r = blend(r, greater(a, F32_INF), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX2 void narrow_e5m2(void *p, __m256i u)
{
	__m256i a = abs_bits(u);
	__m256i r = e5m2_finite(a);

	r = blend(r, greater(a, (143u << 23) - 1), set1(0x7c));
	r = blend(r, greater(a, F32_INF), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX2 void narrow_e5m2_sat(void *p, __m256i u)
{
	__m256i a = abs_bits(u);
	__m256i r = e5m2_finite(_mm256_min_epi32(a, set1(E5M2_MAX)));

	r = blend(r, greater(a, F32_INF), set1(0x7f));
	store_fp8(p, r, u);
}

#define CVT_ISA AVX2
#define CVT_TABLE castfs_cvt_avx2
#include "kernels/convert_table.h"

/* Eight bf16 elements from a grouped frame's planes, as float32 bits. */
static inline AVX2 __m256i widen_bf16_planes(const uint8_t *sm,
					     const uint8_t *ex)
{
	__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)sm));
	__m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)ex));
	__m256i sign = _mm256_slli_epi32(_mm256_and_si256(s, set1(0x80)), 24);
	__m256i mant = _mm256_slli_epi32(_mm256_and_si256(s, set1(0x7f)), 16);

	return _mm256_or_si256(_mm256_or_si256(sign, mant),
			       _mm256_slli_epi32(e, 23));
}

/* The un-grouping fused into the cast: no bf16 buffer between them. */
#define PLANES_KERNEL(to, sat)                                                 \
	static AVX2 void cvtp_bf16_##to(void *restrict dst,                    \
					const uint8_t *restrict sm,            \
					const uint8_t *restrict ex, size_t n)  \
	{                                                                      \
		uint8_t *d = dst;                                              \
		size_t i;                                                      \
                                                                               \
		for (i = 0; i + STEP <= n; i += STEP)                          \
			narrow_##to(d + i, widen_bf16_planes(sm + i, ex + i)); \
		if (i < n)                                                     \
			castfs_cvtp_scalar[sat](d + i, sm + i, ex + i, n - i); \
	}

PLANES_KERNEL(e4m3, 0)
PLANES_KERNEL(e4m3_sat, 1)

const castfs_convert_planes_fn castfs_cvtp_avx2[2] = { cvtp_bf16_e4m3,
						       cvtp_bf16_e4m3_sat };

#endif
