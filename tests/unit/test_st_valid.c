/* SPDX-License-Identifier: MIT */
/* lib/st_header: headers the reference reader accepts, and sizes. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "format/st_header.h"
#include "testutil.h"

#include "st_testutil.h"
#include "unit.h"

/* ---- valid headers ---- */

/* FORMATS.md 1.4, as the reference writer lays it out (examples.py). */
START_TEST(test_st_header__worked_example_parses)
{
	static const char *order[] = { "a", "s", "b", "w" };
	static const uint64_t offs[] = { 0, 16, 20, 26, 32 };
	size_t len;
	uint8_t *f = tu_raw(worked_json, sizeof(worked_json) - 1, UINT64_MAX,
			    32, &len);
	struct castfs_header *h;
	const struct castfs_meta_kv *kv;

	ck_assert_uint_eq(sizeof(worked_json) - 1, 264);
	ck_assert_mem_eq(f, worked_prefix, 8);
	ck_assert_uint_eq(len, 304);
	h = stt_parse_ok(f, len);
	ck_assert_uint_eq(h->header_len, 264);
	ck_assert_uint_eq(h->data_start, 272);
	ck_assert_uint_eq(h->data_len, 32);
	ck_assert_uint_eq(h->ntensors, 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_str_eq(h->tensors[i].name, order[i]);
		ck_assert_uint_eq(h->tensors[i].begin, offs[i]);
		ck_assert_uint_eq(h->tensors[i].end, offs[i + 1]);
	}
	ck_assert_int_eq(stt_find(h, "w")->dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_uint_eq(stt_find(h, "w")->nelems, 6);
	ck_assert_uint_eq(stt_find(h, "a")->shape[1], 2);
	ck_assert_uint_eq(stt_find(h, "s")->ndim, 0);
	ck_assert_uint_eq(stt_find(h, "s")->nelems, 1);
	ck_assert(h->has_metadata);
	kv = castfs_header_meta(h, "format");
	ck_assert_ptr_nonnull(kv);
	ck_assert_str_eq(kv->value, "pt");
	ck_assert_ptr_null(castfs_header_meta(h, "nope"));
	castfs_header_free(h);
	free(f);
}
END_TEST

START_TEST(test_st_header__rank0_tensor)
{
	struct castfs_header *h =
		stt_parse_json_ok("{" TJ("s", "F64", "", "0,8") "}", 8);

	ck_assert_uint_eq(h->tensors[0].ndim, 0);
	ck_assert_uint_eq(h->tensors[0].nelems, 1);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__empty_tensors)
{
	struct castfs_header *h = stt_parse_json_ok(
		"{" TJ("e1", "F32", "0", "0,0") "," TJ(
			"e2", "BF16", "3,0,7",
			"0,0") "," TJ("x", "U8", "2",
				      "0,2") "," TJ("e3", "U8", "0", "2,2") "}",
		2);

	ck_assert_uint_eq(h->ntensors, 4);
	ck_assert_str_eq(h->tensors[0].name, "e1"); /* ties break by name */
	ck_assert_str_eq(h->tensors[1].name, "e2");
	ck_assert_str_eq(h->tensors[2].name, "x");
	ck_assert_uint_eq(stt_find(h, "e2")->nelems, 0);
	ck_assert_uint_eq(h->data_len, 2);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__no_tensors)
{
	struct castfs_header *h = stt_parse_json_ok("{}", 0);

	ck_assert_uint_eq(h->ntensors, 0);
	ck_assert(!h->has_metadata);
	ck_assert_ptr_null(castfs_header_find(h, "a", 1));
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__every_dtype)
{
	enum castfs_dtype dt = (enum castfs_dtype)_i;
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;
	const struct castfs_tensor *t;

	tu_st_add(b, "x", "U8", SHAPE(3), NULL);
	tu_st_add(b, "t", castfs_dtype_name(dt), SHAPE(2, 4), NULL);
	h = stt_build_ok(b);
	t = stt_find(h, "t");
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_uint_eq(t->nelems, 8);
	ck_assert_uint_eq(t->end - t->begin, castfs_dtype_bits(dt));
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__f4_even_count)
{
	struct castfs_header *h =
		stt_parse_json_ok("{" TJ("w", "F4", "3,2", "0,3") "}", 3);

	ck_assert_uint_eq(h->tensors[0].nelems, 6);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__f6_whole_bytes)
{
	struct castfs_header *h =
		stt_parse_json_ok("{" TJ("w", "F6_E2M3", "4", "0,3") "}", 3);

	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_absent)
{
	struct castfs_header *h =
		stt_parse_json_ok("{" TJ("w", "U8", "", "0,1") "}", 1);

	ck_assert(!h->has_metadata);
	ck_assert_uint_eq(h->nmeta, 0);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_null)
{
	struct castfs_header *h =
		stt_parse_json_ok("{\"__metadata__\":null}", 0);

	ck_assert(!h->has_metadata);
	ck_assert_uint_eq(h->ntensors, 0);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_empty_object)
{
	struct castfs_header *h = stt_parse_json_ok("{\"__metadata__\":{}}", 0);

	ck_assert(h->has_metadata);
	ck_assert_uint_eq(h->nmeta, 0);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_present_in_file_order)
{
	struct tu_st *b = tu_st_new();
	struct tu_st_opts o = { .meta_last = true, .pretty = true };
	struct castfs_header *h;

	tu_st_set_opts(b, &o);
	tu_st_meta(b, "z", "last\n\"q\"");
	tu_st_meta(b, "format", "pt");
	tu_st_meta_n(b, "k\0", 2, "v\0v", 3);
	tu_st_add(b, "w", "U8", SHAPE(1), NULL);
	h = stt_build_ok(b);
	ck_assert(h->has_metadata);
	ck_assert_uint_eq(h->nmeta, 3);
	ck_assert_str_eq(h->meta[0].key, "z");
	ck_assert_str_eq(h->meta[0].value, "last\n\"q\"");
	ck_assert_str_eq(h->meta[1].key, "format");
	ck_assert_uint_eq(h->meta[2].key_len, 2);
	ck_assert_uint_eq(h->meta[2].value_len, 3);
	ck_assert_mem_eq(h->meta[2].value, "v\0v", 4);
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__unsorted_key_order)
{
	static const enum tu_key_order orders[] = { TU_KEYS_REVERSE,
						    TU_KEYS_SHUFFLE };
	struct tu_st *b = tu_st_new();
	char name[32];

	for (int i = 0; i < 40; i++) {
		sprintf(name, "layer.%d.w", i);
		tu_st_add(b, name, i % 3 ? "BF16" : "F32",
			  SHAPE(4, (uint64_t)i), NULL);
	}
	for (int k = 0; k < 2; k++) {
		struct tu_st_opts o = { .keys = orders[k],
					.seed = 7,
					.fields_reversed = k == 1 };
		struct castfs_header *h;

		tu_st_set_opts(b, &o);
		h = stt_build_ok(b);
		ck_assert_uint_eq(h->ntensors, 40);
		stt_check_sorted(h);
		ck_assert_uint_eq(stt_find(h, "layer.0.w")->begin, 0);
		ck_assert_int_eq(stt_find(h, "layer.39.w")->dtype,
				 CASTFS_DTYPE_F32);
		castfs_header_free(h);
	}
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__trailing_spaces_accepted)
{
	static const char pads[] = { ' ', '\n', '\t', '\r' };
	struct tu_st *b = tu_st_new();

	tu_st_add(b, "w", "I32", SHAPE(2), NULL);
	for (int i = 0; i < 4; i++) {
		struct tu_st_opts o = { .pad_byte = pads[i],
					.extra_pad = 17,
					.pretty = i == 3 };
		struct castfs_header *h;

		tu_st_set_opts(b, &o);
		h = stt_build_ok(b);
		ck_assert_uint_eq(h->header_len % 8, 1);
		ck_assert_uint_eq(h->tensors[0].end, 8);
		castfs_header_free(h);
	}
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__unpadded_header_accepted)
{
	struct tu_st *b = tu_st_new();
	struct tu_st_opts o = { .align = 1 };
	struct castfs_header *h;

	tu_st_set_opts(b, &o);
	tu_st_add(b, "ab", "U8", SHAPE(1), NULL);
	h = stt_build_ok(b);
	ck_assert_uint_eq(h->header_len, 54);
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__nul_in_name)
{
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;
	const struct castfs_tensor *t;

	tu_st_add_n(b, "a\0b", 3, "U8", SHAPE(1), NULL, TU_NBYTES_AUTO);
	tu_st_add_n(b, "a", 1, "U8", SHAPE(2), NULL, TU_NBYTES_AUTO);
	tu_st_add_n(b, "a\0", 2, "U8", SHAPE(3), NULL, TU_NBYTES_AUTO);
	h = stt_build_ok(b);
	t = castfs_header_find(h, "a\0b", 3);
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->name_len, 3);
	ck_assert_mem_eq(t->name, "a\0b", 4);
	ck_assert_uint_eq(t->nelems, 1);
	ck_assert_uint_eq(castfs_header_find(h, "a", 1)->nelems, 2);
	ck_assert_uint_eq(castfs_header_find(h, "a\0", 2)->nelems, 3);
	ck_assert_ptr_null(castfs_header_find(h, "a\0c", 3));
	stt_check_sorted(h);
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__very_long_name)
{
	size_t n = 1 << 20;
	char *name = malloc(n);
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h;

	memset(name, 'x', n);
	tu_st_add_n(b, name, n, "U8", SHAPE(1), NULL, TU_NBYTES_AUTO);
	tu_st_add_n(b, name, n - 1, "F8_E5M2", SHAPE(1), NULL, TU_NBYTES_AUTO);
	h = stt_build_ok(b);
	ck_assert_uint_eq(castfs_header_find(h, name, n)->name_len, n);
	castfs_header_free(h);
	tu_st_add_n(b, name, n, "U16", SHAPE(1), NULL, TU_NBYTES_AUTO);
	{
		size_t len;
		uint8_t *f = tu_st_build(b, &len);

		ck_assert_int_eq(castfs_header_parse(f, len, len, &h, &d),
				 -EINVAL);
		ck_assert_ptr_nonnull(
			strstr(d.msg, "duplicate tensor name 'xxxx"));
		ck_assert_ptr_nonnull(strstr(d.msg, "x...'"));
		ck_assert_uint_lt(strlen(d.msg), 100);
		free(f);
	}
	tu_st_free(b);
	free(name);
}
END_TEST

