/* SPDX-License-Identifier: MIT */
/*
 * Quantiser kernels of 16-bit sources and of double quantisation: every
 * ISA's absmax16, q4_16 and q8 against the scalar reference, bit for bit,
 * over every BF16 and F16 pattern (NaN, Inf, subnormals, zeros) and random
 * blocks, and every BF16 block absmax at both sides of every code
 * threshold; the scalar 16-bit kernels against the float32 ones they stand
 * for; the precomputed dynamic-map midpoints against their rule.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant.h"
#include "quant/quant_internal.h"
#include "testutil.h"
#include "unit.h"

#define NALL 65536u

static const size_t blocksizes[] = { 64, 128, 256, 4096 };
static const size_t lengths[] = { 1,  2,  15, 16,  17,	 31,   32,    33,
				  63, 64, 65, 127, 1000, 4097, 12345, NALL };

static const enum castfs_qtype qtypes[] = { CASTFS_Q_NF4, CASTFS_Q_FP4 };

/*
 * @n 16-bit patterns: for n == NALL every pattern once, in a shuffled
 * order (so blocks mix NaN, Inf and finite values); otherwise random
 * weights around 0.02 with some specials.
 */
static uint8_t *make16(size_t n, uint64_t seed, bool f16)
{
	uint8_t *x = malloc(2 * n + 1);

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++) {
		uint64_t r = tu_rand(&seed);
		uint16_t h = (uint16_t)r;

		if (n == NALL)
			h = (uint16_t)(i * 40503u); /* odd: a permutation */
		else if (r % 7 != 0)
			h = (uint16_t)((f16 ? 0x2000 : 0x3c00) +
				       (r >> 32) % 0x600) |
			    (uint16_t)(r & 0x8000);
		castfs_store_le16(x + 2 * i, h);
	}
	return x;
}

static void widen_all(float *f, const uint8_t *x, size_t n, bool f16)
{
	castfs_convert_fn cvt = castfs_convert_get_isa(
		CASTFS_ISA_SCALAR, f16 ? CASTFS_DTYPE_F16 : CASTFS_DTYPE_BF16,
		CASTFS_DTYPE_F32, 0);

	cvt(f, x, n);
}

/* The scalar 16-bit kernels are the float32 ones on the widened values. */
START_TEST(test_quant_kernels__scalar16_equals_scalar_f32)
{
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	bool f16 = _i & 1;
	size_t bs = blocksizes[_i / 2], n = NALL;
	uint8_t *x = make16(n, 1, f16), *c1 = malloc(n), *c2 = malloc(n);
	float *f = malloc(n * sizeof(*f)), *a1 = malloc(n * sizeof(*a1)),
	      *a2 = malloc(n * sizeof(*a2));

	widen_all(f, x, n, f16);
	s->absmax(a1, f, n, bs);
	s->absmax16(a2, x, n, bs, f16);
	ck_assert_int_eq(memcmp(a1, a2, n / bs * sizeof(*a1)), 0);
	for (size_t q = 0; q < 2; q++) {
		s->q4(c1, f, n, bs, qtypes[q]);
		s->q4_16(c2, a2, x, n, bs, qtypes[q], f16);
		/* The absmax it reports are absmax16's. */
		ck_assert_int_eq(memcmp(a1, a2, n / bs * sizeof(*a1)), 0);
		ck_assert_int_eq(memcmp(c1, c2, n / 2), 0);
	}
	free(x);
	free(c1);
	free(c2);
	free(f);
	free(a1);
	free(a2);
}
END_TEST

