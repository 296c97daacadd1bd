/* SPDX-License-Identifier: MIT */
/* lib/st_header: every header the reference reader rejects, and the
 * malformed-checkpoint corpus. */
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

/* ---- invalid headers, one named test each ---- */

#define BAD_CASES(X)                                                                     \
	X(empty_header, "", 0, -EINVAL, "must begin with '{'")                           \
	X(leading_space_rejected, " {}", 0, -EINVAL, "must begin with '{'")              \
	X(utf8_bom_rejected, "\xef\xbb\xbf{}", 0, -EINVAL, "begin with '{'")             \
	X(not_an_object, "[]", 0, -EINVAL, "must begin with '{'")                        \
	X(trailing_garbage, "{} x", 0, -EINVAL, "after the JSON object")                 \
	X(second_object, "{}{}", 0, -EINVAL, "after the JSON object")                    \
	X(trailing_nul_padding, "{}\0\0", 0, -EINVAL,                                    \
	  "control byte 0x00 outside")                                                   \
	X(non_utf8, "{\"\xff\":1}", 0, -EINVAL,                                          \
	  "not valid UTF-8 at header byte 2")                                            \
	X(utf8_overlong, "{\"\xc0\xaf\":1}", 0, -EINVAL, "not valid UTF-8")              \
	X(utf8_overlong_3, "{\"\xe0\x80\xaf\":1}", 0, -EINVAL,                           \
	  "not valid UTF-8")                                                             \
	X(utf8_surrogate, "{\"\xed\xa0\x80\":1}", 0, -EINVAL,                            \
	  "not valid UTF-8")                                                             \
	X(utf8_above_max, "{\"\xf4\x90\x80\x80\":1}", 0, -EINVAL, "UTF-8")               \
	X(utf8_truncated, "{\"a\":1}\xe2\x82", 0, -EINVAL,                               \
	  "UTF-8 at header byte 7")                                                      \
	X(float_number, "{" TJ("a", "U8", "2.0", "0,2") "}", 2, -EINVAL,                 \
	  "number 2.0 at header byte 28 is not an integer")                              \
	X(exponent_number, "{" TJ("a", "U8", "1e3", "0,1000") "}", 1000,                 \
	  -EINVAL, "number 1e3 at header byte 28 is not an integer")                     \
	X(negative_number, "{" TJ("a", "U8", "-1", "0,0") "}", 0, -EINVAL,               \
	  "negative number -1 at header byte 28")                                        \
	X(leading_zero, "{" TJ("a", "U8", "01", "0,1") "}", 1, -EINVAL,                  \
	  "number 01 at header byte 28 has a leading zero")                              \
	X(above_2p53, "{" TJ("a", "U8", "9007199254740993", "0,0") "}", 0,               \
	  -EINVAL, "number 9007199254740993 at header byte 28 exceeds 2^53")             \
	X(huge_number,                                                                   \
	  "{" TJ("a", "U8", "1", "0,100000000000000000000000") "}", 0,                   \
	  -EINVAL, "exceeds 2^53")                                                       \
	X(raw_control_char, "{\"a\nb\":1}", 0, -EINVAL,                                  \
	  "raw control byte 0x0a in a string at header byte 3")                          \
	X(control_outside_string, "{\x01}", 0, -EINVAL,                                  \
	  "control byte 0x01 outside a string at header byte 1")                         \
	X(invalid_escape, "{\"a\\x\":1}", 0, -EINVAL,                                    \
	  "invalid escape in a string at header byte 3")                                 \
	X(lone_high_surrogate, "{\"\\ud800\":1}", 0, -EINVAL,                            \
	  "invalid escape")                                                              \
	X(lone_low_surrogate, "{\"\\udc00\":1}", 0, -EINVAL, "invalid escape")           \
	X(short_unicode_escape, "{\"\\u12\"}", 0, -EINVAL, "invalid escape")             \
	X(unterminated_string, "{\"abc", 0, -EINVAL,                                     \
	  "unterminated string starting at header byte 1")                               \
	X(invalid_json, "{\"a\":}", 0, -EINVAL,                                          \
	  "invalid JSON near header byte 5")                                             \
	X(unclosed_object, "{\"a\":{}", 0, -EINVAL, "invalid JSON near")                 \
	X(metadata_non_string, "{\"__metadata__\":{\"k\":1}}", 0, -EINVAL,               \
	  "__metadata__ 'k': value must be a string, got a number")                      \
	X(metadata_nested, "{\"__metadata__\":{\"k\":{}}}", 0, -EINVAL,                  \
	  "value must be a string, got an object")                                       \
	X(metadata_array, "{\"__metadata__\":[]}", 0, -EINVAL,                           \
	  "__metadata__ must be an object or null, got an array")                        \
	X(metadata_string, "{\"__metadata__\":\"x\"}", 0, -EINVAL,                       \
	  "must be an object or null, got a string")                                     \
	X(duplicate_metadata_key,                                                        \
	  "{\"__metadata__\":{\"k\":\"1\",\"j\":\"\",\"k\":\"2\"}}", 0,                  \
	  -EINVAL, "duplicate __metadata__ key 'k'")                                     \
	X(duplicate_metadata, "{\"__metadata__\":null,\"__metadata__\":{}}",             \
	  0, -EINVAL, "duplicate key '__metadata__'")                                    \
	X(tensor_not_object, "{\"w\":[1]}", 0, -EINVAL,                                  \
	  "tensor 'w': expected an object, got an array")                                \
	X(missing_dtype, "{\"w\":{\"shape\":[],\"data_offsets\":[0,0]}}", 0,             \
	  -EINVAL, "tensor 'w': missing field 'dtype'")                                  \
	X(missing_shape, "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,0]}}",            \
	  0, -EINVAL, "tensor 'w': missing field 'shape'")                               \
	X(missing_offsets, "{\"w\":{\"dtype\":\"U8\",\"shape\":[]}}", 0,                 \
	  -EINVAL, "tensor 'w': missing field 'data_offsets'")                           \
	X(dtype_not_string,                                                              \
	  "{\"w\":{\"dtype\":7,\"shape\":[],\"data_offsets\":[0,1]}}", 1,                \
	  -EINVAL, "tensor 'w': field 'dtype' must be a string, got a number")           \
	X(unknown_dtype, "{" TJ("w", "F9", "1", "0,1") "}", 1, -EINVAL,                  \
	  "tensor 'w': unknown dtype 'F9'")                                              \
	X(dtype_wrong_case, "{" TJ("w", "f32", "1", "0,4") "}", 4, -EINVAL,              \
	  "unknown dtype 'f32'")                                                         \
	X(dtype_with_nul, "{" TJ("w", "F32\\u0000", "1", "0,4") "}", 4,                  \
	  -EINVAL, "unknown dtype 'F32\\x00'")                                           \
	X(shape_not_array,                                                               \
	  "{\"w\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 3,            \
	  -EINVAL, "field 'shape' must be an array, got a number")                       \
	X(shape_string_entry, "{" TJ("w", "U8", "1,\"2\"", "0,2") "}", 2,                \
	  -EINVAL, "tensor 'w': shape[1] must be an integer, got a string")              \
	X(shape_null_entry, "{" TJ("w", "U8", "null", "0,0") "}", 0, -EINVAL,            \
	  "shape[0] must be an integer, got null")                                       \
	X(offsets_not_array,                                                             \
	  "{\"w\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":{}}}", 1,              \
	  -EINVAL, "field 'data_offsets' must be an array, got an object")               \
	X(one_offset, "{" TJ("w", "U8", "", "0") "}", 1, -EINVAL,                        \
	  "data_offsets must have 2 entries, got 1")                                     \
	X(three_offsets, "{" TJ("w", "U8", "", "0,1,1") "}", 1, -EINVAL,                 \
	  "data_offsets must have 2 entries, got 3")                                     \
	X(offset_bool, "{" TJ("w", "U8", "", "0,true") "}", 1, -EINVAL,                  \
	  "data_offsets[1] must be an integer, got a boolean")                           \
	X(duplicate_field,                                                               \
	  "{\"w\":{\"dtype\":\"U8\",\"shape\":[],\"dtype\":\"U8\","                      \
	  "\"data_offsets\":[0,1]}}",                                                    \
	  1, -EINVAL, "tensor 'w': duplicate field 'dtype'")                             \
	X(duplicate_offsets_field,                                                       \
	  "{\"w\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],"                \
	  "\"data_offsets\":[0,1]}}",                                                    \
	  1, -EINVAL, "duplicate field 'data_offsets'")                                  \
	X(duplicate_names,                                                               \
	  "{" TJ("w", "U8", "", "0,1") "," TJ("w", "U8", "", "1,2") "}", 2,              \
	  -EINVAL, "duplicate tensor name 'w'")                                          \
	X(duplicate_names_escaped,                                                       \
	  "{" TJ("w", "U8", "", "0,1") "," TJ("\\u0077", "U8", "", "1,2") "}",           \
	  2, -EINVAL, "duplicate tensor name 'w'")                                       \
	X(offsets_not_from_zero, "{" TJ("w", "U8", "", "4,5") "}", 5, -EINVAL,           \
	  "tensor 'w': data_offsets begin at 4, but the first")                          \
	X(hole_in_offsets,                                                               \
	  "{" TJ("a", "U8", "", "0,1") "," TJ("b", "U8", "", "2,3") "}", 3,              \
	  -EINVAL,                                                                       \
	  "tensor 'b': data_offsets [2,3) leave a hole after 'a', which ends at 1")      \
	X(overlapping_offsets,                                                           \
	  "{" TJ("a", "F32", "", "0,4") "," TJ("b", "F32", "", "2,6") "}", 6,            \
	  -EINVAL,                                                                       \
	  "tensor 'b': data_offsets [2,6) overlap 'a', which ends at 4")                 \
	X(end_before_begin,                                                              \
	  "{" TJ("a", "U8", "", "0,1") "," TJ("b", "U8", "0", "1,0") "}", 1,             \
	  -EINVAL, "tensor 'b': data_offsets end 0 is before begin 1")                   \
	X(size_mismatch, "{" TJ("w", "F16", "4", "0,10") "}", 10, -EINVAL,               \
	  "tensor 'w': data_offsets [0,10) hold 10 bytes, but 4 elements of F16 need 8") \
	X(shape_overflow,                                                                \
	  "{" TJ("w", "U8", "9007199254740992,9007199254740992", "0,0") "}",             \
	  0, -EOVERFLOW, "tensor 'w': shape product overflows 64 bits")                  \
	X(bits_overflow,                                                                 \
	  "{" TJ("w", "F64", "9007199254740992,256", "0,0") "}", 0,                      \
	  -EOVERFLOW, "bit count overflows 64 bits")                                     \
	X(f4_odd_count, "{" TJ("w", "F4", "3", "0,2") "}", 2, -EINVAL,                   \
	  "tensor 'w': 3 elements of 4-bit F4 do not fill whole bytes")                  \
	X(f6_misaligned, "{" TJ("w", "F6_E3M2", "2", "0,2") "}", 2, -EINVAL,             \
	  "2 elements of 6-bit F6_E3M2 do not fill whole bytes")                         \
	X(trailing_bytes, "{" TJ("w", "U8", "2", "0,2") "}", 3, -EINVAL,                 \
	  "but the file has 64 bytes (trailing bytes)")                                  \
	X(truncated_data, "{" TJ("w", "U8", "2", "0,2") "}", 1, -EINVAL,                 \
	  "(truncated)")                                                                 \
	X(first_error_wins,                                                              \
	  "{" TJ("a", "U8", "", "0,2") "," TJ("b", "U8", "", "5,6") "}", 6,              \
	  -EINVAL, "tensor 'a': data_offsets [0,2) hold 2 bytes")

