/* SPDX-License-Identifier: MIT */
/*
 * safetensors headers. Parse: a strict lexer pass (UTF-8, integers <= 2^53,
 * escapes), cJSON for the structure, then the reference validate() rules.
 * Emit: byte for byte what safetensors' serialize() writes.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "st_header.h"

#define ST_MAX_DEPTH 127 /* serde_json fails on the 128th nested container */
#define ST_MAX_INT (UINT64_C(1) << 53)
#define ST_SHOW 56 /* a name quoted in a message, cut to ~44 bytes */
#define ST_META "__metadata__"

/* ---- bytes, names and messages ---- */

struct st_span {
	const char *p;
	size_t n;
};

/* Rust's str ordering: bytewise, a proper prefix first. */
static int st_cmp_bytes(const char *a, size_t an, const char *b, size_t bn)
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
static size_t st_first_dup(struct st_span *v, size_t n)
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
static const char *st_show(char out[ST_SHOW], const char *s, size_t n)
{
	size_t i, o = 0;

	for (i = 0; i < n && o < 44; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
			out[o++] = (char)c;
		else
			o += (size_t)snprintf(out + o, ST_SHOW - o, "\\x%02x", c);
	}
	if (i < n)
		memcpy(out + o, "...", 3), o += 3;
	out[o] = '\0';
	return out;
}

/* Offset of the first byte that is not strict UTF-8 (no overlongs, no
 * surrogates, nothing above U+10FFFF), or @n. */
static size_t st_utf8_bad(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i], lo = 0x80, hi = 0xbf;
		size_t k;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			k = 1;
		else if (c >= 0xe0 && c <= 0xef)
			k = 2;
		else if (c >= 0xf0 && c <= 0xf4)
			k = 3;
		else
			return i;
		lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : lo;
		hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : hi;
		if (n - i <= k || s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (size_t j = 2; j <= k; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return i;
		i += k + 1;
	}
	return n;
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
static size_t st_decode(const uint8_t *raw, size_t n, char *out, size_t cap)
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

struct st_str {
	uint32_t off, len; /* the raw body between the quotes */
	uint32_t dec;      /* its decoded length */
};

struct st_lex {
	const uint8_t *js;
	size_t len;
	struct st_str *str; /* every string, in document order */
	size_t nstr, cap;
	struct castfs_diag *d;
};

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
	lx->str[lx->nstr++] = (struct st_str){ (uint32_t)off, (uint32_t)len,
					       (uint32_t)dec };
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
			return castfs_diag_set(lx->d, -EINVAL,
				"unterminated string starting at header byte %zu",
				*pos);
		c = lx->js[i];
		if (c == '"')
			break;
		if (c < 0x20)
			return castfs_diag_set(lx->d, -EINVAL,
				"raw control byte 0x%02x in a string at header byte %zu",
				c, i);
		if (c != '\\') {
			i++, dec++;
			continue;
		}
		adv = st_escape(lx->js + i, lx->len - i, &cp);
		if (!adv)
			return castfs_diag_set(lx->d, -EINVAL,
				"invalid escape in a string at header byte %zu", i);
		dec += st_utf8_put(tmp, cp);
		i += adv;
	}
	*pos = i + 1;
	return st_lex_push(lx, start, i - start, dec);
}

