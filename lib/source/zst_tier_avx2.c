/* SPDX-License-Identifier: MIT */
/*
 * One tier of a tiered frame with AVX2, 32 codes a step, for CPUs without
 * AVX-512 VBMI2: codes unpacked to bytes by shifts and unpacks, mapped by
 * pshufb, escapes filled in order by a pshufb whose indices are a prefix
 * count of the escape mask. Compiled with a target attribute and called
 * only where the CPU has AVX2 and POPCNT (zst_tier.c chooses once).
 */
#include <string.h>

#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,popcnt")))
/* Inlined so that each width's loop has its shifts as constants. */
#define AVX2_INLINE AVX2 inline __attribute__((always_inline))

/* The escapes (a code's lowest bit left set when all its bits are) of
 * the 32 bytes @x, summed into the four 64-bit lanes of @acc: a nibble
 * table pshufb counts bits, vpsadbw adds them. */
AVX2_INLINE static __m256i escapes_add(__m256i acc, __m256i x, unsigned w)
{
	__m256i nib = _mm256_set1_epi8(0x0F),
		tbl = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3,
				       3, 4, 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3,
				       2, 3, 3, 4);
	__m256i low = _mm256_set1_epi8(w == 1 ? -1 : w == 2 ? 0x55 : 0x11);

	if (w >= 2)
		x = _mm256_and_si256(x, _mm256_srli_epi64(x, 1));
	if (w == 4)
		x = _mm256_and_si256(x, _mm256_srli_epi64(x, 2));
	x = _mm256_and_si256(x, low);
	x = _mm256_add_epi8(
		_mm256_shuffle_epi8(tbl, _mm256_and_si256(x, nib)),
		_mm256_shuffle_epi8(
			tbl, _mm256_and_si256(_mm256_srli_epi16(x, 4), nib)));
	return _mm256_add_epi64(acc,
				_mm256_sad_epu8(x, _mm256_setzero_si256()));
}

/* The reference's step on 32 bytes at a time, its tail with POPCNT. */
AVX2 size_t zst_tier_escapes_avx2(const uint8_t *p, size_t len, unsigned w)
{
	__m256i acc = _mm256_setzero_si256();
	uint64_t lane[4];
	size_t at = 0, e;

	for (; len - at >= 32; at += 32)
		acc = escapes_add(
			acc, _mm256_loadu_si256((const __m256i *)(p + at)), w);
	_mm256_storeu_si256((__m256i *)lane, acc);
	e = (size_t)(lane[0] + lane[1] + lane[2] + lane[3]);
	for (; at < len; at += 8)
		e += (size_t)__builtin_popcountll(
			zst_tier_escape_bits(p, len, w, at));
	return e;
}

/* The 32 codes of @w = 2 or 4 bits at @p as bytes, in order. */
AVX2_INLINE static __m256i unpack_codes(const uint8_t *p, unsigned w)
{
	__m128i lo4 = _mm_set1_epi8(0x0F), lo2 = _mm_set1_epi8(0x03);
	__m128i x = w == 4 ? _mm_loadu_si128((const __m128i *)p) :
			     _mm_loadl_epi64((const __m128i *)p);
	__m128i a = _mm_and_si128(x, lo4);
	__m128i b = _mm_and_si128(_mm_srli_epi16(x, 4), lo4);
	__m128i n0 = _mm_unpacklo_epi8(a, b), n1 = _mm_unpackhi_epi8(a, b);

	if (w == 2) { /* n0 holds 16 nibbles of two codes each */
		a = _mm_and_si128(n0, lo2);
		b = _mm_and_si128(_mm_srli_epi16(n0, 2), lo2);
		n0 = _mm_unpacklo_epi8(a, b);
		n1 = _mm_unpackhi_epi8(a, b);
	}
	return _mm256_set_m128i(n1, n0);
}

/* 0xFF where the 32 one-bit codes at @p are set (escapes). */
AVX2_INLINE static __m256i bits_mask(const uint8_t *p)
{
	uint32_t v;
	__m256i spread = _mm256_set_epi64x(0x0303030303030303ll,
					   0x0202020202020202ll,
					   0x0101010101010101ll, 0);
	__m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);

	memcpy(&v, p, 4);
	spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v), spread);
	return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/*
 * @v with the escapes (0xFF in @m) replaced in order by the bytes at @nx:
 * an escape's index in its 128-bit lane is the escapes before it, the
 * lane's prefix sum of @m (each -1); the upper lane reads from past the
 * lower lane's @lo escapes. Reads 32 bytes at most from @nx.
 */
