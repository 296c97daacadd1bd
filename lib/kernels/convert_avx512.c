/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 kernels: 16 elements per step, widened to float32 bits in a zmm
 * and narrowed again, with the same integer algorithms as convert_scalar.c.
 */
#include "common/compiler.h"
#include "kernels/convert_internal.h"
#include "kernels/convert_w8.h"
#include "kernels/convert_w8_loops.h"

#if CASTFS_HAVE_X86_KERNELS
#include <immintrin.h>
#include <stdint.h>

/*
 * GCC 12's _mm512_undefined_*() initialise a variable with itself, which
 * -Winit-self reports as maybe-uninitialized (GCC PR 105593, fixed in 13).
 */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define STEP 16

#define F32_ABS 0x7fffffff
#define F32_INF 0x7f800000
#define E4M3_MAX 0x43e00000 /* 448.0f */
#define E5M2_MAX 0x47600000 /* 57344.0f */

static inline AVX512 __m512i set1(uint32_t v)
{
	return _mm512_set1_epi32((int)v);
}

/* a + b as floats, on bit patterns: the fp8 subnormal rounding. */
static inline AVX512 __m512i fadd(__m512i a, uint32_t b)
{
	__m512 s = _mm512_add_ps(_mm512_castsi512_ps(a),
				 _mm512_castsi512_ps(set1(b)));
	return _mm512_castps_si512(s);
}

/* (a + bias + bit @lsb of a) >> @lsb: round-to-nearest-even by shifting. */
static inline AVX512 __m512i rne_shift(__m512i a, uint32_t bias, unsigned lsb)
{
	__m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, lsb), set1(1));

	a = _mm512_add_epi32(_mm512_add_epi32(a, set1(bias)), odd);
	return _mm512_srli_epi32(a, lsb);
}

static inline AVX512 __m512i widen_f32(const void *p)
{
	return _mm512_loadu_si512(p);
}

/* vcvtph2ps is exact, and quiets NaN as widen_f16() does. */
static inline AVX512 __m512i widen_f16(const void *p)
{
	__m256i h = _mm256_loadu_si256(p);

	return _mm512_castps_si512(_mm512_cvtph_ps(h));
}

static inline AVX512 __m512i widen_bf16(const void *p)
{
	__m256i h = _mm256_loadu_si256(p);

	return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

static inline AVX512 __m512i widen_e4m3(const void *p)
{
	__m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p));
	__m512i m = _mm512_and_si512(b, set1(0x7f));
	__m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, set1(0x80)), 24);
	__m512i r = _mm512_add_epi32(_mm512_slli_epi32(m, 20), set1(120 << 23));
	__m512 sub =
		_mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(0x1p-9f));

	r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(m, set1(8)),
				  _mm512_castps_si512(sub));
	r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(m, set1(0x7f)),
				  set1(0x7ff00000));
	return _mm512_or_si512(r, sign);
}

/* e5m2 is the top byte of an f16. */
static inline AVX512 __m512i widen_e5m2(const void *p)
{
	__m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(p));

	h = _mm256_slli_epi16(h, 8);
	return _mm512_castps_si512(_mm512_cvtph_ps(h));
}

static inline AVX512 void narrow_f32(void *p, __m512i u)
{
	_mm512_storeu_si512(p, u);
}

static inline AVX512 void narrow_f16(void *p, __m512i u)
{
	__m256i h =
		_mm512_cvtps_ph(_mm512_castsi512_ps(u),
				_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);

	_mm256_storeu_si256(p, h);
}

/*
 * Integer RNE rather than vcvtneps2bf16, which flushes subnormal inputs to
 * zero where torch keeps them.
 */
static inline AVX512 void narrow_bf16(void *p, __m512i u)
{
	__m512i r = rne_shift(u, 0x7fff, 16);
	__m512i a = _mm512_and_si512(u, set1(F32_ABS));
	__m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), set1(0x40));

	r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, set1(F32_INF)),
				  qnan);
	_mm256_storeu_si256(p, _mm512_cvtepi32_epi16(r));
}

/* The finite part of fp8e4m3fn_from_fp32_value(), for |x| = @a < 480. */
static inline AVX512 __m512i e4m3_finite(__m512i a)
{
	__m512i r = rne_shift(a, ((uint32_t)(7 - 127) << 23) + 0x7ffff, 20);
	__m512i sub = _mm512_sub_epi32(fadd(a, 141u << 23), set1(141u << 23));

	return _mm512_mask_mov_epi32(
		r, _mm512_cmplt_epu32_mask(a, set1(121u << 23)), sub);
}

