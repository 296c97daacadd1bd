/* SPDX-License-Identifier: MIT */
/*
 * The safetensors header lexer: what cJSON is too lenient about (UTF-8,
 * raw control bytes, non-integral or huge numbers, nesting), and the
 * byte, name and message helpers shared by the parser and the emitter.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "format/st_internal.h"
/* ---- bytes, names and messages ---- */

/* Rust's str ordering: bytewise, a proper prefix first. */
int st_cmp_bytes(const char *a, size_t an, const char *b, size_t bn)
{
	size_t m = an < bn ? an : bn;
	int r = m ? memcmp(a, b, m) : 0;

	if (r)
		return r;
	return (an > bn) - (an < bn);
}

static int st_span_cmp(const void *a, const void *b)
{
	const struct st_span *x = a, *y = b;

	return st_cmp_bytes(x->p, x->n, y->p, y->n);
}

/* Sort @v; return the index of an entry equal to its predecessor, or @n. */
size_t st_first_dup(struct st_span *v, size_t n)
{
	if (n < 2)
		return n;
	qsort(v, n, sizeof(*v), st_span_cmp);
	for (size_t i = 1; i < n; i++)
		if (!st_span_cmp(&v[i - 1], &v[i]))
			return i;
	return n;
}

/*
 * Quote @n bytes of @s for a message: printable ASCII as is, the rest as
 * \xNN, cut with "..." after ~44 bytes. Reads at most 44 bytes of @s.
 */
const char *st_show(char out[ST_SHOW], const char *s, size_t n)
{
	size_t i, o = 0;

	for (i = 0; i < n && o < 44; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
			out[o++] = (char)c;
		else
			o += (size_t)snprintf(out + o, ST_SHOW - o, "\\x%02x",
					      c);
	}
	if (i < n)
		memcpy(out + o, "...", 3), o += 3;
	out[o] = '\0';
	return out;
}

static size_t st_utf8_put(uint8_t out[4], uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xc0 | cp >> 6);
		out[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xe0 | cp >> 12);
		out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (uint8_t)(0xf0 | cp >> 18);
	out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

static bool st_hex4(const uint8_t *p, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < 4; i++) {
		uint8_t c = p[i];
		uint32_t x;

		if (c >= '0' && c <= '9')
			x = (uint32_t)(c - '0');
		else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
			x = (uint32_t)((c | 0x20) - 'a' + 10);
		else
			return false;
		*v = *v << 4 | x;
	}
	return true;
}

/*
 * The escape at @p (p[0] == '\\', @avail bytes readable): its code point
 * into *@cp and its length (2, 6, or 12 for a surrogate pair); 0 if it is
 * invalid, lone surrogates included (serde_json rejects them).
 */
static size_t st_escape(const uint8_t *p, size_t avail, uint32_t *cp)
{
	static const char simple[] = "\"\\/bfnrt";
	static const uint8_t value[] = { '"', '\\', '/', 8, 12, 10, 13, 9 };
	const char *q;
	uint32_t hi, lo;

	if (avail < 2)
		return 0;
	if (p[1] != 'u') {
		q = p[1] ? strchr(simple, p[1]) : NULL;
		if (!q)
			return 0;
		*cp = value[q - simple];
		return 2;
	}
	if (avail < 6 || !st_hex4(p + 2, &hi) || (hi >= 0xdc00 && hi <= 0xdfff))
		return 0;
	if (hi < 0xd800 || hi > 0xdbff) {
		*cp = hi;
		return 6;
	}
	if (avail < 12 || p[6] != '\\' || p[7] != 'u' || !st_hex4(p + 8, &lo) ||
	    lo < 0xdc00 || lo > 0xdfff)
		return 0;
	*cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
	return 12;
}

/* Decode a lexed string body into @out (at most @cap bytes written);
 * returns the full decoded length. */
size_t st_decode(const uint8_t *raw, size_t n, char *out, size_t cap)
{
	size_t i = 0, o = 0;

	while (i < n) {
		uint8_t tmp[4];
		const uint8_t *src = raw + i;
		size_t len = 1, adv = 1;

		if (raw[i] == '\\') {
			uint32_t cp = 0;

			adv = st_escape(raw + i, n - i, &cp);
			assert(adv);
			len = st_utf8_put(tmp, cp);
			src = tmp;
		}
		for (size_t j = 0; j < len && o + j < cap; j++)
			out[o + j] = (char)src[j];
		o += len;
		i += adv;
	}
	return o;
}

/* ---- lexer pre-pass: what cJSON is too lenient about ---- */

