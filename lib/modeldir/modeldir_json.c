/* SPDX-License-Identifier: MIT */
/*
 * JSON text for the model-directory views: output as json.dumps writes it,
 * validation (cJSON), and object members found as byte spans of the text.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeldir/modeldir_internal.h"

#define MD_MAX_DEPTH 1000 /* cJSON's CJSON_NESTING_LIMIT */

/* ---- output ---- */

void castfs_md_put_u64(struct castfs_strbuf *b, uint64_t v)
{
	castfs_sb_printf(b, "%llu", (unsigned long long)v);
}

/*
 * The code point of the UTF-8 sequence at @s (at most @n bytes) and its
 * length into *@used; U+FFFD and length 1 for a malformed sequence.
 */
static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *used)
{
	uint32_t cp, min;
	size_t len;

	*used = 1;
	if (s[0] < 0x80)
		return s[0];
	if ((s[0] & 0xe0) == 0xc0)
		len = 2, cp = s[0] & 0x1fu, min = 0x80;
	else if ((s[0] & 0xf0) == 0xe0)
		len = 3, cp = s[0] & 0x0fu, min = 0x800;
	else if ((s[0] & 0xf8) == 0xf0)
		len = 4, cp = s[0] & 0x07u, min = 0x10000;
	else
		return 0xfffd;
	if (len > n)
		return 0xfffd;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0xfffd;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0xfffd;
	*used = len;
	return cp;
}

static void put_u16_escape(struct castfs_strbuf *b, uint32_t u)
{
	char tmp[8];

	snprintf(tmp, sizeof(tmp), "\\u%04x", (unsigned)u);
	castfs_sb_put(b, tmp, 6);
}

static void put_escaped(struct castfs_strbuf *b, uint32_t cp)
{
	static const char short_esc[][3] = {
		['\b'] = "\\b", ['\t'] = "\\t", ['\n'] = "\\n",
		['\f'] = "\\f", ['\r'] = "\\r",
	};
	char c = (char)cp;

	if (cp == '"' || cp == '\\') {
		castfs_sb_put(b, "\\", 1);
		castfs_sb_put(b, &c, 1);
	} else if (cp < sizeof(short_esc) / sizeof(short_esc[0]) &&
		   short_esc[cp][0]) {
		castfs_sb_put(b, short_esc[cp], 2);
	} else if (cp >= 0x20 && cp < 0x7f) {
		castfs_sb_put(b, &c, 1);
	} else if (cp < 0x10000) {
		put_u16_escape(b, cp);
	} else {
		cp -= 0x10000;
		put_u16_escape(b, 0xd800 | (cp >> 10));
		put_u16_escape(b, 0xdc00 | (cp & 0x3ff));
	}
}

void castfs_md_put_str(struct castfs_strbuf *b, const char *s, size_t n)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0, used;

	castfs_sb_put(b, "\"", 1);
	while (i < n) {
		put_escaped(b, utf8_next(u + i, n - i, &used));
		i += used;
	}
	castfs_sb_put(b, "\"", 1);
}

/* ---- scanning ---- */

/* Past the string that starts at *@i (a '"'). */
static int skip_string(const char *js, size_t len, size_t *i)
{
	size_t p = *i + 1;

	while (p < len && js[p] != '"') {
		if ((unsigned char)js[p] < 0x20)
			return -EINVAL;
		p += js[p] == '\\' ? 2 : 1;
	}
	if (p >= len)
		return -EINVAL;
	*i = p + 1;
	return 0;
}

/* Past the object or array that starts at *@i; strings are skipped. */
static int skip_container(const char *js, size_t len, size_t *i)
{
	size_t p = *i, depth = 0;
	int rc;

	do {
		if (p >= len)
			return -EINVAL;
		if (js[p] == '"') {
			rc = skip_string(js, len, &p);
			if (rc)
				return rc;
			continue;
		}
		if (js[p] == '{' || js[p] == '[') {
			if (++depth > MD_MAX_DEPTH)
				return -EINVAL;
		} else if (js[p] == '}' || js[p] == ']') {
			depth--;
		}
		p++;
	} while (depth > 0);
	*i = p;
	return 0;
}

static bool scalar_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-' ||
	       c == '+' || c == '.' || c == 'E';
}

/* Past the value that starts at *@i. The caller has validated the whole
 * text, so a scalar is just its run of characters. */