/* One (ISA, f16) pair: absmax16 and q4_16 over lengths x blocksizes. */
START_TEST(test_quant_kernels__isa16_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 2);
	bool f16 = _i & 1;
	const struct castfs_quant_kernels *k = castfs_quant_kernels_isa(isa);
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	uint8_t *c1 = malloc(NALL), *c2 = malloc(NALL);
	float *a1 = malloc(NALL * sizeof(float)),
	      *a2 = malloc(NALL * sizeof(float));

	ck_assert_ptr_nonnull(k); /* registered for runnable ISAs only */
	for (size_t b = 0; b < sizeof(blocksizes) / sizeof(*blocksizes); b++) {
		for (size_t l = 0; l < sizeof(lengths) / sizeof(*lengths);
		     l++) {
			size_t n = lengths[l], bs = blocksizes[b];
			/* Odd addresses: kernels take unaligned sources. */
			uint8_t *src = make16(n, n * 31 + bs, f16);
			uint8_t *buf = malloc(2 * n + 1), *x = buf + (l & 1);

			memcpy(x, src, 2 * n);
			free(src);
			s->absmax16(a1, x, n, bs, f16);
			k->absmax16(a2, x, n, bs, f16);
			ck_assert_int_eq(memcmp(a1, a2, (n + bs - 1) / bs * 4),
					 0);
			for (size_t q = 0; q < 2; q++) {
				memset(c1, 0xaa, NALL);
				memset(c2, 0x55, NALL);
				s->q4_16(c1, q ? a1 : NULL, x, n, bs, qtypes[q],
					 f16);
				k->q4_16(c2, q ? a2 : NULL, x, n, bs, qtypes[q],
					 f16);
				ck_assert_msg(
					memcmp(c1, c2, (n + 1) / 2) == 0,
					"%s q4_16 n=%zu bs=%zu qt=%zu f16=%d",
					castfs_isa_name(isa), n, bs, q, f16);
			}
			/* q = 1 reported its blocks' absmax: absmax16's. */
			ck_assert_int_eq(memcmp(a1, a2, (n + bs - 1) / bs * 4),
					 0);
			free(buf);
		}
	}
	free(c1);
	free(c2);
	free(a1);
	free(a2);
}
END_TEST

/* @v as F16 bits (rounded by the scalar converter). */
static uint16_t narrow_f16(float v)
{
	castfs_convert_fn cvt = castfs_convert_get_isa(
		CASTFS_ISA_SCALAR, CASTFS_DTYPE_F32, CASTFS_DTYPE_F16, 0);
	uint8_t b[2];

	cvt(b, &v, 1);
	return castfs_load_le16(b);
}

/*
 * Weight-like BF16 or F16 blocks of 64: mostly finite values around 0.02
 * (the SIMD fast path), and per kind of block one NaN, one +-Inf, all
 * zeros of both signs, subnormals, or values on both sides of every
 * midpoint with absmax 1 (scale 1, so s is the value itself).
 */
static uint8_t *make_weights(size_t n, uint64_t seed, bool f16)
{
	uint8_t *x = malloc(2 * n + 1);
	const float *mid = castfs_q4_mids[CASTFS_Q_NF4].f;

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++) {
		uint64_t r = tu_rand(&seed);
		float u = (float)((r >> 40) & 0xffff) / 65536.0f - 0.5f;
		float v = u * 0.08f;
		size_t kind = (i / 64) % 11, j = i % 64;
		uint16_t h;

		if (kind == 1)
			v = j == 0 ? 1.0f :
				     (r & 1 ? -1.0f : 1.0f) * mid[j % 15];
		else if (kind == 7)
			v = r & 1 ? -0.0f : 0.0f;
		else if (kind == 9)
			v = u * 1e-40f;
		h = f16 ? narrow_f16(v) : (uint16_t)(castfs_f32_bits(v) >> 16);
		if (kind == 1 && j > 0)
			h = (uint16_t)(h + (r >> 8) % 3 - 1); /* around mid */
		if (kind == 3 && j == (r >> 20) % 64)
			h = f16 ? 0x7e00 : 0x7fc0;
		if (kind == 5 && j == (r >> 20) % 64)
			h = (uint16_t)((f16 ? 0x7c00 : 0x7f80) | (r & 0x8000));
		castfs_store_le16(x + 2 * i, h);
	}
	return x;
}

