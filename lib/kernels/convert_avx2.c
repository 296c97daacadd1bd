/* SPDX-License-Identifier: MIT */
/*
 * AVX2 kernels: 8 elements per step, widened to float32 bits in a ymm and
 * narrowed again, with the same integer algorithms as convert_scalar.c.
 */
#include "common/compiler.h"
#include "kernels/convert_internal.h"
#include "kernels/convert_w8.h"
#include "kernels/convert_w8_loops.h"

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

/*
 * 16-bit sources to fp8 on 16 16-bit lanes, as convert_avx512.c does on
 * 32: twice the elements of a step widened to float32. AVX2 has no
 * per-lane 16-bit shift, so a subnormal result's shift right by s is a
 * multiply by 2^(16 - s) (made by two pshufb): the product's high half is
 * the quotient, its low half the bits shifted out.
 */
#define CVT_ISA AVX2
#define WSTEP 16

static inline AVX2 __m256i set1w(uint16_t v)
{
	return _mm256_set1_epi16((short)v);
}

/* Lanes of @a (each below 2^15) that are > @v: signed compares suffice. */
static inline AVX2 __m256i greaterw(__m256i a, uint16_t v)
{
	return _mm256_cmpgt_epi16(a, set1w(v));
}

/* Normal results: the mantissa rounded to nearest even by shifting. */
static inline AVX2 __m256i w8_normal(__m256i a, struct w8 f)
{
	__m256i odd =
		_mm256_and_si256(_mm256_srli_epi16(a, (int)f.shift), set1w(1));

	a = _mm256_add_epi16(a, set1w(f.rebias));
	return _mm256_srli_epi16(_mm256_add_epi16(a, odd), (int)f.shift);
}

/* 2^(16 - s) for each lane's s in 1..15 (0 for s = 0: never a subnormal
 * result). A lane's high byte is 0, which both tables map to 0. */
static inline AVX2 __m256i pow_16_minus(__m256i s)
{
	__m256i lo = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, (char)0x80,
				      0x40, 0x20, 0x10, 8, 4, 2, 0, 0, 0, 0, 0,
				      0, 0, 0, 0, (char)0x80, 0x40, 0x20, 0x10,
				      8, 4, 2);
	__m256i hi = _mm256_setr_epi8(0, (char)0x80, 0x40, 0x20, 0x10, 8, 4, 2,
				      1, 0, 0, 0, 0, 0, 0, 0, 0, (char)0x80,
				      0x40, 0x20, 0x10, 8, 4, 2, 1, 0, 0, 0, 0,
				      0, 0, 0);

	return _mm256_or_si256(_mm256_shuffle_epi8(lo, s),
			       _mm256_slli_epi16(_mm256_shuffle_epi8(hi, s),
						 8));
}

/*
 * Subnormal results: the significand M (implicit bit included) shifted
 * right by s = smallc - E, capped at 15, ties to even, as convert_avx512.c's
 * w8_small() (whose comment says why the cap is right). With q = M >> s
 * and r the bits shifted out at the top of 16, rounding goes up when r is
 * over half, or half with q odd: when r + (q & 1) > 0x8000.
 */
static inline AVX2 __m256i w8_small(__m256i a, struct w8 f)
{
	__m256i e = _mm256_srli_epi16(a, (int)f.ms);
	__m256i m =
		_mm256_or_si256(_mm256_and_si256(a, set1w((1u << f.ms) - 1)),
				set1w(1u << f.ms));
	__m256i s = _mm256_min_epu16(_mm256_subs_epu16(set1w(f.smallc), e),
				     set1w(15));
	__m256i pow = pow_16_minus(s);
	__m256i q = _mm256_mulhi_epu16(m, pow);
	__m256i r = _mm256_mullo_epi16(m, pow);
	__m256i t = _mm256_adds_epu16(r, _mm256_and_si256(q, set1w(1)));

	return _mm256_add_epi16(
		q, _mm256_min_epu16(_mm256_subs_epu16(t, set1w(0x8000)),
				    set1w(1)));
}

