/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes quantisers: the tables and rules against the format's
 * definition (bnb's code lists, midpoints, ties, NaN/Inf policy), every
 * SIMD kernel against the scalar reference, and the quant_state JSON
 * against Python's spelling. The plans are in test_quant_plan.c.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant.h"
#include "testutil.h"
#include "unit.h"

#define NF4 CASTFS_Q_NF4
#define FP4 CASTFS_Q_FP4

/* Code values as bnb's functional.py get_4bit_type lists them. */
static const double nf4_list[16] = {
	-1.0,
	-0.6961928009986877,
	-0.5250730514526367,
	-0.39491748809814453,
	-0.28444138169288635,
	-0.18477343022823334,
	-0.09105003625154495,
	0.0,
	0.07958029955625534,
	0.16093020141124725,
	0.24611230194568634,
	0.33791524171829224,
	0.44070982933044434,
	0.5626170039176941,
	0.7229568362236023,
	1.0,
};

/* FP4 before bnb's division by its largest magnitude (12). */
static const float fp4_list[16] = {
	0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3,
};

/* The 16 values in ascending order, ties by code (a stable argsort). */
static void sorted_codes(enum castfs_qtype qt, uint8_t order[16])
{
	const float *v = castfs_q4_table(qt);

	for (int i = 0; i < 16; i++)
		order[i] = (uint8_t)i;
	for (int i = 1; i < 16; i++) {
		for (int j = i; j > 0 && v[order[j - 1]] > v[order[j]]; j--) {
			uint8_t t = order[j];

			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	}
}

/* The float32 bound between sorted positions @k and @k + 1. */
static float q4_mid(enum castfs_qtype qt, int k)
{
	const float *v = castfs_q4_table(qt);
	uint8_t order[16];

	sorted_codes(qt, order);
	return (v[order[k]] + v[order[k + 1]]) / 2;
}

START_TEST(test_quant__tables_are_bnb_lists)
{
	const float *nf4 = castfs_q4_table(NF4), *fp4 = castfs_q4_table(FP4);

	for (int i = 0; i < 16; i++) {
		ck_assert_uint_eq(castfs_f32_bits(nf4[i]),
				  castfs_f32_bits((float)nf4_list[i]));
		ck_assert_uint_eq(castfs_f32_bits(fp4[i]),
				  castfs_f32_bits(fp4_list[i] / 12.0f));
	}
	/* Python's "-0" is the integer 0: code 8 is +0.0. */
	ck_assert_uint_eq(castfs_f32_bits(fp4[8]), 0);
}
END_TEST

/* A value at each position gets its code; a midpoint goes down, above up. */
START_TEST(test_quant__q4_nearest_code_ties_go_low)
{
	enum castfs_qtype qt = _i ? FP4 : NF4;
	const float *v = castfs_q4_table(qt);
	uint8_t order[16];

	sorted_codes(qt, order);
	for (int p = 0; p < 16; p++) {
		uint8_t c = castfs_q4_code(v[order[p]], 1.0f, qt);

		/* FP4's two zeros: 0.0 itself takes the first (code 0). */
		ck_assert_uint_eq(v[c] == v[order[p]], 1);
	}
	for (int k = 0; k < 15; k++) {
		float m = q4_mid(qt, k);

		ck_assert_uint_eq(castfs_q4_code(m, 1.0f, qt), order[k]);
		ck_assert_uint_eq(castfs_q4_code(nextafterf(m, 2.0f), 1.0f, qt),
				  order[k + 1]);
	}
}
END_TEST

START_TEST(test_quant__q4_nan_inf_and_zeros)
{
	/* NaN counts as 0; +-Inf saturate to the codes of +-1.0. */
	ck_assert_uint_eq(castfs_q4_code(NAN, 1.0f, NF4), 7);
	ck_assert_uint_eq(castfs_q4_code(NAN, 1.0f, FP4), 0);
	ck_assert_uint_eq(castfs_q4_code(INFINITY, 0.5f, NF4), 15);
	ck_assert_uint_eq(castfs_q4_code(-INFINITY, 0.5f, NF4), 0);
	ck_assert_uint_eq(castfs_q4_code(INFINITY, 0.5f, FP4), 3);
	ck_assert_uint_eq(castfs_q4_code(-INFINITY, 0.5f, FP4), 11);
	ck_assert_uint_eq(castfs_q4_code(-0.0f, 1.0f, NF4), 7);
	ck_assert_uint_eq(castfs_q4_code(-0.0f, 1.0f, FP4), 0);
	/* FP4 values too small for +-0.0052 round to a zero code. */
	ck_assert_uint_eq(castfs_q4_code(1e-4f, 1.0f, FP4), 8);
	ck_assert_uint_eq(castfs_q4_code(-1e-4f, 1.0f, FP4), 0);
	ck_assert_uint_eq(castfs_q4_code(0.004f, 1.0f, FP4), 1);
	ck_assert_uint_eq(castfs_q4_code(-0.004f, 1.0f, FP4), 9);
}
END_TEST

START_TEST(test_quant__absmax_skips_nan_and_inf)
{
	const float x[] = { 1.0f, -3.0f, NAN, INFINITY, -INFINITY, 2.0f };
	const float bad[] = { NAN, INFINITY, -INFINITY };

	ck_assert(castfs_q_absmax(x, 6) == 3.0f);
	ck_assert(castfs_q_absmax(bad, 3) == 0.0f);
	ck_assert(castfs_q_absmax(x, 0) == 0.0f);
	ck_assert(castfs_q_scale(2.0f) == 0.5f);
	/* bnb clamps absmax to 1e-38 before the reciprocal. */
	ck_assert(castfs_q_scale(0.0f) == 1.0f / 1e-38f);
	ck_assert(isfinite(castfs_q_scale(0.0f)));
}
END_TEST

static void q4_run(const struct castfs_quant_kernels *k, uint8_t *dst,
		   const float *x, size_t n, size_t bs, enum castfs_qtype qt)
{
	k->q4(dst, x, n, bs, qt);
}

START_TEST(test_quant__q4_zero_block_odd_n_and_nibble_order)
{
	const struct castfs_quant_kernels *k = castfs_quant_kernels_get();
	float x[65] = { 0 };
	uint8_t out[33];

	q4_run(k, out, x, 64, 64, NF4);
	for (int i = 0; i < 32; i++)
		ck_assert_uint_eq(out[i], 0x77);
	q4_run(k, out, x, 64, 64, FP4);
	for (int i = 0; i < 32; i++)
		ck_assert_uint_eq(out[i], 0x00);
	/* Element 2k in the high nibble. */
	x[0] = 1.0f;
	x[1] = -1.0f;
	q4_run(k, out, x, 64, 64, NF4);
	ck_assert_uint_eq(out[0], 0xf0);
	/* Odd n: the last element pads with the code of 0.0. */
	x[64] = -2.0f;
	q4_run(k, out, x, 65, 64, NF4);
	ck_assert_uint_eq(out[32], 0x07);
	q4_run(k, out, x, 65, 64, FP4);
	ck_assert_uint_eq(out[32], 0xb0);
}
END_TEST

static float dyn_mid(int k)
{
	const float *c = castfs_q_dynmap();

	return (c[k] + c[k + 1]) / 2;
}

START_TEST(test_quant__dynmap_shape_and_codes)
{
	const float *c = castfs_q_dynmap();

	for (int i = 0; i < 255; i++)
		ck_assert(c[i] < c[i + 1]);
	ck_assert(c[127] == 0.0f);
	ck_assert(c[255] == 1.0f);
	ck_assert(c[0] > -1.0f && c[0] < -0.99f);
	for (int i = 0; i < 127; i++)
		ck_assert(c[i] == -c[254 - i]);
	for (int k = 0; k < 255; k++) {
		ck_assert_uint_eq(castfs_q8_code(dyn_mid(k), 1.0f), k);
		ck_assert_uint_eq(castfs_q8_code(nextafterf(dyn_mid(k), 2.0f),
						 1.0f),
				  k + 1);
		ck_assert_uint_eq(castfs_q8_code(c[k], 1.0f), k);
	}
	ck_assert_uint_eq(castfs_q8_code(-1.0f, 1.0f), 0);
	ck_assert_uint_eq(castfs_q8_code(1.0f, 1.0f), 255);
	ck_assert_uint_eq(castfs_q8_code(NAN, 1.0f), 127);
	ck_assert_uint_eq(castfs_q8_code(0.5f, 2.0f), 255);
}
END_TEST

START_TEST(test_quant__i8_rounds_half_even_and_saturates)
{
	ck_assert_int_eq(castfs_i8_code(2.5f, 1.0f), 2);
	ck_assert_int_eq(castfs_i8_code(3.5f, 1.0f), 4);
	ck_assert_int_eq(castfs_i8_code(-2.5f, 1.0f), -2);
	ck_assert_int_eq(castfs_i8_code(-0.4f, 1.0f), 0);
	ck_assert_int_eq(castfs_i8_code(126.6f, 1.0f), 127);
	ck_assert_int_eq(castfs_i8_code(300.0f, 1.0f), 127);
	ck_assert_int_eq(castfs_i8_code(NAN, 1.0f), 0);
	ck_assert_int_eq(castfs_i8_code(INFINITY, 1.0f), 127);
	ck_assert_int_eq(castfs_i8_code(-INFINITY, 0.0f), -127);
	ck_assert_int_eq(castfs_i8_code(5.0f, 0.0f), 0);
	ck_assert(castfs_i8_scale(0.0f) == 0.0f);
	ck_assert(castfs_i8_scale(4.0f) == 31.75f);
	/* torch's 127.0 / x is reciprocal(x) * 127, not a division. */
	ck_assert(castfs_i8_scale(3.810546875f) == (1.0f / 3.810546875f) * 127);
	ck_assert(castfs_i8_scale(3.810546875f) != 127 / 3.810546875f);
}
END_TEST

/* Python repr() of float32 values read as doubles, and of doubles. */
static const struct {
	uint32_t bits;
	const char *repr;
} f32_reprs[] = {
	{ 0x40281746u, "2.626420497894287" },
	{ 0x38d1b717u, "9.999999747378752e-05" },
	{ 0x3727c5acu, "9.999999747378752e-06" },
	{ 0x5a0e1bcau, "1.0000000272564224e+16" },
	{ 0x58635fa9u, "999999986991104.0" },
	{ 0x42f60000u, "123.0" },
	{ 0x3dcccccdu, "0.10000000149011612" },
	{ 0x3f800000u, "1.0" },
	{ 0x00000001u, "1.401298464324817e-45" },
	{ 0x7f7fffffu, "3.4028234663852886e+38" },
	{ 0x38800000u, "6.103515625e-05" },
	{ 0x477fe000u, "65504.0" },
	{ 0x35800000u, "9.5367431640625e-07" },
	/* Powers of two whose closest short decimal does not read back. */
	{ 0x21800000u, "8.673617379884035e-19" },
	{ 0x0e000000u, "1.5777218104420236e-30" },
	{ 0x00000400u, "1.4349296274686127e-42" },
	{ 0x29800000u, "5.684341886080802e-14" },
	{ 0x00000200u, "7.174648137343064e-43" },
	{ 0x3901742du, "0.0001234567753272131" },
	{ 0x4ceb79a3u, "123456792.0" },
	{ 0x29735a1cu, "5.4034996420891657e-14" },
	{ 0x7953a6f2u, "6.868504314752395e+34" },
	{ 0x32899387u, "1.60159867590437e-08" },
	{ 0x5351d228u, "901174001664.0" },
	{ 0x4497c815u, "1214.2525634765625" },
	{ 0x40f3a77au, "7.614193916320801" },
	{ 0x3781b3adu, "1.546166640764568e-05" },
};

static const struct {
	double v;
	const char *repr;
} f64_reprs[] = {
	{ 0.0001, "0.0001" },
	{ 1e-05, "1e-05" },
	{ 1e16, "1e+16" },
	{ 1e15, "1000000000000000.0" },
	{ 0.001, "0.001" },
	{ -2.5, "-2.5" },
	{ 100.0, "100.0" },
	{ 123456789012345678.0, "1.2345678901234568e+17" },
	{ 5e-324, "5e-324" },
	{ 1.7976931348623157e308, "1.7976931348623157e+308" },
	{ 0.3, "0.3" },
	{ 1e22, "1e+22" },
	{ 0.0, "0.0" },
	{ -0.0, "-0.0" },
	{ NAN, "NaN" },
	{ INFINITY, "Infinity" },
	{ -INFINITY, "-Infinity" },
};

START_TEST(test_quant__pyfloat_matches_python_repr)
{
	char buf[40];

	for (size_t i = 0; i < sizeof(f32_reprs) / sizeof(f32_reprs[0]); i++) {
		float f = castfs_f32_from_bits(f32_reprs[i].bits);

		ck_assert_int_eq(castfs_q_pyfloat(buf, sizeof(buf), f),
				 (int)strlen(f32_reprs[i].repr));
		ck_assert_str_eq(buf, f32_reprs[i].repr);
	}
	for (size_t i = 0; i < sizeof(f64_reprs) / sizeof(f64_reprs[0]); i++) {
		castfs_q_pyfloat(buf, sizeof(buf), f64_reprs[i].v);
		ck_assert_str_eq(buf, f64_reprs[i].repr);
	}
	ck_assert_int_eq(castfs_q_pyfloat(buf, 3, 2.5), -ENOSPC);
}
END_TEST

START_TEST(test_quant__state_json_is_bnb_json)
{
	struct castfs_q4_state st = {
		.qtype = NF4,
		.blocksize = 64,
		.dtype = "bfloat16",
		.rows = 7,
		.cols = 100,
	};
	static const char plain[] = "{\"quant_type\": \"nf4\", \"blocksize\": "
				    "64, \"dtype\": \"bfloat16\", \"shape\": "
				    "[7, 100]}";
	static const char nested[] =
		"{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": "
		"\"bfloat16\", \"shape\": [7, 100], \"nested_blocksize\": 256, "
		"\"nested_dtype\": \"float32\", \"nested_offset\": "
		"2.626420497894287       }";
	char buf[CASTFS_Q4_STATE_MAX];
	size_t off;
	int n;

	n = castfs_q4_state_json(buf, sizeof(buf), &st, &off);
	ck_assert_int_eq(n, (int)strlen(plain));
	ck_assert_int_eq(memcmp(buf, plain, (size_t)n), 0);
	ck_assert_uint_eq(off, 0);
	st.qtype = FP4;
	st.nested = true;
	n = castfs_q4_state_json(buf, sizeof(buf), &st, &off);
	ck_assert_int_eq(n, (int)strlen(nested));
	castfs_q4_state_offset(buf + off, castfs_f32_from_bits(0x40281746u));
	ck_assert_int_eq(memcmp(buf, nested, (size_t)n), 0);
	ck_assert_int_eq(castfs_q4_state_json(buf, 40, &st, &off), -ENOSPC);
}
END_TEST

/* splitmix-driven inputs with NaN, Inf, zeros and exact midpoint ties. */
static void fill_inputs(float *x, size_t n, uint64_t seed, enum castfs_qtype qt)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t r = tu_rand(&seed);
		double u = (double)(r >> 11) / 9007199254740992.0 - 0.5;

		switch (r % 29) {
		case 0:
			x[i] = NAN;
			break;
		case 1:
			x[i] = (r & 64) ? INFINITY : -INFINITY;
			break;
		case 2:
			x[i] = 0.0f;
			break;
		case 3:
			x[i] = 1.0f;
			break; /* absmax 1: ties below are exact */
		case 4:
			x[i] = q4_mid(qt, (int)((r >> 8) % 15));
			break;
		case 5:
			x[i] = (float)(u * 1e-40);
			break;
		default:
			x[i] = (float)(u * 4.0);
			break;
		}
	}
	/* Some all-zero blocks. */
	if (n >= 192)
		memset(x + 128, 0, 64 * sizeof(*x));
}