static bool st_is_numch(uint8_t c)
{
	return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
	       c == '+' || c == '-' || c == '.';
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
		return castfs_diag_set(lx->d, -EINVAL,
			"negative number %.*s at header byte %zu", show, tok, b);
	for (size_t i = 0; i < n; i++) {
		if (tok[i] < '0' || tok[i] > '9')
			return castfs_diag_set(lx->d, -EINVAL,
				"number %.*s at header byte %zu is not an integer",
				show, tok, b);
		if (v <= ST_MAX_INT)
			v = v * 10 + (uint64_t)(tok[i] - '0');
	}
	if (n > 1 && tok[0] == '0')
		return castfs_diag_set(lx->d, -EINVAL,
			"number %.*s at header byte %zu has a leading zero",
			show, tok, b);
	if (v > ST_MAX_INT)
		return castfs_diag_set(lx->d, -EINVAL,
			"number %.*s at header byte %zu exceeds 2^53", show, tok,
			b);
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
			rc = castfs_diag_set(lx->d, -EINVAL,
				"control byte 0x%02x outside a string at header byte %zu",
				c, i);
		} else if ((c == '{' || c == '[') && ++depth > ST_MAX_DEPTH) {
			rc = castfs_diag_set(lx->d, -EINVAL,
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

static int st_lex(struct st_lex *lx)
{
	size_t bad = st_utf8_bad(lx->js, lx->len);

	if (bad != lx->len)
		return castfs_diag_set(lx->d, -EINVAL,
			"header is not valid UTF-8 at header byte %zu", bad);
	if (!lx->len || lx->js[0] != '{')
		return castfs_diag_set(lx->d, -EINVAL,
			"header must begin with '{' (found %s at header byte 0)",
			lx->len ? "another byte" : "nothing");
	return st_lex_all(lx);
}

/*
 * cJSON builds the structure. Note: cJSON_ParseWithLengthOpts() resets and
 * sets cJSON's global error position, which is racy but harmless: we only
 * use return_parse_end.
 */
static int st_json(const struct st_lex *lx, cJSON **root)
{
	const char *js = (const char *)lx->js, *end = NULL;
	cJSON *j = cJSON_ParseWithLengthOpts(js, lx->len, &end, 0);
	size_t at = end ? (size_t)(end - js) : 0;

	if (!j)
		return castfs_diag_set(lx->d, -EINVAL,
			"invalid JSON near header byte %zu", at);
	for (; at < lx->len; at++) {
		uint8_t c = lx->js[at];

		if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			cJSON_Delete(j);
			return castfs_diag_set(lx->d, -EINVAL,
				"byte 0x%02x after the JSON object at header byte %zu",
				c, at);
		}
	}
	*root = j;
	return 0;
}

/* ---- walking the tree (twice: count, then fill) ---- */

struct st_ctx {
	const uint8_t *js;
	const struct st_str *str;
	size_t next; /* the next string token, in cJSON's pre-order */
	struct castfs_diag *d;
	size_t nt, nmeta, ndims, nchars;
	bool seen_meta, has_meta;
	struct castfs_header *h; /* NULL while counting */
	uint64_t *dims;
	char *chars;
};

static size_t st_tok_decode(const struct st_ctx *c, size_t k, char *out,
			    size_t cap)
{
	return st_decode(c->js + c->str[k].off, c->str[k].len, out, cap);
}

static bool st_tok_is(const struct st_ctx *c, size_t k, const char *lit)
{
	char buf[16];
	size_t n = strlen(lit);

	assert(n <= sizeof(buf));
	if (c->str[k].dec != n)
		return false;
	st_tok_decode(c, k, buf, sizeof(buf));
	return !memcmp(buf, lit, n);
}

static const char *st_tok_show(const struct st_ctx *c, size_t k,
			       char out[ST_SHOW])
{
	char raw[48];

	st_tok_decode(c, k, raw, sizeof(raw));
	return st_show(out, raw, c->str[k].dec);
}

static int st_terr(const struct st_ctx *c, size_t k, int rc,
		   const char *fmt, ...) CASTFS_PRINTF(4, 5);

static int st_terr(const struct st_ctx *c, size_t k, int rc,
		   const char *fmt, ...)
{
	char name[ST_SHOW], why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return castfs_diag_set(c->d, rc, "tensor '%s': %s",
			       st_tok_show(c, k, name), why);
}

static const char *st_type(const cJSON *it)
{
	if (cJSON_IsNull(it))
		return "null";
	if (cJSON_IsBool(it))
		return "a boolean";
	if (cJSON_IsNumber(it))
		return "a number";
	if (cJSON_IsString(it))
		return "a string";
	return cJSON_IsArray(it) ? "an array" : "an object";
}

/* Strings in @it's subtree, object keys included. Depth <= ST_MAX_DEPTH. */
static size_t st_count_strings(const cJSON *it)
{
	size_t n = cJSON_IsString(it) ? 1 : 0;
	size_t key = cJSON_IsObject(it) ? 1 : 0;

	for (const cJSON *ch = it->child; ch; ch = ch->next)
		n += key + st_count_strings(ch);
	return n;
}

static char *st_store_str(struct st_ctx *c, size_t k, size_t *len)
{
	char *p = c->chars;

	*len = st_tok_decode(c, k, p, c->str[k].dec);
	p[*len] = '\0';
	c->chars += *len + 1;
	return p;
}

static int st_meta(struct st_ctx *c, const cJSON *obj)
{
	char s[ST_SHOW];

	if (c->seen_meta)
		return castfs_diag_set(c->d, -EINVAL,
				       "duplicate key '" ST_META "'");
	c->seen_meta = true;
	if (cJSON_IsNull(obj))
		return 0;
	if (!cJSON_IsObject(obj))
		return castfs_diag_set(c->d, -EINVAL,
			ST_META " must be an object or null, got %s",
			st_type(obj));
	c->has_meta = true;
	for (const cJSON *it = obj->child; it; it = it->next) {
		size_t k = c->next++;
		struct castfs_meta_kv *kv;

		if (!cJSON_IsString(it))
			return castfs_diag_set(c->d, -EINVAL,
				ST_META " '%s': value must be a string, got %s",
				st_tok_show(c, k, s), st_type(it));
		if (c->h) {
			kv = &c->h->meta[c->nmeta];
			kv->key = st_store_str(c, k, &kv->key_len);
			kv->value = st_store_str(c, c->next, &kv->value_len);
		}
		c->nchars += c->str[k].dec + c->str[c->next].dec + 2;
		c->next++;
		c->nmeta++;
	}
	return 0;
}

struct st_fields {
	const cJSON *dtype, *shape, *offs;
	size_t dtype_tok;
};

static int st_fields(struct st_ctx *c, size_t k, const cJSON *obj,
		     struct st_fields *f)
{
	static const char *const names[] = { "dtype", "shape", "data_offsets" };
	const cJSON **slot[] = { &f->dtype, &f->shape, &f->offs };

	for (const cJSON *it = obj->child; it; it = it->next) {
		size_t fk = c->next++, i = 0;

		while (i < 3 && !st_tok_is(c, fk, names[i]))
			i++;
		if (i < 3 && *slot[i])
			return st_terr(c, k, -EINVAL, "duplicate field '%s'",
				       names[i]);
		if (i < 3)
			*slot[i] = it;
		if (i == 0)
			f->dtype_tok = c->next;
		c->next += st_count_strings(it);
	}
	for (size_t i = 0; i < 3; i++)
		if (!*slot[i])
			return st_terr(c, k, -EINVAL, "missing field '%s'",
				       names[i]);
	return 0;
}

static int st_dtype(const struct st_ctx *c, size_t k, const struct st_fields *f,
		    enum castfs_dtype *dt)
{
	char buf[16], s[ST_SHOW];
	size_t n;

	if (!cJSON_IsString(f->dtype))
		return st_terr(c, k, -EINVAL,
			       "field 'dtype' must be a string, got %s",
			       st_type(f->dtype));
	n = st_tok_decode(c, f->dtype_tok, buf, sizeof(buf));
	*dt = n < sizeof(buf) ? castfs_dtype_from_name(buf, n)
			      : CASTFS_DTYPE_INVALID;
	if (*dt == CASTFS_DTYPE_INVALID)
		return st_terr(c, k, -EINVAL, "unknown dtype '%s'",
			       st_tok_show(c, f->dtype_tok, s));
	return 0;
}

/* The integers of array @a; the first @cap go to @v. The lexer has already
 * proved every number a non-negative integer <= 2^53, exact in a double. */
static int st_ints(const struct st_ctx *c, size_t k, const cJSON *a,
		   const char *field, uint64_t *v, size_t cap, size_t *n)
{
	size_t i = 0;

	if (!cJSON_IsArray(a))
		return st_terr(c, k, -EINVAL, "field '%s' must be an array, got %s",
			       field, st_type(a));
	for (const cJSON *e = a->child; e; e = e->next, i++) {
		if (!cJSON_IsNumber(e))
			return st_terr(c, k, -EINVAL,
				       "%s[%zu] must be an integer, got %s",
				       field, i, st_type(e));
		assert(e->valuedouble >= 0 && e->valuedouble <= 0x1p53);
		if (i < cap)
			v[i] = (uint64_t)e->valuedouble;
	}
	*n = i;
	return 0;
}

static int st_tensor(struct st_ctx *c, const cJSON *obj, size_t k)
{
	struct st_fields f = { 0 };
	enum castfs_dtype dt = CASTFS_DTYPE_INVALID;
	uint64_t off[2] = { 0, 0 };
	size_t ndim = 0, noff = 0;
	int rc;

	if (!cJSON_IsObject(obj))
		return st_terr(c, k, -EINVAL, "expected an object, got %s",
			       st_type(obj));
	rc = st_fields(c, k, obj, &f);
	if (!rc)
		rc = st_dtype(c, k, &f, &dt);
	if (!rc)
		rc = st_ints(c, k, f.shape, "shape", c->dims,
			     c->h ? SIZE_MAX : 0, &ndim);
	if (!rc)
		rc = st_ints(c, k, f.offs, "data_offsets", off, 2, &noff);
	if (rc)
		return rc;
	if (noff != 2)
		return st_terr(c, k, -EINVAL,
			       "data_offsets must have 2 entries, got %zu", noff);
	if (c->h) {
		struct castfs_tensor *t = &c->h->tensors[c->nt];

		t->name = st_store_str(c, k, &t->name_len);
		t->dtype = dt;
		t->ndim = (uint32_t)ndim; /* < N/2 entries */
		t->shape = c->dims;
		t->begin = off[0];
		t->end = off[1];
		c->dims += ndim;
	}
	c->nt++;
	c->ndims += ndim;
	c->nchars += c->str[k].dec + 1;
	return 0;
}

static int st_walk(struct st_ctx *c, const cJSON *root)
{
	c->next = c->nt = c->nmeta = c->ndims = c->nchars = 0;
	c->seen_meta = c->has_meta = false;
	for (const cJSON *it = root->child; it; it = it->next) {
		size_t k = c->next++;
		int rc = st_tok_is(c, k, ST_META) ? st_meta(c, it)
						  : st_tensor(c, it, k);

		if (rc)
			return rc;
	}
	return 0;
}

/* One block: header, tensors, by_name, meta, shapes, then the strings. */
static int st_alloc(const struct st_ctx *c, struct castfs_header **out)
{
	const size_t tsz = sizeof(struct castfs_tensor) + sizeof(void *);
	uint64_t sz = sizeof(struct castfs_header), a, b, m;
	struct castfs_header *h;
	char *p;

	_Static_assert(sizeof(struct castfs_header) % 8 == 0, "alignment");
	_Static_assert(sizeof(struct castfs_tensor) % 8 == 0, "alignment");
	_Static_assert(sizeof(struct castfs_meta_kv) % 8 == 0, "alignment");
	if (castfs_ckd_mul(&a, c->nt, tsz) ||
	    castfs_ckd_mul(&b, c->nmeta, sizeof(struct castfs_meta_kv)) ||
	    castfs_ckd_mul(&m, c->ndims, sizeof(uint64_t)) ||
	    castfs_ckd_add(&sz, sz, a) || castfs_ckd_add(&sz, sz, b) ||
	    castfs_ckd_add(&sz, sz, m) || castfs_ckd_add(&sz, sz, c->nchars) ||
	    sz > SIZE_MAX)
		return -ENOMEM;
	h = calloc(1, (size_t)sz);
	if (!h)
		return -ENOMEM;
	p = (char *)(h + 1);
	h->tensors = (void *)p;
	p += c->nt * sizeof(struct castfs_tensor);
	h->by_name = (void *)p;
	p += c->nt * sizeof(void *);
	h->meta = (void *)p;
	p += c->nmeta * sizeof(struct castfs_meta_kv);
	h->ntensors = c->nt;
	h->nmeta = c->nmeta;
	h->has_metadata = c->has_meta;
	*out = h;
	return 0;
}

/* ---- validation of the filled header ---- */

static int st_offset_order(const void *a, const void *b)
{
	const struct castfs_tensor *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return st_cmp_bytes(x->name, x->name_len, y->name, y->name_len);
}

static int st_name_order(const void *a, const void *b)
{
	const struct castfs_tensor *const *x = a, *const *y = b;

	return st_cmp_bytes((*x)->name, (*x)->name_len, (*y)->name,
			    (*y)->name_len);
}

static int st_unique(struct castfs_header *h, struct castfs_diag *d)
{
	struct st_span *v;
	char s[ST_SHOW];
	size_t i;

	for (i = 0; i < h->ntensors; i++)
		h->by_name[i] = &h->tensors[i];
	if (h->ntensors > 1)
		qsort(h->by_name, h->ntensors, sizeof(*h->by_name),
		      st_name_order);
	for (i = 1; i < h->ntensors; i++)
		if (!st_name_order(&h->by_name[i - 1], &h->by_name[i]))
			return castfs_diag_set(d, -EINVAL,
				"duplicate tensor name '%s'",
				st_show(s, h->by_name[i]->name,
					h->by_name[i]->name_len));
	v = malloc((h->nmeta ? h->nmeta : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < h->nmeta; i++)
		v[i] = (struct st_span){ h->meta[i].key, h->meta[i].key_len };
	i = st_first_dup(v, h->nmeta);
	if (i < h->nmeta)
		castfs_diag_set(d, -EINVAL, "duplicate " ST_META " key '%s'",
				st_show(s, v[i].p, v[i].n));
	free(v);
	return i < h->nmeta ? -EINVAL : 0;
}

static int st_check_offsets(const struct castfs_tensor *t,
			    const struct castfs_tensor *prev, uint64_t start,
			    struct castfs_diag *d)
{
	char s[ST_SHOW], p[ST_SHOW];

	st_show(s, t->name, t->name_len);
	if (t->end < t->begin)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': data_offsets end %" PRIu64
			" is before begin %" PRIu64, s, t->end, t->begin);
	if (!prev && t->begin)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': data_offsets begin at %" PRIu64
			", but the first tensor must begin at 0", s, t->begin);
	if (t->begin != start)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
			") %s '%s', which ends at %" PRIu64, s, t->begin,
			t->end, t->begin > start ? "leave a hole after" : "overlap",
			st_show(p, prev->name, prev->name_len), start);
	return 0;
}