START_TEST(test_st_header__escapes_decoded)
{
	struct castfs_header *h = stt_parse_json_ok(
		"{" TJ("q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\xc3\xa9",
		       "U8", "", "0,1") "}",
		1);
	static const char want[] =
		"q\"b\\s/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\xc3\xa9";

	ck_assert_uint_eq(h->tensors[0].name_len, sizeof(want) - 1);
	ck_assert_str_eq(h->tensors[0].name, want);
	castfs_header_free(h);
}
END_TEST

/* Escaped keys mean the same as plain ones, as in serde_json. */
START_TEST(test_st_header__escaped_keys_recognised)
{
	struct castfs_header *h = stt_parse_json_ok(
		"{\"__metadata\\u005f_\":{\"k\":\"v\"},\"w\":{\"d\\u0074ype\":"
		"\"\\u00553\\u0032\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		4);

	ck_assert(h->has_metadata);
	ck_assert_int_eq(h->tensors[0].dtype, CASTFS_DTYPE_U32);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__unknown_fields_ignored)
{
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;

	/* strings inside ignored fields must not shift the key bookkeeping */
	tu_st_add(b, "a", "F16", SHAPE(2), NULL);
	tu_st_extra(b, 0,
		    "\"x\":{\"dtype\":\"zz\",\"k\":[\"s\",{\"t\":\"u\"}]},"
		    "\"x\":null,\"y\":[1,2,3.5e0]");
	tu_st_add(b, "b", "BF16", SHAPE(3), NULL);
	tu_st_extra(b, 1, "\"shape_\":\"q\"");
	tu_st_add(b, "c", "BF16", SHAPE(1), NULL);
	{
		size_t len;
		uint8_t *f = tu_st_build(b, &len);

		/* 3.5e0 is a float: our lexer rejects every float token */
		stt_expect_bad_file(f, len, -EINVAL,
				    "number 3.5e0 at header byte");
		free(f);
	}
	tu_st_extra(b, 0,
		    "\"x\":{\"dtype\":\"zz\",\"k\":[\"s\",{\"t\":\"u\"}]},"
		    "\"x\":null,\"y\":[1,2,true]");
	h = stt_build_ok(b);
	ck_assert_int_eq(stt_find(h, "a")->dtype, CASTFS_DTYPE_F16);
	ck_assert_int_eq(stt_find(h, "b")->dtype, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(stt_find(h, "c")->nelems, 1);
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__raw_utf8_names)
{
	struct castfs_header *h = stt_parse_json_ok(
		"{" TJ("\xe6\x9d\x83\xe9\x87\x8d", "U8", "",
		       "0,1") "," TJ("\xf0\x9f\x98\x80", "U8", "", "1,2") "}",
		2);

	ck_assert_uint_eq(stt_find(h, "\xe6\x9d\x83\xe9\x87\x8d")->begin, 0);
	ck_assert_uint_eq(stt_find(h, "\xf0\x9f\x98\x80")->begin, 1);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__max_int_accepted)
{
	static const char js[] =
		"{" TJ("w", "U8", "9007199254740992", "0,9007199254740992") "}";
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	size_t len;
	uint8_t *f = tu_raw(js, sizeof(js) - 1, UINT64_MAX, 0, &len);
	uint64_t size = len + (UINT64_C(1) << 53);

	ck_assert_int_eq(castfs_header_parse(f, len, size, &h, &d), 0);
	ck_assert_uint_eq(h->data_len, UINT64_C(1) << 53);
	castfs_header_free(h);
	free(f);
}
END_TEST

START_TEST(test_st_header__find_many)
{
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;
	uint64_t s = 42;
	char name[32];

	for (int i = 0; i < 500; i++) {
		sprintf(name, "%016llx", (unsigned long long)tu_rand(&s));
		tu_st_add(b, name + (i % 7), "U8", SHAPE((uint64_t)(i % 5)),
			  NULL);
	}
	h = stt_build_ok(b);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		ck_assert_ptr_eq(castfs_header_find(h, t->name, t->name_len),
				 t);
		ck_assert_ptr_null(
			castfs_header_find(h, t->name, t->name_len + 1));
	}
	ck_assert_ptr_null(castfs_header_find(h, "", 0));
	ck_assert_ptr_null(castfs_header_find(NULL, "a", 1));
	stt_check_sorted(h);
	castfs_header_free(h);
	castfs_header_free(NULL);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__read_through_reader)
{
	struct tu_st *b = tu_st_new();
	struct castfs_mem_reader mr;
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	size_t len;
	uint8_t *f;

	tu_st_add(b, "w", "BF16", SHAPE(2, 3), NULL);
	tu_st_meta(b, "format", "pt");
	f = tu_st_build(b, &len);
	castfs_mem_reader_init(&mr, f, len);
	ck_assert_int_eq(castfs_header_read(&mr.r, len, &h, &d), 0);
	ck_assert_uint_eq(stt_find(h, "w")->end, 12);
	castfs_header_free(h);
	h = NULL;
	castfs_mem_reader_init(&mr, f, 20); /* the file shrank: short read */
	ck_assert_int_eq(castfs_header_read(&mr.r, len, &h, &d), -EIO);
	ck_assert_ptr_nonnull(strstr(d.msg, "header failed"));
	castfs_diag_clear(&d);
	ck_assert_int_eq(castfs_header_read(&mr.r, 5, &h, &d), -EINVAL);
	ck_assert_ptr_nonnull(strstr(d.msg, "file of 5 bytes"));
	ck_assert_ptr_null(h);
	free(f);
	tu_st_free(b);
}
END_TEST

/* ---- sizes ---- */

START_TEST(test_st_header__nelems_and_nbytes)
{
	uint64_t v = 99;
	uint64_t big = UINT64_C(1) << 40;

	ck_assert_int_eq(castfs_shape_nelems(NULL, 0, &v), 0);
	ck_assert_uint_eq(v, 1);
	ck_assert_int_eq(
		castfs_shape_nelems((uint64_t[]){ 0, big, big }, 3, &v), 0);
	ck_assert_uint_eq(v, 0);
	v = 7;
	ck_assert_int_eq(castfs_shape_nelems((uint64_t[]){ big, big, 0 }, 3,
					     &v),
			 -EOVERFLOW);
	ck_assert_uint_eq(v, 7);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_F4, 6, &v), 0);
	ck_assert_uint_eq(v, 3);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_F4, 5, &v), -EINVAL);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_F6_E2M3, 4, &v), 0);
	ck_assert_uint_eq(v, 3);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_F64,
					      UINT64_C(1) << 58, &v),
			 -EOVERFLOW);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_INVALID, 1, &v),
			 -EINVAL);
	ck_assert_int_eq(castfs_tensor_nbytes(CASTFS_DTYPE_C64, 3, &v), 0);
	ck_assert_uint_eq(v, 24);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("st_valid");
	TCase *tc = tcase_create("valid");

	tcase_add_test(tc, test_st_header__worked_example_parses);
	tcase_add_test(tc, test_st_header__rank0_tensor);
	tcase_add_test(tc, test_st_header__empty_tensors);
	tcase_add_test(tc, test_st_header__no_tensors);
	tcase_add_loop_test(tc, test_st_header__every_dtype, 0,
			    CASTFS_DTYPE_COUNT);
	tcase_add_test(tc, test_st_header__f4_even_count);
	tcase_add_test(tc, test_st_header__f6_whole_bytes);
	tcase_add_test(tc, test_st_header__metadata_absent);
	tcase_add_test(tc, test_st_header__metadata_null);
	tcase_add_test(tc, test_st_header__metadata_empty_object);
	tcase_add_test(tc, test_st_header__metadata_present_in_file_order);
	tcase_add_test(tc, test_st_header__unsorted_key_order);
	tcase_add_test(tc, test_st_header__trailing_spaces_accepted);
	tcase_add_test(tc, test_st_header__unpadded_header_accepted);
	tcase_add_test(tc, test_st_header__nul_in_name);
	tcase_add_test(tc, test_st_header__very_long_name);
	tcase_add_test(tc, test_st_header__escapes_decoded);
	tcase_add_test(tc, test_st_header__escaped_keys_recognised);
	tcase_add_test(tc, test_st_header__unknown_fields_ignored);
	tcase_add_test(tc, test_st_header__raw_utf8_names);
	tcase_add_test(tc, test_st_header__max_int_accepted);
	tcase_add_test(tc, test_st_header__find_many);
	tcase_add_test(tc, test_st_header__read_through_reader);
	tcase_add_test(tc, test_st_header__nelems_and_nbytes);
	suite_add_tcase(s, tc);
	return s;
}
