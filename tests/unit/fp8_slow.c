/* SPDX-License-Identifier: MIT */
/* The slow FP8 oracle of the unit tests and its data generators. */
#include <string.h>

#include "fp8_slow.h"
#include "testutil.h"

/* E4M3FN as the OCP spec defines it (bias 7, no Inf, S.1111.111 NaN). */
float slow_e4m3(uint8_t b)
{
	int e = (b >> 3) & 15, m = b & 7;
	float v = e ? (float)(8 + m) / 8.0f : (float)m / 8.0f;

	for (int k = e ? e : 1; k < 7; k++)
		v /= 2.0f;
	for (int k = 7; k < e; k++)
		v *= 2.0f;
	return b & 0x80 ? -v : v;
}

/* Round to nearest even, as an integer computation on the fp32 bits. */
uint16_t slow_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void fill_codes(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i < n; i++) {
		dst[i] = (uint8_t)tu_rand(st);
		if ((dst[i] & 0x7F) == 0x7F)
			dst[i] = 0x3C; /* no NaN codes: finite reference */
	}
}

void fill_scales(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i + 4 <= n; i += 4) {
		float s = (float)(tu_rand(st) % 1000 + 1) / 7919.0f;

		memcpy(dst + i, &s, 4);
	}
}

void fill_e8m0(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i < n; i++)
		dst[i] = (uint8_t)(110 + tu_rand(st) % 30);
}

float slow_scale(const uint8_t *s, bool e8m0, size_t i)
{
	float v = 1.0f;

	if (!e8m0) {
		memcpy(&v, s + 4 * i, 4);
		return v;
	}
	for (int k = s[i]; k < 127; k++)
		v /= 2.0f;
	for (int k = 127; k < s[i]; k++)
		v *= 2.0f;
	return v;
}
