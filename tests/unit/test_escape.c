/* SPDX-License-Identifier: MIT */
/*
 * common/escape: names made valid UTF-8 without control characters,
 * reversibly. Validity is judged by glibc's iconv (UTF-8 to UTF-32, which
 * refuses ill-formed input), not by castfs's own decoder.
 */
#include <check.h>
#include <errno.h>
#include <iconv.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "unit.h"

/* glibc's verdict: @s is well-formed UTF-8. */
static bool iconv_valid(const char *s)
{
	iconv_t cd = iconv_open("UTF-32LE", "UTF-8");
	size_t in = strlen(s), out = 4 * in + 8;
	char *buf = malloc(out), *op = buf, *ip = (char *)(uintptr_t)s;
	size_t rc;

	ck_assert_ptr_ne(cd, (iconv_t)-1);
	rc = iconv(cd, &ip, &in, &op, &out);
	iconv_close(cd);
	free(buf);
	return rc != (size_t)-1 && in == 0;
}

/* The documented way back: each \xHH is the byte HH. */
static size_t unescape(const char *s, char *out)
{
	size_t n = 0;

	while (*s) {
		if (s[0] == '\\' && s[1] == 'x') {
			char hex[3] = { s[2], s[3], 0 };

			out[n++] = (char)strtoul(hex, NULL, 16);
			s += 4;
		} else {
			out[n++] = *s++;
		}
	}
	return n;
}

static bool has_control(const char *s)
{
	const uint8_t *p = (const uint8_t *)s;

	for (size_t i = 0; p[i]; i++) {
		if (p[i] < 0x20 || p[i] == 0x7f)
			return true;
		if (p[i] == 0xc2 && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f)
			return true; /* C1 */
	}
	return false;
}

static void check_one(const char *raw, size_t n, const char *want)
{
	char *e = castfs_escape(raw, n), back[4096];

	ck_assert_ptr_nonnull(e);
	if (want)
		ck_assert_str_eq(e, want);
	ck_assert_msg(iconv_valid(e), "not UTF-8: %s", e);
	ck_assert(!has_control(e));
	ck_assert_uint_eq(unescape(e, back), n);
	ck_assert(memcmp(back, raw, n) == 0);
	free(e);
}

START_TEST(test_escape__known_names)
{
	/* The oracle itself refuses what castfs must escape. */
	ck_assert(!iconv_valid("bad\xff"));
	ck_assert(!iconv_valid("\xed\xa0\x80"));
	ck_assert(!iconv_valid("\xc0\xaf"));
	ck_assert(iconv_valid("caf\xc3\xa9"));
	check_one("plain.safetensors", 17, "plain.safetensors");
	check_one("caf\xc3\xa9/\xe6\x97\xa5.safetensors", 20, NULL);
	check_one("a\nb", 3, "a\\x0ab");
	check_one("\x1b[31mred", 8, "\\x1b[31mred");
	check_one("bad\xff.st", 7, "bad\\xff.st");
	check_one("back\\slash", 10, "back\\x5cslash");
	check_one("csi\xc2\x9b", 5, "csi\\xc2\\x9b");
	check_one("\xed\xa0\x80", 3, "\\xed\\xa0\\x80"); /* a surrogate */
	check_one("\xc0\xaf", 2, "\\xc0\\xaf"); /* an overlong '/' */
	check_one("\xf4\x90\x80\x80", 4,
		  "\\xf4\\x90\\x80\\x80"); /* > U+10FFFF */
	check_one("cut\xe6\x97", 5, "cut\\xe6\\x97");
	check_one("\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80");
}
END_TEST

START_TEST(test_escape__random_bytes_round_trip)
{
	char raw[64];

	srand(42);
	for (int round = 0; round < 20000; round++) {
		size_t n = (size_t)(rand() % 64);

		for (size_t i = 0; i < n; i++)
			raw[i] = (char)(rand() & 0xff);
		check_one(raw, n, NULL);
	}
}
END_TEST

