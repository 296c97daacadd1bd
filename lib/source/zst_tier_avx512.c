/* SPDX-License-Identifier: MIT */
/*
 * One tier of a tiered frame with AVX-512 VBMI/VBMI2, 64 codes a step:
 * vpermb + vpmultishiftqb unpack the fixed-width codes to bytes, vpermb
 * maps them through the tier's ranks, vpexpandb fills the escapes in
 * order from the next tier; VPOPCNTQ counts escapes. Compiled with a target attribute and called
 * only where the CPU has these (zst_tier.c chooses once).
 */
#include <string.h>

#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define AVX512                                                           \
	__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2," \
			      "avx512vpopcntdq,popcnt")))

/* Byte q*8 + b of the result: code 8q + b of a step, once
 * vpmultishiftqb has shifted byte b of qword q by b*w bits. The step's
 * 8w code bytes are first spread so qword q holds bytes [qw, qw + 8). */
AVX512 static void unpack_ctl(unsigned w, __m512i *spread, __m512i *shift)
{
	uint8_t s[64], h[64];

	for (unsigned i = 0; i < 64; i++) {
		s[i] = (uint8_t)((i / 8) * w + i % 8);
		h[i] = (uint8_t)((i % 8) * w);
	}
	*spread = _mm512_loadu_si512(s);
	*shift = _mm512_loadu_si512(h);
}

/* The reference's step on 64 bytes at a time, VPOPCNTQ counting. */
AVX512 size_t zst_tier_escapes_avx512(const uint8_t *p, size_t len, unsigned w)
{
	__m512i acc = _mm512_setzero_si512();
	__m512i low = _mm512_set1_epi64((long long)zst_tier_escape_bits(
		(const uint8_t[8]){ 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
				    0xFF },
		8, w, 0));
	uint64_t lane[8];
	size_t at = 0, e;

	for (; len - at >= 64; at += 64) {
		__m512i x = _mm512_loadu_si512(p + at);

		if (w >= 2)
			x = _mm512_and_si512(x, _mm512_maskz_srli_epi64(0xFF, x,
									1));
		if (w == 4)
			x = _mm512_and_si512(x, _mm512_maskz_srli_epi64(0xFF, x,
									2));
		acc = _mm512_add_epi64(
			acc, _mm512_popcnt_epi64(_mm512_and_si512(x, low)));
	}
	/* Not _mm512_reduce_add_epi64: GCC 12 warns in it (undefined). */
	_mm512_storeu_si512(lane, acc);
	e = 0;
	for (int k = 0; k < 8; k++)
		e += (size_t)lane[k];
	for (; at < len; at += 8)
		e += (size_t)__builtin_popcountll(
			zst_tier_escape_bits(p, len, w, at));
	return e;
}

/* @v's bytes shifted up by one, bit k of the @left (1..64) bits at @low
 * below byte k: a low-bit word is a mask, the add of one an or. */
AVX512 static inline __m512i with_low(__m512i v, const uint8_t *low,
				      size_t left)
{
	uint64_t bits = 0;

	if (left == 64)
		memcpy(&bits, low, 8); /* a load, not a call */
	else
		memcpy(&bits, low, (left + 7) / 8);
	v = _mm512_add_epi8(v, v);
	return _mm512_mask_add_epi8(v, (__mmask64)bits, v, _mm512_set1_epi8(1));
}

/*
 * One step: the 64 codes of @raw (those in @m) mapped, the escapes filled
 * from *@next (bytes up to @end), which moves past them. A whole vector
 * of @next is loaded where 64 bytes remain, else only the escapes' bytes
 * (a masked load, which never reads past them): vpexpandb then takes a
 * register, where its memory form cost a third more on Zen 4.
 */
AVX512 static inline __m512i step(__m512i raw, __mmask64 m, __m512i spread,
				  __m512i shift, __m512i esc, __m512i lut,
				  const uint8_t **next, const uint8_t *end)
{
	__m512i c = _mm512_and_si512(
		_mm512_maskz_multishift_epi64_epi8(
			~0ull, shift,
			_mm512_maskz_permutexvar_epi8(~0ull, spread, raw)),
		esc);
	__mmask64 e = _mm512_mask_cmpeq_epi8_mask(m, c, esc);
	/* The maskz forms: GCC 12's plain ones warn (undefined src). */
	__m512i v = _mm512_maskz_permutexvar_epi8(~0ull, c, lut);
	unsigned k = (unsigned)__builtin_popcountll(e);
	__m512i x = end - *next >= 64 ?
			    _mm512_loadu_si512(*next) :
			    _mm512_maskz_loadu_epi8(
				    k < 64 ? (1ull << k) - 1 : ~0ull, *next);

	*next += k;
	return _mm512_mask_expand_epi8(v, e, x);
}

AVX512 void zst_tier_expand_avx512(uint8_t *out, const uint8_t *codes, size_t n,
				   unsigned w, const uint8_t *map,
				   const uint8_t *next, size_t nnext,
				   const uint8_t *low)
{
	uint8_t tab[64] = { 0 };
	__m512i spread, shift, esc = _mm512_set1_epi8((char)((1u << w) - 1));
	const uint8_t *end = next + nnext;
	size_t len = (n * w + 7) / 8, i = 0;
	__m512i lut, v;

	/* The escape's own entry is never read: vpexpandb overwrites it. */
	memcpy(tab, map, (1u << w) - 1);
	lut = _mm512_loadu_si512(tab);
	unpack_ctl(w, &spread, &shift);
	/* Whole steps with 64 code bytes left to load: plain loads and
	 * stores (the masked ones cost more). */
	for (; i + 64 <= n && len - i * w / 8 >= 64; i += 64) {
		v = step(_mm512_loadu_si512(codes + i * w / 8), ~0ull, spread,
			 shift, esc, lut, &next, end);
		if (low)
			v = with_low(v, low + i / 8, 64);
		_mm512_storeu_si512(out + i, v);
	}
	for (; i < n; i += 64) {
		size_t left = n - i < 64 ? n - i : 64;
		__mmask64 m = left == 64 ? ~0ull : (1ull << left) - 1;
		__mmask64 lm = (1ull << ((left * w + 7) / 8)) - 1;

		v = step(_mm512_maskz_loadu_epi8(lm, codes + i * w / 8), m,
			 spread, shift, esc, lut, &next, end);
		if (low)
			v = with_low(v, low + i / 8, left);
		_mm512_mask_storeu_epi8(out + i, m, v);
	}
}

#endif
