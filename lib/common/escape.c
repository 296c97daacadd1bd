// SPDX-License-Identifier: MIT
/* Reversible escaping of names into valid UTF-8 without control bytes. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/escape.h"

size_t castfs_utf8_len(const void *s, size_t n)
{
	const uint8_t *p = s;
	uint8_t lo = 0x80, hi = 0xbf;
	size_t len;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		len = 2;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		len = 3;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		len = 4;
	else
		return 0;
	/* The second byte's range excludes overlongs and surrogates. */
	if (p[0] == 0xe0)
		lo = 0xa0;
	else if (p[0] == 0xed)
		hi = 0x9f;
	else if (p[0] == 0xf0)
		lo = 0x90;
	else if (p[0] == 0xf4)
		hi = 0x8f;
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++) {
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	}
	return len;
}

size_t castfs_json_skip_ws(const void *s, size_t n, size_t i)
{
	const uint8_t *u = s;

	while (i < n &&
	       (u[i] == ' ' || u[i] == '\t' || u[i] == '\n' || u[i] == '\r'))
		i++;
	return i;
}

size_t castfs_json_values(const void *s, size_t n, size_t stop)
{
	const uint8_t *u = s;
	size_t values = 1;
	bool str = false;

	for (size_t i = 0; i < n && values <= stop; i++) {
		if (str && u[i] == '\\')
			i++; /* the escaped byte cannot end the string */
		else if (u[i] == '"')
			str = !str;
		else if (!str && (u[i] == '[' || u[i] == '{' || u[i] == ','))
			values++;
	}
	return values;
}

size_t castfs_utf8_bad(const void *s, size_t n)
{
	const uint8_t *p = s;
	size_t i = 0, k;

	while (i < n && (k = castfs_utf8_len(p + i, n - i)) != 0)
		i += k;
	return i;
}

/* Whether the sequence of @len bytes at @p is written as escapes (the
 * backslash too unless @text). */
static bool escaped(const uint8_t *p, size_t len, bool text)
{
	if (len == 0)
		return true; /* not UTF-8 */
	if (len == 1)
		return p[0] < 0x20 || p[0] == 0x7f || (p[0] == '\\' && !text);
	return len == 2 && p[0] == 0xc2 && p[1] <= 0x9f; /* C1 controls */
}

size_t castfs_escape_next(const char *s, size_t n, bool *esc)
{
	size_t len = castfs_utf8_len(s, n);

	*esc = escaped((const uint8_t *)s, len, false);
	return len ? len : 1;
}

static size_t escape_into(char *dst, size_t cap, const char *s, size_t n,
			  bool text)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *p = (const uint8_t *)s;
	size_t o = 0, i = 0;

	while (i < n) {
		size_t len = castfs_utf8_len(p + i, n - i);
		size_t take = len ? len : 1;

		if (escaped(p + i, len, text)) {
			if (o + 4 * take >= cap)
				break;
			for (size_t k = 0; k < take; k++) {
				dst[o++] = '\\';
				dst[o++] = 'x';
				dst[o++] = hex[p[i + k] >> 4];
				dst[o++] = hex[p[i + k] & 15];
			}
		} else {
			if (o + take >= cap)
				break;
			for (size_t k = 0; k < take; k++)
				dst[o++] = (char)p[i + k];
		}
		i += take;
	}
	dst[o] = '\0';
	return o;
}

size_t castfs_escape_buf(char *dst, size_t cap, const char *s, size_t n)
{
	return escape_into(dst, cap, s, n, false);
}

size_t castfs_escape_text_buf(char *dst, size_t cap, const char *s, size_t n)
{
	return escape_into(dst, cap, s, n, true);
}

static char *escape_new(const char *s, size_t n, bool text)
{
	size_t cap = 4 * n + 1;
	char *out = cap > n ? malloc(cap) : NULL;

	if (out)
		escape_into(out, cap, s, n, text);
	return out;
}

char *castfs_escape(const char *s, size_t n)
{
	return escape_new(s, n, false);
}

char *castfs_escape_text(const char *s, size_t n)
{
	return escape_new(s, n, true);
}