START_TEST(test_escape__cut_at_a_whole_escape)
{
	char buf[8];

	/* "ab" then \xff needs 4 more bytes: 2 + 4 + NUL > 6. */
	ck_assert_uint_eq(castfs_escape_buf(buf, 6, "ab\xff", 3), 2);
	ck_assert_str_eq(buf, "ab");
	ck_assert_uint_eq(castfs_escape_buf(buf, 7, "ab\xff", 3), 6);
	ck_assert_str_eq(buf, "ab\\xff");
	ck_assert_uint_eq(castfs_escape_buf(buf, 1, "ab", 2), 0);
	ck_assert_str_eq(buf, "");
}
END_TEST

/* What castfs_escape_next() says of each character, rebuilt into text,
 * is what castfs_escape_buf() writes: the CLI's printers quote the same
 * characters. */
START_TEST(test_escape__next_agrees_with_escape_buf)
{
	static const char hex[] = "0123456789abcdef";
	char raw[64], want[257], got[257];

	srand(7);
	for (int round = 0; round < 20000; round++) {
		size_t n = (size_t)(rand() % 64), o = 0;

		for (size_t i = 0; i < n; i++)
			raw[i] = (char)(round % 2 ? rand() & 0xff :
						    0x80 + rand() % 64);
		for (size_t i = 0; i < n;) {
			bool esc;
			size_t len = castfs_escape_next(raw + i, n - i, &esc);

			for (size_t k = 0; k < len; k++, i++) {
				unsigned char c = (unsigned char)raw[i];

				if (!esc) {
					got[o++] = (char)c;
					continue;
				}
				got[o++] = '\\';
				got[o++] = 'x';
				got[o++] = hex[c >> 4];
				got[o++] = hex[c & 15];
			}
		}
		got[o] = '\0';
		castfs_escape_buf(want, sizeof(want), raw, n);
		ck_assert_str_eq(got, want);
	}
}
END_TEST

/* Messages: raw controls escaped, the escapes already there (and any
 * backslash) kept, so a second pass changes nothing. */
START_TEST(test_escape__text_escapes_once)
{
	char once[512], twice[512], raw[64];

	castfs_escape_text_buf(once, sizeof(once), "'a\\x5cb' \x1b\xc2\x9b\xff",
			       13);
	ck_assert_str_eq(once, "'a\\x5cb' \\x1b\\xc2\\x9b\\xff");
	srand(11);
	for (int round = 0; round < 20000; round++) {
		size_t n = (size_t)(rand() % 64);

		for (size_t i = 0; i < n; i++)
			raw[i] = (char)(rand() & 0xff);
		castfs_escape_text_buf(once, sizeof(once), raw, n);
		castfs_escape_text_buf(twice, sizeof(twice), once,
				       strlen(once));
		ck_assert_str_eq(once, twice);
		ck_assert_uint_eq(castfs_utf8_bad(once, strlen(once)),
				  strlen(once));
	}
}
END_TEST

/* The bound on a parser's values: exact for non-empty containers, blind
 * to brackets and commas in strings (escaped quotes too), and cut short
 * past the caller's cap. */
START_TEST(test_escape__json_values_bound)
{
	static const struct {
		const char *js;
		size_t values;
	} cases[] = {
		{ "0", 1 },
		{ "[0,0,0]", 4 },
		{ "{\"a\": 1, \"b\": [2, 3]}", 5 },
		{ "[\"a,b[\", \"c\\\"{,\", \"\\\\\"]", 4 },
		{ "[]", 2 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_uint_eq(castfs_json_values(cases[i].js,
						     strlen(cases[i].js), 100),
				  cases[i].values);
	ck_assert_uint_eq(castfs_json_values("[0,0,0,0,0,0]", 13, 2), 3);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("escape");
	TCase *tc = tcase_create("escape");

	tcase_add_test(tc, test_escape__known_names);
	tcase_add_test(tc, test_escape__random_bytes_round_trip);
	tcase_add_test(tc, test_escape__cut_at_a_whole_escape);
	tcase_add_test(tc, test_escape__next_agrees_with_escape_buf);
	tcase_add_test(tc, test_escape__text_escapes_once);
	tcase_add_test(tc, test_escape__json_values_bound);
	suite_add_tcase(s, tc);
	return s;
}