AVX2_INLINE static __m256i fill_escapes(__m256i v, __m256i m, const uint8_t *nx,
					unsigned lo)
{
	__m256i s = _mm256_add_epi8(m, _mm256_slli_si256(m, 1));
	__m256i src = _mm256_loadu2_m128i((const __m128i *)(nx + lo),
					  (const __m128i *)nx);

	s = _mm256_add_epi8(s, _mm256_slli_si256(s, 2));
	s = _mm256_add_epi8(s, _mm256_slli_si256(s, 4));
	s = _mm256_add_epi8(s, _mm256_slli_si256(s, 8));
	return _mm256_blendv_epi8(
		v, _mm256_shuffle_epi8(src, _mm256_sub_epi8(m, s)), m);
}

/*
 * The 32 codes at @p mapped through @lut into @out, escapes from @nx,
 * each byte then shifted up by one with the next of the 32 bits at @low
 * below it where @low is not NULL; returns the escapes used, counting
 * only those at the positions set in @keep (the others lie past the
 * tier's last code, in padding).
 */
AVX2_INLINE static unsigned step(uint8_t *out, const uint8_t *p, unsigned w,
				 __m256i lut, const uint8_t *nx, uint32_t keep,
				 const uint8_t *low)
{
	__m256i c, v, m;
	uint32_t e;

	if (w == 1) {
		m = bits_mask(p);
		v = lut;
	} else {
		c = unpack_codes(p, w);
		m = _mm256_cmpeq_epi8(c,
				      _mm256_set1_epi8((char)((1 << w) - 1)));
		v = _mm256_shuffle_epi8(lut, c);
	}
	e = (uint32_t)_mm256_movemask_epi8(m) & keep;
	v = fill_escapes(v, m, nx, (unsigned)__builtin_popcount(e & 0xFFFF));
	if (low)
		v = _mm256_or_si256(_mm256_add_epi8(v, v),
				    _mm256_and_si256(bits_mask(low),
						     _mm256_set1_epi8(1)));
	_mm256_storeu_si256((__m256i *)out, v);
	return (unsigned)__builtin_popcount(e);
}

/* The tier's loop for one width @w (a constant where it is inlined). */
AVX2_INLINE static void expand_w(uint8_t *out, const uint8_t *codes, size_t n,
				 unsigned w, __m256i lut, const uint8_t *next,
				 size_t left, const uint8_t *low)
{
	uint8_t cbuf[16] = { 0 }, obuf[32], tail[64] = { 0 }, lbuf[4] = { 0 };
	bool own = false; /* @next copied to @tail: under 32 bytes left */

	for (size_t i = 0; i < n; i += 32) {
		unsigned used;

		if (left < 32 && !own) {
			memcpy(tail, next, left);
			next = tail;
			own = true;
		}
		if (n - i >= 32) {
			used = step(out + i, codes + i * w / 8, w, lut, next,
				    ~0u, low ? low + i / 8 : NULL);
		} else {
			memcpy(cbuf, codes + i * w / 8, ((n - i) * w + 7) / 8);
			if (low)
				memcpy(lbuf, low + i / 8, (n - i + 7) / 8);
			used = step(obuf, cbuf, w, lut, next,
				    (1u << (n - i)) - 1, low ? lbuf : NULL);
			memcpy(out + i, obuf, n - i);
		}
		next += used;
		left -= used;
	}
}

AVX2 void zst_tier_expand_avx2(uint8_t *out, const uint8_t *codes, size_t n,
			       unsigned w, const uint8_t *map,
			       const uint8_t *next, size_t nnext,
			       const uint8_t *low)
{
	uint8_t tab[16] = { 0 };
	__m256i lut;

	memcpy(tab, map, (1u << w) - 1);
	lut = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)tab));
	if (w == 4)
		expand_w(out, codes, n, 4, lut, next, nnext, low);
	else if (w == 2)
		expand_w(out, codes, n, 2, lut, next, nnext, low);
	else
		expand_w(out, codes, n, 1, _mm256_set1_epi8((char)map[0]), next,
			 nnext, low);
}

#endif