#define DEFINE_BAD(name, json, data, rc, phrase)                          \
	START_TEST(test_st_header__##name)                                \
	{                                                                 \
		stt_expect_bad(json, sizeof(json) - 1, data, rc, phrase); \
	}                                                                 \
	END_TEST
BAD_CASES(DEFINE_BAD)

START_TEST(test_st_header__empty_file)
{
	stt_expect_bad_file((const uint8_t *)"", 0, -EINVAL,
			    "file of 0 bytes is shorter than the 8-byte");
}
END_TEST

START_TEST(test_st_header__seven_bytes)
{
	stt_expect_bad_file((const uint8_t *)"\x02\0\0\0\0\0\0", 7, -EINVAL,
			    "file of 7 bytes is shorter");
}
END_TEST

START_TEST(test_st_header__header_len_past_end)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 3, 0, &len);

	stt_expect_bad_file(f, len, -EINVAL,
			    "header length 3 past end of file (size 10)");
	free(f);
}
END_TEST

/* 8 + N must not wrap: N near 2^64 is E2BIG before any addition. */
START_TEST(test_st_header__header_len_huge)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, UINT64_MAX - 4, 0, &len);

	stt_expect_bad_file(f, len, -E2BIG, "exceeds the 100000000-byte limit");
	free(f);
}
END_TEST

