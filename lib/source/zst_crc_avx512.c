/* SPDX-License-Identifier: MIT */
/*
 * CRC32C with AVX-512 VPCLMULQDQ: 256 bytes a step as sixteen 128-bit
 * lanes, each folded 2048 bits forward by two carry-less multiplies, then
 * folded into one lane, which two crc32 instructions reduce. The crc32
 * instruction alone is bound at 8 bytes a cycle; this is not. Compiled
 * with a target attribute and called only where the CPU has it (zst_crc.c
 * chooses once and computes the fold constants).
 */
#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,vpclmulqdq,sse4.2")))

/* Each 128-bit lane times its pair of constants: lo·k.lo ^ hi·k.hi. */
AVX512 static __m512i fold(__m512i x, __m512i k)
{
	return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
				_mm512_clmulepi64_epi128(x, k, 0x11));
}

AVX512 static __m512i fold_xor(__m512i x, __m512i k, __m512i d)
{
	return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
					 _mm512_clmulepi64_epi128(x, k, 0x11),
					 d, 0x96);
}

/* The four lanes of @z folded into one (lane 3 stays), then reduced. */
AVX512 static uint32_t lanes_reduce(__m512i z, const uint64_t *k)
{
	__m512i y = fold(z, _mm512_loadu_si512(k));
	uint64_t q[8];

	/* Not _mm512_extracti32x4_epi32: GCC 12 warns in it (undefined). */
	_mm512_storeu_si512(
		q, _mm512_xor_si512(y, _mm512_maskz_mov_epi64(0xC0, z)));
	return (uint32_t)_mm_crc32_u64(_mm_crc32_u64(0,
						     q[0] ^ q[2] ^ q[4] ^ q[6]),
				       q[1] ^ q[3] ^ q[5] ^ q[7]);
}

/* Whole 256-byte steps of @p (@n >= 256): the register after them. */
AVX512 uint32_t zst_crc32c_avx512(uint32_t crc, const uint8_t *p, size_t n,
				  const struct zst_crc_folds *k)
{
	__m512i k2048 = _mm512_loadu_si512(k->by2048);
	__m512i k512 = _mm512_loadu_si512(k->by512);
	__m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
	__m512i x2 = _mm512_loadu_si512(p + 128);
	__m512i x3 = _mm512_loadu_si512(p + 192);

	/* The register is the message's first 32 bits, complemented. */
	x0 = _mm512_xor_si512(x0, _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, crc));
	for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
		x0 = fold_xor(x0, k2048, _mm512_loadu_si512(p));
		x1 = fold_xor(x1, k2048, _mm512_loadu_si512(p + 64));
		x2 = fold_xor(x2, k2048, _mm512_loadu_si512(p + 128));
		x3 = fold_xor(x3, k2048, _mm512_loadu_si512(p + 192));
	}
	x1 = fold_xor(x0, k512, x1);
	x2 = fold_xor(x1, k512, x2);
	x3 = fold_xor(x2, k512, x3);
	return lanes_reduce(x3, k->lanes);
}
#endif
