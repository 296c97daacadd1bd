/* SPDX-License-Identifier: MIT */
/* The in-memory safetensors builder used by the unit tests. */
#include <check.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "format/dtype.h"
#include "testutil.h"

struct tu_tensor {
	char *name;
	size_t name_len;
	char *dtype;
	uint32_t ndim;
	uint64_t *shape;
	uint8_t *data;
	size_t nbytes;
	char *extra;
	bool forced;
	uint64_t begin, end;
};

struct tu_meta {
	char *key, *value;
	size_t key_len, value_len;
};

struct tu_st {
	struct tu_st_opts o;
	struct tu_tensor *t;
	size_t nt;
	struct tu_meta *m;
	size_t nm;
	int meta_state; /* 0 absent, 1 object, 2 null */
	size_t *order; /* data order of the last build */
};

struct tu_buf {
	char *p;
	size_t len, cap;
};

static void *tu_xalloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p)
		abort();
	return p;
}

static void *tu_dup(const void *p, size_t n)
{
	void *q = tu_xalloc(NULL, n + 1);

	if (n)
		memcpy(q, p, n);
	((char *)q)[n] = '\0';
	return q;
}

static void tu_put(struct tu_buf *b, const void *p, size_t n)
{
	if (!n)
		return;
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = tu_xalloc(b->p, b->cap);
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

static void tu_printf(struct tu_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void tu_printf(struct tu_buf *b, const char *fmt, ...)
{
	char tmp[64];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	tu_put(b, tmp, (size_t)n);
}

uint64_t tu_rand(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

void tu_pattern(uint8_t *dst, size_t n, void *seed)
{
	uint64_t s = seed ? *(uint64_t *)seed : 1;

	for (size_t i = 0; i < n; i++)
		dst[i] = (uint8_t)(tu_rand(&s) >> 56);
}

struct tu_st *tu_st_new(void)
{
	struct tu_st *b = tu_xalloc(NULL, sizeof(*b));

	memset(b, 0, sizeof(*b));
	return b;
}

void tu_st_free(struct tu_st *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->nt; i++) {
		free(b->t[i].name);
		free(b->t[i].dtype);
		free(b->t[i].shape);
		free(b->t[i].data);
		free(b->t[i].extra);
	}
	for (size_t i = 0; i < b->nm; i++) {
		free(b->m[i].key);
		free(b->m[i].value);
	}
	free(b->t);
	free(b->m);
	free(b->order);
	free(b);
}

void tu_st_set_opts(struct tu_st *b, const struct tu_st_opts *o)
{
	b->o = *o;
}

static size_t tu_auto_nbytes(const char *dtype, uint32_t ndim,
			     const uint64_t *shape)
{
	enum castfs_dtype dt = castfs_dtype_from_name(dtype, strlen(dtype));
	uint64_t n = 1;

	if (dt == CASTFS_DTYPE_INVALID)
		return 0;
	for (uint32_t i = 0; i < ndim; i++)
		n *= shape[i];
	return (size_t)(n * castfs_dtype_bits(dt) / 8);
}

size_t tu_st_add_n(struct tu_st *b, const char *name, size_t name_len,
		   const char *dtype, uint32_t ndim, const uint64_t *shape,
		   const void *data, size_t nbytes)
{
	struct tu_tensor *t;
	uint64_t seed = b->nt + 1;

	b->t = tu_xalloc(b->t, (b->nt + 1) * sizeof(*b->t));
	t = &b->t[b->nt];
	memset(t, 0, sizeof(*t));
	if (nbytes == TU_NBYTES_AUTO)
		nbytes = tu_auto_nbytes(dtype, ndim, shape);
	t->name = tu_dup(name, name_len);
	t->name_len = name_len;
	t->dtype = tu_dup(dtype, strlen(dtype));
	t->ndim = ndim;
	t->shape = tu_dup(shape, ndim * sizeof(*shape));
	t->nbytes = nbytes;
	t->data = tu_xalloc(NULL, nbytes);
	if (data)
		memcpy(t->data, data, nbytes);
	else
		tu_pattern(t->data, nbytes, &seed);
	return b->nt++;
}

size_t tu_st_add(struct tu_st *b, const char *name, const char *dtype,
		 uint32_t ndim, const uint64_t *shape, const void *data)
{
	return tu_st_add_n(b, name, strlen(name), dtype, ndim, shape, data,
			   TU_NBYTES_AUTO);
}

size_t tu_st_add_fill(struct tu_st *b, const char *name, const char *dtype,
		      uint32_t ndim, const uint64_t *shape, tu_fill_fn fill,
		      void *ctx)
{
	size_t i = tu_st_add(b, name, dtype, ndim, shape, NULL);

	fill(b->t[i].data, b->t[i].nbytes, ctx);
	return i;
}

void tu_st_extra(struct tu_st *b, size_t i, const char *json)
{
	free(b->t[i].extra);
	b->t[i].extra = tu_dup(json, strlen(json));
}

void tu_st_offsets(struct tu_st *b, size_t i, uint64_t begin, uint64_t end)
{
	b->t[i].forced = true;
	b->t[i].begin = begin;
	b->t[i].end = end;
}

void tu_st_meta_n(struct tu_st *b, const char *key, size_t key_len,
		  const char *value, size_t value_len)
{
	b->m = tu_xalloc(b->m, (b->nm + 1) * sizeof(*b->m));
	b->m[b->nm++] = (struct tu_meta){ tu_dup(key, key_len),
					  tu_dup(value, value_len), key_len,
					  value_len };
	b->meta_state = 1;
}

void tu_st_meta(struct tu_st *b, const char *key, const char *value)
{
	tu_st_meta_n(b, key, strlen(key), value, strlen(value));
}

void tu_st_meta_null(struct tu_st *b)
{
	b->meta_state = 2;
}

char *tu_json_str(const char *s, size_t n)
{
	struct tu_buf b = { 0 };

	tu_put(&b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			tu_printf(&b, "\\%c", c);
		else if (c < 0x20)
			tu_printf(&b, "\\u%04X", c);
		else
			tu_put(&b, &s[i], 1);
	}
	tu_put(&b, "\"", 1);
	tu_put(&b, "", 1);
	return b.p;
}

static const struct tu_st *tu_sort_ctx; /* qsort has no context argument */

static int tu_writer_cmp(const void *a, const void *b)
{
	const struct tu_tensor *x = &tu_sort_ctx->t[*(const size_t *)a];
	const struct tu_tensor *y = &tu_sort_ctx->t[*(const size_t *)b];
	int dx = castfs_dtype_from_name(x->dtype, strlen(x->dtype));
	int dy = castfs_dtype_from_name(y->dtype, strlen(y->dtype));
	size_t m = x->name_len < y->name_len ? x->name_len : y->name_len;
	int r;

	if (dx != dy)
		return dy - dx;
	r = memcmp(x->name, y->name, m);
	if (r)
		return r;
	return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Data order and offsets. */
static void tu_layout_all(struct tu_st *b)
{
	uint64_t off = 0;

	free(b->order);
	b->order = tu_xalloc(NULL, b->nt * sizeof(size_t));
	for (size_t i = 0; i < b->nt; i++)
		b->order[i] = i;
	tu_sort_ctx = b;
	if (b->o.layout == TU_LAYOUT_WRITER && b->nt > 1)
		qsort(b->order, b->nt, sizeof(size_t), tu_writer_cmp);
	for (size_t i = 0; i < b->nt; i++) {
		struct tu_tensor *t = &b->t[b->order[i]];

		if (!t->forced) {
			t->begin = off;
			t->end = off + t->nbytes;
		}
		off += t->nbytes;
	}
}

static void tu_sep(struct tu_buf *j, const struct tu_st *b, const char *s)
{
	tu_put(j, s, strlen(s));
	if (b->o.pretty)
		tu_put(j, " \n ", 3);
}

static void tu_put_tensor(struct tu_buf *j, const struct tu_st *b,
			  const struct tu_tensor *t)
{
	char *k = tu_json_str(t->name, t->name_len);
	struct tu_buf f[3] = { { 0 } };

	tu_put(j, k, strlen(k));
	free(k);
	tu_sep(j, b, ":");
	tu_sep(j, b, "{");
	if (t->extra) {
		tu_put(j, t->extra, strlen(t->extra));
		tu_sep(j, b, ",");
	}
	tu_printf(&f[0], "\"dtype\":\"%s\"", t->dtype);
	tu_put(&f[1], "\"shape\":[", 9);
	for (uint32_t i = 0; i < t->ndim; i++)
		tu_printf(&f[1], "%s%" PRIu64, i ? "," : "", t->shape[i]);
	tu_put(&f[1], "]", 1);
	tu_printf(&f[2], "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]", t->begin,
		  t->end);
	for (int i = 0; i < 3; i++) {
		struct tu_buf *x = &f[b->o.fields_reversed ? 2 - i : i];

		tu_put(j, x->p, x->len);
		tu_sep(j, b, i < 2 ? "," : "}");
		free(x->p);
	}
}

static void tu_put_meta(struct tu_buf *j, const struct tu_st *b)
{
	tu_sep(j, b, "\"__metadata__\":");
	if (b->meta_state == 2) {
		tu_put(j, "null", 4);
		return;
	}
	tu_sep(j, b, "{");
	for (size_t i = 0; i < b->nm; i++) {
		char *k = tu_json_str(b->m[i].key, b->m[i].key_len);
		char *v = tu_json_str(b->m[i].value, b->m[i].value_len);

		if (i)
			tu_sep(j, b, ",");
		tu_put(j, k, strlen(k));
		tu_sep(j, b, ":");
		tu_put(j, v, strlen(v));
		free(k);
		free(v);
	}
	tu_sep(j, b, "}");
}

static void tu_key_order(const struct tu_st *b, size_t *keys)
{
	uint64_t s = b->o.seed;

	for (size_t i = 0; i < b->nt; i++)
		keys[i] = b->o.keys == TU_KEYS_REVERSE ?
				  b->order[b->nt - 1 - i] :
				  b->order[i];
	if (b->o.keys != TU_KEYS_SHUFFLE)
		return;
	for (size_t i = b->nt; i > 1; i--) {
		size_t r = (size_t)(tu_rand(&s) % i), x = keys[i - 1];

		keys[i - 1] = keys[r];
		keys[r] = x;
	}
}

static void tu_put_json(struct tu_buf *j, const struct tu_st *b)
{
	size_t *keys = tu_xalloc(NULL, b->nt * sizeof(size_t));
	bool first = true;

	tu_key_order(b, keys);
	if (b->o.lead)
		tu_put(j, b->o.lead, strlen(b->o.lead));
	tu_sep(j, b, "{");
	if (b->meta_state && !b->o.meta_last) {
		tu_put_meta(j, b);
		first = false;
	}
	for (size_t i = 0; i < b->nt; i++, first = false) {
		if (!first)
			tu_sep(j, b, ",");
		tu_put_tensor(j, b, &b->t[keys[i]]);
	}
	if (b->meta_state && b->o.meta_last) {
		if (!first)
			tu_sep(j, b, ",");
		tu_put_meta(j, b);
	}
	tu_put(j, "}", 1);
	free(keys);
}

uint8_t *tu_st_build(struct tu_st *b, size_t *len)
{
	struct tu_buf j = { 0 }, f = { 0 };
	unsigned align = b->o.align ? b->o.align : 8;
	char pad = b->o.pad_byte ? b->o.pad_byte : ' ';

	tu_layout_all(b);
	tu_put_json(&j, b);
	while (j.len % align)
		tu_put(&j, &pad, 1);
	for (size_t i = 0; i < b->o.extra_pad; i++)
		tu_put(&j, &pad, 1);
	tu_put(&f, "\0\0\0\0\0\0\0\0", 8);
	castfs_store_le64(f.p, j.len);
	tu_put(&f, j.p, j.len);
	free(j.p);
	for (size_t i = 0; i < b->nt; i++) {
		const struct tu_tensor *t = &b->t[b->order[i]];

		tu_put(&f, t->data, t->nbytes);
	}
	for (size_t i = 0; i < b->o.trailing; i++)
		tu_put(&f, "\xee", 1);
	*len = f.len;
	return (uint8_t *)tu_xalloc(f.p, f.len);
}

const uint8_t *tu_st_data(const struct tu_st *b, size_t i, size_t *nbytes)
{
	*nbytes = b->t[i].nbytes;
	return b->t[i].data;
}

void tu_st_layout(const struct tu_st *b, size_t i, uint64_t *begin,
		  uint64_t *end)
{
	*begin = b->t[i].begin;
	*end = b->t[i].end;
}

uint8_t *tu_raw(const void *json, size_t json_len, uint64_t claim,
		size_t data_len, size_t *len)
{
	uint8_t *p = tu_xalloc(NULL, 8 + json_len + data_len);

	castfs_store_le64(p, claim == UINT64_MAX ? json_len : claim);
	if (json_len)
		memcpy(p + 8, json, json_len);
	memset(p + 8 + json_len, 0, data_len);
	*len = 8 + json_len + data_len;
	return p;
}

uint8_t *tu_raw_str(const char *json, size_t data_len, size_t *len)
{
	return tu_raw(json, strlen(json), UINT64_MAX, data_len, len);
}

uint8_t *tu_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	struct tu_buf b = { 0 };
	char tmp[4096];
	size_t n;

	*len = 0;
	if (!f)
		return NULL;
	while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
		tu_put(&b, tmp, n);
	fclose(f);
	*len = b.len;
	return (uint8_t *)tu_xalloc(b.p, b.len);
}

void tu_write_file(const char *dir, const char *name, const void *data,
		   size_t len)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
		abort();
}

void tu_fixture_init(struct tu_fixture *fx, uint8_t *file, size_t len)
{
	struct castfs_diag d = { { 0 } };

	fx->file = file;
	fx->file_len = len;
	if (castfs_header_parse(file, len, len, &fx->h, &d) ||
	    castfs_views_builtin(&fx->views) || castfs_scratch_init(&fx->s))
		abort();
	castfs_mem_reader_init(&fx->mr, file, len);
}

void tu_fixture_fini(struct tu_fixture *fx)
{
	castfs_scratch_fini(&fx->s);
	castfs_views_fini(&fx->views);
	castfs_header_free(fx->h);
	free(fx->file);
}

struct castfs_plan *tu_fixture_plan(const struct tu_fixture *fx,
				    const char *name)
{
	const struct castfs_view *v =
		castfs_views_find(&fx->views, name, strlen(name));
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *p;

	ck_assert_ptr_nonnull(v);
	ck_assert_msg(castfs_view_plan(v, fx->h, &p, &d) == 0, "%s", d.msg);
	return p;
}

uint8_t *tu_fixture_read_all(struct tu_fixture *fx, const struct castfs_plan *p,
			     struct castfs_scratch *s)
{
	uint8_t *buf = malloc(p->size + 1);

	ck_assert_ptr_nonnull(buf);
	/* One byte more than the size: a read past the end must stop. */
	ck_assert_int_eq(castfs_plan_read(p, &fx->mr.r, s, buf, p->size + 1, 0),
			 (ssize_t)p->size);
	return buf;
}
