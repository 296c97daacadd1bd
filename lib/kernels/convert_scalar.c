/* SPDX-License-Identifier: MIT */
/*
 * The reference kernels: one element at a time, torch's CPU algorithms
 * transcribed (docs/FORMATS.md §2). Every SIMD kernel must match these bits.
 */
#include <stdint.h>
#include <string.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert_internal.h"

/*
 * Every conversion widens to float32 bits, then narrows. Widening from
 * f16/bf16/fp8 is exact, so this rounds once, as torch does. From f64 it
 * rounds twice (double -> float -> target), which is also what torch does.
 *
 * NaN policy: the output is a NaN of the input's sign. Widening keeps the
 * payload, shifted up, and quiets it except from bf16 (a plain shift, as in
 * torch); narrowing to f16 is vcvtps2ph's sign|0x7e00|mant>>13, to bf16 it is
 * (bits >> 16) | 0x40, to either fp8 it is 0x7f|sign (torch).
 *
 * The fp8 and f16 subnormal paths round with a float add, as torch does: the
 * result depends on MXCSR rounding (round-to-nearest by default) but not on
 * FTZ/DAZ, since every operand or result that could be denormal has a
 * rounded result of zero anyway.
 */

#define F32_SIGN UINT32_C(0x80000000)
#define F32_INF UINT32_C(0x7f800000)
#define E4M3_MAX UINT32_C(0x43e00000) /* 448.0f */
#define E5M2_MAX UINT32_C(0x47600000) /* 57344.0f */

static uint32_t fadd_bits(uint32_t a, uint32_t b)
{
	return castfs_f32_bits(castfs_f32_from_bits(a) +
			       castfs_f32_from_bits(b));
}

static uint32_t widen_f64(uint64_t u)
{
	uint32_t sign = (uint32_t)(u >> 32) & F32_SIGN;

	/* As cvtsd2ss does, made explicit so other CPUs agree. */
	if ((u & ~(UINT64_C(1) << 63)) > UINT64_C(0x7ff0000000000000))
		return sign | 0x7fc00000 | ((uint32_t)(u >> 29) & 0x7fffff);
	return castfs_f32_bits((float)castfs_f64_from_bits(u));
}

static uint32_t widen_f32(uint32_t u)
{
	return u;
}

/* Exactly what vcvtph2ps does, NaN quieting included. */
static uint32_t widen_f16(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0x1f)
		return sign | F32_INF | m << 13 | (m ? 0x400000 : 0);
	if (e == 0) /* m * 2^-24 is exact and normal in f32 */
		return sign | castfs_f32_bits((float)m * 0x1p-24f);
	return sign | (e + 127 - 15) << 23 | m << 13;
}

static uint32_t widen_bf16(uint16_t h)
{
	return (uint32_t)h << 16;
}

static uint32_t widen_e4m3(uint8_t b)
{
	uint32_t sign = (uint32_t)(b & 0x80) << 24;
	uint32_t m = b & 0x7f;

	if (m == 0x7f) /* the only NaN; payload 0b111 shifted up, as torch */
		return sign | 0x7ff00000;
	if (m < 8)
		return sign | castfs_f32_bits((float)m * 0x1p-9f);
	return sign | ((m >> 3) + 127 - 7) << 23 | (m & 7) << 20;
}

/* e5m2 is the top byte of an f16: this is torch's own route. */
static uint32_t widen_e5m2(uint8_t b)
{
	return widen_f16((uint16_t)(b << 8));
}

static uint32_t narrow_f32(uint32_t u)
{
	return u;
}

/* IEEE round-to-nearest-even with subnormals and overflow to Inf. */
static uint16_t narrow_f16(uint32_t u)
{
	uint32_t sign = (u >> 16) & 0x8000, a = u & ~F32_SIGN;

	if (a > F32_INF)
		return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
	if (a >= UINT32_C(0x477ff000)) /* 65520 ties up to Inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < UINT32_C(113) << 23) /* below 2^-14: ulp of 0.5f is 2^-24 */
		return (uint16_t)(sign |
				  (fadd_bits(a, 0x3f000000) - 0x3f000000));
	a += ((uint32_t)(15 - 127) << 23) + 0xfff + ((a >> 13) & 1);
	return (uint16_t)(sign | a >> 13);
}

