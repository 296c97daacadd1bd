/* SPDX-License-Identifier: MIT */
/*
 * The one contract between a unit-test file and the shared runner
 * (check_main.c): each test binary links exactly one unit_suite().
 */
#ifndef CASTFS_TESTS_UNIT_H
#define CASTFS_TESTS_UNIT_H

#include <check.h>

/* unit_suite - the binary's Check suite; the runner owns and frees it. */
Suite *unit_suite(void);

/*
 * unit_add_isa_loop - adds loop test @t to @tc for the indices
 * [isa * @per, (isa + 1) * @per) of every SIMD ISA (all but scalar) this
 * CPU runs. The indices of the others are not run but counted as skipped:
 * the runner prints the count and the ISAs ("skipped" is never a pass),
 * and the per-ISA programs (per_isa_<isa>.sh) exit 77 for them. Call only
 * from unit_suite(); not thread-safe.
 */
void unit_add_isa_loop(TCase *tc, const TTest *t, int per);

#endif