/* safetensors validate(): sizes match shapes, offsets tile [0, end). */
static int st_check_tensor(struct castfs_tensor *t, struct castfs_diag *d)
{
	unsigned bits = castfs_dtype_bits(t->dtype);
	const char *dt = castfs_dtype_name(t->dtype);
	char s[ST_SHOW];
	uint64_t nbits;

	st_show(s, t->name, t->name_len);
	if (castfs_shape_nelems(t->shape, t->ndim, &t->nelems))
		return castfs_diag_set(d, -EOVERFLOW,
			"tensor '%s': shape product overflows 64 bits", s);
	if (castfs_ckd_mul(&nbits, t->nelems, bits))
		return castfs_diag_set(d, -EOVERFLOW,
			"tensor '%s': %" PRIu64 " elements of %s: bit count "
			"overflows 64 bits", s, t->nelems, dt);
	if (nbits % 8)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': %" PRIu64 " elements of %u-bit %s do not "
			"fill whole bytes", s, t->nelems, bits, dt);
	if (t->end - t->begin != nbits / 8)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
			") hold %" PRIu64 " bytes, but %" PRIu64
			" elements of %s need %" PRIu64, s, t->begin, t->end,
			t->end - t->begin, t->nelems, dt, nbits / 8);
	return 0;
}

