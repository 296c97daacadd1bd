/* SPDX-License-Identifier: MIT */
/*
 * The tier coder (zst_tier_pack.c) with AVX2, for CPUs without AVX-512
 * VBMI2: the AVX-512 coder's plan (one tier at a time) on 32 symbols a
 * step. The ranks come from the table in a scalar loop (AVX2 has no
 * 256-entry byte lookup); each tier's codes are a subtract and a min,
 * packed by a movemask (1 bit) or multiply-adds (2 and 4 bits), and the
 * ranks that escape are left-packed 8 at a time by a pshufb whose indices
 * a 256-entry table gives for each 8-bit escape mask. Compiled with a
 * target attribute and called only where the CPU has AVX2 and POPCNT
 * (zst_tier.c chooses once).
 */
#include <pthread.h>
#include <string.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,popcnt")))

/* For each 8-bit mask, the positions of its set bits in order: the
 * pshufb indices that left-pack the bytes it selects. */
static uint8_t pack_idx[256][8];
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;

static void pack_idx_init(void)
{
	for (unsigned m = 0; m < 256; m++) {
		unsigned n = 0;

		for (unsigned b = 0; b < 8; b++)
			if (m >> b & 1)
				pack_idx[m][n++] = (uint8_t)b;
	}
}

/* The @n (<= 32) bytes at @in selected by @mask, left-packed to @next
 * (8 bytes of slack). Returns how many. */
AVX2 static size_t left_pack(uint8_t *next, const uint8_t *in, uint32_t mask)
{
	size_t nn = 0;

	for (unsigned g = 0; g < 4; g++, mask >>= 8) {
		unsigned m = mask & 0xFF;
		__m128i v = _mm_loadl_epi64(
			(const __m128i *)(const void *)(in + 8 * g));
		__m128i idx = _mm_loadl_epi64(
			(const __m128i *)(const void *)pack_idx[m]);

		_mm_storel_epi64((__m128i *)(void *)(next + nn),
				 _mm_shuffle_epi8(v, idx));
		nn += (size_t)_mm_popcnt_u32(m);
	}
	return nn;
}

/* 32 codes of @w bits, LSB-first, to @out (4 * @w bytes). */
AVX2 static void pack32(uint8_t *out, __m256i c, unsigned w)
{
	if (w == 1) {
		castfs_store_le32(
			out, (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(
				     c, _mm256_set1_epi8(1))));
	} else if (w == 2) {
		__m256i t = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0401));
		__m256i b;

		/* each dword c0 + 4c1 + 16c2 + 64c3 <= 255: its low byte */
		t = _mm256_madd_epi16(t, _mm256_set1_epi32(0x00100001));
		b = _mm256_shuffle_epi8(
			t, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1,
					    -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
					    -1, -1, -1, -1, -1, -1, -1, -1, -1,
					    -1, -1, -1));
		castfs_store_le32(out, (uint32_t)_mm256_cvtsi256_si32(b));
		castfs_store_le32(out + 4,
				  (uint32_t)_mm256_extract_epi32(b, 4));
	} else {
		__m256i t = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x1001));

		_mm_storeu_si128(
			(__m128i *)(void *)out,
			_mm_packus_epi16(_mm256_castsi256_si128(t),
					 _mm256_extracti128_si256(t, 1)));
	}
}

AVX2 size_t zst_tier_step_avx2(uint8_t *out, uint8_t *next, uint8_t *in,
			       size_t n, unsigned w, unsigned base)
{
	const __m256i vb = _mm256_set1_epi8((char)base);
	const __m256i ve = _mm256_set1_epi8((char)((1u << w) - 1));
	size_t nn = 0;

	pthread_once(&pack_once, pack_idx_init);
	for (size_t i = 0; i < n; i += 32) {
		size_t m = n - i < 32 ? n - i : 32;
		uint32_t valid = m == 32 ? ~0u : (1u << m) - 1;
		__m256i r;

		/* The last step's ranks in a zeroed step: no byte past @n
		 * is read as a rank, nor left-packed. */
		if (m < 32) {
			memset(in + n, 0, 32);
			valid = (1u << m) - 1;
		}
		r = _mm256_loadu_si256((const __m256i *)(void *)(in + i));
		__m256i c = _mm256_min_epu8(_mm256_sub_epi8(r, vb), ve);
		uint32_t esc = (uint32_t)_mm256_movemask_epi8(
				       _mm256_cmpeq_epi8(c, ve)) &
			       valid;

		nn += left_pack(next + nn, in + i, esc);
		if (m == 32) {
			pack32(out + i / 8 * w, c, w);
		} else {
			uint8_t cs[32];

			/* The last codes, bit by bit, into the zeroed tail. */
			_mm256_storeu_si256((__m256i *)(void *)cs, c);
			for (size_t j = 0; j < m; j++) {
				size_t bit = (i + j) * w;

				out[bit / 8] |= (uint8_t)(cs[j] << (bit % 8));
			}
		}
	}
	return nn;
}

AVX2 size_t zst_tier_lowbits_pack_avx2(uint8_t *d, const uint8_t *ex,
				       size_t count)
{
	const __m256i one = _mm256_set1_epi8(1);
	size_t i = 0;

	for (; i + 32 <= count; i += 32) {
		__m256i x = _mm256_loadu_si256(
			(const __m256i *)(const void *)(ex + i));

		castfs_store_le32(
			d + i / 8,
			(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(
				_mm256_and_si256(x, one), one)));
	}
	return i;
}
#endif
