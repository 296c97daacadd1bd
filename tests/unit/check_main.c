// SPDX-License-Identifier: MIT
/*
 * The main() of every Check binary: runs unit_suite() with CK_ENV settings
 * and maps CASTFS_ISA naming an ISA this build or CPU lacks to a skip.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/convert.h"
#include "unit.h"

/* Exit status automake reads as SKIP. */
#define UNIT_SKIP 77

/* Loop indices unit_add_isa_loop() did not register, per ISA. */
static int isa_skipped[CASTFS_ISA_COUNT];

void unit_add_isa_loop(TCase *tc, const TTest *t, int per)
{
	for (int isa = CASTFS_ISA_SCALAR + 1; isa < CASTFS_ISA_COUNT; isa++) {
		if (castfs_isa_available((enum castfs_isa)isa))
			tcase_add_loop_test(tc, t, isa * per, (isa + 1) * per);
		else
			isa_skipped[isa] += per;
	}
}

/* Says how many checks did not run, and why, next to Check's summary. */
static void report_skipped(void)
{
	for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
		if (isa_skipped[isa])
			printf("Skipped: %d checks of %s (not supported by "
			       "this CPU or build; per_isa_%s.sh reports "
			       "SKIP)\n",
			       isa_skipped[isa],
			       castfs_isa_name((enum castfs_isa)isa),
			       castfs_isa_name((enum castfs_isa)isa));
	}
}

/*
 * An ISA named by CASTFS_ISA that cannot run here is a skip, as is one this
 * build does not know (a "neon" leg of a CI matrix on x86): the per-ISA
 * runs (per_isa.sh) then run everywhere.
 */
static int isa_skip(void)
{
	const char *env = getenv("CASTFS_ISA");
	enum castfs_isa isa;

	if (!env)
		return 0;
	isa = castfs_isa_from_name(env);
	if (castfs_isa_available(isa))
		return 0;
	fprintf(stderr, "CASTFS_ISA=%s: %s, skipping\n", env,
		isa == CASTFS_ISA_COUNT ? "not an ISA of this build" :
					  "not supported by this CPU");
	return UNIT_SKIP;
}

int main(void)
{
	SRunner *sr;
	int failed;

	if (isa_skip())
		return UNIT_SKIP;
	sr = srunner_create(unit_suite());
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	report_skipped();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