/* The fast path of finite blocks and its fallbacks, against the scalar. */
START_TEST(test_quant_kernels__isa16_weight_blocks)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 2);
	bool f16 = _i & 1;
	const struct castfs_quant_kernels *k = castfs_quant_kernels_isa(isa);
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	static const size_t ns[] = { 64, 128, 64 * 37 + 40, 64 * 11 * 9,
				     4096 * 3 + 64 * 5 };
	size_t nmax = 4096 * 3 + 64 * 5;
	uint8_t *c1 = malloc(nmax), *c2 = malloc(nmax);
	float *a1 = malloc(nmax * sizeof(float)),
	      *a2 = malloc(nmax * sizeof(float));

	ck_assert_ptr_nonnull(k);
	for (size_t b = 0; b < sizeof(blocksizes) / sizeof(*blocksizes); b++) {
		for (size_t l = 0; l < sizeof(ns) / sizeof(*ns); l++) {
			size_t n = ns[l], bs = blocksizes[b];
			size_t nb = (n + bs - 1) / bs;
			uint8_t *x = make_weights(n, n + bs, f16);

			s->absmax16(a1, x, n, bs, f16);
			k->absmax16(a2, x, n, bs, f16);
			ck_assert_int_eq(memcmp(a1, a2, nb * 4), 0);
			for (size_t q = 0; q < 2; q++) {
				memset(c1, 0xaa, nmax);
				memset(c2, 0x55, nmax);
				memset(a2, 0x55, nmax * sizeof(float));
				s->q4_16(c1, NULL, x, n, bs, qtypes[q], f16);
				k->q4_16(c2, a2, x, n, bs, qtypes[q], f16);
				ck_assert_msg(memcmp(c1, c2, (n + 1) / 2) == 0,
					      "%s q4_16 n=%zu bs=%zu qt=%zu "
					      "f16=%d",
					      castfs_isa_name(isa), n, bs, q,
					      f16);
				ck_assert_int_eq(memcmp(a1, a2, nb * 4), 0);
			}
			free(x);
		}
	}
	free(c1);
	free(c2);
	free(a1);
	free(a2);
}
END_TEST

/* The order key of BF16 bits @h (value order, -0 just below +0) and back. */
static int bf16_key(uint16_t h)
{
	return h & 0x8000 ? -1 - (h & 0x7fff) : h;
}

static uint16_t bf16_of_key(int k)
{
	return (uint16_t)(k < 0 ? 0x8000 | (-1 - k) : k);
}

/* The scalar quantiser's position (0..15) of BF16 key @k among the sorted
 * codes of @qt, for @scale. */
static int scalar_pos(int k, float scale, enum castfs_qtype qt)
{
	float x = castfs_f32_from_bits((uint32_t)bf16_of_key(k) << 16);
	uint8_t c = castfs_q4_code(x, scale, qt);
	int p = 0;

	while (castfs_q4_order[qt][p] != c)
		p++;
	return p;
}

/* The largest key in [@lo, @hi] whose position is <= @pos (@lo - 1 if
 * none): the scalar threshold, found by bisection (positions ascend). */
static int scalar_thresh(int lo, int hi, int pos, float scale,
			 enum castfs_qtype qt)
{
	int l = lo - 1,
	    h = hi; /* pos(l) <= pos (or l < lo); answer in [l, h] */

	if (scalar_pos(hi, scale, qt) <= pos)
		return hi;
	while (h - l > 1) {
		int c = l + (h - l) / 2;

		if (scalar_pos(c, scale, qt) <= pos)
			l = c;
		else
			h = c;
	}
	return l;
}

/*
 * One 64-element BF16 block of absmax bits @a: a, -a, +0, -0, and for each
 * of the 15 scalar thresholds T (keys) T - 1, T, T + 1 and T + 2, clamped
 * to [-a, a].
 */
