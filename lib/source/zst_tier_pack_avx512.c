/* SPDX-License-Identifier: MIT */
/*
 * The tier coder (zst_tier_pack.c) with AVX-512 VBMI/VBMI2, 64 symbols a
 * step and one tier at a time: vpermi2b maps the symbols to their ranks,
 * each tier's codes are a subtract and an unsigned min, packed to w bits
 * by multiply-adds, and vpcompressb carries the ranks that escape a tier
 * on to the next, in order. The scalar coder walks every symbol through
 * its tiers with a branch per tier and a read-modify-write per code (35-44
 * % of a packing thread). Compiled with a target attribute and called
 * only where the CPU has these (zst_tier.c chooses once).
 */
#include <string.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

/* GCC 12's _mm512_undefined_*() initialise a variable with itself, which
 * -Winit-self reports as maybe-uninitialized (GCC PR 105593, fixed in 13). */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define AVX512                                                           \
	__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2," \
			      "avx512vpopcntdq,popcnt")))

/* The ranks of @m <= 64 symbols (@ex's bytes >> @shift) into @dst (64
 * bytes written): @of, the 256-byte rank table, in four registers. */
AVX512 static void ranks64(uint8_t *dst, const uint8_t *ex, size_t m,
			   unsigned shift, const __m512i *of)
{
	__mmask64 valid = m == 64 ? ~0ull : (1ull << m) - 1;
	__m512i x = _mm512_maskz_loadu_epi8(valid, ex);
	__m512i lo, hi;

	if (shift)
		x = _mm512_and_si512(_mm512_srli_epi16(x, 1),
				     _mm512_set1_epi8(0x7F));
	lo = _mm512_permutex2var_epi8(of[0], x, of[1]);
	hi = _mm512_permutex2var_epi8(of[2], x, of[3]);
	_mm512_storeu_si512(dst, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x),
							lo, hi));
}

/* 64 codes of @w bits, LSB-first, to @out (8 * @w bytes). */
AVX512 static void pack64(uint8_t *out, __m512i c, unsigned w)
{
	if (w == 1) {
		castfs_store_le64(out, _mm512_test_epi8_mask(c, c));
	} else if (w == 2) {
		__m512i t = _mm512_maddubs_epi16(c, _mm512_set1_epi16(0x0401));

		t = _mm512_madd_epi16(t, _mm512_set1_epi32(0x00100001));
		_mm_storeu_si128((__m128i *)(void *)out,
				 _mm512_cvtepi32_epi8(t));
	} else {
		__m512i t = _mm512_maddubs_epi16(c, _mm512_set1_epi16(0x1001));

		_mm256_storeu_si256((__m256i *)(void *)out,
				    _mm512_cvtepi16_epi8(t));
	}
}

AVX512 size_t zst_tier_step_avx512(uint8_t *out, uint8_t *next, uint8_t *in,
				   size_t n, unsigned w, unsigned base)
{
	const __m512i vb = _mm512_set1_epi8((char)base);
	const __m512i ve = _mm512_set1_epi8((char)((1u << w) - 1));
	size_t nn = 0;

	for (size_t i = 0; i < n; i += 64) {
		size_t m = n - i < 64 ? n - i : 64;
		__mmask64 valid = m == 64 ? ~0ull : (1ull << m) - 1;
		__m512i r = _mm512_maskz_loadu_epi8(valid, in + i);
		__m512i c = _mm512_min_epu8(_mm512_sub_epi8(r, vb), ve);
		__mmask64 esc = _mm512_mask_cmpeq_epi8_mask(valid, c, ve);

		_mm512_storeu_si512(next + nn,
				    _mm512_maskz_compress_epi8(esc, r));
		nn += (size_t)_mm_popcnt_u64(esc);
		if (m == 64) {
			pack64(out + i / 8 * w, c, w);
		} else {
			uint8_t cs[64];

			/* The last codes, bit by bit, into the zeroed tail. */
			_mm512_storeu_si512(cs, c);
			for (size_t j = 0; j < m; j++) {
				size_t bit = (i + j) * w;

				out[bit / 8] |= (uint8_t)(cs[j] << (bit % 8));
			}
		}
	}
	return nn;
}

AVX512 void zst_tier_ranks_avx512(uint8_t *dst, const uint8_t *ex, size_t count,
				  unsigned shift, const uint8_t *of)
{
	__m512i tab[4];

	for (int q = 0; q < 4; q++)
		tab[q] = _mm512_loadu_si512(of + 64 * q);
	for (size_t i = 0; i < count; i += 64)
		ranks64(dst + i, ex + i, count - i < 64 ? count - i : 64, shift,
			tab);
}

AVX512 size_t zst_tier_lowbits_pack_avx512(uint8_t *d, const uint8_t *ex,
					   size_t count)
{
	size_t i = 0;

	for (; i + 64 <= count; i += 64)
		castfs_store_le64(d + i / 8, _mm512_test_epi8_mask(
						     _mm512_loadu_si512(ex + i),
						     _mm512_set1_epi8(1)));
	return i;
}
#endif