START_TEST(test_st_header__header_at_limit_is_not_e2big)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 100000000, 0, &len);

	stt_expect_bad_file(f, len, -EINVAL,
			    "header length 100000000 past end");
	free(f);
}
END_TEST

START_TEST(test_st_header__buffer_shorter_than_header)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	size_t len;
	uint8_t *f = tu_raw_str("{}      ", 0, &len);

	ck_assert_int_eq(castfs_header_parse(f, 12, 100, &h, &d), -EINVAL);
	ck_assert_ptr_null(h);
	ck_assert_ptr_nonnull(strstr(d.msg, "shorter than the 16-byte header"));
	free(f);
}
END_TEST

/* A reader that counts what it serves and pretends the file is huge. */
struct big_reader {
	struct castfs_reader r;
	uint8_t head[16];
	uint64_t served;
};

static ssize_t big_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct big_reader *br = ctx;

	ck_assert_uint_le(off + n, sizeof(br->head));
	memcpy(buf, br->head + off, n);
	br->served += n;
	return (ssize_t)n;
}

START_TEST(test_st_header__header_over_100mb)
{
	struct big_reader br = { .r = { big_pread, &br, NULL, NULL } };
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 100000001, 0, &len);

	stt_expect_bad_file(
		f, len, -E2BIG,
		"header length 100000001 exceeds the 100000000-byte");
	memcpy(br.head, f, len);
	ck_assert_int_eq(castfs_header_read(&br.r, UINT64_C(1) << 40, &h, &d),
			 -E2BIG);
	ck_assert_ptr_null(h);
	ck_assert_uint_eq(br.served, 8);
	free(f);
}
END_TEST

