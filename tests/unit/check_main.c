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
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