static int st_validate(struct castfs_header *h, uint64_t file_size,
		       struct castfs_diag *d)
{
	uint64_t start = 0, end;
	int rc;

	for (size_t i = 0; i < h->ntensors; i++) {
		struct castfs_tensor *t = &h->tensors[i];

		rc = st_check_offsets(t, i ? t - 1 : NULL, start, d);
		if (!rc)
			rc = st_check_tensor(t, d);
		if (rc)
			return rc;
		start = t->end;
	}
	h->data_len = start;
	if (castfs_ckd_add(&end, h->data_start, start))
		return castfs_diag_set(d, -EOVERFLOW,
			"data end %" PRIu64 " + %" PRIu64 " overflows 64 bits",
			h->data_start, start);
	if (end != file_size)
		return castfs_diag_set(d, -EINVAL,
			"data ends at file byte %" PRIu64 " (8 + %" PRIu64
			" + %" PRIu64 ") but the file has %" PRIu64
			" bytes (%s)", end, h->header_len, start, file_size,
			end < file_size ? "trailing bytes" : "truncated");
	return 0;
}

/* ---- public: parse ---- */

static int st_prefix(const uint8_t *buf, size_t buf_len, uint64_t file_size,
		     uint64_t *n, struct castfs_diag *d)
{
	uint64_t v;

	if (file_size < 8)
		return castfs_diag_set(d, -EINVAL,
			"file of %" PRIu64 " bytes is shorter than the "
			"8-byte header length", file_size);
	if (buf_len < 8)
		return castfs_diag_set(d, -EINVAL,
			"buffer of %zu bytes lacks the 8-byte header length",
			buf_len);
	v = castfs_load_le64(buf);
	if (v > CASTFS_HEADER_MAX)
		return castfs_diag_set(d, -E2BIG,
			"header length %" PRIu64 " exceeds the %u-byte limit",
			v, CASTFS_HEADER_MAX);
	if (8 + v > file_size)
		return castfs_diag_set(d, -EINVAL,
			"header length %" PRIu64 " past end of file (size %"
			PRIu64 ")", v, file_size);
	*n = v;
	return 0;
}

