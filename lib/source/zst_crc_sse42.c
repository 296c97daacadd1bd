/* SPDX-License-Identifier: MIT */
/*
 * CRC32C with SSE4.2's crc32 instruction: its latency is three cycles and
 * one issues per cycle, so three independent streams of ZST_CRC_STREAM
 * bytes run at once and are joined by zst_crc_shift(). Compiled with a
 * target attribute and called only where the CPU has SSE4.2
 * (zst_crc.c chooses once).
 */
#include <string.h>

#include "source/zst_internal.h"

#if ZST_HAVE_X86
#include <immintrin.h>

#define SSE42 __attribute__((target("sse4.2")))

SSE42 static uint32_t crc_bytes(uint32_t crc, const uint8_t *p, size_t n)
{
	uint64_t c = crc, v;

	for (; n >= 8; n -= 8, p += 8) {
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
	}
	for (; n; n--)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	return (uint32_t)c;
}

/* One round: the three streams at @p, @p + S, @p + 2S, then joined. */
SSE42 static uint32_t crc_round(uint32_t crc, const uint8_t *p)
{
	const size_t s = ZST_CRC_STREAM;
	uint64_t c0 = crc, c1 = 0, c2 = 0, v0, v1, v2;

	for (size_t at = 0; at < s; at += 8) {
		memcpy(&v0, p + at, 8);
		memcpy(&v1, p + s + at, 8);
		memcpy(&v2, p + 2 * s + at, 8);
		c0 = _mm_crc32_u64(c0, v0);
		c1 = _mm_crc32_u64(c1, v1);
		c2 = _mm_crc32_u64(c2, v2);
	}
	return zst_crc_shift((uint32_t)c0, 2) ^ zst_crc_shift((uint32_t)c1, 1) ^
	       (uint32_t)c2;
}

uint32_t zst_crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n)
{
	for (; n >= 3 * ZST_CRC_STREAM; n -= 3 * ZST_CRC_STREAM) {
		crc = crc_round(crc, p);
		p += 3 * ZST_CRC_STREAM;
	}
	return crc_bytes(crc, p, n);
}
#endif
