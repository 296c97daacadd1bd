/* SPDX-License-Identifier: MIT */
/*
 * lib/kernels: the casts that read a grouped pack's planes. Each ISA's
 * planes kernel must write what the scalar kernel of the pair writes for
 * the same elements un-grouped here (the scalar kernels are held to torch
 * by the compatibility tests): all 65536 bf16 and fp16 patterns, and fp32
 * patterns of every exponent with random and edge mantissas.
 */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "unit.h"

#define NPAT 65536u

/* The planes of bf16 @v (s|eeeeeeee|mmmmmmm): s|mmmmmmm and eeeeeeee. */
static void split(uint16_t v, uint8_t *sm, uint8_t *ex)
{
	*sm = (uint8_t)(((v >> 8) & 0x80u) | (v & 0x7Fu));
	*ex = (uint8_t)((v >> 7) & 0xFFu);
}

/* Every bf16 pattern as little-endian bytes and as planes, shifted by
 * @skew bytes so that no pointer is aligned. */
struct pats {
	uint8_t bytes[2 * NPAT + 8];
	uint8_t sm[NPAT + 8], ex[NPAT + 8];
};

static void fill(struct pats *p, unsigned skew)
{
	for (uint32_t v = 0; v < NPAT; v++) {
		p->bytes[skew + 2 * v] = (uint8_t)v;
		p->bytes[skew + 2 * v + 1] = (uint8_t)(v >> 8);
		split((uint16_t)v, &p->sm[skew + v], &p->ex[skew + v]);
	}
}

/* Loop index: ISA x saturation x skew (0..3). */
START_TEST(test_kernels_planes__isa_matches_scalar_on_all_patterns)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 8);
	unsigned flags = (_i / 4) % 2 ? CASTFS_CVT_SATURATE : 0;
	unsigned skew = (unsigned)_i % 4;
	struct pats *p = malloc(sizeof(*p));
	uint8_t *want = malloc(NPAT + 8), *got = malloc(NPAT + 8);
	castfs_convert_fn ref;
	castfs_convert_planes_fn fn;

	fn = castfs_convert_planes_get_isa(isa, CASTFS_DTYPE_F8_E4M3, flags);
	if (!castfs_isa_available(isa)) {
		ck_assert_ptr_null(fn);
		goto out;
	}
	ck_assert_ptr_nonnull(fn);
	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, CASTFS_DTYPE_BF16,
				     CASTFS_DTYPE_F8_E4M3, flags);
	fill(p, skew);
	/* Lengths that leave every tail size of the vector loop. */
	for (size_t n = NPAT - 9; n <= NPAT - skew; n++) {
		memset(want, 0xA5, NPAT + 8);
		memset(got, 0xA5, NPAT + 8);
		ref(want + skew, p->bytes + skew, n);
		fn(got + skew, p->sm + skew, p->ex + skew, n);
		ck_assert_msg(!memcmp(want, got, NPAT + 8),
			      "%s flags %u skew %u n %zu differ",
			      castfs_isa_name(isa), flags, skew, n);
	}
out:
	free(got);
	free(want);
	free(p);
}
END_TEST

/* The selected kernel is one of the tested ones; other pairs have none. */
START_TEST(test_kernels_planes__only_e4m3_has_planes)
{
	ck_assert_ptr_nonnull(
		castfs_convert_planes_get(CASTFS_DTYPE_F8_E4M3, 0));
	ck_assert_ptr_nonnull(castfs_convert_planes_get(CASTFS_DTYPE_F8_E4M3,
							CASTFS_CVT_SATURATE));
	ck_assert_ptr_null(castfs_convert_planes_get(CASTFS_DTYPE_F8_E5M2, 0));
	ck_assert_ptr_null(castfs_convert_planes_get(CASTFS_DTYPE_F16, 0));
	ck_assert_ptr_null(
		castfs_convert_planes_get(CASTFS_DTYPE_F8_E4M3, 1u << 7));
}
END_TEST

/* The planes of @n fp32 words at @w, the exponent made a byte (plane 3),
 * the sign and 7 high mantissa bits plane 2 (lib/source/zst_group.c). */
static void split32(const uint32_t *w, size_t n, uint8_t *const *pl)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t v = w[i];

		pl[0][i] = (uint8_t)v;
		pl[1][i] = (uint8_t)(v >> 8);
		pl[2][i] = (uint8_t)(((v >> 24) & 0x80u) | ((v >> 16) & 0x7Fu));
		pl[3][i] = (uint8_t)(v >> 23);
	}
}

static uint32_t lcg32(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s;
}

/* Mantissas of fill32(): 0, 1, all ones, the e4m3 rounding boundaries of
 * normal results (bit 19 alone, bits 19-20, just below and above half)
 * and of subnormal ones (bits 20, 21, 22 alone, and with the lowest bit:
 * the grouped kernels see that bit only as a sticky bit). */
static const uint32_t mant32[] = { 0,	     1,	       0x7FFFFF, 0x80000,
				   0x180000, 0x7FFFF,  0x80001,	 0x100000,
				   0x100001, 0x200000, 0x200001, 0x400000,
				   0x400001 };