static int st_build(const struct st_lex *lx, const cJSON *root, uint64_t n,
		    uint64_t file_size, struct castfs_header **out)
{
	struct st_ctx c = { .js = lx->js, .str = lx->str, .d = lx->d };
	struct castfs_header *h = NULL;
	int rc;

	if (!cJSON_IsObject(root))
		return castfs_diag_set(lx->d, -EINVAL,
				       "header JSON is not an object");
	rc = st_walk(&c, root);
	if (!rc)
		rc = st_alloc(&c, &h);
	if (rc)
		return rc;
	assert(c.next == lx->nstr);
	h->header_len = n;
	h->data_start = 8 + n;
	c.h = h;
	c.dims = (void *)(h->meta + h->nmeta);
	c.chars = (char *)(c.dims + c.ndims);
	rc = st_walk(&c, root);
	assert(!rc && c.nt == h->ntensors);
	if (h->ntensors > 1)
		qsort(h->tensors, h->ntensors, sizeof(*h->tensors),
		      st_offset_order);
	if (!rc)
		rc = st_unique(h, lx->d);
	if (!rc)
		rc = st_validate(h, file_size, lx->d);
	if (rc) {
		free(h);
		return rc;
	}
	*out = h;
	return 0;
}

int castfs_header_parse(const void *buf, size_t buf_len, uint64_t file_size,
			struct castfs_header **out, struct castfs_diag *d)
{
	struct st_lex lx = { .d = d };
	cJSON *root = NULL;
	uint64_t n;
	int rc;

