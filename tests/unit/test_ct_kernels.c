/* SPDX-License-Identifier: MIT */
/*
 * The scaled-fp8 loops of every ISA (castfs_ct_kernels: the codes of
 * fp8_dynamic / fp8_block, of ComfyUI's fp8_scaled, the row absmax)
 * against the scalar reference, bit for bit: every BF16 and F16 pattern
 * widened (NaN, Inf, subnormals, -0.0), random float32 patterns, random
 * weights, values at the BF16 / F16 / E4M3 rounding ties and the clamp,
 * with zero, subnormal, huge, infinite and NaN scales, odd lengths and
 * unaligned pointers; the absmax and the codes of 16-bit values read as
 * they are against those of their widening. An ISA the CPU lacks is reported as skipped.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant_ct.h"
#include "quant/quant_round.h"
#include "testutil.h"
#include "unit.h"

#define NALL 65536u

static const enum castfs_dtype dts[] = { CASTFS_DTYPE_BF16, CASTFS_DTYPE_F16,
					 CASTFS_DTYPE_F32 };

static const size_t lengths[] = { 0,   1,   2,	 7,   8,    15,	  16,
				  17,  31,  32,	 33,  63,   64,	  65,
				  100, 255, 256, 257, 1000, 4099, NALL - 1 };

enum { SET_RANDW, SET_BF16, SET_F16, SET_BITS, SET_TIES, SET_ZERO, NSETS };

/* Random weights ~0.02 with a few outliers: what a row looks like. */
static float rand_weight(uint64_t *seed)
{
	uint64_t r = tu_rand(seed);
	float v = (float)((int32_t)(r >> 32)) * 0x1p-31f * 0.05f;

	return r % 97 == 0 ? v * 1000.0f : v;
}

/* A value at a rounding tie: of E4M3 codes, BF16 or F16 (random kind). */
static float tie_value(uint64_t *seed)
{
	uint64_t r = tu_rand(seed);
	uint32_t sign = (uint32_t)(r & 1) << 31;
	uint8_t k = (uint8_t)((r >> 8) % 126);

	switch ((r >> 1) % 4) {
	case 0: /* midway between E4M3 codes k and k + 1 (<= 480) */
		return castfs_f32_from_bits(
			sign | castfs_f32_bits((castfs_qr_e4m3_value(k) +
						castfs_qr_e4m3_value(
							(uint8_t)(k + 1))) /
					       2.0f));
	case 1: /* BF16 tie: low half 0x8000 */
		return castfs_f32_from_bits((uint32_t)(r >> 32) << 16 |
					    0x8000u);
	case 2: /* F16 tie: 13 low bits 0x1000, exponent in F16's range */
		return castfs_f32_from_bits(
			sign |
			(uint32_t)(0x33000000u + (r >> 40) % 0x10000000u) |
			0x1000u);
	default: /* the clamp's edges and E4M3's largest codes */
		return (float)((int)(r >> 40) % 40 + 430) *
		       (sign ? -1.0f : 1.0f);
	}
}

static float set_value(int set, size_t i, uint64_t *seed)
{
	uint64_t r;

	switch (set) {
	case SET_RANDW:
		return rand_weight(seed);
	case SET_BF16: /* an odd multiplier: every pattern once, shuffled */
		return castfs_f32_from_bits((uint32_t)(uint16_t)(i * 40503u)
					    << 16);
	case SET_F16:
		return castfs_qr_f16_value((uint16_t)(i * 40503u));
	case SET_BITS:
		r = tu_rand(seed);
		return castfs_f32_from_bits((uint32_t)r);
	case SET_TIES:
		return tie_value(seed);
	default: /* zero rows, both signs */
		return i % 3 ? 0.0f : -0.0f;
	}
}

/* NALL + 1 values of @set (one extra for the unaligned start). */
static float *make_set(int set, uint64_t seed)
{
	float *x = malloc((NALL + 1) * sizeof(*x));

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i <= NALL; i++)
		x[i] = set_value(set, i, &seed);
	return x;
}

