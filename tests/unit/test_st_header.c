/* SPDX-License-Identifier: MIT */
/* lib/st_header: parsing, validation and emission of safetensors headers. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "st_header.h"
#include "testutil.h"

/* A tensor entry of a hand-written header. */
#define TJ(n, dt, sh, off)                               \
	"\"" n "\":{\"dtype\":\"" dt "\",\"shape\":[" sh \
	"],\"data_offsets\":[" off "]}"
#define SHAPE(...)                                                          \
	(uint32_t)(sizeof((uint64_t[]){ __VA_ARGS__ }) / sizeof(uint64_t)), \
		(uint64_t[])                                                \
	{                                                                   \
		__VA_ARGS__                                                 \
	}

static int parse(const uint8_t *f, size_t len, struct castfs_header **h,
		 struct castfs_diag *d)
{
	castfs_diag_clear(d);
	*h = NULL;
	return castfs_header_parse(f, len, len, h, d);
}

static void expect_bad_file(const uint8_t *f, size_t len, int rc,
			    const char *phrase)
{
	struct castfs_diag d;
	struct castfs_header *h;
	int got = parse(f, len, &h, &d);

	ck_assert_msg(got == rc, "rc %d (%s), want %d", got, d.msg, rc);
	ck_assert_ptr_null(h);
	ck_assert_msg(strstr(d.msg, phrase), "diag '%s' lacks '%s'", d.msg,
		      phrase);
}

static void expect_bad(const char *json, size_t json_len, size_t data_len,
		       int rc, const char *phrase)
{
	size_t len;
	uint8_t *f = tu_raw(json, json_len, UINT64_MAX, data_len, &len);

	expect_bad_file(f, len, rc, phrase);
	free(f);
}

static struct castfs_header *parse_ok(const uint8_t *f, size_t len)
{
	struct castfs_diag d;
	struct castfs_header *h;
	int rc = parse(f, len, &h, &d);

	ck_assert_msg(rc == 0, "rc %d: %s", rc, d.msg);
	ck_assert_ptr_nonnull(h);
	return h;
}

static struct castfs_header *parse_json_ok(const char *json, size_t data_len)
{
	size_t len;
	uint8_t *f = tu_raw_str(json, data_len, &len);
	struct castfs_header *h = parse_ok(f, len);

	free(f);
	return h;
}

static struct castfs_header *build_ok(struct tu_st *b)
{
	size_t len;
	uint8_t *f = tu_st_build(b, &len);
	struct castfs_header *h = parse_ok(f, len);

	free(f);
	return h;
}

static const struct castfs_tensor *find(const struct castfs_header *h,
					const char *name)
{
	const struct castfs_tensor *t =
		castfs_header_find(h, name, strlen(name));

	ck_assert_msg(t != NULL, "tensor '%s' not found", name);
	return t;
}

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

#define DEFINE_BAD(name, json, data, rc, phrase)                      \
	START_TEST(test_st_header__##name)                            \
	{                                                             \
		expect_bad(json, sizeof(json) - 1, data, rc, phrase); \
	}                                                             \
	END_TEST
BAD_CASES(DEFINE_BAD)

START_TEST(test_st_header__empty_file)
{
	expect_bad_file((const uint8_t *)"", 0, -EINVAL,
			"file of 0 bytes is shorter than the 8-byte");
}
END_TEST

START_TEST(test_st_header__seven_bytes)
{
	expect_bad_file((const uint8_t *)"\x02\0\0\0\0\0\0", 7, -EINVAL,
			"file of 7 bytes is shorter");
}
END_TEST

START_TEST(test_st_header__header_len_past_end)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 3, 0, &len);

	expect_bad_file(f, len, -EINVAL,
			"header length 3 past end of file (size 10)");
	free(f);
}
END_TEST

/* 8 + N must not wrap: N near 2^64 is E2BIG before any addition. */
START_TEST(test_st_header__header_len_huge)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, UINT64_MAX - 4, 0, &len);

	expect_bad_file(f, len, -E2BIG, "exceeds the 100000000-byte limit");
	free(f);
}
END_TEST