	rc = st_prefix(buf, buf_len, file_size, &n, d);
	if (rc)
		return rc;
	if (buf_len - 8 < n)
		return castfs_diag_set(d, -EINVAL,
			"buffer of %zu bytes is shorter than the %" PRIu64
			"-byte header", buf_len, 8 + n);
	lx.js = (const uint8_t *)buf + 8;
	lx.len = (size_t)n;
	rc = st_lex(&lx);
	if (!rc)
		rc = st_json(&lx, &root);
	if (rc)
		goto out_free_tokens;
	rc = st_build(&lx, root, n, file_size, out);
	cJSON_Delete(root);
out_free_tokens:
	free(lx.str);
	return rc;
}

int castfs_header_read(const struct castfs_reader *r, uint64_t file_size,
		       struct castfs_header **out, struct castfs_diag *d)
{
	uint8_t b8[8] = { 0 }, *buf;
	uint64_t n;
	int rc;

	if (file_size >= 8) {
		rc = castfs_reader_read(r, b8, 8, 0);
		if (rc)
			return castfs_diag_set(d, rc,
				"reading the header length failed (errno %d)",
				-rc);
	}
	rc = st_prefix(b8, file_size >= 8 ? 8 : 0, file_size, &n, d);
	if (rc)
		return rc;
	buf = malloc((size_t)n + 8);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, b8, 8);
	rc = castfs_reader_read(r, buf + 8, (size_t)n, 8);
	if (rc)
		castfs_diag_set(d, rc, "reading the %" PRIu64
				"-byte header failed (errno %d)", n, -rc);
	else
		rc = castfs_header_parse(buf, (size_t)n + 8, file_size, out, d);
	free(buf);
	return rc;
}

void castfs_header_free(struct castfs_header *h)
{
	free(h); /* one block; see st_alloc() */
}