static void thresh_block(uint8_t *x, uint16_t a, enum castfs_qtype qt)
{
	float scale = castfs_q_scale(castfs_f32_from_bits((uint32_t)a << 16));
	int lo = bf16_key((uint16_t)(0x8000 | a)), hi = a;
	uint16_t h[64] = { a, (uint16_t)(0x8000 | a), 0, 0x8000 };

	for (int k = 0; k < 15; k++) {
		int t = scalar_thresh(lo, hi, k, scale, qt);

		for (int d = 0; d < 4; d++) {
			int v = t - 1 + d;

			v = v < lo ? lo : v > hi ? hi : v;
			h[4 + 4 * k + d] = bf16_of_key(v);
		}
	}
	for (int i = 0; i < 64; i++)
		castfs_store_le16(x + 2 * i, h[i]);
}

/*
 * Every BF16 value that can be a block absmax (0 to the largest finite),
 * each in a block holding both sides of every threshold of the scalar
 * quantiser: codes and absmax of each ISA equal the scalar ones. Codes
 * are step functions of the value, so agreeing on both sides of every
 * scalar step means agreeing on every value of the block's range; this
 * holds the AVX-512 threshold table (castfs_q4_thresh) and its exponent
 * shift exact for every absmax, and the range where they apply.
 */
START_TEST(test_quant_kernels__isa16_every_absmax_threshold)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 2);
	enum castfs_qtype qt = qtypes[_i & 1];
	const struct castfs_quant_kernels *k = castfs_quant_kernels_isa(isa);
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	size_t nb = 0x7f80, n = 64 * nb;
	uint8_t *x = malloc(2 * n), *c1 = malloc(n / 2), *c2 = malloc(n / 2);
	float *a1 = malloc(nb * sizeof(float)),
	      *a2 = malloc(nb * sizeof(float));

	ck_assert_ptr_nonnull(k);
	for (size_t a = 0; a < nb; a++)
		thresh_block(x + 128 * a, (uint16_t)a, qt);
	s->q4_16(c1, a1, x, n, 64, qt, false);
	k->q4_16(c2, a2, x, n, 64, qt, false);
	for (size_t b = 0; b < nb; b++)
		ck_assert_msg(memcmp(c1 + 32 * b, c2 + 32 * b, 32) == 0 &&
				      memcmp(a1 + b, a2 + b, 4) == 0,
			      "%s qt=%d absmax 0x%04zx", castfs_isa_name(isa),
			      (int)qt, b);
	free(x);
	free(c1);
	free(c2);
	free(a1);
	free(a2);
}
END_TEST

/* Block absmax minus an offset: ties on midpoints, NaN, huge scales. */
static void make_amax(float *a, size_t n, uint64_t seed)
{
	const float *mids = castfs_q8_mids.f;

	for (size_t i = 0; i < n; i++) {
		uint64_t r = tu_rand(&seed);
		double u = (double)(r >> 11) / 9007199254740992.0;

		switch (r % 13) {
		case 0:
			a[i] = NAN;
			break;
		case 1:
			a[i] = 0.0f;
			break;
		case 2:
			a[i] = 0.25f + mids[(r >> 20) % 255] * 0.25f;
			break;
		case 3:
			a[i] = 1e30f;
			break;
		default:
			a[i] = (float)(u * 0.5);
			break;
		}
	}
}