/* Deep nesting inside an ignored field: rejected by the lexer before cJSON
 * recurses, with no crash even at 100000 levels. */
START_TEST(test_st_header__deep_nesting_rejected)
{
	size_t depth = 100000, n = 0;
	char *js = malloc(2 * depth + 128);

	n += (size_t)sprintf(js, "{\"w\":{\"x\":");
	memset(js + n, '[', depth);
	n += depth;
	memset(js + n, ']', depth);
	n += depth;
	n += (size_t)sprintf(js + n, "}}");
	stt_expect_bad(js, n, 0, -EINVAL,
		       "JSON nested deeper than 127 levels at header byte 135");
	free(js);
}
END_TEST

START_TEST(test_st_header__nesting_at_limit_accepted)
{
	struct tu_st *b = tu_st_new();
	char extra[300];
	struct castfs_header *h;
	size_t n = (size_t)sprintf(extra, "\"x\":");

	/* top object + tensor object + 125 arrays = 127 levels, serde's most */
	memset(extra + n, '[', 125);
	memset(extra + n + 125, ']', 125);
	extra[n + 250] = '\0';
	tu_st_add(b, "w", "U8", SHAPE(3), NULL);
	tu_st_extra(b, 0, extra);
	h = stt_build_ok(b);
	ck_assert_uint_eq(h->ntensors, 1);
	castfs_header_free(h);
	memmove(extra + n + 1, extra + n, 251); /* one level more */
	strcat(extra, "]");
	tu_st_extra(b, 0, extra);
	{
		size_t len;
		uint8_t *f = tu_st_build(b, &len);

		stt_expect_bad_file(f, len, -EINVAL, "nested deeper than 127");
		free(f);
	}
	tu_st_free(b);
}
END_TEST

/* ---- the malformed corpus ---- */

