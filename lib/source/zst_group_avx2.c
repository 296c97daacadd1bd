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
#endif