START_TEST(test_quant_kernels__q8_matches_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)_i;
	const struct castfs_quant_kernels *k = castfs_quant_kernels_isa(isa);
	const struct castfs_quant_kernels *s =
		castfs_quant_kernels_isa(CASTFS_ISA_SCALAR);
	static const float offsets[] = { 0.0f, 0.25f, -0.125f };
	static const float scales[] = { 4.0f, 1.0f / 0.2499f, 1e38f, 1.0f };
	float a[1000];
	uint8_t c1[1000], c2[1000];

	ck_assert_ptr_nonnull(k); /* registered for runnable ISAs only */
	make_amax(a, 1000, 5);
	for (size_t o = 0; o < 3; o++) {
		for (size_t c = 0; c < 4; c++) {
			for (size_t n = 0; n <= 40; n++) {
				s->q8(c1, a + n, n, offsets[o], scales[c]);
				k->q8(c2, a + n, n, offsets[o], scales[c]);
				ck_assert_int_eq(memcmp(c1, c2, n), 0);
			}
			s->q8(c1, a, 1000, offsets[o], scales[c]);
			k->q8(c2, a, 1000, offsets[o], scales[c]);
			ck_assert_int_eq(memcmp(c1, c2, 1000), 0);
		}
	}
	/* Exactly on each midpoint (scale 1, offset 0): ties stay low. */
	for (size_t i = 0; i < 255; i++)
		a[i] = castfs_q8_mids.f[i];
	s->q8(c1, a, 255, 0.0f, 1.0f);
	k->q8(c2, a, 255, 0.0f, 1.0f);
	ck_assert_int_eq(memcmp(c1, c2, 255), 0);
	for (size_t i = 0; i < 255; i++)
		ck_assert_uint_eq(c1[i], i);
}
END_TEST

START_TEST(test_quant_kernels__q8_mids_follow_the_rule)
{
	const float *c = castfs_q_dynmap();

	for (unsigned k = 0; k < 255; k++) {
		float m = (c[k] + c[k + 1]) * 0.5f;

		ck_assert_uint_eq(castfs_q8_mids.u[k], castfs_f32_bits(m));
		if (k)
			ck_assert(castfs_q8_mids.f[k - 1] <= m);
	}
	ck_assert(isinf(castfs_q8_mids.f[255]));
}
END_TEST

/* Every level of the search tree holds the midpoints its doc says. */
START_TEST(test_quant_kernels__q8_tree_layout)
{
	const uint32_t *t = castfs_q8_tree.u, *m = castfs_q8_mids.u;

	for (unsigned b = 0; b < 16; b++) {
		ck_assert_uint_eq(t[CASTFS_Q8_T16 + b], m[16 * b + 15]);
		ck_assert_uint_eq(t[CASTFS_Q8_T8 + b], m[16 * b + 7]);
		for (unsigned c = 0; c < 2; c++)
			ck_assert_uint_eq(t[CASTFS_Q8_T4 + 2 * b + c],
					  m[16 * b + 8 * c + 3]);
		for (unsigned c = 0; c < 4; c++)
			ck_assert_uint_eq(t[CASTFS_Q8_T2 + 4 * b + c],
					  m[16 * b + 4 * c + 1]);
		for (unsigned c = 0; c < 8; c++)
			ck_assert_uint_eq(t[CASTFS_Q8_T1 + 8 * b + c],
					  m[16 * b + 2 * c]);
	}
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("quant_kernels");
	TCase *tc = tcase_create("kernels");

	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(
		tc, test_quant_kernels__scalar16_equals_scalar_f32, 0,
		2 * (int)(sizeof(blocksizes) / sizeof(*blocksizes)));
	unit_add_isa_loop(tc, test_quant_kernels__isa16_matches_scalar, 2);
	unit_add_isa_loop(tc, test_quant_kernels__isa16_weight_blocks, 2);
	unit_add_isa_loop(tc, test_quant_kernels__isa16_every_absmax_threshold,
			  2);
	unit_add_isa_loop(tc, test_quant_kernels__q8_matches_scalar, 1);
	tcase_add_test(tc, test_quant_kernels__q8_mids_follow_the_rule);
	tcase_add_test(tc, test_quant_kernels__q8_tree_layout);
	suite_add_tcase(s, tc);
	return s;
}