/* The finite part of fp8e5m2_from_fp32_value(), for |x| = @a < 65536. */
static inline AVX512 __m512i e5m2_finite(__m512i a)
{
	__m512i r = rne_shift(a, ((uint32_t)(15 - 127) << 23) + 0xfffff, 21);
	__m512i sub = _mm512_sub_epi32(fadd(a, 134u << 23), set1(134u << 23));

	return _mm512_mask_mov_epi32(
		r, _mm512_cmplt_epu32_mask(a, set1(113u << 23)), sub);
}

/* ORs the sign of @u into the fp8 codes @r and stores the low bytes. */
static inline AVX512 void store_fp8(void *p, __m512i r, __m512i u)
{
	__m512i sign = _mm512_srli_epi32(u, 31);

	r = _mm512_or_si512(r, _mm512_slli_epi32(sign, 7));
	_mm_storeu_si128(p, _mm512_cvtepi32_epi8(r));
}

static inline AVX512 __mmask16 is_nan(__m512i a)
{
	return _mm512_cmpgt_epu32_mask(a, set1(F32_INF));
}

static inline AVX512 void narrow_e4m3(void *p, __m512i u)
{
	__m512i a = _mm512_and_si512(u, set1(F32_ABS));
	__m512i r = e4m3_finite(a);

	r = _mm512_mask_mov_epi32(
		r, _mm512_cmpge_epu32_mask(a, set1(1087u << 20)), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX512 void narrow_e4m3_sat(void *p, __m512i u)
{
	__m512i a = _mm512_and_si512(u, set1(F32_ABS));
	__m512i r = e4m3_finite(_mm512_min_epu32(a, set1(E4M3_MAX)));

	r = _mm512_mask_mov_epi32(r, is_nan(a), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX512 void narrow_e5m2(void *p, __m512i u)
{
	__m512i a = _mm512_and_si512(u, set1(F32_ABS));
	__m512i r = e5m2_finite(a);

	r = _mm512_mask_mov_epi32(
		r, _mm512_cmpge_epu32_mask(a, set1(143u << 23)), set1(0x7c));
	r = _mm512_mask_mov_epi32(r, is_nan(a), set1(0x7f));
	store_fp8(p, r, u);
}

static inline AVX512 void narrow_e5m2_sat(void *p, __m512i u)
{
	__m512i a = _mm512_and_si512(u, set1(F32_ABS));
	__m512i r = e5m2_finite(_mm512_min_epu32(a, set1(E5M2_MAX)));

	r = _mm512_mask_mov_epi32(r, is_nan(a), set1(0x7f));
	store_fp8(p, r, u);
}

/*
 * 16-bit sources to fp8 on 32 16-bit lanes: a bf16 or f16 widens to float32
 * exactly, so narrow_e4m3()'s and narrow_e5m2()'s integer rounding can run
 * on the 16 bits alone, twice the elements a step. A struct w8
 * (convert_w8.h) holds one pair's constants.
 */
#define CVT_ISA AVX512
#define WSTEP 32

static inline AVX512 __m512i set1w(uint16_t v)
{
	return _mm512_set1_epi16((short)v);
}

/* Normal results: the mantissa rounded to nearest even by shifting, as
 * rne_shift() does on the float32. */
static inline AVX512 __m512i w8_normal(__m512i a, struct w8 f)
{
	__m512i odd = _mm512_and_si512(_mm512_srli_epi16(a, f.shift), set1w(1));

	a = _mm512_add_epi16(a, set1w(f.rebias));
	return _mm512_srli_epi16(_mm512_add_epi16(a, odd), f.shift);
}

/*
 * Subnormal results: |x| over the destination's least subnormal, rounded
 * to nearest even (what the float add of a power of two does in the scalar
 * narrowing), that is the significand M (implicit bit included) shifted
 * right by s = smallc - E with ties to even. Once s passes the width of M
 * every M gives 0, so s is capped at 15 to keep the shifts inside 16 bits;
 * a source subnormal (E = 0, given the implicit bit too) is then 0 as well,
 * which is right for these three pairs (below half the least subnormal).
 */
static inline AVX512 __m512i w8_small(__m512i a, struct w8 f)
{
	__m512i e = _mm512_srli_epi16(a, f.ms);
	__m512i m =
		_mm512_or_si512(_mm512_and_si512(a, set1w((1u << f.ms) - 1)),
				set1w(1u << f.ms));
	__m512i s = _mm512_min_epu16(_mm512_subs_epu16(set1w(f.smallc), e),
				     set1w(15));
	__m512i half = _mm512_srlv_epi16(set1w(0x7fff),
					 _mm512_sub_epi16(set1w(16), s));
	__m512i odd = _mm512_and_si512(_mm512_srlv_epi16(m, s), set1w(1));

	m = _mm512_add_epi16(_mm512_add_epi16(m, half), odd);
	return _mm512_srlv_epi16(m, s);
}

/* The codes of |x| = @a (bits 0..14), without sign; @sat clamps first, as
 * clamp() does (NaN is not clamped). */
static inline AVX512 __m512i w8_codes(__m512i a, struct w8 f, int sat)
{
	__m512i c = sat ? _mm512_min_epu16(a, set1w(f.max)) : a;
	__m512i r = _mm512_mask_mov_epi16(
		w8_normal(c, f), _mm512_cmplt_epu16_mask(c, set1w(f.norm)),
		w8_small(c, f));

	if (!sat)
		r = _mm512_mask_mov_epi16(
			r, _mm512_cmpge_epu16_mask(a, set1w(f.big)),
			set1w(f.bigcode));
	if (sat || f.bigcode != 0x7f)
		r = _mm512_mask_mov_epi16(
			r, _mm512_cmpgt_epu16_mask(a, set1w(f.inf)),
			set1w(0x7f));
	return r;
}

/* Stores 32 signed codes (16-bit lanes) as bytes. */
static inline AVX512 void store_w8(void *p, __m512i r)
{
	_mm256_storeu_si256(p, _mm512_cvtepi16_epi8(r));
}

/*
 * Stores 64 signed codes, @lo's 32 then @hi's: one byte pack (per 128-bit
 * lane: 8 of lo, 8 of hi) and one qword permute, where two vpmovwb are
 * four shuffle uops.
 */
static inline AVX512 void store_w8x2(void *p, __m512i lo, __m512i hi)
{
	__m512i b = _mm512_packus_epi16(lo, hi); /* codes <= 0xff: exact */

	b = _mm512_permutexvar_epi64(_mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0),
				     b);
	_mm512_storeu_si512(p, b);
}

/* The codes of 32 elements @x with their signs, as 16-bit lanes. */
static inline AVX512 __m512i w8_signed_v(__m512i x, struct w8 f, int sat)
{
	__m512i r = w8_codes(_mm512_and_si512(x, set1w(0x7fff)), f, sat);

	return _mm512_or_si512(r, _mm512_and_si512(_mm512_srli_epi16(x, 8),
						   set1w(0x80)));
}

/* The codes of 32 elements at @p with their signs, as 16-bit lanes. */
static inline AVX512 __m512i w8_signed(const uint8_t *p, struct w8 f, int sat)
{
	return w8_signed_v(_mm512_loadu_si512(p), f, sat);
}

W8_WORD_KERNEL(bf16, e4m3, W8_BF16_E4M3, BF16, E4M3, 0)
W8_WORD_KERNEL(bf16, e4m3_sat, W8_BF16_E4M3, BF16, E4M3, 1)
W8_WORD_KERNEL(bf16, e5m2, W8_BF16_E5M2, BF16, E5M2, 0)
W8_WORD_KERNEL(bf16, e5m2_sat, W8_BF16_E5M2, BF16, E5M2, 1)
W8_WORD_KERNEL(f16, e4m3, W8_F16_E4M3, F16, E4M3, 0)
W8_WORD_KERNEL(f16, e4m3_sat, W8_F16_E4M3, F16, E4M3, 1)

#define CVT_WORD_KERNELS 1
#define CVT_TABLE castfs_cvt_avx512
#include "kernels/convert_table.h"

/* The codes of 32 elements of a grouped frame's bf16 planes (32 bytes
 * each), with their signs: |x| is ex << 7 | (sm & 0x7f), the sign bit 7
 * of sm. */
static inline AVX512 __m512i w8_planes_v(__m256i sm, __m256i ex, int sat)
{
	__m512i s = _mm512_cvtepu8_epi16(sm);
	__m512i e = _mm512_cvtepu8_epi16(ex);
	__m512i a = _mm512_or_si512(_mm512_slli_epi16(e, 7),
				    _mm512_and_si512(s, set1w(0x7f)));
	__m512i r = w8_codes(a, W8_BF16_E4M3, sat);

	return _mm512_or_si512(r, _mm512_and_si512(s, set1w(0x80)));
}

static inline AVX512 __m512i w8_planes(const uint8_t *sm, const uint8_t *ex,
				       int sat)
{
	return w8_planes_v(_mm256_loadu_si256((const void *)sm),
			   _mm256_loadu_si256((const void *)ex), sat);
}

/*
 * Planes two vectors a step (convert_w8_loops.h): 64 bytes of two planes
 * interleaved into 16-bit lanes, @hi's byte high, by unpacklo/hi (within
 * each 128-bit lane: elements 16k..16k+7 in *@a, 16k+8..16k+15 in *@b),
 * which store_w8_lanes()'s packus puts back in order; no widening
 * shuffles and no permute (a grouped fp16 frame cast 14 % faster).
 */
#define W8_VEC __m512i

static inline AVX512 __m512i w8_load(const uint8_t *p)
{
	return _mm512_loadu_si512(p);
}

static inline AVX512 void w8_unpack(__m512i lo, __m512i hi, __m512i *a,
				    __m512i *b)
{
	*a = _mm512_unpacklo_epi8(lo, hi);
	*b = _mm512_unpackhi_epi8(lo, hi);
}

static inline AVX512 void store_w8_lanes(void *p, __m512i a, __m512i b)
{
	_mm512_storeu_si512(p, _mm512_packus_epi16(a, b)); /* codes <= 0xff */
}

/* The codes of 32 bf16 elements whose planes w8_unpack() interleaved,
 * @w = ex << 8 | sm: |x| is ex << 7 | (sm & 0x7f), the sign bit 7. */
static inline AVX512 __m512i w8_sm_ex(__m512i w, int sat)
{
	__m512i a = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 1),
					      set1w(0x7f80),
					      _mm512_and_si512(w, set1w(0x7f)),
					      0xea); /* (A & B) | C */
	__m512i r = w8_codes(a, W8_BF16_E4M3, sat);

	return _mm512_ternarylogic_epi32(r, w, set1w(0x80),
					 0xf8); /* A | (B & C) */
}

/* fp32 planes 0..2 of 64 elements at @i folded into bf16's sign and
 * mantissa plane with the low 16 bits' sticky bit (w8_f32_planes()). */
static inline AVX512 __m512i w8_sticky(const uint8_t *const *p, size_t i)
{
	__m512i low = _mm512_or_si512(_mm512_loadu_si512(p[0] + i),
				      _mm512_loadu_si512(p[1] + i));

	return _mm512_or_si512(_mm512_loadu_si512(p[2] + i),
			       _mm512_min_epu8(low, _mm512_set1_epi8(1)));
}

W8_PLANES_KERNEL(e4m3, 0)
W8_PLANES_KERNEL(e4m3_sat, 1)

const castfs_convert_planes_fn castfs_cvtp_avx512[2] = { cvtp_bf16_e4m3,
							 cvtp_bf16_e4m3_sat };

/* The codes of 32 fp16 elements of a grouped frame's planes, with their
 * signs: |x| is (hi & 0x7f) << 8 | lo, the sign bit 7 of hi. */
static inline AVX512 __m512i w8_f16_planes(const uint8_t *lo, const uint8_t *hi,
					   int sat)
{
	__m512i l = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)lo));
	__m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)hi));
	__m512i a = _mm512_or_si512(
		_mm512_slli_epi16(_mm512_and_si512(h, set1w(0x7f)), 8), l);
	__m512i r = w8_codes(a, W8_F16_E4M3, sat);

	return _mm512_or_si512(r, _mm512_and_si512(h, set1w(0x80)));
}