static int st_lex_push(struct st_lex *lx, size_t off, size_t len, size_t dec)
{
	if (lx->nstr == lx->cap) {
		size_t cap = lx->cap ? 2 * lx->cap : 64;
		struct st_str *s = realloc(lx->str, cap * sizeof(*s));

		if (!s)
			return -ENOMEM;
		lx->str = s;
		lx->cap = cap;
	}
	/* N <= 100 MB, so every offset and length fits 32 bits. */
	lx->str[lx->nstr++] =
		(struct st_str){ (uint32_t)off, (uint32_t)len, (uint32_t)dec };
	return 0;
}

static int st_lex_string(struct st_lex *lx, size_t *pos)
{
	size_t start = *pos + 1, i = start, dec = 0;

	for (;;) {
		uint8_t tmp[4], c;
		uint32_t cp = 0;
		size_t adv;

		if (i >= lx->len)
			return castfs_diag_set(
				lx->d, -EINVAL,
				"unterminated string starting at header byte %zu",
				*pos);
		c = lx->js[i];
		if (c == '"')
			break;
		if (c < 0x20)
			return castfs_diag_set(
				lx->d, -EINVAL,
				"raw control byte 0x%02x in a string at header byte %zu",
				c, i);
		if (c != '\\') {
			i++, dec++;
			continue;
		}
		adv = st_escape(lx->js + i, lx->len - i, &cp);
		if (!adv)
			return castfs_diag_set(
				lx->d, -EINVAL,
				"invalid escape in a string at header byte %zu",
				i);
		dec += st_utf8_put(tmp, cp);
		i += adv;
	}
	*pos = i + 1;
	return st_lex_push(lx, start, i - start, dec);
}

static bool st_is_numch(uint8_t c)
{
	return (c >= '0' && c <= '9') ||
	       ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '+' ||
	       c == '-' || c == '.';
}

/* A number token must be 0|[1-9][0-9]* and at most 2^53: serde rejects
 * floats for usize, and cJSON would round larger integers through double. */
static int st_lex_number(struct st_lex *lx, size_t *pos)
{
	const char *tok = (const char *)lx->js + *pos;
	size_t b = *pos, e = b, n;
	int show;
	uint64_t v = 0;

	while (e < lx->len && st_is_numch(lx->js[e]))
		e++;
	n = e - b;
	show = (int)(n < 24 ? n : 24);
	if (tok[0] == '-')
		return castfs_diag_set(
			lx->d, -EINVAL,
			"negative number %.*s at header byte %zu", show, tok,
			b);
	for (size_t i = 0; i < n; i++) {
		if (tok[i] < '0' || tok[i] > '9')
			return castfs_diag_set(
				lx->d, -EINVAL,
				"number %.*s at header byte %zu is not an integer",
				show, tok, b);
		if (v <= ST_MAX_INT)
			v = v * 10 + (uint64_t)(tok[i] - '0');
	}
	if (n > 1 && tok[0] == '0')
		return castfs_diag_set(
			lx->d, -EINVAL,
			"number %.*s at header byte %zu has a leading zero",
			show, tok, b);
	if (v > ST_MAX_INT)
		return castfs_diag_set(
			lx->d, -EINVAL,
			"number %.*s at header byte %zu exceeds 2^53", show,
			tok, b);
	*pos = e;
	return 0;
}

/* Outside strings: JSON whitespace, structure, literals and numbers only
 * (cJSON skips any byte <= 0x20 as whitespace), nesting capped. */
static int st_lex_all(struct st_lex *lx)
{
	size_t i = 0, depth = 0;
	int rc = 0;

	while (!rc && i < lx->len) {
		uint8_t c = lx->js[i];

		if (c == '"') {
			rc = st_lex_string(lx, &i);
		} else if (c == '-' || (c >= '0' && c <= '9')) {
			rc = st_lex_number(lx, &i);
		} else if (st_is_numch(c)) {
			while (i < lx->len && st_is_numch(lx->js[i]))
				i++; /* true/false/null, or garbage for cJSON */
		} else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
			rc = castfs_diag_set(
				lx->d, -EINVAL,
				"control byte 0x%02x outside a string at header byte %zu",
				c, i);
		} else if ((c == '{' || c == '[') && ++depth > ST_MAX_DEPTH) {
			rc = castfs_diag_set(
				lx->d, -EINVAL,
				"JSON nested deeper than %d levels at header byte %zu",
				ST_MAX_DEPTH, i);
		} else {
			if ((c == '}' || c == ']') && depth)
				depth--;
			i++;
		}
	}
	return rc;
}

int st_lex(struct st_lex *lx)
{
	size_t bad = castfs_utf8_bad(lx->js, lx->len);

	if (bad != lx->len)
		return castfs_diag_set(
			lx->d, -EINVAL,
			"header is not valid UTF-8 at header byte %zu", bad);
	if (!lx->len || lx->js[0] != '{')
		return castfs_diag_set(
			lx->d, -EINVAL,
			"header must begin with '{' (found %s at header byte 0)",
			lx->len ? "another byte" : "nothing");
	return st_lex_all(lx);
}
