/* SPDX-License-Identifier: MIT */
/*
 * Un-grouping with AVX2: 32 elements per step, twice the SSE2 loop of
 * zst_group.c. 256-bit unpacks work inside each 128-bit lane, so each
 * step ends with a lane permute that puts the elements back in order.
 * Compiled with a target attribute (no per-file -m flag) and called only
 * where the CPU has AVX2 (zst_group.c chooses once).
 */
#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

AVX2 static __m256i unalign16(__m256i t)
{
	__m256i s = _mm256_slli_epi16(
		_mm256_and_si256(t, _mm256_set1_epi16(0x80)), 8);
	__m256i e = _mm256_and_si256(_mm256_srli_epi16(t, 1),
				     _mm256_set1_epi16(0x7F80));

	return _mm256_or_si256(_mm256_or_si256(s, e),
			       _mm256_and_si256(t, _mm256_set1_epi16(0x7F)));
}

AVX2 static __m256i unalign32(__m256i t)
{
	__m256i s = _mm256_slli_epi32(
		_mm256_and_si256(t, _mm256_set1_epi32(0x800000)), 8);
	__m256i e = _mm256_and_si256(_mm256_srli_epi32(t, 1),
				     _mm256_set1_epi32(0x7F800000));

	return _mm256_or_si256(_mm256_or_si256(s, e),
			       _mm256_and_si256(t,
						_mm256_set1_epi32(0x7FFFFF)));
}

AVX2 static __m256i load32(const uint8_t *p)
{
	return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

AVX2 static void store32(void *p, __m256i v)
{
	_mm256_storeu_si256((__m256i *)p, v);
}

AVX2 size_t zst_ungroup2_avx2(uint16_t *dst, const uint8_t *lo,
			      const uint8_t *hi, size_t count, bool bf16)
{
	size_t i = 0;

	for (; i + 32 <= count; i += 32) {
		__m256i l = load32(lo + i), h = load32(hi + i);
		/* lanes: a = elements 0-7 | 16-23, b = 8-15 | 24-31 */
		__m256i a = _mm256_unpacklo_epi8(l, h);
		__m256i b = _mm256_unpackhi_epi8(l, h);
		__m256i e0 = _mm256_permute2x128_si256(a, b, 0x20);
		__m256i e1 = _mm256_permute2x128_si256(a, b, 0x31);

		store32(dst + i, bf16 ? unalign16(e0) : e0);
		store32(dst + i + 16, bf16 ? unalign16(e1) : e1);
	}
	return i;
}

AVX2 size_t zst_ungroup4_avx2(uint32_t *dst, const uint8_t *const *b,
			      size_t count, bool f32)
{
	size_t i = 0;

	for (; i + 32 <= count; i += 32) {
		__m256i b0 = load32(b[0] + i), b1 = load32(b[1] + i);
		__m256i b2 = load32(b[2] + i), b3 = load32(b[3] + i);
		__m256i l01 = _mm256_unpacklo_epi8(b0, b1);
		__m256i h01 = _mm256_unpackhi_epi8(b0, b1);
		__m256i l23 = _mm256_unpacklo_epi8(b2, b3);
		__m256i h23 = _mm256_unpackhi_epi8(b2, b3);
		/* lanes: w0 = 0-3 | 16-19, w1 = 4-7 | 20-23,
		 * w2 = 8-11 | 24-27, w3 = 12-15 | 28-31 */
		__m256i w0 = _mm256_unpacklo_epi16(l01, l23);
		__m256i w1 = _mm256_unpackhi_epi16(l01, l23);
		__m256i w2 = _mm256_unpacklo_epi16(h01, h23);
		__m256i w3 = _mm256_unpackhi_epi16(h01, h23);
		__m256i o[4] = { _mm256_permute2x128_si256(w0, w1, 0x20),
				 _mm256_permute2x128_si256(w2, w3, 0x20),
				 _mm256_permute2x128_si256(w0, w1, 0x31),
				 _mm256_permute2x128_si256(w2, w3, 0x31) };

		for (int k = 0; k < 4; k++)
			store32(dst + i + 8 * k, f32 ? unalign32(o[k]) : o[k]);
	}
	return i;
}

/* Grouping, the inverse: zst_group.c's SSE2 loop on 256 bits, each
 * step's packs (which work inside each 128-bit lane) put back in order
 * by one permute. */
AVX2 static __m256i align16(__m256i v)
{
	__m256i e = _mm256_and_si256(_mm256_slli_epi16(v, 1),
				     _mm256_set1_epi16(-256));
	__m256i s = _mm256_and_si256(_mm256_srli_epi16(v, 8),
				     _mm256_set1_epi16(0x80));

	return _mm256_or_si256(_mm256_or_si256(e, s),
			       _mm256_and_si256(v, _mm256_set1_epi16(0x7F)));
}

AVX2 static __m256i align32(__m256i v)
{
	__m256i e = _mm256_and_si256(_mm256_slli_epi32(v, 1),
				     _mm256_set1_epi32((int)0xFF000000u));
	__m256i s = _mm256_and_si256(_mm256_srli_epi32(v, 8),
				     _mm256_set1_epi32(0x800000));

	return _mm256_or_si256(_mm256_or_si256(e, s),
			       _mm256_and_si256(v,
						_mm256_set1_epi32(0x7FFFFF)));
}

AVX2 size_t zst_group2_avx2(uint8_t *lo, uint8_t *hi, const uint8_t *src,
			    size_t count, bool bf16)
{
	const __m256i ff = _mm256_set1_epi16(0xFF);
	size_t i = 0;

	for (; i + 32 <= count; i += 32) {
		__m256i a = load32(src + 2 * i), b = load32(src + 2 * i + 32);

		if (bf16) {
			a = align16(a);
			b = align16(b);
		}
		/* 64-bit units: a 0-7, b 16-23, a 8-15, b 24-31 */
		__m256i l = _mm256_packus_epi16(_mm256_and_si256(a, ff),
						_mm256_and_si256(b, ff));
		__m256i h = _mm256_packus_epi16(_mm256_srli_epi16(a, 8),
						_mm256_srli_epi16(b, 8));

		store32(lo + i, _mm256_permute4x64_epi64(l, 0xD8));
		store32(hi + i, _mm256_permute4x64_epi64(h, 0xD8));
	}
	return i;
}

AVX2 size_t zst_group4_avx2(uint8_t *const *b, const uint8_t *src, size_t count,
			    bool f32)
{
	const __m256i ff = _mm256_set1_epi32(0xFF);
	/* 32-bit units after the packs: v0 0-3, v1 8-11, v2 16-19, v3 24-27,
	 * v0 4-7, v1 12-15, v2 20-23, v3 28-31 */
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	size_t i = 0;

	for (; i + 32 <= count; i += 32) {
		__m256i v[4];

		for (int k = 0; k < 4; k++) {
			v[k] = load32(src + 4 * i + 32 * k);
			if (f32)
				v[k] = align32(v[k]);
		}
		for (int p = 0; p < 4; p++) {
			__m256i x[4];

			for (int k = 0; k < 4; k++)
				x[k] = _mm256_and_si256(
					_mm256_srli_epi32(v[k], 8 * p), ff);
			__m256i y = _mm256_packus_epi16(
				_mm256_packs_epi32(x[0], x[1]),
				_mm256_packs_epi32(x[2], x[3]));

			store32(b[p] + i,
				_mm256_permutevar8x32_epi32(y, order));
		}
	}
	return i;
}
#endif