/* torch's round_to_nearest_even(); subnormals kept, overflow to Inf. */
static uint16_t narrow_bf16(uint32_t u)
{
	if ((u & ~F32_SIGN) > F32_INF)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* torch's fp8e4m3fn_from_fp32_value() before PR #178817 made it saturate. */
static uint8_t narrow_e4m3(uint32_t u)
{
	uint32_t sign = u & F32_SIGN, a = u ^ sign;
	uint8_t r;

	if (a >= UINT32_C(1087) << 20) { /* 480.0f, Inf, NaN */
		r = 0x7f;
	} else if (a < UINT32_C(121) << 23) { /* below 2^-6 */
		r = (uint8_t)(fadd_bits(a, UINT32_C(141) << 23) -
			      (UINT32_C(141) << 23));
	} else {
		a += ((uint32_t)(7 - 127) << 23) + 0x7ffff + ((a >> 20) & 1);
		r = (uint8_t)(a >> 20);
	}
	return r | (uint8_t)(sign >> 24);
}

/* torch's fp8e5m2_from_fp32_value(). */
static uint8_t narrow_e5m2(uint32_t u)
{
	uint32_t sign = u & F32_SIGN, a = u ^ sign;
	uint8_t r;

	if (a >= UINT32_C(143) << 23) { /* 65536.0f, Inf, NaN */
		r = a > F32_INF ? 0x7f : 0x7c;
	} else if (a < UINT32_C(113) << 23) { /* below 2^-14 */
		r = (uint8_t)(fadd_bits(a, UINT32_C(134) << 23) -
			      (UINT32_C(134) << 23));
	} else {
		a += ((uint32_t)(15 - 127) << 23) + 0xfffff + ((a >> 21) & 1);
		r = (uint8_t)(a >> 21);
	}
	return r | (uint8_t)(sign >> 24);
}

/* Clamp before rounding, so nothing rounds up into NaN or Inf. */
static uint32_t clamp(uint32_t u, uint32_t max)
{
	uint32_t a = u & ~F32_SIGN;

	if (a > max && a <= F32_INF)
		return (u & F32_SIGN) | max;
	return u;
}

static uint8_t narrow_e4m3_sat(uint32_t u)
{
	return narrow_e4m3(clamp(u, E4M3_MAX));
}

static uint8_t narrow_e5m2_sat(uint32_t u)
{
	return narrow_e5m2(clamp(u, E5M2_MAX));
}

static uint64_t load_64(const uint8_t *p, size_t i)
{
	return castfs_load_le64(p + 8 * i);
}

static uint32_t load_32(const uint8_t *p, size_t i)
{
	return castfs_load_le32(p + 4 * i);
}

static uint16_t load_16(const uint8_t *p, size_t i)
{
	return castfs_load_le16(p + 2 * i);
}

static uint8_t load_8(const uint8_t *p, size_t i)
{
	return p[i];
}

static void store_32(uint8_t *p, size_t i, uint32_t v)
{
	castfs_store_le32(p + 4 * i, v);
}

static void store_16(uint8_t *p, size_t i, uint16_t v)
{
	castfs_store_le16(p + 2 * i, v);
}

static void store_8(uint8_t *p, size_t i, uint8_t v)
{
	p[i] = v;
}

/* cvt_<from>_<to>: element size in bits @sb, @db; types as named above. */
#define KERNEL(from, sb, to, db)                                             \
	static CASTFS_UNUSED void cvt_##from##_##to(                         \
		void *restrict dst, const void *restrict src, size_t n)      \
	{                                                                    \
		const uint8_t *s = src;                                      \
		uint8_t *d = dst;                                            \
                                                                             \
		for (size_t i = 0; i < n; i++)                               \
			store_##db(                                          \
				d, i,                                        \
				narrow_##to(widen_##from(load_##sb(s, i)))); \
	}

