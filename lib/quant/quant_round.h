/* SPDX-License-Identifier: MIT */
/*
 * One-element roundings of float32 for the scalar quantisers: the same
 * bits as the cast kernels (kernels/convert_scalar.c, torch's algorithms),
 * inlined, so that a quantiser rounds each element in registers instead of
 * through a kernel call per element or per 256-element chunk. The unit test
 * test_quant_round compares them with castfs_convert_get()'s kernels over
 * every 16-bit / 8-bit code and many float32 values (NaN, Inf, subnormals,
 * ties). Pure functions; thread-safe.
 */
#ifndef CASTFS_QUANT_ROUND_H
#define CASTFS_QUANT_ROUND_H

#include <math.h>
#include <stdint.h>

#include "common/bytes.h"
#include "format/dtype.h"

/* Like convert_scalar.c's fadd_bits(): the subnormal paths round by an add,
 * exactly as the kernels (and torch) do. */
static inline uint32_t castfs_qr_fadd_bits(uint32_t a, uint32_t b)
{
	return castfs_f32_bits(castfs_f32_from_bits(a) +
			       castfs_f32_from_bits(b));
}

/*
 * castfs_qr_bf16_bits - the BF16 code of @f as the F32->BF16 kernel gives
 * it (round to nearest even; a NaN keeps its top bits, quieted).
 */
static inline uint16_t castfs_qr_bf16_bits(float f)
{
	uint32_t u = castfs_f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/*
 * castfs_qr_f16_bits - the F16 code of @f as the F32->F16 kernel gives it
 * (round to nearest even, subnormals kept, overflow to Inf).
 */
static inline uint16_t castfs_qr_f16_bits(float f)
{
	uint32_t u = castfs_f32_bits(f);
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* 65520 ties up to Inf */
		return (uint16_t)(sign | 0x7c00u);
	if (a < 113u << 23) /* below 2^-14: ulp of 0.5f is 2^-24 */
		return (uint16_t)(sign | (castfs_qr_fadd_bits(a, 0x3f000000u) -
					  0x3f000000u));
	a += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(sign | a >> 13);
}

/* castfs_qr_f16_value - the float value of F16 code @h (the F16->F32 kernel,
 * NaN quieting included). */
static inline float castfs_qr_f16_value(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0x1f)
		return castfs_f32_from_bits(sign | 0x7f800000u | m << 13 |
					    (m ? 0x400000u : 0));
	if (e == 0)
		return castfs_f32_from_bits(
			sign | castfs_f32_bits((float)m * 0x1p-24f));
	return castfs_f32_from_bits(sign | (e + 127 - 15) << 23 | m << 13);
}

/*
 * castfs_qr_round - @f rounded to @dt (BF16, F16 or F32) and widened back,
 * as quant_ct.c's roundings do: a BF16 NaN becomes +NaN (0x7FC00000, as
 * torch's bfloat16 rounding gives it), an F16 NaN keeps its sign.
 */
static inline float castfs_qr_round(float f, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_BF16) {
		if (isnan(f))
			return NAN;
		return castfs_f32_from_bits((uint32_t)castfs_qr_bf16_bits(f)
					    << 16);
	}
	if (dt == CASTFS_DTYPE_F16)
		return castfs_qr_f16_value(castfs_qr_f16_bits(f));
	return f;
}

/*
 * castfs_qr_e4m3 - the F8_E4M3 code of @f as the non-saturating F32->E4M3
 * kernel gives it (480 and above, Inf and NaN: 0x7F with the sign).
 */
static inline uint8_t castfs_qr_e4m3(float f)
{
	uint32_t u = castfs_f32_bits(f);
	uint32_t sign = u & 0x80000000u, a = u ^ sign;
	uint8_t r;

	if (a >= 1087u << 20) {
		r = 0x7f;
	} else if (a < 121u << 23) { /* below 2^-6 */
		r = (uint8_t)(castfs_qr_fadd_bits(a, 141u << 23) -
			      (141u << 23));
	} else {
		a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + ((a >> 20) & 1u);
		r = (uint8_t)(a >> 20);
	}
	return r | (uint8_t)(sign >> 24);
}

/* castfs_qr_e4m3_value - the float value of F8_E4M3 code @b (the E4M3->F32
 * kernel: 0x7F/0xFF give a NaN of that sign). */
static inline float castfs_qr_e4m3_value(uint8_t b)
{
	uint32_t sign = (uint32_t)(b & 0x80u) << 24;
	uint32_t m = b & 0x7fu;

	if (m == 0x7f)
		return castfs_f32_from_bits(sign | 0x7ff00000u);
	if (m < 8)
		return castfs_f32_from_bits(
			sign | castfs_f32_bits((float)m * 0x1p-9f));
	return castfs_f32_from_bits(sign | ((m >> 3) + 127 - 7) << 23 |
				    (m & 7) << 20);
}

/*
 * castfs_qr_roundf_i8 - the low byte of (int32_t)roundf(@v) as x86
 * compiles C's conversion (cvttss2si: INT_MIN, low byte 0, for NaN and
 * values outside int32), without a libm call: for |@v| < 2^23, t =
 * trunc(@v) and t +- 0.5 are exact, and comparing @v with them rounds half
 * away from zero; larger values are integers already. Only comparisons
 * follow the caller's product, so no FMA contraction can change a result.
 */
static inline int8_t castfs_qr_roundf_i8(float v)
{
	int32_t i;
	float t;

	if (!(v > -2147483648.0f && v < 2147483648.0f))
		return 0;
	i = (int32_t)v;
	if (v > -8388608.0f && v < 8388608.0f) {
		t = (float)i;
		i += (v >= t + 0.5f) - (v <= t - 0.5f);
	}
	return (int8_t)i;
}

#endif
