/* SPDX-License-Identifier: MIT */
/*
 * The GGUF Q8_0 / Q4_0 quantiser kernels (quant/quant_gguf.h): every ISA
 * this CPU runs against the scalar reference, bit for bit, over random
 * blocks and blocks built to hit each rule (ties at .5, zeros and -0.0,
 * NaN / Inf anywhere, huge and subnormal values, equal |max| of both
 * signs), every block count up to 17 at unaligned addresses, and every BF16
 * and F16 pattern through the 16-bit entries; the scalar 16-bit entries
 * against the float32 ones on the cast kernels' widening. The bytes of the
 * scalar code itself are checked against ggml's reference quantizers in
 * tests/compat/test_gguf*.py. An ISA the CPU lacks is reported as skipped.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant_gguf.h"
#include "testutil.h"
#include "unit.h"

#define QK CASTFS_GGUF_QK
#define KINDS 18u
#define NB (KINDS * 64u) /* blocks of the float32 set */
#define NALL 65536u /* 16-bit patterns: 2048 blocks */

static float rnd_unit(uint64_t *s)
{
	return (float)(tu_rand(s) >> 40) * 0x1p-24f * 2.0f - 1.0f;
}

static uint32_t rnd_pos(uint64_t *s)
{
	return (uint32_t)(tu_rand(s) % QK);
}

/* Random values at a random scale 2^[-40, 40). */
static void fill_random(float *x, uint64_t *s)
{
	float sc = ldexpf(1.0f, (int)(tu_rand(s) % 80) - 40);

	for (unsigned j = 0; j < QK; j++)
		x[j] = rnd_unit(s) * sc;
}

/* Ties: Q8_0 with d = 1 (amax 127) and halves; Q4_0 with d = 1 (first max
 * -8) and x * id + 8.5 on integers, scaled by a power of two. */
static void fill_ties(float *x, uint64_t *s, bool q4)
{
	float sc = ldexpf(1.0f, (int)(tu_rand(s) % 20) - 10);

	for (unsigned j = 0; j < QK; j++) {
		int k = (int)(tu_rand(s) % (q4 ? 16 : 254)) - (q4 ? 7 : 127);

		x[j] = ((float)k + (q4 ? -0.5f : 0.5f)) * sc;
	}
	x[rnd_pos(s)] = (q4 ? -8.0f : 127.0f) * sc;
}

static void fill_special(float *x, unsigned kind, uint64_t *s)
{
	fill_random(x, s);
	switch (kind) {
	case 4: /* all +0.0 */
	case 5: /* all -0.0 */
	case 6: /* +-0.0 mixed */
		for (unsigned j = 0; j < QK; j++)
			x[j] = (kind == 4 || (kind == 6 && tu_rand(s) % 2)) ?
				       0.0f :
				       -0.0f;
		break;
	case 7: /* NaN anywhere (a negative one too) */
		x[rnd_pos(s)] = tu_rand(s) % 2 ? NAN : -NAN;
		break;
	case 8: /* NaN last, after the largest value */
		x[QK - 1] = NAN;
		break;
	case 9: /* NaN first */
		x[0] = NAN;
		break;
	case 10: /* +-Inf */
		x[rnd_pos(s)] = tu_rand(s) % 2 ? INFINITY : -INFINITY;
		break;
	case 11: /* huge values: d and x * id near the float limits */
		for (unsigned j = 0; j < QK; j++)
			x[j] = rnd_unit(s) * FLT_MAX;
		break;
	case 12: /* subnormal only: d subnormal, 1 / d huge or Inf */
		for (unsigned j = 0; j < QK; j++)
			x[j] = castfs_f32_from_bits(
				(uint32_t)(tu_rand(s) & 0x807fffffu));
		break;
	case 13: /* a subnormal block with a tiny normal */
		fill_special(x, 12, s);
		x[rnd_pos(s)] = FLT_MIN * (tu_rand(s) % 2 ? 1.0f : -1.0f);
		break;
	case 14: /* equal |max| of both signs: Q4_0 keeps the first */
		x[rnd_pos(s)] = 3.0f;
		x[rnd_pos(s)] = -3.0f;
		break;
	case 15: /* any bit pattern */
		for (unsigned j = 0; j < QK; j++)
			x[j] = castfs_f32_from_bits((uint32_t)tu_rand(s));
		break;
	case 16: /* NaN and Inf together */
		x[rnd_pos(s)] = INFINITY;
		x[rnd_pos(s)] = NAN;
		break;
	default: /* one large value among small ones */
		x[rnd_pos(s)] = 1e30f;
		break;
	}
}