const struct castfs_tensor *castfs_header_find(const struct castfs_header *h,
					       const char *name, size_t len)
{
	size_t lo = 0, hi = h ? h->ntensors : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct castfs_tensor *t = h->by_name[mid];
		int r = st_cmp_bytes(t->name, t->name_len, name, len);

		if (!r)
			return t;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct castfs_meta_kv *castfs_header_meta(const struct castfs_header *h,
						const char *key)
{
	size_t n = strlen(key);

	for (size_t i = 0; h && i < h->nmeta; i++)
		if (!st_cmp_bytes(h->meta[i].key, h->meta[i].key_len, key, n))
			return &h->meta[i];
	return NULL;
}

/* ---- sizes ---- */

int castfs_shape_nelems(const uint64_t *shape, uint32_t ndim, uint64_t *out)
{
	uint64_t n = 1;

	/* Left to right like Rust's try_fold: [2^40, 2^40, 0] overflows. */
	for (uint32_t i = 0; i < ndim; i++)
		if (castfs_ckd_mul(&n, n, shape[i]))
			return -EOVERFLOW;
	*out = n;
	return 0;
}

int castfs_tensor_nbytes(enum castfs_dtype dtype, uint64_t nelems,
			 uint64_t *out)
{
	unsigned bits = castfs_dtype_bits(dtype);
	uint64_t nbits;

	if (!bits)
		return -EINVAL;
	if (castfs_ckd_mul(&nbits, nelems, bits))
		return -EOVERFLOW;
	if (nbits % 8)
		return -EINVAL;
	*out = nbits / 8;
	return 0;
}

/* ---- emit ---- */

/* Writes into @buf, or only counts while @buf is NULL; stops at the cap. */
struct st_sink {
	uint8_t *buf;
	uint64_t len;
	bool over;
};

static void st_put(struct st_sink *s, const void *p, size_t n)
{
	uint64_t end;

	if (s->over || !n)
		return;
	if (castfs_ckd_add(&end, s->len, n) || end > 8 + CASTFS_HEADER_MAX) {
		s->over = true;
		return;
	}
	if (s->buf)
		memcpy(s->buf + s->len, p, n);
	s->len = end;
}

static void st_puts(struct st_sink *s, const char *str)
{
	st_put(s, str, strlen(str));
}

static void st_put_u64(struct st_sink *s, uint64_t v)
{
	char b[24];
	int n = snprintf(b, sizeof(b), "%" PRIu64, v);

	st_put(s, b, (size_t)n);
}

/* serde_json's escaping: \" \\ \b \f \n \r \t, other C0 as \u00xx. */
static void st_put_str(struct st_sink *s, const char *p, size_t n)
{
	static const char hex[] = "0123456789abcdef", *short_esc = "btn\0fr";
	size_t run = 0;

	st_put(s, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		char e[6] = { '\\', (char)c, '0', '0', hex[c >> 4], hex[c & 15] };

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		st_put(s, p + run, i - run);
		run = i + 1;
		if (c >= 8 && c <= 13 && short_esc[c - 8]) {
			e[1] = short_esc[c - 8];
			st_put(s, e, 2);
		} else if (c >= 0x20) {
			st_put(s, e, 2);
		} else {
			e[1] = 'u';
			st_put(s, e, 6);
		}
	}
	st_put(s, p + run, n - run);
	st_put(s, "\"", 1);
}

static void st_put_tensor(struct st_sink *s, const struct castfs_emit_tensor *t)
{
	st_put_str(s, t->name, t->name_len);
	st_puts(s, ":{\"dtype\":\"");
	st_puts(s, castfs_dtype_name(t->dtype));
	st_puts(s, "\",\"shape\":[");
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (i)
			st_put(s, ",", 1);
		st_put_u64(s, t->shape[i]);
	}
	st_puts(s, "],\"data_offsets\":[");
	st_put_u64(s, t->begin);
	st_put(s, ",", 1);
	st_put_u64(s, t->end);
	st_puts(s, "]}");
}

static void st_put_header(struct st_sink *s,
			  const struct castfs_emit_tensor *t, size_t n,
			  bool has_meta, const struct castfs_meta_kv *meta,
			  size_t nmeta)
{
	st_put(s, "{", 1);
	if (has_meta) {
		st_puts(s, "\"" ST_META "\":{");
		for (size_t i = 0; i < nmeta; i++) {
			if (i)
				st_put(s, ",", 1);
			st_put_str(s, meta[i].key, meta[i].key_len);
			st_put(s, ":", 1);
			st_put_str(s, meta[i].value, meta[i].value_len);
		}
		st_put(s, "}", 1);
	}
	for (size_t i = 0; i < n; i++) {
		if (i || has_meta)
			st_put(s, ",", 1);
		st_put_tensor(s, &t[i]);
	}
	st_put(s, "}", 1);
}

static bool st_utf8_ok(const char *p, size_t n)
{
	return !n || st_utf8_bad((const uint8_t *)p, n) == n;
}

static int st_emit_check_one(const struct castfs_emit_tensor *t,
			     struct castfs_diag *d)
{
	char s[ST_SHOW];
	uint64_t nelems, nbytes;
	int rc;

	st_show(s, t->name, t->name_len);
	if (!st_utf8_ok(t->name, t->name_len) ||
	    !st_cmp_bytes(t->name, t->name_len, ST_META, strlen(ST_META)))
		return castfs_diag_set(d, -EINVAL,
			"tensor name '%s' is not valid UTF-8 or is reserved", s);
	if (!castfs_dtype_bits(t->dtype))
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': invalid dtype %d", s, (int)t->dtype);
	rc = castfs_shape_nelems(t->shape, t->ndim, &nelems);
	if (!rc)
		rc = castfs_tensor_nbytes(t->dtype, nelems, &nbytes);
	if (rc)
		return castfs_diag_set(d, rc,
			"tensor '%s': shape of %s %s", s,
			castfs_dtype_name(t->dtype), rc == -EOVERFLOW ?
			"overflows 64 bits" : "does not fill whole bytes");
	if (nbytes != t->nbytes)
		return castfs_diag_set(d, -EINVAL,
			"tensor '%s': nbytes %" PRIu64 " but %" PRIu64
			" elements of %s need %" PRIu64, s, t->nbytes, nelems,
			castfs_dtype_name(t->dtype), nbytes);
	return 0;
}