static const size_t blocksizes[] = { 64, 128, 256, 4096 };
static const size_t lengths[] = { 1,  2,  15,  16,   17,   63,
				  64, 65, 127, 1000, 4097, 12345 };
#define NLENGTHS (sizeof(lengths) / sizeof(lengths[0]))

START_TEST(test_quant__isa_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 2);
	enum castfs_qtype qt = _i % 2 ? FP4 : NF4;
	const struct castfs_quant_kernels *k = castfs_quant_kernels_isa(isa);
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	size_t cap = 12345;
	float *x = malloc(cap * sizeof(*x)), *a1, *a2;
	uint8_t *c1 = malloc(cap), *c2 = malloc(cap);

	ck_assert_ptr_nonnull(k); /* registered for runnable ISAs only */
	a1 = malloc(cap * sizeof(*a1));
	a2 = malloc(cap * sizeof(*a2));
	for (size_t b = 0; b < sizeof(blocksizes) / sizeof(*blocksizes); b++) {
		for (size_t l = 0; l < NLENGTHS; l++) {
			size_t n = lengths[l], bs = blocksizes[b];
			size_t nb = (n + bs - 1) / bs;

			fill_inputs(x, n, n * 31 + bs, qt);
			memset(c1, 0xaa, cap);
			memset(c2, 0x55, cap);
			s->q4(c1, x, n, bs, qt);
			k->q4(c2, x, n, bs, qt);
			ck_assert_int_eq(memcmp(c1, c2, (n + 1) / 2), 0);
			s->absmax(a1, x, n, bs);
			k->absmax(a2, x, n, bs);
			ck_assert_int_eq(memcmp(a1, a2, nb * sizeof(*a1)), 0);
			for (size_t j = 0; j < 4; j++) {
				static const float sc[] = { 31.75f, 0.0f,
							    1000.0f, 63.5f };

				s->i8((int8_t *)c1, x, n, sc[j]);
				k->i8((int8_t *)c2, x, n, sc[j]);
				ck_assert_int_eq(memcmp(c1, c2, n), 0);
			}
		}
	}
	free(a1);
	free(a2);
	free(x);
	free(c1);
	free(c2);
}
END_TEST

TCase *quant_plan_tcase(void); /* test_quant_plan.c */

Suite *unit_suite(void)
{
	Suite *s = suite_create("quant");
	TCase *rules = tcase_create("rules");
	TCase *simd = tcase_create("simd");

	tcase_add_test(rules, test_quant__tables_are_bnb_lists);
	tcase_add_loop_test(rules, test_quant__q4_nearest_code_ties_go_low, 0,
			    2);
	tcase_add_test(rules, test_quant__q4_nan_inf_and_zeros);
	tcase_add_test(rules, test_quant__absmax_skips_nan_and_inf);
	tcase_add_test(rules, test_quant__q4_zero_block_odd_n_and_nibble_order);
	tcase_add_test(rules, test_quant__dynmap_shape_and_codes);
	tcase_add_test(rules, test_quant__i8_rounds_half_even_and_saturates);
	tcase_add_test(rules, test_quant__pyfloat_matches_python_repr);
	tcase_add_test(rules, test_quant__state_json_is_bnb_json);
	suite_add_tcase(s, rules);
	unit_add_isa_loop(simd, test_quant__isa_matches_scalar, 2);
	suite_add_tcase(s, simd);
	suite_add_tcase(s, quant_plan_tcase());
	return s;
}
