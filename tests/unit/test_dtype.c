/* SPDX-License-Identifier: MIT */
/* lib/dtype: the safetensors dtype table (FORMATS.md 1.3). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "format/dtype.h"
#include "unit.h"

/* FORMATS.md 1.3, in enum order: the writer's sort depends on it. */
static const struct {
	const char *name;
	unsigned bits;
	bool castable;
} table[] = {
	{ "BOOL", 8, false },	     { "F4", 4, false },
	{ "F6_E2M3", 6, false },     { "F6_E3M2", 6, false },
	{ "U8", 8, false },	     { "I8", 8, false },
	{ "F8_E5M2", 8, true },	     { "F8_E4M3", 8, true },
	{ "F8_E8M0", 8, false },     { "F8_E4M3FNUZ", 8, false },
	{ "F8_E5M2FNUZ", 8, false }, { "I16", 16, false },
	{ "U16", 16, false },	     { "F16", 16, true },
	{ "BF16", 16, true },	     { "I32", 32, false },
	{ "U32", 32, false },	     { "F32", 32, true },
	{ "C64", 64, false },	     { "F64", 64, true },
	{ "I64", 64, false },	     { "U64", 64, false },
};

START_TEST(test_dtype__table_size)
{
	ck_assert_uint_eq(CASTFS_DTYPE_COUNT, sizeof(table) / sizeof(table[0]));
	ck_assert_int_eq(CASTFS_DTYPE_INVALID, CASTFS_DTYPE_COUNT);
}
END_TEST

START_TEST(test_dtype__name_round_trip)
{
	enum castfs_dtype dt = (enum castfs_dtype)_i;
	const char *n = castfs_dtype_name(dt);

	ck_assert_str_eq(n, table[_i].name);
	ck_assert_int_eq(castfs_dtype_from_name(n, strlen(n)), dt);
}
END_TEST

START_TEST(test_dtype__bits)
{
	ck_assert_uint_eq(castfs_dtype_bits((enum castfs_dtype)_i),
			  table[_i].bits);
}
END_TEST

START_TEST(test_dtype__castable_set)
{
	ck_assert_uint_eq(castfs_dtype_is_castable((enum castfs_dtype)_i),
			  table[_i].castable);
}
END_TEST

START_TEST(test_dtype__unknown_names)
{
	static const char *const bad[] = { "",	   "f32",	  "F3",
					   "F32 ", "F8_E4M3FN",	  "FLOAT",
					   "BF",   "F8_E4M3FNUZX" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(castfs_dtype_from_name(bad[i], strlen(bad[i])),
				 CASTFS_DTYPE_INVALID);
	/* length-delimited: a NUL or a prefix is not a match */
	ck_assert_int_eq(castfs_dtype_from_name("F32\0", 4),
			 CASTFS_DTYPE_INVALID);
	ck_assert_int_eq(castfs_dtype_from_name("F32", 2),
			 CASTFS_DTYPE_INVALID);
	ck_assert_int_eq(castfs_dtype_from_name("F16x", 3), CASTFS_DTYPE_F16);
}
END_TEST

START_TEST(test_dtype__out_of_range)
{
	ck_assert_str_eq(castfs_dtype_name(CASTFS_DTYPE_INVALID), "?");
	ck_assert_str_eq(castfs_dtype_name((enum castfs_dtype) - 1), "?");
	ck_assert_uint_eq(castfs_dtype_bits(CASTFS_DTYPE_INVALID), 0);
	ck_assert(!castfs_dtype_is_castable(CASTFS_DTYPE_INVALID));
	ck_assert_ptr_null(castfs_dtype_numpy(CASTFS_DTYPE_INVALID));
	ck_assert_ptr_null(castfs_dtype_torch(CASTFS_DTYPE_INVALID));
}
END_TEST

START_TEST(test_dtype__numpy_and_torch_names)
{
	ck_assert_str_eq(castfs_dtype_numpy(CASTFS_DTYPE_F32), "<f4");
	ck_assert_str_eq(castfs_dtype_numpy(CASTFS_DTYPE_U8), "|u1");
	ck_assert_str_eq(castfs_dtype_numpy(CASTFS_DTYPE_BOOL), "|b1");
	ck_assert_ptr_null(castfs_dtype_numpy(CASTFS_DTYPE_BF16));
	ck_assert_ptr_null(castfs_dtype_numpy(CASTFS_DTYPE_F8_E4M3));
	ck_assert_str_eq(castfs_dtype_torch(CASTFS_DTYPE_BF16), "bfloat16");
	ck_assert_str_eq(castfs_dtype_torch(CASTFS_DTYPE_F8_E4M3),
			 "float8_e4m3fn");
	ck_assert_str_eq(castfs_dtype_torch(CASTFS_DTYPE_F4),
			 "float4_e2m1fn_x2");
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("dtype");
	TCase *tc = tcase_create("table");

	tcase_add_test(tc, test_dtype__table_size);
	tcase_add_loop_test(tc, test_dtype__name_round_trip, 0,
			    CASTFS_DTYPE_COUNT);
	tcase_add_loop_test(tc, test_dtype__bits, 0, CASTFS_DTYPE_COUNT);
	tcase_add_loop_test(tc, test_dtype__castable_set, 0,
			    CASTFS_DTYPE_COUNT);
	tcase_add_test(tc, test_dtype__unknown_names);
	tcase_add_test(tc, test_dtype__out_of_range);
	tcase_add_test(tc, test_dtype__numpy_and_torch_names);
	suite_add_tcase(s, tc);
	return s;
}
