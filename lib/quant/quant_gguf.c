/* SPDX-License-Identifier: MIT */
/*
 * ggml's reference quantisers for Q8_0 and Q4_0 (ggml-quants.c
 * quantize_row_q8_0_ref, quantize_row_q4_0_ref), written so that the
 * compiler cannot change their rounding: every product and sum is stored
 * in a float before the next step (no FMA contraction), because the Q4_0
 * codes of a few ties depend on it (docs/FORMATS.md).
 */
#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant_gguf.h"
#include "quant/quant_round.h"

/* The stored bits of @f: the barrier that keeps x * id from fusing. */
static float fl32(float f)
{
	volatile float v = f;

	return v;
}

uint16_t castfs_gguf_fp16(float f)
{
	uint32_t u, sign, absu, mant;
	int32_t exp;

	memcpy(&u, &f, sizeof(u));
	sign = (u >> 16) & 0x8000u;
	absu = u & 0x7fffffffu;
	if (absu > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u);
	if (absu >= 0x477ff000u) /* rounds to >= 65536: infinity */
		return (uint16_t)(sign | 0x7c00u);
	exp = (int32_t)(absu >> 23) - 127 + 15;
	if (exp <= 0) { /* subnormal half (or zero) */
		uint32_t shift;

		if (exp < -10)
			return (uint16_t)sign;
		mant = (absu & 0x7fffffu) | 0x800000u;
		shift = (uint32_t)(14 - exp);
		{
			uint32_t half = 1u << (shift - 1);
			uint32_t rem = mant & ((1u << shift) - 1);
			uint32_t q = mant >> shift;

			if (rem > half || (rem == half && (q & 1u)))
				q++;
			return (uint16_t)(sign | q);
		}
	}
	mant = absu & 0x7fffffu;
	{
		uint32_t q = ((uint32_t)exp << 10) | (mant >> 13);
		uint32_t rem = mant & 0x1fffu;

		if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
			q++; /* a carry into the exponent is still right */
		return (uint16_t)(sign | q);
	}
}

/* C's (int8_t) of a float as x86 compiles it: cvttss2si gives INT_MIN
 * (low byte 0) for NaN and values out of int32 range. */
static int8_t to_i8(float f)
{
	if (!(f > -2147483648.0f && f < 2147483648.0f))
		return 0;
	return (int8_t)(int32_t)f;
}

static void q8_0_block(uint8_t *dst, const float *x)
{
	float amax = 0.0f, d, id;

	for (unsigned j = 0; j < CASTFS_GGUF_QK; j++) {
		float a = fabsf(x[j]);

		amax = amax > a ? amax : a; /* ggml's MAX(): NaN wins */
	}
	/* no sum follows a product here: nothing an FMA could fuse */
	d = amax / 127.0f;
	id = d != 0.0f ? 1.0f / d : 0.0f;
	castfs_store_le16(dst, castfs_gguf_fp16(d));
	for (unsigned j = 0; j < CASTFS_GGUF_QK; j++)
		dst[2 + j] = (uint8_t)castfs_qr_roundf_i8(x[j] * id);
}

void castfs_gguf_q8_0(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks)
{
	for (size_t b = 0; b < nblocks; b++)
		q8_0_block(dst + b * CASTFS_GGUF_Q8_0_BYTES,
			   x + b * CASTFS_GGUF_QK);
}

static uint8_t q4_code(float x, float id)
{
	int8_t q = to_i8(fl32(fl32(x * id) + 8.5f));

	return (uint8_t)(q < 15 ? q : 15);
}

static void q4_0_block(uint8_t *dst, const float *x)
{
	const unsigned half = CASTFS_GGUF_QK / 2;
	float amax = 0.0f, max = 0.0f, d, id;

	for (unsigned j = 0; j < CASTFS_GGUF_QK; j++) {
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	d = fl32(max / -8.0f);
	id = d != 0.0f ? fl32(1.0f / d) : 0.0f;
	castfs_store_le16(dst, castfs_gguf_fp16(d));
	for (unsigned j = 0; j < half; j++)
		dst[2 + j] = (uint8_t)(q4_code(x[j], id) |
				       q4_code(x[j + half], id) << 4);
}

void castfs_gguf_q4_0(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks)
{
	for (size_t b = 0; b < nblocks; b++)
		q4_0_block(dst + b * CASTFS_GGUF_Q4_0_BYTES,
			   x + b * CASTFS_GGUF_QK);
}

/* Block @b of 16-bit values @x widened exactly to float32 into @f, as the
 * BF16/F16 -> F32 cast kernels do (a NaN stays a NaN of its sign). */
static void widen_block(float *f, const void *x, size_t b, bool f16)
{
	const uint8_t *p = (const uint8_t *)x + b * CASTFS_GGUF_QK * 2;

	for (unsigned j = 0; j < CASTFS_GGUF_QK; j++) {
		uint16_t h = castfs_load_le16(p + 2 * j);

		f[j] = f16 ? castfs_qr_f16_value(h) :
			     castfs_f32_from_bits((uint32_t)h << 16);
	}
}

/* @nblocks blocks of 16-bit values widened one block at a time and
 * quantised by @block into @bytes each. */
static void run16(uint8_t *restrict dst, const void *restrict x, size_t nblocks,
		  bool f16, size_t bytes,
		  void (*block)(uint8_t *, const float *))
{
	float f[CASTFS_GGUF_QK];

	for (size_t b = 0; b < nblocks; b++) {
		widen_block(f, x, b, f16);
		block(dst + b * bytes, f);
	}
}

static void q8_0_16_scalar(uint8_t *restrict dst, const void *restrict x,
			   size_t nblocks, bool f16)
{
	run16(dst, x, nblocks, f16, CASTFS_GGUF_Q8_0_BYTES, q8_0_block);
}

static void q4_0_16_scalar(uint8_t *restrict dst, const void *restrict x,
			   size_t nblocks, bool f16)
{
	run16(dst, x, nblocks, f16, CASTFS_GGUF_Q4_0_BYTES, q4_0_block);
}

const struct castfs_gguf_kernels castfs_gguf_scalar = {
	.q8_0 = castfs_gguf_q8_0,
	.q4_0 = castfs_gguf_q4_0,
	.q8_0_16 = q8_0_16_scalar,
	.q4_0_16 = q4_0_16_scalar,
};
