/* SPDX-License-Identifier: MIT */
/*
 * lib/kernels: the casts that read a grouped pack's bf16 planes. Each ISA's
 * planes kernel must write what the scalar bf16 kernel writes for the same
 * elements un-grouped here (the scalar kernels are held to torch by the
 * compatibility tests), for all 65536 bf16 patterns.
 */
#include <check.h>
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

Suite *unit_suite(void)
{
	Suite *s = suite_create("kernels_planes");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(
		tc, test_kernels_planes__isa_matches_scalar_on_all_patterns, 0,
		8 * CASTFS_ISA_COUNT);
	tcase_add_test(tc, test_kernels_planes__only_e4m3_has_planes);
	suite_add_tcase(s, tc);
	return s;
}