#define NMANT32 (sizeof(mant32) / sizeof(*mant32))
/* Blocks of 512 (every sign and exponent) of fill32(): the fixed
 * mantissas, then three of random ones; repeated 8 times. */
#define COUNT32 (512 * (NMANT32 + 3) * 8)

/* Every sign and exponent with the mantissas above and random ones. */
static void fill32(uint32_t *w, size_t n)
{
	uint32_t s = 7;

	for (size_t i = 0; i < n; i++) {
		uint32_t se = (uint32_t)(i % 512) << 23;
		size_t k = (i / 512) % (NMANT32 + 3);

		w[i] = se | (k < NMANT32 ? mant32[k] : lcg32(&s) & 0x7FFFFF);
	}
}

/* Loop index: ISA x saturation x source (fp16, fp32) x skew (0, 3). */
START_TEST(test_kernels_planes__grouped_match_scalar)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / 8);
	unsigned flags = (_i / 4) % 2 ? CASTFS_CVT_SATURATE : 0;
	bool f32 = (_i / 2) % 2;
	unsigned skew = _i % 2 ? 3 : 0, w = f32 ? 4 : 2;
	enum castfs_dtype from = f32 ? CASTFS_DTYPE_F32 : CASTFS_DTYPE_F16;
	size_t count = f32 ? COUNT32 : NPAT;
	uint8_t *bytes = malloc(w * count + 8), *pl[4];
	uint8_t *want = malloc(count + 8), *got = malloc(count + 8);
	uint32_t *words = malloc(4 * count);
	castfs_convert_grouped_fn fn;
	castfs_convert_fn ref;

	fn = castfs_convert_grouped_get_isa(isa, from, CASTFS_DTYPE_F8_E4M3,
					    flags);
	if (!castfs_isa_available(isa)) {
		ck_assert_ptr_null(fn);
		goto out;
	}
	ck_assert_ptr_nonnull(fn);
	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, from,
				     CASTFS_DTYPE_F8_E4M3, flags);
	for (unsigned k = 0; k < w; k++)
		pl[k] = (uint8_t *)malloc(count + 8) + skew;
	if (f32) {
		fill32(words, count);
	} else {
		for (size_t v = 0; v < count; v++)
			words[v] = (uint32_t)v;
	}
	for (size_t i = 0; i < count; i++) {
		if (f32) {
			memcpy(bytes + skew + 4 * i, &words[i], 4);
		} else {
			bytes[skew + 2 * i] = (uint8_t)words[i];
			bytes[skew + 2 * i + 1] = (uint8_t)(words[i] >> 8);
			pl[0][i] = (uint8_t)words[i];
			pl[1][i] = (uint8_t)(words[i] >> 8);
		}
	}
	if (f32)
		split32(words, count, pl);
	/* Lengths that leave every tail size of the vector loops. */
	for (size_t n = count - 70; n <= count; n += 1) {
		memset(want, 0xA5, count + 8);
		memset(got, 0xA5, count + 8);
		ref(want + skew, bytes + skew, n);
		fn(got + skew, (const uint8_t *const *)pl, n);
		ck_assert_msg(!memcmp(want, got, count + 8),
			      "%s flags %u fp%u skew %u n %zu differ",
			      castfs_isa_name(isa), flags, f32 ? 32 : 16, skew,
			      n);
	}
	for (unsigned k = 0; k < w; k++)
		free(pl[k] - skew);
out:
	free(words);
	free(got);
	free(want);
	free(bytes);
}
END_TEST

/* Only fp16 and fp32 to E4M3 have grouped kernels. */
START_TEST(test_kernels_planes__grouped_pairs)
{
	ck_assert_ptr_null(castfs_convert_grouped_get_isa(
		CASTFS_ISA_SCALAR, CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, 0));
	ck_assert_ptr_null(castfs_convert_grouped_get_isa(
		CASTFS_ISA_SCALAR, CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E5M2, 0));
	ck_assert_ptr_null(castfs_convert_grouped_get_isa(
		CASTFS_ISA_SCALAR, CASTFS_DTYPE_F16, CASTFS_DTYPE_F8_E4M3,
		1u << 7));
	ck_assert_ptr_nonnull(castfs_convert_grouped_get_isa(
		CASTFS_ISA_SCALAR, CASTFS_DTYPE_F16, CASTFS_DTYPE_F8_E4M3,
		CASTFS_CVT_SATURATE));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("kernels_planes");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(
		tc, test_kernels_planes__isa_matches_scalar_on_all_patterns, 0,
		8 * CASTFS_ISA_COUNT);
	tcase_add_test(tc, test_kernels_planes__only_e4m3_has_planes);
	tcase_add_loop_test(tc, test_kernels_planes__grouped_match_scalar, 0,
			    8 * CASTFS_ISA_COUNT);
	tcase_add_test(tc, test_kernels_planes__grouped_pairs);
	suite_add_tcase(s, tc);
	return s;
}