/* Scales as castfs_ct_f8_scale() can give them, and beyond. */
static float scale_at(size_t k, enum castfs_dtype dt)
{
	static const float fixed[] = { 1.0f,	    0x1p-3f,	0x1p-7f,
				       0x1p-10f,    0x1p-23f,	0x1p-140f,
				       3.0e38f,	    INFINITY,	NAN,
				       0.02f / 448, 1.0f / 3.0f };

	if (k < sizeof(fixed) / sizeof(*fixed))
		return castfs_qr_round(fixed[k], dt);
	return castfs_ct_f8_scale((float)k * 0.37f, dt);
}

#define NSCALES 14u

static void expect_same(const struct castfs_ct_kernels *k,
			const struct castfs_ct_kernels *s, const float *x,
			size_t n, float scale, enum castfs_dtype dt,
			const char *what)
{
	static uint8_t c1[NALL + 1], c2[NALL + 1];
	float a1, a2;

	memset(c1, 0xAA, n + 1);
	memset(c2, 0xAA, n + 1);
	k->f8_codes(c1, x, n, scale, dt);
	s->f8_codes(c2, x, n, scale, dt);
	ck_assert_msg(memcmp(c1, c2, n + 1) == 0,
		      "f8_codes %s: n %zu scale %a dt %d", what, n,
		      (double)scale, (int)dt);
	k->comfy_codes(c1 + 1, x, n, scale, dt);
	s->comfy_codes(c2 + 1, x, n, scale, dt);
	ck_assert_msg(memcmp(c1, c2, n + 1) == 0,
		      "comfy_codes %s: n %zu inv %a dt %d", what, n,
		      (double)scale, (int)dt);
	a1 = k->absmax(x, n);
	a2 = s->absmax(x, n);
	ck_assert_msg(castfs_f32_bits(a1) == castfs_f32_bits(a2),
		      "absmax %s: n %zu: %a != %a", what, n, (double)a1,
		      (double)a2);
}

/* Every set, scale and length; aligned and unaligned sources. */
START_TEST(test_ct_kernels__isa_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 3);
	enum castfs_dtype dt = dts[_i % 3];
	const struct castfs_ct_kernels *k = castfs_ct_kernels_isa(isa);
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);

	ck_assert_ptr_nonnull(k);
	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_ne(k, s);
	for (int set = 0; set < NSETS; set++) {
		float *x = make_set(set, 0x5eed + (uint64_t)set);

		for (size_t sc = 0; sc < NSCALES; sc++)
			for (size_t l = 0;
			     l < sizeof(lengths) / sizeof(*lengths); l++) {
				float scale = scale_at(sc, dt);

				expect_same(k, s, x, lengths[l], scale, dt,
					    castfs_isa_name(isa));
				expect_same(k, s, x + 1, lengths[l], scale, dt,
					    castfs_isa_name(isa));
			}
		free(x);
	}
}
END_TEST

/*
 * absmax16 of @isa over 16-bit patterns (every one, shuffled; weights;
 * zeros of both signs) at every length, aligned and at an odd byte
 * address, equals the scalar absmax of the float32 widening.
 */
