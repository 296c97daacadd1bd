/* SPDX-License-Identifier: MIT */
/* Emit a safetensors header byte for byte as safetensors' serialize(). */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "common/escape.h"
#include "format/st_header.h"
#include "format/st_internal.h"

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

/* Decimal digits by hand: snprintf() per number made a header of many
 * shape entries cost seconds per view. */
static void st_put_u64(struct st_sink *s, uint64_t v)
{
	char b[20];
	size_t i = sizeof(b);

	do
		b[--i] = (char)('0' + v % 10);
	while (v /= 10);
	st_put(s, b + i, sizeof(b) - i);
}

/* serde_json's escaping: \" \\ \b \f \n \r \t, other C0 as \u00xx. */
static void st_put_str(struct st_sink *s, const char *p, size_t n)
{
	static const char hex[] = "0123456789abcdef", *short_esc = "btn\0fr";
	size_t run = 0;

	st_put(s, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		char e[6] = {
			'\\', (char)c, '0', '0', hex[c >> 4], hex[c & 15]
		};

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

static void st_put_header(struct st_sink *s, const struct castfs_emit_tensor *t,
			  size_t n, bool has_meta,
			  const struct castfs_meta_kv *meta, size_t nmeta)
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
	return !n || castfs_utf8_bad(p, n) == n;
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
		return castfs_diag_set(
			d, -EINVAL,
			"tensor name '%s' is not valid UTF-8 or is reserved",
			s);
	if (!castfs_dtype_bits(t->dtype))
		return castfs_diag_set(d, -EINVAL,
				       "tensor '%s': invalid dtype %d", s,
				       (int)t->dtype);
	rc = castfs_shape_nelems(t->shape, t->ndim, &nelems);
	if (!rc)
		rc = castfs_tensor_nbytes(t->dtype, nelems, &nbytes);
	if (rc)
		return castfs_diag_set(d, rc, "tensor '%s': shape of %s %s", s,
				       castfs_dtype_name(t->dtype),
				       rc == -EOVERFLOW ?
					       "overflows 64 bits" :
					       "does not fill whole bytes");
	if (nbytes != t->nbytes)
		return castfs_diag_set(d, -EINVAL,
				       "tensor '%s': nbytes %" PRIu64
				       " but %" PRIu64
				       " elements of %s need %" PRIu64,
				       s, t->nbytes, nelems,
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
					     ST_META
					     " entry %zu is not valid UTF-8",
					     i);
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

/*
 * safetensors prepare(): dtype descending in enum order, then name; the
 * late tensors form a second run in the same order.
 */
static int st_data_order(const void *a, const void *b)
{
	const struct castfs_emit_tensor *x = a, *y = b;

	if (x->late != y->late)
		return x->late ? 1 : -1;
	if (x->dtype != y->dtype)
		return x->dtype < y->dtype ? 1 : -1;
	return st_cmp_bytes(x->name, x->name_len, y->name, y->name_len);
}

static int st_emit_place(struct castfs_emit_tensor *t, size_t n,
			 struct castfs_diag *d)
{
	uint64_t off = 0;

	if (n > 1)
		qsort(t, n, sizeof(*t), st_data_order);
	for (size_t i = 0; i < n; i++) {
		t[i].begin = off;
		if (castfs_ckd_add(&off, off, t[i].nbytes))
			return castfs_diag_set(
				d, -EOVERFLOW,
				"data size overflows 64 bits at tensor %zu", i);
		t[i].end = off;
	}
	return 0;
}

/* Whether every tensor starts at a multiple of its element size. */
static bool st_emit_aligned(const struct castfs_emit_tensor *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned bytes = castfs_dtype_bits(t[i].dtype) / 8;

		if (bytes > 1 && t[i].begin % bytes)
			return false;
	}
	return true;
}

/*
 * Offsets in data order. The late run keeps every tensor aligned only
 * when the bytes before it are (safetensors' own order guarantees it for
 * any sizes; loaders that view a mapping in place need it): otherwise
 * the late tensors take their usual places.
 */
static int st_emit_offsets(struct castfs_emit_tensor *t, size_t n,
			   struct castfs_diag *d)
{
	int rc = st_emit_place(t, n, d);

	if (rc || st_emit_aligned(t, n))
		return rc;
	for (size_t i = 0; i < n; i++)
		t[i].late = false;
	return st_emit_place(t, n, d);
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
				       "header would exceed %u bytes",
				       CASTFS_HEADER_MAX);
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