static void corpus_check(const char *dir, const char *file, const char *err,
			 const char *phrase)
{
	static const struct {
		const char *name;
		int rc;
	} errs[] = {
		{ "EINVAL", -EINVAL },
		{ "E2BIG", -E2BIG },
		{ "EOVERFLOW", -EOVERFLOW },
	};
	struct castfs_mem_reader mr;
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	char path[4096];
	size_t len;
	uint8_t *f;
	int rc = 1;

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (!strcmp(err, errs[i].name))
			rc = errs[i].rc;
	ck_assert_msg(rc < 0, "%s: unknown errno name %s", file, err);
	ck_assert((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) <
		  sizeof(path));
	f = tu_read_file(path, &len);
	ck_assert_msg(f != NULL, "cannot read %s", path);
	stt_expect_bad_file(f, len, rc, phrase);
	castfs_mem_reader_init(&mr, f, len);
	ck_assert_int_eq(castfs_header_read(&mr.r, len, &h, &d), rc);
	ck_assert_msg(strstr(d.msg, phrase), "%s via reader: '%s'", file,
		      d.msg);
	free(f);
}

static size_t corpus_run(const char *dir, char ***listed)
{
	char path[4096], line[1024];
	size_t n = 0;
	FILE *ex;

	ck_assert((size_t)snprintf(path, sizeof(path), "%s/EXPECTED", dir) <
		  sizeof(path));
	ex = fopen(path, "r");
	ck_assert_msg(ex != NULL, "cannot open %s", path);
	while (fgets(line, sizeof(line), ex)) {
		char *file = strtok(line, " \n"), *err = strtok(NULL, " \n");
		char *phrase = strtok(NULL, "\n");

		if (!file || file[0] == '#')
			continue;
		ck_assert_msg(err && phrase, "EXPECTED: bad line for %s", file);
		corpus_check(dir, file, err, phrase);
		*listed = realloc(*listed, (n + 1) * sizeof(char *));
		(*listed)[n++] = strdup(file);
	}
	fclose(ex);
	return n;
}

START_TEST(test_st_header__malformed_corpus)
{
	const char *top = getenv("top_srcdir");
	char dir[4096], **listed = NULL;
	struct dirent *e;
	size_t n, nfiles = 0;
	DIR *dp;

	ck_assert((size_t)snprintf(dir, sizeof(dir), "%s/tests/data/malformed",
				   top ? top : ".") < sizeof(dir));
	n = corpus_run(dir, &listed);
	ck_assert_uint_ge(n, 45);
	dp = opendir(dir);
	ck_assert_ptr_nonnull(dp);
	while ((e = readdir(dp))) {
		bool found = false;

		if (!strstr(e->d_name, ".safetensors"))
			continue;
		for (size_t i = 0; i < n && !found; i++)
			found = !strcmp(listed[i], e->d_name);
		ck_assert_msg(found, "%s is not listed in EXPECTED", e->d_name);
		nfiles++;
	}
	closedir(dp);
	ck_assert_uint_eq(nfiles, n);
	for (size_t i = 0; i < n; i++)
		free(listed[i]);
	free(listed);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("st_header");
	TCase *bad = tcase_create("invalid");
	TCase *misc = tcase_create("misc");

#define ADD_BAD(name, ...) tcase_add_test(bad, test_st_header__##name);
	BAD_CASES(ADD_BAD)
	tcase_add_test(bad, test_st_header__empty_file);
	tcase_add_test(bad, test_st_header__seven_bytes);
	tcase_add_test(bad, test_st_header__header_len_past_end);
	tcase_add_test(bad, test_st_header__header_len_huge);
	tcase_add_test(bad, test_st_header__header_at_limit_is_not_e2big);
	tcase_add_test(bad, test_st_header__buffer_shorter_than_header);
	tcase_add_test(bad, test_st_header__header_over_100mb);
	tcase_add_test(bad, test_st_header__deep_nesting_rejected);
	tcase_add_test(bad, test_st_header__nesting_at_limit_accepted);
	tcase_add_test(misc, test_st_header__malformed_corpus);
	suite_add_tcase(s, bad);
	suite_add_tcase(s, misc);
	return s;
}