static void check_absmax16(enum castfs_isa isa, bool f16)
{
	const struct castfs_ct_kernels *k = castfs_ct_kernels_isa(isa);
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);
	castfs_convert_fn widen = castfs_convert_get_isa(
		CASTFS_ISA_SCALAR, f16 ? CASTFS_DTYPE_F16 : CASTFS_DTYPE_BF16,
		CASTFS_DTYPE_F32, 0);
	uint8_t *raw = malloc(2 * NALL + 1);
	float *f = malloc(NALL * sizeof(*f));
	uint64_t seed = 7;

	ck_assert_ptr_nonnull(k);
	for (int set = 0; set < 3; set++) {
		for (size_t i = 0; i < NALL; i++) {
			uint64_t r = tu_rand(&seed);
			uint16_t h = (uint16_t)(i * 40503u);

			if (set == 1)
				h = (uint16_t)((f16 ? 0x2000 : 0x3c00) +
					       (r >> 32) % 0x600) |
				    (uint16_t)(r & 0x8000);
			else if (set == 2)
				h = (uint16_t)(r & 0x8000);
			castfs_store_le16(raw + 1 + 2 * i, h);
		}
		for (size_t l = 0; l < sizeof(lengths) / sizeof(*lengths);
		     l++) {
			size_t n = lengths[l];
			float want, got;

			memmove(raw, raw + 1, 2 * n);
			widen(f, raw, n);
			want = s->absmax(f, n);
			got = k->absmax16(raw, n, f16);
			ck_assert_msg(
				castfs_f32_bits(got) == castfs_f32_bits(want),
				"absmax16 %s f16 %d set %d n %zu: %a != %a",
				castfs_isa_name(isa), (int)f16, set, n,
				(double)got, (double)want);
			memmove(raw + 1, raw, 2 * n);
			got = k->absmax16(raw + 1, n, f16);
			ck_assert_uint_eq(castfs_f32_bits(got),
					  castfs_f32_bits(want));
		}
	}
	free(f);
	free(raw);
}

/* The 16-bit pattern @i of set @set (as check_absmax16()'s sets). */
static uint16_t set16(int set, size_t i, bool f16, uint64_t *seed)
{
	uint64_t r = tu_rand(seed);

	if (set == 1)
		return (uint16_t)((f16 ? 0x2000 : 0x3c00) + (r >> 32) % 0x600) |
		       (uint16_t)(r & 0x8000);
	if (set == 2)
		return (uint16_t)(r & 0x8000);
	return (uint16_t)(i * 40503u);
}

/*
 * f8_codes16 of @isa (the scalar one included) over 16-bit patterns at
 * every scale and length, aligned and at an odd byte address, equals the
 * scalar f8_codes of their float32 widening (the scalar kernel's).
 */
static void check_codes16_of(const struct castfs_ct_kernels *k,
			     const char *name, bool f16)
{
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);
	enum castfs_dtype dt = f16 ? CASTFS_DTYPE_F16 : CASTFS_DTYPE_BF16;
	castfs_convert_fn widen = castfs_convert_get_isa(CASTFS_ISA_SCALAR, dt,
							 CASTFS_DTYPE_F32, 0);
	uint8_t *raw = malloc(2 * NALL + 1);
	float *f = malloc(NALL * sizeof(*f));
	static uint8_t c1[NALL + 1], c2[NALL + 1];
	uint64_t seed = 11;

	ck_assert_ptr_nonnull(k);
	for (int set = 0; set < 3; set++) {
		for (size_t i = 0; i < NALL; i++)
			castfs_store_le16(raw + 1 + 2 * i,
					  set16(set, i, f16, &seed));
		widen(f, raw + 1, NALL);
		for (size_t sc = 0; sc < NSCALES; sc++)
			for (size_t l = 0;
			     l < sizeof(lengths) / sizeof(*lengths); l++) {
				size_t n = lengths[l];
				float scale = scale_at(sc, dt);

				memset(c1, 0xAA, n + 1);
				memset(c2, 0xAA, n + 1);
				s->f8_codes(c2, f, n, scale, dt);
				k->f8_codes16(c1, raw + 1, n, scale, dt);
				ck_assert_msg(memcmp(c1, c2, n + 1) == 0,
					      "codes16 %s f16 %d set %d n %zu "
					      "scale %a",
					      name, (int)f16, set, n,
					      (double)scale);
				memmove(raw, raw + 1, 2 * n);
				k->f8_codes16(c1, raw, n, scale, dt);
				memmove(raw + 1, raw, 2 * n);
				ck_assert_int_eq(memcmp(c1, c2, n + 1), 0);
			}
	}
	free(f);
	free(raw);
}

static void check_codes16(enum castfs_isa isa, bool f16)
{
	check_codes16_of(castfs_ct_kernels_isa(isa), castfs_isa_name(isa), f16);
}