/* Kinds block by block (odd @seed), or in runs of 16 blocks, so that the
 * kernels' groups of blocks without NaN (8 in AVX2, 16 in AVX-512) are
 * reached too. */
static void make_blocks(float *x, size_t nb, uint64_t seed)
{
	bool runs = !(seed & 1);

	for (size_t b = 0; b < nb; b++) {
		unsigned kind = (unsigned)((runs ? b / 16 : b) % KINDS);
		float *xb = x + b * QK;

		if (kind < 2)
			fill_random(xb, &seed);
		else if (kind < 4)
			fill_ties(xb, &seed, kind == 3);
		else
			fill_special(xb, kind, &seed);
	}
}

/*
 * NALL 16-bit values behind one byte (odd addresses): for @seed 0 every
 * pattern once, shuffled so blocks mix the specials; otherwise weights
 * around 0.02 and their halves (no NaN), a few runs of zeros.
 */
static uint8_t *make16(uint64_t seed, bool f16)
{
	uint8_t *x = malloc(2 * NALL + 1);
	bool weights = seed != 0;

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < NALL; i++) {
		uint64_t r = tu_rand(&seed);
		uint16_t h = (uint16_t)(i * 40503u); /* odd: a permutation */

		if (weights)
			h = (uint16_t)((f16 ? 0x2000 : 0x3c00) +
				       (r >> 32) % 0x600) |
			    (uint16_t)(r & 0x8000);
		if (weights && (i / 256) % 17 == 3)
			h = (uint16_t)(r & 0x8000);
		castfs_store_le16(x + 1 + 2 * i, h);
	}
	return x;
}

typedef void (*qf32_fn)(uint8_t *restrict, const float *restrict, size_t);

/* One quantiser of @k against scalar over @x and over 0..17 blocks (every
 * tail of the AVX-512 groups of 16) at an unaligned address (output
 * unaligned too). */
static void cmp_f32(qf32_fn f, qf32_fn ref, const float *x, size_t bytes,
		    const char *what)
{
	size_t len = NB * bytes + 1;
	uint8_t *a = malloc(len), *b = malloc(len);
	float *u = malloc((18 * QK + 1) * sizeof(*u));

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(u);
	ref(a, x, NB);
	f(b, x, NB);
	for (size_t i = 0; i < NB; i++)
		ck_assert_msg(!memcmp(a + i * bytes, b + i * bytes, bytes),
			      "%s: block %zu differs", what, i);
	for (size_t n = 0; n <= 17; n++) {
		memcpy(u + 1, x + 7 * QK, n * QK * sizeof(*u));
		memset(a, 0xa5, len);
		memset(b, 0xa5, len);
		ref(a + 1, u + 1, n);
		f(b + 1, u + 1, n);
		ck_assert_msg(!memcmp(a, b, len), "%s: %zu blocks", what, n);
	}
	free(u);
	free(b);
	free(a);
}

START_TEST(test_gguf_kernels__isa_f32_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)_i;
	const struct castfs_gguf_kernels *k = castfs_gguf_kernels_isa(isa);
	const struct castfs_gguf_kernels *s = &castfs_gguf_scalar;
	float *x = malloc(NB * QK * sizeof(*x));

	ck_assert_ptr_nonnull(k); /* registered for runnable ISAs only */
	ck_assert_ptr_nonnull(x);
	for (uint64_t seed = 1; seed <= 8; seed++) {
		make_blocks(x, NB, seed);
		cmp_f32(k->q8_0, s->q8_0, x, CASTFS_GGUF_Q8_0_BYTES, "q8_0");
		cmp_f32(k->q4_0, s->q4_0, x, CASTFS_GGUF_Q4_0_BYTES, "q4_0");
	}
	free(x);
}
END_TEST