/* The codes of |x| = @a (bits 0..14), without sign; @sat clamps first, as
 * clamp() does (NaN is not clamped). */
static inline AVX2 __m256i w8_codes(__m256i a, struct w8 f, int sat)
{
	__m256i c = sat ? _mm256_min_epu16(a, set1w(f.max)) : a;
	__m256i r = blend(w8_normal(c, f), _mm256_cmpgt_epi16(set1w(f.norm), c),
			  w8_small(c, f));

	if (!sat)
		r = blend(r, greaterw(a, (uint16_t)(f.big - 1)),
			  set1w(f.bigcode));
	if (sat || f.bigcode != 0x7f)
		r = blend(r, greaterw(a, f.inf), set1w(0x7f));
	return r;
}

/* The codes of 16 elements @x with their signs, as 16-bit lanes. */
static inline AVX2 __m256i w8_signed_v(__m256i x, struct w8 f, int sat)
{
	__m256i r = w8_codes(_mm256_and_si256(x, set1w(0x7fff)), f, sat);

	return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi16(x, 8),
						   set1w(0x80)));
}

/* The codes of 16 elements at @p with their signs, as 16-bit lanes. */
static inline AVX2 __m256i w8_signed(const uint8_t *p, struct w8 f, int sat)
{
	return w8_signed_v(_mm256_loadu_si256((const void *)p), f, sat);
}

/* Stores 16 signed codes (16-bit lanes, each <= 0xff: packus is exact). */
static inline AVX2 void store_w8(void *p, __m256i r)
{
	_mm_storeu_si128(p, _mm_packus_epi16(_mm256_castsi256_si128(r),
					     _mm256_extracti128_si256(r, 1)));
}

/* Stores 32 signed codes, @lo's 16 then @hi's: packus works per 128-bit
 * lane (8 of lo, 8 of hi), so a qword permute puts them in order. */
static inline AVX2 void store_w8x2(void *p, __m256i lo, __m256i hi)
{
	__m256i b = _mm256_packus_epi16(lo, hi);

	_mm256_storeu_si256(p, _mm256_permute4x64_epi64(b, 0xD8));
}

W8_WORD_KERNEL(bf16, e4m3, W8_BF16_E4M3, BF16, E4M3, 0)
W8_WORD_KERNEL(bf16, e4m3_sat, W8_BF16_E4M3, BF16, E4M3, 1)
W8_WORD_KERNEL(bf16, e5m2, W8_BF16_E5M2, BF16, E5M2, 0)
W8_WORD_KERNEL(bf16, e5m2_sat, W8_BF16_E5M2, BF16, E5M2, 1)
W8_WORD_KERNEL(f16, e4m3, W8_F16_E4M3, F16, E4M3, 0)
W8_WORD_KERNEL(f16, e4m3_sat, W8_F16_E4M3, F16, E4M3, 1)

#define CVT_WORD_KERNELS 1
#define CVT_TABLE castfs_cvt_avx2
#include "kernels/convert_table.h"

/* The codes of 16 elements of a grouped frame's bf16 planes (16 bytes
 * each), with their signs: |x| is ex << 7 | (sm & 0x7f), the sign bit 7
 * of sm. */
static inline AVX2 __m256i w8_planes_v(__m128i sm, __m128i ex, int sat)
{
	__m256i s = _mm256_cvtepu8_epi16(sm);
	__m256i e = _mm256_cvtepu8_epi16(ex);
	__m256i a = _mm256_or_si256(_mm256_slli_epi16(e, 7),
				    _mm256_and_si256(s, set1w(0x7f)));
	__m256i r = w8_codes(a, W8_BF16_E4M3, sat);

	return _mm256_or_si256(r, _mm256_and_si256(s, set1w(0x80)));
}

static inline AVX2 __m256i w8_planes(const uint8_t *sm, const uint8_t *ex,
				     int sat)
{
	return w8_planes_v(_mm_loadu_si128((const void *)sm),
			   _mm_loadu_si128((const void *)ex), sat);
}

/* Planes two vectors a step, interleaved into 16-bit lanes and packed
 * back within 128-bit lanes, as convert_avx512.c's w8_unpack() says. */
