# SPDX-License-Identifier: MIT
# Unit tests of the plan, recipes and the namespace.
check_PROGRAMS += tests/unit/test_plan tests/unit/test_recipe tests/unit/test_ns
TESTS += tests/unit/test_plan tests/unit/test_recipe tests/unit/test_ns
tests_unit_test_plan_SOURCES = tests/unit/test_plan.c tests/unit/testutil.c \
	tests/unit/testutil.h
tests_unit_test_plan_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_plan_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)
tests_unit_test_recipe_SOURCES = tests/unit/test_recipe.c
tests_unit_test_recipe_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_recipe_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)
tests_unit_test_ns_SOURCES = tests/unit/test_ns.c tests/unit/testutil.c \
	tests/unit/testutil.h
tests_unit_test_ns_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_ns_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)

# The kernel-dependent suites again, once per available ISA.
TESTS += tests/unit/per_isa.sh
EXTRA_DIST += tests/unit/per_isa.sh

# STYLE R1/R2 made mechanical.
TESTS += scripts/check-layering.sh
EXTRA_DIST += scripts/check-layering.sh scripts/format.sh .clang-format