/* Each source to every target but itself, fp8 targets also saturating. */
#define KERNELS_FROM(from, sb)        \
	KERNEL(from, sb, f32, 32)     \
	KERNEL(from, sb, f16, 16)     \
	KERNEL(from, sb, bf16, 16)    \
	KERNEL(from, sb, e4m3, 8)     \
	KERNEL(from, sb, e4m3_sat, 8) \
	KERNEL(from, sb, e5m2, 8)     \
	KERNEL(from, sb, e5m2_sat, 8)

/*
 * The identity pairs are generated too, hence CASTFS_UNUSED above: only
 * their saturating forms are used (e5m2 -> e5m2 maps Inf to 57344).
 */
KERNELS_FROM(f64, 64)
KERNELS_FROM(f32, 32)
KERNELS_FROM(f16, 16)
KERNELS_FROM(bf16, 16)
KERNELS_FROM(e4m3, 8)
KERNELS_FROM(e5m2, 8)

/*
 * numpy's npy_doublebits_to_halfbits: double -> half rounded once (to
 * nearest, ties to even), overflow to Inf, a NaN keeping the top of its
 * payload (never turning into Inf).
 */
static uint16_t f64_f16_once(uint64_t d)
{
	const uint64_t mant = UINT64_C(0x000fffffffffffff);
	uint16_t sgn = (uint16_t)((d >> 48) & 0x8000);
	uint64_t exp = d & UINT64_C(0x7ff0000000000000), sig = d & mant;

	if (exp >= UINT64_C(0x40f0000000000000)) { /* >= 2^16, Inf, NaN */
		uint16_t nan = (uint16_t)(0x7c00 + (sig >> 42));

		if (exp == UINT64_C(0x7ff0000000000000) && sig)
			return (uint16_t)(sgn | (nan == 0x7c00 ? 0x7c01 : nan));
		return (uint16_t)(sgn | 0x7c00);
	}
	if (exp <= UINT64_C(0x3f00000000000000)) { /* below 2^-14 */
		if (exp < UINT64_C(0x3e60000000000000))
			return sgn; /* below 2^-25: zero */
		/* the subnormal's bits up to bit 53, the rounding bit 52 */
		sig = (sig | (mant + 1)) << ((exp >> 52) - 998);
		if ((sig & UINT64_C(0x003fffffffffffff)) !=
		    UINT64_C(0x0010000000000000))
			sig += UINT64_C(0x0010000000000000);
		return (uint16_t)(sgn | (sig >> 53));
	}
	/* a carry out of the significand steps the exponent: right, and
	 * 65520 and up become Inf */
	if ((sig & UINT64_C(0x000007ffffffffff)) !=
	    UINT64_C(0x0000020000000000))
		sig += UINT64_C(0x0000020000000000);
	return (uint16_t)(sgn + ((exp - UINT64_C(0x3f00000000000000)) >> 42) +
			  (sig >> 42));
}

void castfs_cvt_f64_f16_once(void *restrict dst, const void *restrict src,
			     size_t n)
{
	const uint8_t *s = src;
	uint8_t *o = dst;

	for (size_t i = 0; i < n; i++)
		castfs_store_le16(o + 2 * i,
				  f64_f16_once(castfs_load_le64(s + 8 * i)));
}

/* @from == @to without flags is a copy: NaN payloads pass untouched. */
static void copy_1(void *restrict dst, const void *restrict src, size_t n)
{
	memcpy(dst, src, n);
}

static void copy_2(void *restrict dst, const void *restrict src, size_t n)
{
	memcpy(dst, src, 2 * n);
}

static void copy_4(void *restrict dst, const void *restrict src, size_t n)
{
	memcpy(dst, src, 4 * n);
}

static void copy_8(void *restrict dst, const void *restrict src, size_t n)
{
	memcpy(dst, src, 8 * n);
}

#define T(x) CASTFS_CVT_##x

/* clang-format off */
/*
 * Row for a source type; the arguments let the identity entry be a copy.
 * F64 is a target only of itself.
 */