/*
 * The codes of 32 fp32 elements of a grouped frame's planes, as bf16
 * codes: the low 16 mantissa bits (planes 0 and 1) only decide whether
 * any of them is set, and that sticky bit ORed into the bf16 mantissa's
 * lowest bit rounds to odd at 7 bits, from which rounding to nearest even
 * at e4m3's 3 (or fewer, subnormal) bits is exact, overflow and NaN
 * included: fp32 bits compare with a bound whose low 16 bits are 0 as
 * their sticky bf16 does.
 */
static inline AVX512 __m512i w8_f32_planes(const uint8_t *const *p, size_t i,
					   int sat)
{
	__m256i low =
		_mm256_or_si256(_mm256_loadu_si256((const void *)(p[0] + i)),
				_mm256_loadu_si256((const void *)(p[1] + i)));
	__m256i sm =
		_mm256_or_si256(_mm256_loadu_si256((const void *)(p[2] + i)),
				_mm256_min_epu8(low, _mm256_set1_epi8(1)));

	return w8_planes_v(sm, _mm256_loadu_si256((const void *)(p[3] + i)),
			   sat);
}

W8_GROUPED_F16_KERNEL(e4m3, 0)
W8_GROUPED_F16_KERNEL(e4m3_sat, 1)
W8_GROUPED_F32_KERNEL(e4m3, 0)
W8_GROUPED_F32_KERNEL(e4m3_sat, 1)

const castfs_convert_grouped_fn castfs_cvtg_avx512[2][2] = {
	{ cvtg_f16_e4m3, cvtg_f16_e4m3_sat },
	{ cvtg_f32_e4m3, cvtg_f32_e4m3_sat },
};

#endif