/* Duplicate names among @n spans; -ENOMEM, -EINVAL or 0. */
static int st_emit_dups(struct st_span *v, size_t n, const char *what,
			struct castfs_diag *d)
{
	char s[ST_SHOW];
	size_t i = st_first_dup(v, n);

	if (i == n)
		return 0;
	return castfs_diag_set(d, -EINVAL, "duplicate %s '%s'", what,
			       st_show(s, v[i].p, v[i].n));
}

static int st_emit_check(const struct castfs_emit_tensor *t, size_t n,
			 const struct castfs_meta_kv *meta, size_t nmeta,
			 struct castfs_diag *d)
{
	struct st_span *v;
	size_t i;
	int rc = 0;

	for (i = 0; !rc && i < n; i++)
		rc = st_emit_check_one(&t[i], d);
	for (i = 0; !rc && i < nmeta; i++)
		if (!st_utf8_ok(meta[i].key, meta[i].key_len) ||
		    !st_utf8_ok(meta[i].value, meta[i].value_len))
			rc = castfs_diag_set(d, -EINVAL,
				ST_META " entry %zu is not valid UTF-8", i);
	if (rc)
		return rc;
	v = malloc((n > nmeta ? n : nmeta ? nmeta : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		v[i] = (struct st_span){ t[i].name, t[i].name_len };
	rc = st_emit_dups(v, n, "tensor name", d);
	for (i = 0; !rc && i < nmeta; i++)
		v[i] = (struct st_span){ meta[i].key, meta[i].key_len };
	if (!rc)
		rc = st_emit_dups(v, nmeta, ST_META " key", d);
	free(v);
	return rc;
}

/* safetensors prepare(): dtype descending in enum order, then name. */
static int st_data_order(const void *a, const void *b)
{
	const struct castfs_emit_tensor *x = a, *y = b;

	if (x->dtype != y->dtype)
		return x->dtype < y->dtype ? 1 : -1;
	return st_cmp_bytes(x->name, x->name_len, y->name, y->name_len);
}

static int st_emit_offsets(struct castfs_emit_tensor *t, size_t n,
			   struct castfs_diag *d)
{
	uint64_t off = 0;

	if (n > 1)
		qsort(t, n, sizeof(*t), st_data_order);
	for (size_t i = 0; i < n; i++) {
		t[i].begin = off;
		if (castfs_ckd_add(&off, off, t[i].nbytes))
			return castfs_diag_set(d, -EOVERFLOW,
				"data size overflows 64 bits at tensor %zu", i);
		t[i].end = off;
	}
	return 0;
}

int castfs_header_emit(struct castfs_emit_tensor *t, size_t n, bool has_meta,
		       const struct castfs_meta_kv *meta, size_t nmeta,
		       uint8_t **out, size_t *out_len, struct castfs_diag *d)
{
	struct st_sink s = { .len = 8 };
	uint64_t hdr;
	int rc;

	rc = st_emit_check(t, n, has_meta ? meta : NULL, has_meta ? nmeta : 0,
			   d);
	if (!rc)
		rc = st_emit_offsets(t, n, d);
	if (rc)
		return rc;
	st_put_header(&s, t, n, has_meta, meta, nmeta);
	hdr = (s.len - 8 + 7) / 8 * 8;
	if (s.over || hdr > CASTFS_HEADER_MAX)
		return castfs_diag_set(d, -E2BIG,
			"header would exceed %u bytes", CASTFS_HEADER_MAX);
	s = (struct st_sink){ .buf = malloc((size_t)hdr + 8), .len = 8 };
	if (!s.buf)
		return -ENOMEM;
	st_put_header(&s, t, n, has_meta, meta, nmeta);
	assert(!s.over && s.len <= hdr + 8);
	memset(s.buf + s.len, ' ', (size_t)(hdr + 8 - s.len));
	castfs_store_le64(s.buf, hdr);
	*out = s.buf;
	*out_len = (size_t)hdr + 8;
	return 0;
}