#define ROW(from, f64, f32, f16, bf16, e4m3, e5m2)                           \
	{                                                                    \
		[T(F64)] = { f64, NULL },                                    \
		[T(F32)] = { f32, NULL },                                    \
		[T(F16)] = { f16, NULL },                                    \
		[T(BF16)] = { bf16, NULL },                                  \
		[T(E4M3)] = { e4m3, cvt_##from##_e4m3_sat },                 \
		[T(E5M2)] = { e5m2, cvt_##from##_e5m2_sat },                 \
	}

const struct castfs_cvt_table castfs_cvt_scalar = {
	.fn = {
		[T(F64)] = ROW(f64, copy_8, cvt_f64_f32, cvt_f64_f16,
			       cvt_f64_bf16, cvt_f64_e4m3, cvt_f64_e5m2),
		[T(F32)] = ROW(f32, NULL, copy_4, cvt_f32_f16,
			       cvt_f32_bf16, cvt_f32_e4m3, cvt_f32_e5m2),
		[T(F16)] = ROW(f16, NULL, cvt_f16_f32, copy_2,
			       cvt_f16_bf16, cvt_f16_e4m3, cvt_f16_e5m2),
		[T(BF16)] = ROW(bf16, NULL, cvt_bf16_f32, cvt_bf16_f16,
				copy_2, cvt_bf16_e4m3, cvt_bf16_e5m2),
		[T(E4M3)] = ROW(e4m3, NULL, cvt_e4m3_f32, cvt_e4m3_f16,
				cvt_e4m3_bf16, copy_1, cvt_e4m3_e5m2),
		[T(E5M2)] = ROW(e5m2, NULL, cvt_e5m2_f32, cvt_e5m2_f16,
				cvt_e5m2_bf16, cvt_e5m2_e4m3, copy_1),
	},
};
/* clang-format on */

/* bf16 bits from a grouped frame's planes (lib/source/zst_group.c). */
static uint16_t bf16_of_planes(uint8_t sm, uint8_t ex)
{
	return (uint16_t)(((sm & 0x80u) << 8) | ((unsigned)ex << 7) |
			  (sm & 0x7Fu));
}

#define PLANES_KERNEL(to)                                                  \
	static void cvtp_bf16_##to(void *restrict dst,                     \
				   const uint8_t *restrict sm,             \
				   const uint8_t *restrict ex, size_t n)   \
	{                                                                  \
		uint8_t *d = dst;                                          \
                                                                           \
		for (size_t i = 0; i < n; i++)                             \
			d[i] = narrow_##to(                                \
				widen_bf16(bf16_of_planes(sm[i], ex[i]))); \
	}

PLANES_KERNEL(e4m3)
PLANES_KERNEL(e4m3_sat)

const castfs_convert_planes_fn castfs_cvtp_scalar[2] = { cvtp_bf16_e4m3,
							 cvtp_bf16_e4m3_sat };

/* fp32 bits from a grouped frame's planes, the exponent made a byte. */
static uint32_t f32_of_planes(const uint8_t *const *p, size_t i)
{
	return (uint32_t)(p[2][i] & 0x80u) << 24 | (uint32_t)p[3][i] << 23 |
	       (uint32_t)(p[2][i] & 0x7Fu) << 16 | (uint32_t)p[1][i] << 8 |
	       p[0][i];
}

static uint32_t f16_of_planes(const uint8_t *const *p, size_t i)
{
	return widen_f16((uint16_t)(p[0][i] | p[1][i] << 8));
}

#define GROUPED_KERNEL(from, to)                                              \
	static void cvtg_##from##_##to(void *restrict dst,                    \
				       const uint8_t *const *plane, size_t n) \
	{                                                                     \
		uint8_t *d = dst;                                             \
                                                                              \
		for (size_t i = 0; i < n; i++)                                \
			d[i] = narrow_##to(from##_of_planes(plane, i));       \
	}

GROUPED_KERNEL(f16, e4m3)
GROUPED_KERNEL(f16, e4m3_sat)
GROUPED_KERNEL(f32, e4m3)
GROUPED_KERNEL(f32, e4m3_sat)

const castfs_convert_grouped_fn castfs_cvtg_scalar[2][2] = {
	{ cvtg_f16_e4m3, cvtg_f16_e4m3_sat },
	{ cvtg_f32_e4m3, cvtg_f32_e4m3_sat },
};