static int skip_value(const char *js, size_t len, size_t *i)
{
	size_t p = *i;

	if (p >= len)
		return -EINVAL;
	if (js[p] == '"')
		return skip_string(js, len, i);
	if (js[p] == '{' || js[p] == '[')
		return skip_container(js, len, i);
	while (p < len && scalar_char(js[p]))
		p++;
	if (p == *i)
		return -EINVAL;
	*i = p;
	return 0;
}

static int add_member(struct castfs_md_object *o, size_t *cap,
		      const struct castfs_md_member *m)
{
	if (o->n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 16;
		struct castfs_md_member *nm = realloc(o->m, ncap * sizeof(*nm));

		if (!nm)
			return -ENOMEM;
		o->m = nm;
		*cap = ncap;
	}
	o->m[o->n++] = *m;
	return 0;
}

/* One "key": value at *@i (after '{' or ','), its lead starting there. */
static int scan_member(const char *js, size_t len, size_t *i,
		       struct castfs_md_member *m)
{
	size_t p = castfs_json_skip_ws(js, len, *i);
	int rc;

	m->lead = *i;
	m->lead_len = p - *i;
	m->key = p;
	if (p >= len || js[p] != '"')
		return -EINVAL;
	rc = skip_string(js, len, &p);
	if (rc)
		return rc;
	m->key_len = p - m->key;
	p = castfs_json_skip_ws(js, len, p);
	if (p >= len || js[p] != ':')
		return -EINVAL;
	p = castfs_json_skip_ws(js, len, p + 1);
	m->val = p;
	rc = skip_value(js, len, &p);
	if (rc)
		return rc;
	m->val_len = p - m->val;
	*i = castfs_json_skip_ws(js, len, p);
	return 0;
}

int castfs_md_scan_object(const char *js, size_t len, size_t at,
			  struct castfs_md_object *o)
{
	size_t i = at + 1, cap = 0;
	struct castfs_md_member m;
	int rc;

	*o = (struct castfs_md_object){ .open = at };
	if (at >= len || js[at] != '{')
		return -EINVAL;
	if (castfs_json_skip_ws(js, len, i) < len &&
	    js[castfs_json_skip_ws(js, len, i)] == '}') {
		o->close = castfs_json_skip_ws(js, len, i);
		return 0;
	}
	for (;;) {
		rc = scan_member(js, len, &i, &m);
		if (!rc)
			rc = add_member(o, &cap, &m);
		if (rc)
			break;
		if (i < len && js[i] == ',') {
			i++;
			continue;
		}
		if (i < len && js[i] == '}') {
			o->close = i;
			return 0;
		}
		rc = -EINVAL;
		break;
	}
	castfs_md_object_fini(o);
	return rc;
}

void castfs_md_object_fini(struct castfs_md_object *o)
{
	free(o->m);
	o->m = NULL;
	o->n = 0;
}

bool castfs_md_key_is(const char *js, const struct castfs_md_member *m,
		      const char *key)
{
	size_t n = strlen(key);

	return m->key_len == n + 2 && memcmp(js + m->key + 1, key, n) == 0;
}

int castfs_md_json_cap(const char *json, size_t len, size_t max,
		       struct castfs_diag *d, const char *what)
{
	if (castfs_json_values(json, len, max) <= max)
		return 0;
	return castfs_diag_set(d, -E2BIG, "%s: more than %zu JSON values", what,
			       max);
}

int castfs_md_parse(const char *json, size_t len, cJSON **root,
		    struct castfs_diag *d, const char *what)
{
	const char *end = NULL;
	cJSON *r;
	size_t tail;
	int rc = castfs_md_json_cap(json, len, CASTFS_MD_JSON_VALUES_MAX, d,
				    what);

	if (rc)
		return rc;
	r = cJSON_ParseWithLengthOpts(json, len, &end, false);
	tail = end ? (size_t)(end - json) : 0;
	if (r)
		tail = castfs_json_skip_ws(json, len, tail);
	if (!r || tail != len || !cJSON_IsObject(r)) {
		cJSON_Delete(r);
		return castfs_diag_set(d, -EINVAL,
				       "%s: not a JSON object (near byte %zu)",
				       what, tail);
	}
	if (root)
		*root = r;
	else
		cJSON_Delete(r);
	return 0;
}

int castfs_md_top_object(const char *json, size_t len,
			 struct castfs_md_object *o)
{
	return castfs_md_scan_object(json, len,
				     castfs_json_skip_ws(json, len, 0), o);
}
