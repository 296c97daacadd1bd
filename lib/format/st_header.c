/* SPDX-License-Identifier: MIT */
/*
 * safetensors headers: a strict lexer pass (st_lex.c), the structure
 * (st_tree.c), then the reference reader's validate() rules.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "common/escape.h"
#include "format/st_header.h"
#include "format/st_side.h"
#include "format/st_internal.h"

/* ---- walking the tree (twice: count, then fill) ---- */

struct st_ctx {
	const uint8_t *js;
	const struct st_str *str;
	const struct st_tree *t;
	size_t next; /* the next string token, in pre-order */
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

static int st_terr(const struct st_ctx *c, size_t k, int rc, const char *fmt,
		   ...) CASTFS_PRINTF(4, 5);

static int st_terr(const struct st_ctx *c, size_t k, int rc, const char *fmt,
		   ...)
{
	char name[ST_SHOW], why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return castfs_diag_set(c->d, rc, "tensor '%s': %s",
			       st_tok_show(c, k, name), why);
}

static enum st_kind st_kind(const struct st_ctx *c, uint32_t it)
{
	return st_node_kind(c->t, it);
}

static const char *st_type(const struct st_ctx *c, uint32_t it)
{
	static const char *const names[] = {
		[ST_NULL] = "null",	  [ST_BOOL] = "a boolean",
		[ST_NUMBER] = "a number", [ST_STRING] = "a string",
		[ST_ARRAY] = "an array",  [ST_OBJECT] = "an object",
	};

	return names[st_kind(c, it)];
}

static uint32_t st_child(const struct st_ctx *c, uint32_t it)
{
	return c->t->node[it].child;
}

static uint32_t st_next(const struct st_ctx *c, uint32_t it)
{
	return c->t->node[it].next;
}

/* Strings in @it's subtree, object keys included. Depth <= ST_MAX_DEPTH. */
static size_t st_count_strings(const struct st_ctx *c, uint32_t it)
{
	size_t n = st_kind(c, it) == ST_STRING ? 1 : 0;
	size_t key = st_kind(c, it) == ST_OBJECT ? 1 : 0;

	for (uint32_t ch = st_child(c, it); ch; ch = st_next(c, ch))
		n += key + st_count_strings(c, ch);
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

static int st_meta(struct st_ctx *c, uint32_t obj)
{
	char s[ST_SHOW];

	if (c->seen_meta)
		return castfs_diag_set(c->d, -EINVAL,
				       "duplicate key '" ST_META "'");
	c->seen_meta = true;
	if (st_kind(c, obj) == ST_NULL)
		return 0;
	if (st_kind(c, obj) != ST_OBJECT)
		return castfs_diag_set(c->d, -EINVAL,
				       ST_META
				       " must be an object or null, got %s",
				       st_type(c, obj));
	c->has_meta = true;
	for (uint32_t it = st_child(c, obj); it; it = st_next(c, it)) {
		size_t k = c->next++;
		struct castfs_meta_kv *kv;

		if (st_kind(c, it) != ST_STRING)
			return castfs_diag_set(
				c->d, -EINVAL,
				ST_META " '%s': value must be a string, got %s",
				st_tok_show(c, k, s), st_type(c, it));
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
	uint32_t dtype, shape, offs; /* 0: none */
	size_t dtype_tok;
};

static int st_fields(struct st_ctx *c, size_t k, uint32_t obj,
		     struct st_fields *f)
{
	static const char *const names[] = { "dtype", "shape", "data_offsets" };
	uint32_t *slot[] = { &f->dtype, &f->shape, &f->offs };

	for (uint32_t it = st_child(c, obj); it; it = st_next(c, it)) {
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
		c->next += st_count_strings(c, it);
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

	if (st_kind(c, f->dtype) != ST_STRING)
		return st_terr(c, k, -EINVAL,
			       "field 'dtype' must be a string, got %s",
			       st_type(c, f->dtype));
	n = st_tok_decode(c, f->dtype_tok, buf, sizeof(buf));
	*dt = n < sizeof(buf) ? castfs_dtype_from_name(buf, n) :
				CASTFS_DTYPE_INVALID;
	if (*dt == CASTFS_DTYPE_INVALID)
		return st_terr(c, k, -EINVAL, "unknown dtype '%s'",
			       st_tok_show(c, f->dtype_tok, s));
	return 0;
}

/* The integers of array @a; the first @cap go to @v. The lexer has already
 * proved every number a non-negative integer <= 2^53, exact in a double. */
static int st_ints(const struct st_ctx *c, size_t k, uint32_t a,
		   const char *field, uint64_t *v, size_t cap, size_t *n)
{
	size_t i = 0;

	if (st_kind(c, a) != ST_ARRAY)
		return st_terr(c, k, -EINVAL,
			       "field '%s' must be an array, got %s", field,
			       st_type(c, a));
	for (uint32_t e = st_child(c, a); e; e = st_next(c, e), i++) {
		if (st_kind(c, e) != ST_NUMBER)
			return st_terr(c, k, -EINVAL,
				       "%s[%zu] must be an integer, got %s",
				       field, i, st_type(c, e));
		assert(st_node_num(c->t, e) <= ST_MAX_INT);
		if (i < cap)
			v[i] = st_node_num(c->t, e);
	}
	*n = i;
	return 0;
}

static int st_tensor(struct st_ctx *c, uint32_t obj, size_t k)
{
	struct st_fields f = { 0 };
	enum castfs_dtype dt = CASTFS_DTYPE_INVALID;
	uint64_t off[2] = { 0, 0 };
	size_t ndim = 0, noff = 0;
	int rc;

	if (st_kind(c, obj) != ST_OBJECT)
		return st_terr(c, k, -EINVAL, "expected an object, got %s",
			       st_type(c, obj));
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
			       "data_offsets must have 2 entries, got %zu",
			       noff);
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

static int st_walk(struct st_ctx *c)
{
	c->next = c->nt = c->nmeta = c->ndims = c->nchars = 0;
	c->seen_meta = c->has_meta = false;
	for (uint32_t it = st_child(c, 0); it; it = st_next(c, it)) {
		size_t k = c->next++;
		int rc = st_tok_is(c, k, ST_META) ? st_meta(c, it) :
						    st_tensor(c, it, k);

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
	h->meta_text = &h->meta_store;
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
			return castfs_diag_set(
				d, -EINVAL, "duplicate tensor name '%s'",
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
				       " is before begin %" PRIu64,
				       s, t->end, t->begin);
	if (!prev && t->begin)
		return castfs_diag_set(
			d, -EINVAL,
			"tensor '%s': data_offsets begin at %" PRIu64
			", but the first tensor must begin at 0",
			s, t->begin);
	if (t->begin != start)
		return castfs_diag_set(
			d, -EINVAL,
			"tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
			") %s '%s', which ends at %" PRIu64,
			s, t->begin, t->end,
			t->begin > start ? "leave a hole after" : "overlap",
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
		return castfs_diag_set(
			d, -EOVERFLOW,
			"tensor '%s': shape product overflows 64 bits", s);
	if (castfs_ckd_mul(&nbits, t->nelems, bits))
		return castfs_diag_set(d, -EOVERFLOW,
				       "tensor '%s': %" PRIu64
				       " elements of %s: bit count "
				       "overflows 64 bits",
				       s, t->nelems, dt);
	if (nbits % 8)
		return castfs_diag_set(d, -EINVAL,
				       "tensor '%s': %" PRIu64
				       " elements of %u-bit %s do not "
				       "fill whole bytes",
				       s, t->nelems, bits, dt);
	if (t->end - t->begin != nbits / 8)
		return castfs_diag_set(d, -EINVAL,
				       "tensor '%s': data_offsets [%" PRIu64
				       ",%" PRIu64 ") hold %" PRIu64
				       " bytes, but %" PRIu64
				       " elements of %s need %" PRIu64,
				       s, t->begin, t->end, t->end - t->begin,
				       t->nelems, dt, nbits / 8);
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
				       "data end %" PRIu64 " + %" PRIu64
				       " overflows 64 bits",
				       h->data_start, start);
	if (end != file_size)
		return castfs_diag_set(
			d, -EINVAL,
			"data ends at file byte %" PRIu64 " (8 + %" PRIu64
			" + %" PRIu64 ") but the file has %" PRIu64
			" bytes (%s)",
			end, h->header_len, start, file_size,
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
				       "file of %" PRIu64
				       " bytes is shorter than the "
				       "8-byte header length",
				       file_size);
	if (buf_len < 8)
		return castfs_diag_set(
			d, -EINVAL,
			"buffer of %zu bytes lacks the 8-byte header length",
			buf_len);
	v = castfs_load_le64(buf);
	if (v > CASTFS_HEADER_MAX)
		return castfs_diag_set(d, -E2BIG,
				       "header length %" PRIu64
				       " exceeds the %u-byte limit",
				       v, CASTFS_HEADER_MAX);
	if (8 + v > file_size)
		return castfs_diag_set(d, -EINVAL,
				       "header length %" PRIu64
				       " past end of file (size %" PRIu64 ")",
				       v, file_size);
	*n = v;
	return 0;
}

static int st_build(const struct st_lex *lx, const struct st_tree *t,
		    uint64_t n, uint64_t file_size, struct castfs_header **out)
{
	struct st_ctx c = { .js = lx->js, .str = lx->str, .t = t, .d = lx->d };
	struct castfs_header *h = NULL;
	int rc;

	if (st_kind(&c, 0) != ST_OBJECT)
		return castfs_diag_set(lx->d, -EINVAL,
				       "header JSON is not an object");
	rc = st_walk(&c);
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
	rc = st_walk(&c);
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
	struct st_tree t = { 0 };
	uint64_t n;
	int rc;

	rc = st_prefix(buf, buf_len, file_size, &n, d);
	if (rc)
		return rc;
	if (buf_len - 8 < n)
		return castfs_diag_set(
			d, -EINVAL,
			"buffer of %zu bytes is shorter than the %" PRIu64
			"-byte header",
			buf_len, 8 + n);
	lx.js = (const uint8_t *)buf + 8;
	lx.len = (size_t)n;
	rc = st_lex(&lx);
	if (!rc)
		rc = st_tree_parse(&lx, &t);
	if (!rc)
		rc = st_build(&lx, &t, n, file_size, out);
	st_tree_free(&t);
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
			return castfs_diag_set(
				d, rc,
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
		castfs_diag_set(d, rc,
				"reading the %" PRIu64
				"-byte header failed (errno %d)",
				n, -rc);
	else
		rc = castfs_header_parse(buf, (size_t)n + 8, file_size, out, d);
	free(buf);
	return rc;
}

void castfs_header_free(struct castfs_header *h)
{
	if (!h)
		return;
	castfs_side_free(h->side);
	castfs_shared_put(
		atomic_load_explicit(&h->meta_store, memory_order_acquire));
	free(h); /* one block; see st_alloc() */
}

/* The index in h->by_name of the first name not below @name (@len). */
static size_t st_lower_bound(const struct castfs_header *h, const char *name,
			     size_t len)
{
	size_t lo = 0, hi = h ? h->ntensors : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct castfs_tensor *t = h->by_name[mid];

		if (st_cmp_bytes(t->name, t->name_len, name, len) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

const struct castfs_tensor *castfs_header_find(const struct castfs_header *h,
					       const char *name, size_t len)
{
	size_t i = st_lower_bound(h, name, len);
	const struct castfs_tensor *t = h && i < h->ntensors ? h->by_name[i] :
							       NULL;

	return t && !st_cmp_bytes(t->name, t->name_len, name, len) ? t : NULL;
}

bool castfs_header_has_prefix(const struct castfs_header *h, const char *pre,
			      size_t len)
{
	size_t i = st_lower_bound(h, pre, len);
	const struct castfs_tensor *t = h && i < h->ntensors ? h->by_name[i] :
							       NULL;

	/* a name with the prefix sorts first among those not below it */
	return t && t->name_len >= len && !memcmp(t->name, pre, len);
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