START_TEST(test_st_header__header_at_limit_is_not_e2big)
{
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 100000000, 0, &len);

	expect_bad_file(f, len, -EINVAL, "header length 100000000 past end");
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
	struct big_reader br = { .r = { big_pread, &br } };
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	size_t len;
	uint8_t *f = tu_raw("{}", 2, 100000001, 0, &len);

	expect_bad_file(f, len, -E2BIG,
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
	expect_bad(js, n, 0, -EINVAL,
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
	h = build_ok(b);
	ck_assert_uint_eq(h->ntensors, 1);
	castfs_header_free(h);
	memmove(extra + n + 1, extra + n, 251); /* one level more */
	strcat(extra, "]");
	tu_st_extra(b, 0, extra);
	{
		size_t len;
		uint8_t *f = tu_st_build(b, &len);

		expect_bad_file(f, len, -EINVAL, "nested deeper than 127");
		free(f);
	}
	tu_st_free(b);
}
END_TEST

/* ---- valid headers ---- */

/* FORMATS.md 1.4, as the reference writer lays it out (examples.py). */
static const char worked_json[] =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
	"\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]},"
	"\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[20,26]},"
	"\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,3],\"data_offsets\":[26,32]}}"
	"     ";
static const uint8_t worked_prefix[8] = { 0x08, 0x01, 0, 0, 0, 0, 0, 0 };

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
	h = parse_ok(f, len);
	ck_assert_uint_eq(h->header_len, 264);
	ck_assert_uint_eq(h->data_start, 272);
	ck_assert_uint_eq(h->data_len, 32);
	ck_assert_uint_eq(h->ntensors, 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_str_eq(h->tensors[i].name, order[i]);
		ck_assert_uint_eq(h->tensors[i].begin, offs[i]);
		ck_assert_uint_eq(h->tensors[i].end, offs[i + 1]);
	}
	ck_assert_int_eq(find(h, "w")->dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_uint_eq(find(h, "w")->nelems, 6);
	ck_assert_uint_eq(find(h, "a")->shape[1], 2);
	ck_assert_uint_eq(find(h, "s")->ndim, 0);
	ck_assert_uint_eq(find(h, "s")->nelems, 1);
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
		parse_json_ok("{" TJ("s", "F64", "", "0,8") "}", 8);

	ck_assert_uint_eq(h->tensors[0].ndim, 0);
	ck_assert_uint_eq(h->tensors[0].nelems, 1);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__empty_tensors)
{
	struct castfs_header *h = parse_json_ok(
		"{" TJ("e1", "F32", "0", "0,0") "," TJ(
			"e2", "BF16", "3,0,7",
			"0,0") "," TJ("x", "U8", "2",
				      "0,2") "," TJ("e3", "U8", "0", "2,2") "}",
		2);

	ck_assert_uint_eq(h->ntensors, 4);
	ck_assert_str_eq(h->tensors[0].name, "e1"); /* ties break by name */
	ck_assert_str_eq(h->tensors[1].name, "e2");
	ck_assert_str_eq(h->tensors[2].name, "x");
	ck_assert_uint_eq(find(h, "e2")->nelems, 0);
	ck_assert_uint_eq(h->data_len, 2);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__no_tensors)
{
	struct castfs_header *h = parse_json_ok("{}", 0);

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
	h = build_ok(b);
	t = find(h, "t");
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
		parse_json_ok("{" TJ("w", "F4", "3,2", "0,3") "}", 3);

	ck_assert_uint_eq(h->tensors[0].nelems, 6);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__f6_whole_bytes)
{
	struct castfs_header *h =
		parse_json_ok("{" TJ("w", "F6_E2M3", "4", "0,3") "}", 3);

	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_absent)
{
	struct castfs_header *h =
		parse_json_ok("{" TJ("w", "U8", "", "0,1") "}", 1);

	ck_assert(!h->has_metadata);
	ck_assert_uint_eq(h->nmeta, 0);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_null)
{
	struct castfs_header *h = parse_json_ok("{\"__metadata__\":null}", 0);

	ck_assert(!h->has_metadata);
	ck_assert_uint_eq(h->ntensors, 0);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_header__metadata_empty_object)
{
	struct castfs_header *h = parse_json_ok("{\"__metadata__\":{}}", 0);

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
	h = build_ok(b);
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

static void check_sorted(const struct castfs_header *h)
{
	for (size_t i = 1; i < h->ntensors; i++) {
		const struct castfs_tensor *a = h->by_name[i - 1],
					   *b = h->by_name[i];
		size_t m = a->name_len < b->name_len ? a->name_len :
						       b->name_len;
		int r = memcmp(a->name, b->name, m);

		ck_assert(h->tensors[i - 1].end == h->tensors[i].begin);
		ck_assert(r < 0 || (r == 0 && a->name_len < b->name_len));
	}
}

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
		h = build_ok(b);
		ck_assert_uint_eq(h->ntensors, 40);
		check_sorted(h);
		ck_assert_uint_eq(find(h, "layer.0.w")->begin, 0);
		ck_assert_int_eq(find(h, "layer.39.w")->dtype,
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
		h = build_ok(b);
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
	h = build_ok(b);
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
	h = build_ok(b);
	t = castfs_header_find(h, "a\0b", 3);
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->name_len, 3);
	ck_assert_mem_eq(t->name, "a\0b", 4);
	ck_assert_uint_eq(t->nelems, 1);
	ck_assert_uint_eq(castfs_header_find(h, "a", 1)->nelems, 2);
	ck_assert_uint_eq(castfs_header_find(h, "a\0", 2)->nelems, 3);
	ck_assert_ptr_null(castfs_header_find(h, "a\0c", 3));
	check_sorted(h);
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
	h = build_ok(b);
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
	struct castfs_header *h = parse_json_ok(
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
	struct castfs_header *h = parse_json_ok(
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
		expect_bad_file(f, len, -EINVAL, "number 3.5e0 at header byte");
		free(f);
	}
	tu_st_extra(b, 0,
		    "\"x\":{\"dtype\":\"zz\",\"k\":[\"s\",{\"t\":\"u\"}]},"
		    "\"x\":null,\"y\":[1,2,true]");
	h = build_ok(b);
	ck_assert_int_eq(find(h, "a")->dtype, CASTFS_DTYPE_F16);
	ck_assert_int_eq(find(h, "b")->dtype, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(find(h, "c")->nelems, 1);
	castfs_header_free(h);
	tu_st_free(b);
}
END_TEST

START_TEST(test_st_header__raw_utf8_names)
{
	struct castfs_header *h = parse_json_ok(
		"{" TJ("\xe6\x9d\x83\xe9\x87\x8d", "U8", "",
		       "0,1") "," TJ("\xf0\x9f\x98\x80", "U8", "", "1,2") "}",
		2);

	ck_assert_uint_eq(find(h, "\xe6\x9d\x83\xe9\x87\x8d")->begin, 0);
	ck_assert_uint_eq(find(h, "\xf0\x9f\x98\x80")->begin, 1);
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
	h = build_ok(b);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		ck_assert_ptr_eq(castfs_header_find(h, t->name, t->name_len),
				 t);
		ck_assert_ptr_null(
			castfs_header_find(h, t->name, t->name_len + 1));
	}
	ck_assert_ptr_null(castfs_header_find(h, "", 0));
	ck_assert_ptr_null(castfs_header_find(NULL, "a", 1));
	check_sorted(h);
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
	ck_assert_uint_eq(find(h, "w")->end, 12);
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
	expect_bad_file(f, len, rc, phrase);
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

/* ---- emit ---- */

static uint8_t *emit_ok(struct castfs_emit_tensor *t, size_t n, bool has_meta,
			const struct castfs_meta_kv *m, size_t nm, size_t *len)
{
	struct castfs_diag d = { { 0 } };
	uint8_t *out = NULL;
	int rc = castfs_header_emit(t, n, has_meta, m, nm, &out, len, &d);

	ck_assert_msg(rc == 0, "emit: rc %d: %s", rc, d.msg);
	ck_assert_uint_eq(*len % 8, 0);
	ck_assert_uint_eq(castfs_load_le64(out), *len - 8);
	return out;
}

static void emit_bad(struct castfs_emit_tensor *t, size_t n,
		     const struct castfs_meta_kv *m, size_t nm, int rc,
		     const char *phrase)
{
	struct castfs_diag d = { { 0 } };
	uint8_t *out = NULL;
	size_t len = 12345;
	int got = castfs_header_emit(t, n, m != NULL, m, nm, &out, &len, &d);

	ck_assert_msg(got == rc, "emit: rc %d (%s), want %d", got, d.msg, rc);
	ck_assert_ptr_null(out);
	ck_assert_uint_eq(len, 12345);
	ck_assert_msg(strstr(d.msg, phrase), "diag '%s' lacks '%s'", d.msg,
		      phrase);
}

#define ET(nm, dt, nb, ...)                                                   \
	{                                                                     \
		.name = nm, .name_len = sizeof(nm) - 1,                       \
		.dtype = CASTFS_DTYPE_##dt,                                   \
		.ndim = (uint32_t)(sizeof((uint64_t[]){ __VA_ARGS__ }) / 8) - \
			1,                                                    \
		.shape = (uint64_t[]){ __VA_ARGS__ } + 1, .nbytes = nb        \
	}

START_TEST(test_st_header__emit_worked_example)
{
	struct castfs_emit_tensor t[] = {
		ET("b", BF16, 6, 0, 3),
		ET("a", F32, 16, 0, 2, 2),
		ET("w", F8_E4M3, 6, 0, 2, 3),
		ET("s", F32, 4, 0),
	};
	static const uint32_t cookies[] = { 1, 3, 0, 2 };
	static const uint64_t offs[] = { 0, 16, 20, 26, 32 };
	struct castfs_meta_kv m = { "format", "pt", 6, 2 };
	size_t len;
	uint8_t *out;

	for (uint32_t i = 0; i < 4; i++)
		t[i].cookie = i;
	out = emit_ok(t, 4, true, &m, 1, &len);
	ck_assert_uint_eq(len, 272);
	ck_assert_mem_eq(out, worked_prefix, 8);
	ck_assert_mem_eq(out + 8, worked_json, 264);
	for (int i = 0; i < 4; i++) {
		ck_assert_uint_eq(t[i].cookie, cookies[i]);
		ck_assert_uint_eq(t[i].begin, offs[i]);
		ck_assert_uint_eq(t[i].end, offs[i + 1]);
	}
	free(out);
}
END_TEST

START_TEST(test_st_header__emit_escapes)
{
	static const char name[] = "q\"\\/\b\f\n\r\t\x01\x0b\x1f\x7f\xc3\xa9 "
				   "\xf0\x9f\x98\x80\0z";
	static const char want[] =
		"{\"__metadata__\":{\"k\\n\":\"v\\u0000\\\"\"},"
		"\"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u000b\\u001f\x7f\xc3\xa9 "
		"\xf0\x9f\x98\x80\\u0000z\":{\"dtype\":\"I16\",\"shape\":[0,5],"
		"\"data_offsets\":[0,0]}}";
	struct castfs_emit_tensor t = {
		.name = name,
		.name_len = sizeof(name) - 1,
		.dtype = CASTFS_DTYPE_I16,
		.ndim = 2,
		.shape = (uint64_t[]){ 0, 5 },
	};
	struct castfs_meta_kv m = { "k\n", "v\0\"", 2, 3 };
	size_t len, jl = sizeof(want) - 1;
	uint8_t *out = emit_ok(&t, 1, true, &m, 1, &len);

	ck_assert_uint_eq(len, 8 + (jl + 7) / 8 * 8);
	ck_assert_mem_eq(out + 8, want, jl);
	for (size_t i = 8 + jl; i < len; i++)
		ck_assert_uint_eq(out[i], ' ');
	free(out);
}
END_TEST

START_TEST(test_st_header__emit_empty)
{
	size_t len;
	uint8_t *out = emit_ok(NULL, 0, false, NULL, 0, &len);

	ck_assert_uint_eq(len, 16);
	ck_assert_mem_eq(out, "\x08\0\0\0\0\0\0\0{}      ", 16);
	free(out);
	out = emit_ok(NULL, 0, true, NULL, 0, &len);
	ck_assert_uint_eq(len, 32);
	ck_assert_mem_eq(out + 8, "{\"__metadata__\":{}}     ", 24);
	free(out);
}
END_TEST

/* FORMATS.md 1.4: U64 first ... BOOL last. */
START_TEST(test_st_header__emit_dtype_order)
{
	static const char *const want[] = {
		"U64",	   "I64",	  "F64",	 "C64",	    "F32",
		"U32",	   "I32",	  "BF16",	 "F16",	    "U16",
		"I16",	   "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3",
		"F8_E5M2", "I8",	  "U8",		 "F6_E3M2", "F6_E2M3",
		"F4",	   "BOOL",
	};
	struct castfs_emit_tensor t[CASTFS_DTYPE_COUNT];
	uint64_t shape[1] = { 8 };
	size_t len;
	uint8_t *out;

	ck_assert_uint_eq(CASTFS_DTYPE_COUNT, 22);
	for (int i = 0; i < CASTFS_DTYPE_COUNT; i++) {
		const char *n = castfs_dtype_name((enum castfs_dtype)i);

		t[i] = (struct castfs_emit_tensor){
			.name = n,
			.name_len = strlen(n),
			.dtype = (enum castfs_dtype)i,
			.ndim = 1,
			.shape = shape,
			.nbytes = castfs_dtype_bits((enum castfs_dtype)i),
		};
	}
	out = emit_ok(t, CASTFS_DTYPE_COUNT, false, NULL, 0, &len);
	for (int i = 0; i < CASTFS_DTYPE_COUNT; i++) {
		unsigned unit = castfs_dtype_bits(t[i].dtype) / 8;

		ck_assert_str_eq(t[i].name, want[i]);
		if (unit)
			ck_assert_uint_eq(t[i].begin % unit, 0);
		if (i)
			ck_assert_uint_eq(t[i].begin, t[i - 1].end);
	}
	free(out);
}
END_TEST

START_TEST(test_st_header__emit_name_order_bytewise)
{
	struct castfs_emit_tensor t[] = {
		ET("b", U8, 1, 0, 1),	     ET("a", U8, 1, 0, 1),
		ET("aa", U8, 1, 0, 1),	     ET("B", U8, 1, 0, 1),
		ET("\xc3\xa9", U8, 1, 0, 1), ET("a\0", U8, 1, 0, 1),
		ET("~", U8, 1, 0, 1),
	};
	static const char *const want[] = { "B", "a", "a",	 "aa",
					    "b", "~", "\xc3\xa9" };
	size_t len;
	uint8_t *out = emit_ok(t, 7, false, NULL, 0, &len);

	for (int i = 0; i < 7; i++)
		ck_assert_str_eq(t[i].name, want[i]);
	ck_assert_uint_eq(t[1].name_len, 1);
	ck_assert_uint_eq(t[2].name_len, 2);
	free(out);
}
END_TEST

/* A random name of valid UTF-8, escapes and controls included. */
static size_t rand_name(uint64_t *s, char *out, size_t i, bool controls)
{
	static const char *const frag[] = {
		"a",	"layer",    ".",
		"\"",	"\\",	    "/",
		" ",	"\xc3\xa9", "\xf0\x9f\x98\x80",
		"\x7f", "_",	    "9",
		"\n",	"\x01",	    "\0",
		"\t"
	};
	size_t n = 0, nf = controls ? 16 : 12;

	for (uint64_t k = tu_rand(s) % 6; k > 0; k--) {
		const char *f = frag[tu_rand(s) % nf];
		size_t fl = *f ? strlen(f) : 1;

		memcpy(out + n, f, fl);
		n += fl;
	}
	return n + (size_t)sprintf(out + n, "#%zu", i);
}

struct rand_set {
	struct castfs_emit_tensor t[24];
	uint64_t shape[24][5];
	char name[24][64];
	size_t n;
};

static void rand_set(struct rand_set *r, uint64_t *s, bool controls)
{
	r->n = tu_rand(s) % 24;
	for (size_t i = 0; i < r->n; i++) {
		struct castfs_emit_tensor *t = &r->t[i];
		uint64_t nel = 1;

		t->name = r->name[i];
		t->name_len = rand_name(s, r->name[i], i, controls);
		t->dtype = (enum castfs_dtype)(tu_rand(s) % CASTFS_DTYPE_COUNT);
		t->ndim = (uint32_t)(tu_rand(s) % 4);
		t->shape = r->shape[i];
		for (uint32_t k = 0; k < t->ndim; k++)
			nel *= (r->shape[i][k] = tu_rand(s) % 6);
		if (castfs_dtype_bits(t->dtype) < 8) /* whole bytes */
			nel *= (r->shape[i][t->ndim++] = 4);
		t->nbytes = nel * castfs_dtype_bits(t->dtype) / 8;
		t->cookie = (uint32_t)i;
	}
}

static void check_roundtrip(struct rand_set *r, bool has_meta,
			    const struct castfs_meta_kv *m, size_t nm)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	uint64_t data = 0;
	size_t len;
	uint8_t *out = emit_ok(r->t, r->n, has_meta, m, nm, &len);

	for (size_t i = 0; i < r->n; i++)
		data += r->t[i].nbytes;
	ck_assert_int_eq(castfs_header_parse(out, len, len + data, &h, &d), 0);
	ck_assert_uint_eq(h->ntensors, r->n);
	ck_assert_uint_eq(h->has_metadata, has_meta);
	ck_assert_uint_eq(h->nmeta, has_meta ? nm : 0);
	for (size_t i = 0; i < r->n; i++) {
		const struct castfs_emit_tensor *e = &r->t[i];
		const struct castfs_tensor *t =
			castfs_header_find(h, e->name, e->name_len);

		ck_assert_ptr_nonnull(t);
		ck_assert_int_eq(t->dtype, e->dtype);
		ck_assert_uint_eq(t->ndim, e->ndim);
		for (uint32_t k = 0; k < e->ndim; k++)
			ck_assert_uint_eq(t->shape[k], e->shape[k]);
		ck_assert_uint_eq(t->begin, e->begin);
		ck_assert_uint_eq(t->end, e->end);
	}
	for (size_t i = 0; has_meta && i < nm; i++) {
		ck_assert_uint_eq(h->meta[i].key_len, m[i].key_len);
		ck_assert_mem_eq(h->meta[i].value, m[i].value, m[i].value_len);
	}
	castfs_header_free(h);
	free(out);
}

START_TEST(test_st_header__emit_roundtrip)
{
	struct rand_set r;
	struct castfs_meta_kv m[] = { { "format", "pt", 6, 2 },
				      { "k\0\"", "\x01v\xc3\xa9", 3, 4 } };
	uint64_t s = 5;

	do
		rand_set(&r, &s, true);
	while (r.n < 5);
	check_roundtrip(&r, true, m, 2);
	check_roundtrip(&r, false, m, 2);
}
END_TEST

START_TEST(test_st_header__emit_random_roundtrip)
{
	uint64_t s = 0x5eed;

	for (int it = 0; it < 400; it++) {
		struct rand_set r;
		struct castfs_meta_kv m = { "format", "pt", 6, 2 };

		rand_set(&r, &s, true);
		check_roundtrip(&r, it % 3 != 0, &m, (size_t)(it % 2));
	}
}
END_TEST

/* The builder writes its own JSON; without controls (which it escapes as
 * \u00XX uppercase) it must agree with the emitter byte for byte. */
START_TEST(test_st_header__emit_matches_builder)
{
	uint64_t s = 99;

	for (int it = 0; it < 100; it++) {
		struct rand_set r;
		struct tu_st *b = tu_st_new();
		size_t len, blen;
		uint8_t *out, *bf;
		struct castfs_meta_kv m = { "format", "pt", 6, 2 };

		rand_set(&r, &s, false);
		for (size_t i = 0; i < r.n; i++)
			tu_st_add_n(b, r.t[i].name, r.t[i].name_len,
				    castfs_dtype_name(r.t[i].dtype),
				    r.t[i].ndim, r.t[i].shape, NULL,
				    TU_NBYTES_AUTO);
		tu_st_meta(b, "format", "pt");
		out = emit_ok(r.t, r.n, true, &m, 1, &len);
		bf = tu_st_build(b, &blen);
		ck_assert_uint_ge(blen, len);
		ck_assert_mem_eq(out, bf, len);
		free(bf);
		free(out);
		tu_st_free(b);
	}
}
END_TEST

START_TEST(test_st_header__emit_rejects_duplicates)
{
	struct castfs_emit_tensor t[] = { ET("w", U8, 1, 0, 1),
					  ET("v", F32, 4, 0, 1),
					  ET("w", F32, 4, 0, 1) };
	struct castfs_meta_kv m[] = { { "k", "1", 1, 1 }, { "k", "2", 1, 1 } };

	emit_bad(t, 3, NULL, 0, -EINVAL, "duplicate tensor name 'w'");
	emit_bad(t, 2, m, 2, -EINVAL, "duplicate __metadata__ key 'k'");
}
END_TEST

START_TEST(test_st_header__emit_rejects_bad_sizes)
{
	struct castfs_emit_tensor t[] = {
		ET("w", F16, 7, 0, 2, 2),
		ET("f4", F4, 1, 0, 3),
		ET("o", U8, 0, 0, UINT64_C(1) << 40, UINT64_C(1) << 40, 0),
	};
	const uint64_t g = (UINT64_C(1) << 61) - 1; /* 8 * g bits still fit */
	struct castfs_emit_tensor big[9];
	char names[9][2];

	for (int i = 0; i < 9; i++) {
		names[i][0] = (char)('a' + i);
		big[i] = (struct castfs_emit_tensor){ .name = names[i],
						      .name_len = 1,
						      .dtype = CASTFS_DTYPE_U8,
						      .ndim = 1,
						      .shape = &g,
						      .nbytes = g };
	}

	emit_bad(&t[0], 1, NULL, 0, -EINVAL,
		 "tensor 'w': nbytes 7 but 4 elements of F16 need 8");
	emit_bad(&t[1], 1, NULL, 0, -EINVAL, "does not fill whole bytes");
	emit_bad(&t[2], 1, NULL, 0, -EOVERFLOW, "overflows 64 bits");
	emit_bad(big, 9, NULL, 0, -EOVERFLOW, "data size overflows 64 bits");
}
END_TEST

START_TEST(test_st_header__emit_rejects_bad_names)
{
	struct castfs_emit_tensor t[] = {
		ET("\xff", U8, 1, 0, 1),
		ET("__metadata__", U8, 1, 0, 1),
		ET("ok", U8, 1, 0, 1),
	};
	struct castfs_meta_kv m = { "k", "\xc3", 1, 1 };

	emit_bad(&t[0], 1, NULL, 0, -EINVAL, "not valid UTF-8 or is reserved");
	emit_bad(&t[1], 1, NULL, 0, -EINVAL, "'__metadata__' is not valid");
	t[2].dtype = CASTFS_DTYPE_INVALID;
	emit_bad(&t[2], 1, NULL, 0, -EINVAL, "tensor 'ok': invalid dtype 22");
	t[2].dtype = CASTFS_DTYPE_U8;
	emit_bad(&t[2], 1, &m, 1, -EINVAL, "__metadata__ entry 0 is not valid");
}
END_TEST

/* 17 M control bytes escape to 102 MB of JSON. */
START_TEST(test_st_header__emit_e2big)
{
	size_t n = 17000000;
	char *name = malloc(n);
	struct castfs_emit_tensor t = { .name = name,
					.name_len = n,
					.dtype = CASTFS_DTYPE_U8 };

	memset(name, 1, n);
	t.nbytes = 1;
	emit_bad(&t, 1, NULL, 0, -E2BIG, "header would exceed 100000000 bytes");
	free(name);
}
END_TEST

static void st_emit_tests(TCase *tc)
{
	tcase_add_test(tc, test_st_header__emit_worked_example);
	tcase_add_test(tc, test_st_header__emit_escapes);
	tcase_add_test(tc, test_st_header__emit_empty);
	tcase_add_test(tc, test_st_header__emit_dtype_order);
	tcase_add_test(tc, test_st_header__emit_name_order_bytewise);
	tcase_add_test(tc, test_st_header__emit_roundtrip);
	tcase_add_test(tc, test_st_header__emit_random_roundtrip);
	tcase_add_test(tc, test_st_header__emit_matches_builder);
	tcase_add_test(tc, test_st_header__emit_rejects_duplicates);
	tcase_add_test(tc, test_st_header__emit_rejects_bad_sizes);
	tcase_add_test(tc, test_st_header__emit_rejects_bad_names);
	tcase_add_test(tc, test_st_header__emit_e2big);
}

Suite *st_header_suite(void);

Suite *st_header_suite(void)
{
	Suite *s = suite_create("st_header");
	TCase *bad = tcase_create("invalid");
	TCase *ok = tcase_create("valid");
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
	tcase_add_test(ok, test_st_header__worked_example_parses);
	tcase_add_test(ok, test_st_header__rank0_tensor);
	tcase_add_test(ok, test_st_header__empty_tensors);
	tcase_add_test(ok, test_st_header__no_tensors);
	tcase_add_loop_test(ok, test_st_header__every_dtype, 0,
			    CASTFS_DTYPE_COUNT);
	tcase_add_test(ok, test_st_header__f4_even_count);
	tcase_add_test(ok, test_st_header__f6_whole_bytes);
	tcase_add_test(ok, test_st_header__metadata_absent);
	tcase_add_test(ok, test_st_header__metadata_null);
	tcase_add_test(ok, test_st_header__metadata_empty_object);
	tcase_add_test(ok, test_st_header__metadata_present_in_file_order);
	tcase_add_test(ok, test_st_header__unsorted_key_order);
	tcase_add_test(ok, test_st_header__trailing_spaces_accepted);
	tcase_add_test(ok, test_st_header__unpadded_header_accepted);
	tcase_add_test(ok, test_st_header__nul_in_name);
	tcase_add_test(ok, test_st_header__very_long_name);
	tcase_add_test(ok, test_st_header__escapes_decoded);
	tcase_add_test(ok, test_st_header__escaped_keys_recognised);
	tcase_add_test(ok, test_st_header__unknown_fields_ignored);
	tcase_add_test(ok, test_st_header__raw_utf8_names);
	tcase_add_test(ok, test_st_header__max_int_accepted);
	tcase_add_test(ok, test_st_header__find_many);
	tcase_add_test(ok, test_st_header__read_through_reader);
	tcase_add_test(misc, test_st_header__nelems_and_nbytes);
	tcase_add_test(misc, test_st_header__malformed_corpus);
	st_emit_tests(misc);
	suite_add_tcase(s, bad);
	suite_add_tcase(s, ok);
	suite_add_tcase(s, misc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(st_header_suite());
	int failed;

	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