START_TEST(test_ct_kernels__scalar_codes16)
{
	check_codes16(CASTFS_ISA_SCALAR, _i);
}
END_TEST

START_TEST(test_ct_kernels__isa_codes16)
{
	check_codes16((enum castfs_isa)(_i / 2), _i % 2);
}
END_TEST

START_TEST(test_ct_kernels__scalar_absmax16)
{
	check_absmax16(CASTFS_ISA_SCALAR, _i);
}
END_TEST

/* The AVX512_BF16 variant (vcvtne2ps2bf16) where the CPU has it. */
START_TEST(test_ct_kernels__avx512bf16_codes16)
{
	check_codes16_of(castfs_ct_kernels_avx512bf16(), "avx512bf16", _i);
}
END_TEST

/*
 * The AVX512_BF16 loop divides by a BF16 scale as a product by its
 * reciprocal (ct_recip_exact()): every BF16 pattern at every BF16 scale of
 * the binades 2^-24 to 2^2 (those of weights' absmax / 448), and at 16
 * scales of every other binade whose reciprocal is normal, gives the
 * scalar division's codes; so do those of the binades beyond (subnormal
 * scales, reciprocals that overflow or are subnormal), which divide.
 */
START_TEST(test_ct_kernels__avx512bf16_recip_every_scale)
{
	const struct castfs_ct_kernels *k = castfs_ct_kernels_avx512bf16();
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);
	uint8_t *raw = malloc(2 * 65536);
	float *f = malloc(65536 * sizeof(*f));
	static uint8_t c1[65536], c2[65536];

	ck_assert_ptr_nonnull(raw);
	ck_assert_ptr_nonnull(f);
	for (uint32_t i = 0; i < 65536; i++) {
		castfs_store_le16(raw + 2 * i, (uint16_t)i);
		f[i] = castfs_f32_from_bits(i << 16);
	}
	/* Float32 scales that are not BF16 divide. */
	for (uint32_t i = 0; i < 64; i++) {
		float scale = (0.02f + (float)i * 0.001f) / 448;

		k->f8_codes16(c1, raw, 65536, scale, CASTFS_DTYPE_BF16);
		s->f8_codes(c2, f, 65536, scale, CASTFS_DTYPE_BF16);
		ck_assert_msg(memcmp(c1, c2, 65536) == 0, "scale %a",
			      (double)scale);
	}
	/* Every finite BF16 exponent but the largest (3e38 is elsewhere). */
	for (uint32_t e = 0; e <= 253; e++) {
		bool all = e >= 127 - 24 && e <= 127 + 2;

		for (uint32_t m = 0; m < 128; m += all ? 1 : 8) {
			float scale =
				castfs_f32_from_bits((e << 23) | (m << 16));

			k->f8_codes16(c1, raw, 65536, scale, CASTFS_DTYPE_BF16);
			s->f8_codes(c2, f, 65536, scale, CASTFS_DTYPE_BF16);
			ck_assert_msg(memcmp(c1, c2, 65536) == 0, "scale %a",
				      (double)scale);
		}
	}
	free(f);
	free(raw);
}
END_TEST

START_TEST(test_ct_kernels__isa_absmax16)
{
	check_absmax16((enum castfs_isa)(_i / 2), _i % 2);
}
END_TEST

/*
 * The public functions (the ISA chosen once; per_isa.sh forces each)
 * give the scalar reference's bytes.
 */
