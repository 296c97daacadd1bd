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

#endif