/* Every BF16 / F16 pattern (at an odd address), then random weights,
 * through q8_0_16 and q4_0_16. */
START_TEST(test_gguf_kernels__isa16_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 4);
	bool f16 = _i & 1;
	const struct castfs_gguf_kernels *k = castfs_gguf_kernels_isa(isa);
	const struct castfs_gguf_kernels *s = &castfs_gguf_scalar;
	size_t nb = NALL / QK, len = nb * CASTFS_GGUF_Q8_0_BYTES;
	uint8_t *x = make16((uint64_t)(_i & 2), f16), *a = malloc(len),
		*b = malloc(len);

	ck_assert_ptr_nonnull(k);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	s->q8_0_16(a, x + 1, nb, f16);
	k->q8_0_16(b, x + 1, nb, f16);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	len = nb * CASTFS_GGUF_Q4_0_BYTES;
	s->q4_0_16(a, x + 1, nb, f16);
	k->q4_0_16(b, x + 1, nb, f16);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	free(b);
	free(a);
	free(x);
}
END_TEST

/* The scalar 16-bit entries are the float32 ones on the widened values
 * (the BF16/F16 -> F32 cast kernel the generator used before). */
START_TEST(test_gguf_kernels__scalar16_equals_f32_of_widening)
{
	bool f16 = _i;
	const struct castfs_gguf_kernels *s = &castfs_gguf_scalar;
	castfs_convert_fn cvt = castfs_convert_get_isa(
		CASTFS_ISA_SCALAR, f16 ? CASTFS_DTYPE_F16 : CASTFS_DTYPE_BF16,
		CASTFS_DTYPE_F32, 0);
	size_t nb = NALL / QK, len = nb * CASTFS_GGUF_Q8_0_BYTES;
	uint8_t *x = make16(0, f16), *a = malloc(len), *b = malloc(len);
	float *f = malloc(NALL * sizeof(*f));

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(f);
	cvt(f, x + 1, NALL);
	s->q8_0(a, f, nb);
	s->q8_0_16(b, x + 1, nb, f16);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	len = nb * CASTFS_GGUF_Q4_0_BYTES;
	s->q4_0(a, f, nb);
	s->q4_0_16(b, x + 1, nb, f16);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	free(f);
	free(b);
	free(a);
	free(x);
}
END_TEST

/* The test can fail: blocks built to tie do tie, and NaN / -0.0 reach the
 * rules they are meant for (scalar values written down by hand). */
START_TEST(test_gguf_kernels__fixtures_hit_the_rules)
{
	float x[QK];
	uint8_t q[CASTFS_GGUF_Q8_0_BYTES];

	for (unsigned j = 0; j < QK; j++)
		x[j] = (float)j - 15.5f; /* halves, |max| 15.5 last */
	x[0] = 127.0f;
	castfs_gguf_q8_0(q, x, 1);
	ck_assert_uint_eq(castfs_load_le16(q), 0x3c00); /* d = 1.0 */
	ck_assert_int_eq((int8_t)q[2 + 1], -15); /* -14.5 away from zero */
	ck_assert_int_eq((int8_t)q[2 + 16], 1); /* 0.5 -> 1 */
	for (unsigned j = 0; j < QK; j++)
		x[j] = -0.0f;
	castfs_gguf_q4_0(q, x, 1);
	ck_assert_uint_eq(castfs_load_le16(q), 0x8000); /* d = +0 / -8 */
	ck_assert_uint_eq(q[2], 0x88);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("gguf_kernels");
	TCase *tc = tcase_create("kernels");

	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(
		tc, test_gguf_kernels__scalar16_equals_f32_of_widening, 0, 2);
	tcase_add_test(tc, test_gguf_kernels__fixtures_hit_the_rules);
	unit_add_isa_loop(tc, test_gguf_kernels__isa_f32_matches_scalar, 1);
	unit_add_isa_loop(tc, test_gguf_kernels__isa16_matches_scalar, 4);
	suite_add_tcase(s, tc);
	return s;
}