START_TEST(test_ct_kernels__dispatch_matches_scalar)
{
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);
	enum castfs_dtype dt = dts[_i];
	static uint8_t c1[NALL], c2[NALL];
	float *x = make_set(SET_BF16, 1);

	for (size_t sc = 0; sc < NSCALES; sc++) {
		float scale = scale_at(sc, dt);

		castfs_ct_f8_codes(c1, x, NALL, scale, dt);
		s->f8_codes(c2, x, NALL, scale, dt);
		ck_assert_int_eq(memcmp(c1, c2, NALL), 0);
		castfs_comfy_f8_codes(c1, x, NALL, scale, dt);
		s->comfy_codes(c2, x, NALL, castfs_qr_round(1.0f / scale, dt),
			       dt);
		ck_assert_int_eq(memcmp(c1, c2, NALL), 0);
	}
	ck_assert_uint_eq(castfs_f32_bits(castfs_ct_absmax(x, NALL)),
			  castfs_f32_bits(s->absmax(x, NALL)));
	if (dt != CASTFS_DTYPE_F32) {
		static uint8_t raw[2 * NALL];

		for (size_t i = 0; i < NALL; i++)
			castfs_store_le16(raw + 2 * i, (uint16_t)(i * 40503u));
		castfs_ct_f8_codes16(c1, raw, NALL, scale_at(3, dt), dt);
		s->f8_codes16(c2, raw, NALL, scale_at(3, dt), dt);
		ck_assert_int_eq(memcmp(c1, c2, NALL), 0);
	}
	free(x);
}
END_TEST

/* The reference's documented edge cases, independent of any ISA. */
START_TEST(test_ct_kernels__scalar_edges)
{
	const struct castfs_ct_kernels *s =
		castfs_ct_kernels_isa(CASTFS_ISA_SCALAR);
	const float x[] = { -0.0f, 0.0f, 1e30f,	 -1e30f,
			    NAN,   -NAN, 448.0f, 464.0f };
	uint8_t c[8];

	/* -0.0 gets the zero point (code 0x00); saturation at 448 (0x7E);
	 * a BF16 NaN becomes +NaN (0x7F); 464 (a tie) is clamped first. */
	s->f8_codes(c, x, 8, 1.0f, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(c[0], 0x00);
	ck_assert_uint_eq(c[1], 0x00);
	ck_assert_uint_eq(c[2], 0x7e);
	ck_assert_uint_eq(c[3], 0xfe);
	ck_assert_uint_eq(c[4], 0x7f);
	ck_assert_uint_eq(c[5], 0x7f);
	ck_assert_uint_eq(c[6], 0x7e);
	ck_assert_uint_eq(c[7], 0x7e);
	/* An F16 NaN keeps its sign. */
	s->f8_codes(c, x, 8, 1.0f, CASTFS_DTYPE_F16);
	ck_assert_uint_eq(c[5], 0xff);
	/* ComfyUI: a NaN inverse scale gives its NaN (0x7F), as torch's
	 * x * inv does, whatever the element: -NaN included. */
	s->comfy_codes(c, x, 8, NAN, CASTFS_DTYPE_F32);
	ck_assert_uint_eq(c[0], 0x7f);
	ck_assert_uint_eq(c[5], 0x7f);
	ck_assert_uint_eq(castfs_f32_bits(s->absmax(x, 4)),
			  castfs_f32_bits(1e30f));
	ck_assert(isnan(s->absmax(x, 5)));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("ct_kernels");
	TCase *tc = tcase_create("ct_kernels");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_ct_kernels__scalar_edges);
	tcase_add_loop_test(tc, test_ct_kernels__dispatch_matches_scalar, 0, 3);
	unit_add_isa_loop(tc, test_ct_kernels__isa_matches_scalar, 3);
	tcase_add_loop_test(tc, test_ct_kernels__scalar_absmax16, 0, 2);
	unit_add_isa_loop(tc, test_ct_kernels__isa_absmax16, 2);
	tcase_add_loop_test(tc, test_ct_kernels__scalar_codes16, 0, 2);
	/* Not an ISA of its own, so not counted by unit_add_isa_loop(). */
	if (castfs_ct_kernels_avx512bf16()) {
		tcase_add_loop_test(tc, test_ct_kernels__avx512bf16_codes16, 0,
				    2);
		tcase_add_test(tc,
			       test_ct_kernels__avx512bf16_recip_every_scale);
	} else
		fprintf(stderr, "ct_kernels: no AVX512_BF16, its codes16 "
				"variant not tested\n");
	unit_add_isa_loop(tc, test_ct_kernels__isa_codes16, 2);
	suite_add_tcase(s, tc);
	return s;
}
