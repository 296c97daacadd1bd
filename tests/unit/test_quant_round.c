/* SPDX-License-Identifier: MIT */
/*
 * The inlined one-element roundings (quant/quant_round.h) against the
 * scalar cast kernels they transcribe, bit for bit: every F16 and E4M3
 * code widened; float32 values narrowed to BF16, F16 and E4M3 over every
 * top-16-bit pattern with low halves at and around each tie, and random
 * float32 bits (NaN payloads, Inf, subnormals, zeros of both signs); the
 * libm-free roundf-to-int8 against roundf() over the same values and every
 * tie Q8_0 can meet.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant_ct.h"
#include "quant/quant_round.h"
#include "testutil.h"
#include "unit.h"

/* Low halves: zero, ties of BF16 (0x8000), F16 (0x1000) and E4M3 rounding
 * (bit 19 is in the top half), their neighbours, all ones. */
static const uint16_t lows[] = { 0x0000, 0x0001, 0x0fff, 0x1000, 0x1001,
				 0x7fff, 0x8000, 0x8001, 0xffff };

static castfs_convert_fn scalar(enum castfs_dtype from, enum castfs_dtype to)
{
	castfs_convert_fn f =
		castfs_convert_get_isa(CASTFS_ISA_SCALAR, from, to, 0);

	ck_assert_ptr_nonnull(f);
	return f;
}

/* The kernels' answer for @u against the inline functions'. */
static void check_narrow(uint32_t u)
{
	float f = castfs_f32_from_bits(u), back, want;
	uint16_t hb, hf;
	uint8_t e;

	scalar(CASTFS_DTYPE_F32, CASTFS_DTYPE_BF16)(&hb, &f, 1);
	ck_assert_uint_eq(castfs_qr_bf16_bits(f), hb);
	scalar(CASTFS_DTYPE_F32, CASTFS_DTYPE_F16)(&hf, &f, 1);
	ck_assert_uint_eq(castfs_qr_f16_bits(f), hf);
	scalar(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3)(&e, &f, 1);
	ck_assert_uint_eq(castfs_qr_e4m3(f), e);

	/* castfs_qr_round: the round trip, a BF16 NaN made +0x7FC00000. */
	scalar(CASTFS_DTYPE_BF16, CASTFS_DTYPE_F32)(&want, &hb, 1);
	if (want != want)
		want = castfs_f32_from_bits(0x7fc00000u);
	back = castfs_qr_round(f, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(castfs_f32_bits(back), castfs_f32_bits(want));
	scalar(CASTFS_DTYPE_F16, CASTFS_DTYPE_F32)(&want, &hf, 1);
	back = castfs_qr_round(f, CASTFS_DTYPE_F16);
	ck_assert_uint_eq(castfs_f32_bits(back), castfs_f32_bits(want));
	back = castfs_qr_round(f, CASTFS_DTYPE_F32);
	ck_assert_uint_eq(castfs_f32_bits(back), u);
}

/* libm's roundf, then C's (int8_t)(int32_t) as x86 compiles it (the rule
 * quant_gguf.c's Q8_0 followed before castfs_qr_roundf_i8). */
static int8_t roundf_i8_ref(float v)
{
	float r = roundf(v);

	if (!(r > -2147483648.0f && r < 2147483648.0f))
		return 0;
	return (int8_t)(int32_t)r;
}

static void check_roundf_i8(uint32_t u)
{
	float v = castfs_f32_from_bits(u);

	ck_assert_int_eq(castfs_qr_roundf_i8(v), roundf_i8_ref(v));
}

/* torch's amax(abs(x)) as written plainly: NaN as soon as one is NaN. */
static float absmax_ref(const float *x, size_t n)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++) {
		if (x[i] != x[i])
			return castfs_f32_from_bits(0x7fc00000u);
		m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
	}
	return m;
}

/* castfs_ct_absmax (integer lanes) against the plain rule: every length
 * up to 40 and a long one, with NaN, Inf, -0.0 and subnormals mixed in. */
START_TEST(test_quant_round__ct_absmax)
{
	static const uint32_t special[] = { 0x7f800000u, 0xff800000u,
					    0x7fc00001u, 0xffc00000u,
					    0x80000000u, 0x00000001u,
					    0x807fffffu, 0x7f7fffffu };
	uint64_t seed = 0xab5u;
	float x[4100];

	for (int round = 0; round < 2000; round++) {
		size_t n = round < 1000 ? (size_t)round % 41 : 4100;

		for (size_t i = 0; i < n; i++) {
			uint64_t r = tu_rand(&seed);

			x[i] = castfs_f32_from_bits((uint32_t)r);
			if (r >> 60 < 12)
				x[i] = (float)((int64_t)(r >> 40) - (1 << 23)) *
				       0x1p-20f;
			else if (r >> 60 < 13)
				x[i] = castfs_f32_from_bits(
					special[(r >> 32) % 8]);
			if (round % 3 == 0 && x[i] != x[i])
				x[i] = 1.0f; /* a third without NaN */
		}
		ck_assert_uint_eq(castfs_f32_bits(castfs_ct_absmax(x, n)),
				  castfs_f32_bits(absmax_ref(x, n)));
	}
}
END_TEST