#define W8_VEC __m256i

static inline AVX2 __m256i w8_load(const uint8_t *p)
{
	return _mm256_loadu_si256((const void *)p);
}

static inline AVX2 void w8_unpack(__m256i lo, __m256i hi, __m256i *a,
				  __m256i *b)
{
	*a = _mm256_unpacklo_epi8(lo, hi);
	*b = _mm256_unpackhi_epi8(lo, hi);
}

static inline AVX2 void store_w8_lanes(void *p, __m256i a, __m256i b)
{
	_mm256_storeu_si256(p, _mm256_packus_epi16(a, b)); /* codes <= 0xff */
}

/* The codes of 16 bf16 elements whose planes w8_unpack() interleaved,
 * @w = ex << 8 | sm: |x| is ex << 7 | (sm & 0x7f), the sign bit 7. */
static inline AVX2 __m256i w8_sm_ex(__m256i w, int sat)
{
	__m256i a = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 1),
						     set1w(0x7f80)),
				    _mm256_and_si256(w, set1w(0x7f)));
	__m256i r = w8_codes(a, W8_BF16_E4M3, sat);

	return _mm256_or_si256(r, _mm256_and_si256(w, set1w(0x80)));
}

/* fp32 planes 0..2 of 32 elements at @i folded into bf16's sign and
 * mantissa plane with the low 16 bits' sticky bit (w8_f32_planes()). */
static inline AVX2 __m256i w8_sticky(const uint8_t *const *p, size_t i)
{
	__m256i low = _mm256_or_si256(w8_load(p[0] + i), w8_load(p[1] + i));

	return _mm256_or_si256(w8_load(p[2] + i),
			       _mm256_min_epu8(low, _mm256_set1_epi8(1)));
}

W8_PLANES_KERNEL(e4m3, 0)
W8_PLANES_KERNEL(e4m3_sat, 1)

const castfs_convert_planes_fn castfs_cvtp_avx2[2] = { cvtp_bf16_e4m3,
						       cvtp_bf16_e4m3_sat };

/* The codes of 16 fp16 elements of a grouped frame's planes, with their
 * signs: |x| is (hi & 0x7f) << 8 | lo, the sign bit 7 of hi. */
static inline AVX2 __m256i w8_f16_planes(const uint8_t *lo, const uint8_t *hi,
					 int sat)
{
	__m256i l = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)lo));
	__m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)hi));
	__m256i a = _mm256_or_si256(
		_mm256_slli_epi16(_mm256_and_si256(h, set1w(0x7f)), 8), l);
	__m256i r = w8_codes(a, W8_F16_E4M3, sat);

	return _mm256_or_si256(r, _mm256_and_si256(h, set1w(0x80)));
}

/* The codes of 16 fp32 elements of a grouped frame's planes, as bf16
 * codes with the low 16 mantissa bits' sticky bit: convert_avx512.c's
 * w8_f32_planes() says why that is exact. */
static inline AVX2 __m256i w8_f32_planes(const uint8_t *const *p, size_t i,
					 int sat)
{
	__m128i low = _mm_or_si128(_mm_loadu_si128((const void *)(p[0] + i)),
				   _mm_loadu_si128((const void *)(p[1] + i)));
	__m128i sm = _mm_or_si128(_mm_loadu_si128((const void *)(p[2] + i)),
				  _mm_min_epu8(low, _mm_set1_epi8(1)));

	return w8_planes_v(sm, _mm_loadu_si128((const void *)(p[3] + i)), sat);
}

W8_GROUPED_F16_KERNEL(e4m3, 0)
W8_GROUPED_F16_KERNEL(e4m3_sat, 1)
W8_GROUPED_F32_KERNEL(e4m3, 0)
W8_GROUPED_F32_KERNEL(e4m3_sat, 1)

const castfs_convert_grouped_fn castfs_cvtg_avx2[2][2] = {
	{ cvtg_f16_e4m3, cvtg_f16_e4m3_sat },
	{ cvtg_f32_e4m3, cvtg_f32_e4m3_sat },
};

#endif