/* compressed-tensors' cast_to_fp4 step by step (fp4_utils.py): NaN -> 0,
 * + 0.0 zero point, clamp to [-6, 6], thresholds, torch.signbit. */
static uint8_t fp4_ref(float q)
{
	static const float up[7] = { 0.25f, 0.75f, 1.25f, 1.75f,
				     2.5f,  3.5f,  5.0f };
	uint8_t mag = 0;
	float a;

	if (q != q)
		return 0;
	q += 0.0f;
	q = q > 6.0f ? 6.0f : q < -6.0f ? -6.0f : q;
	a = fabsf(q);
	/* even codes (0, 2, 4, 6) keep their ties: > ; odd ones: >= */
	while (mag < 7 && (mag % 2 == 0 ? a > up[mag] : a >= up[mag]))
		mag++;
	return (uint8_t)(mag | (q < 0.0f ? 8u : 0u));
}

/* castfs_ct_fp4_pack over every BF16 value (NaN, Inf, -0.0, subnormals,
 * every grid point and tie) with two effective scales. */
START_TEST(test_quant_round__fp4_pack_every_bf16)
{
	static const float scales[][2] = { { 1.0f, 1.0f }, { 0.75f, 2.0f } };

	for (size_t k = 0; k < 2; k++) {
		float sc = scales[k][0], gs = scales[k][1], eff = sc / gs;

		for (uint32_t h = 0; h < 65536u; h += 2) {
			float x[2] = { castfs_f32_from_bits(h << 16),
				       castfs_f32_from_bits((h + 1) << 16) };
			uint8_t got;

			castfs_ct_fp4_pack(&got, x, 2, sc, gs);
			ck_assert_uint_eq(got, fp4_ref(x[0] / eff) |
						       fp4_ref(x[1] / eff)
							       << 4);
		}
	}
}
END_TEST

START_TEST(test_quant_round__widen_every_code)
{
	castfs_convert_fn f16 = scalar(CASTFS_DTYPE_F16, CASTFS_DTYPE_F32);
	castfs_convert_fn e4 = scalar(CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F32);

	for (uint32_t h = 0; h < 65536u; h++) {
		uint16_t c = (uint16_t)h;
		float want;

		f16(&want, &c, 1);
		ck_assert_uint_eq(castfs_f32_bits(castfs_qr_f16_value(c)),
				  castfs_f32_bits(want));
	}
	for (uint32_t b = 0; b < 256u; b++) {
		uint8_t c = (uint8_t)b;
		float want;

		e4(&want, &c, 1);
		ck_assert_uint_eq(castfs_f32_bits(castfs_qr_e4m3_value(c)),
				  castfs_f32_bits(want));
	}
}
END_TEST

START_TEST(test_quant_round__narrow_every_top_half)
{
	for (uint32_t hi = 0; hi < 65536u; hi++)
		for (size_t k = 0; k < sizeof(lows) / sizeof(lows[0]); k++)
			check_narrow(hi << 16 | lows[k]);
}
END_TEST

START_TEST(test_quant_round__roundf_i8)
{
	uint64_t seed = 0x0bad5eedu;

	for (uint32_t hi = 0; hi < 65536u; hi++)
		for (size_t k = 0; k < sizeof(lows) / sizeof(lows[0]); k++)
			check_roundf_i8(hi << 16 | lows[k]);
	for (uint32_t i = 0; i < (1u << 21); i++)
		check_roundf_i8((uint32_t)tu_rand(&seed));
	/* Every multiple of 2^-10 in [-300, 300]: all the ties Q8_0 meets. */
	for (int32_t k = -300 * 1024; k <= 300 * 1024; k++)
		check_roundf_i8(castfs_f32_bits((float)k * 0x1p-10f));
	/* Next to the 2^23 and 2^31 bounds. */
	for (int32_t k = -64; k <= 64; k++) {
		check_roundf_i8(UINT32_C(0x4b000000) + (uint32_t)(k + 64));
		check_roundf_i8(UINT32_C(0x4affffc0) + (uint32_t)(k + 64));
		check_roundf_i8(UINT32_C(0xcb000000) + (uint32_t)(k + 64));
		check_roundf_i8(UINT32_C(0x4effffc0) + (uint32_t)(k + 64));
		check_roundf_i8(UINT32_C(0xceffffc0) + (uint32_t)(k + 64));
	}
}
END_TEST

START_TEST(test_quant_round__narrow_random_bits)
{
	uint64_t seed = 0x5eed2026u;

	for (uint32_t i = 0; i < (1u << 21); i++)
		check_narrow((uint32_t)tu_rand(&seed));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("quant_round");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_quant_round__widen_every_code);
	tcase_add_test(tc, test_quant_round__narrow_every_top_half);
	tcase_add_test(tc, test_quant_round__narrow_random_bits);
	tcase_add_test(tc, test_quant_round__roundf_i8);
	tcase_add_test(tc, test_quant_round__ct_absmax);
	tcase_add_test(tc, test_quant_round__fp4_pack_every_bf16);
	suite_add_tcase(s, tc);
	return s;
}
