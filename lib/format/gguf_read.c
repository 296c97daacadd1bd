/* SPDX-License-Identifier: MIT */
/*
 * The GGUF header reader (format/gguf_read.h), after ggml's gguf.cpp
 * gguf_init_from_file: magic "GGUF", version, tensor and KV counts, the
 * KVs, the tensor infos, then the data section at the header's end
 * rounded up to general.alignment (32 by default). Every length is
 * checked against what the file can still hold before anything is
 * allocated for it, so a hostile count costs nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "format/gguf_read.h"

/* Bounds beyond which a header is refused rather than believed. */
#define MAX_TENSORS (1u << 20)
#define MAX_KVS (1u << 20)
#define MAX_STR (1u << 24)
#define MAX_DEPTH 4

/* A forward-only cursor over the file, buffered. */
struct cur {
	const struct castfs_reader *r;
	uint64_t size, off; /* file size, position */
	uint8_t buf[65536];
	uint64_t boff; /* file offset of buf[0] */
	size_t blen;
	struct castfs_diag *d;
};

static int need(struct cur *c, uint64_t n)
{
	if (n > c->size - c->off)
		return castfs_diag_set(c->d, -EINVAL,
				       "GGUF: header runs past the end of the "
				       "file at byte %llu",
				       (unsigned long long)c->off);
	return 0;
}

/* Copy @n bytes at the cursor to @dst (NULL: skip them). */
static int take(struct cur *c, void *dst, uint64_t n)
{
	uint8_t *p = dst;
	int rc = need(c, n);

	while (!rc && n) {
		uint64_t in = c->off - c->boff;
		size_t k;

		if (c->off < c->boff || in >= c->blen) {
			c->boff = c->off;
			c->blen = c->size - c->off < sizeof(c->buf) ?
					  (size_t)(c->size - c->off) :
					  sizeof(c->buf);
			rc = castfs_reader_read(c->r, c->buf, c->blen, c->boff);
			if (rc)
				return rc;
			in = 0;
		}
		k = c->blen - in < n ? c->blen - (size_t)in : (size_t)n;
		if (p) {
			memcpy(p, c->buf + in, k);
			p += k;
		}
		c->off += k;
		n -= k;
	}
	return rc;
}

static int u32(struct cur *c, uint32_t *v)
{
	uint8_t b[4];
	int rc = take(c, b, 4);

	if (!rc)
		*v = castfs_load_le32(b);
	return rc;
}

static int u64(struct cur *c, uint64_t *v)
{
	uint8_t b[8];
	int rc = take(c, b, 8);

	if (!rc)
		*v = castfs_load_le64(b);
	return rc;
}

/* A GGUF string: u64 length, bytes. Copied (NUL-terminated) when @out. */
static int str(struct cur *c, char **out, uint64_t *len)
{
	uint64_t n;
	int rc = u64(c, &n);

	if (!rc && n > MAX_STR)
		rc = castfs_diag_set(c->d, -EINVAL,
				     "GGUF: a string of %llu "
				     "bytes",
				     (unsigned long long)n);
	if (!rc)
		rc = need(c, n);
	if (rc || !out)
		return rc ? rc : take(c, NULL, n);
	*out = malloc((size_t)n + 1);
	if (!*out)
		return -ENOMEM;
	rc = take(c, *out, n);
	(*out)[n] = '\0';
	if (len)
		*len = n;
	return rc;
}

static const uint8_t vsize[CASTFS_GGUF_V_COUNT] = {
	[CASTFS_GGUF_V_U8] = 1,	 [CASTFS_GGUF_V_I8] = 1,
	[CASTFS_GGUF_V_U16] = 2, [CASTFS_GGUF_V_I16] = 2,
	[CASTFS_GGUF_V_U32] = 4, [CASTFS_GGUF_V_I32] = 4,
	[CASTFS_GGUF_V_F32] = 4, [CASTFS_GGUF_V_BOOL] = 1,
	[CASTFS_GGUF_V_U64] = 8, [CASTFS_GGUF_V_I64] = 8,
	[CASTFS_GGUF_V_F64] = 8,
};

static float f32_of(uint32_t w)
{
	float f;

	memcpy(&f, &w, 4);
	return f;
}

/* A scalar of type @t into @kv. */
static int scalar(struct cur *c, uint32_t t, struct castfs_gguf_kv *kv)
{
	uint8_t b[8] = { 0 };
	uint64_t u;
	int rc = take(c, b, vsize[t]);

	if (rc)
		return rc;
	u = castfs_load_le64(b);
	if (t == CASTFS_GGUF_V_I8)
		kv->v.i = (int8_t)b[0];
	else if (t == CASTFS_GGUF_V_I16)
		kv->v.i = (int16_t)(uint16_t)u;
	else if (t == CASTFS_GGUF_V_I32)
		kv->v.i = (int32_t)(uint32_t)u;
	else if (t == CASTFS_GGUF_V_I64)
		kv->v.i = (int64_t)u;
	else if (t == CASTFS_GGUF_V_F64)
		memcpy(&kv->v.f, &u, 8);
	else if (t == CASTFS_GGUF_V_F32)
		kv->v.f = f32_of((uint32_t)u);
	else
		kv->v.u = u; /* unsigned and bool: zero-extended */
	return 0;
}

/* Skip an array's elements (strings and nested arrays walked). */
static int skip_array(struct cur *c, uint32_t t, uint64_t n, int depth)
{
	uint64_t bytes;
	int rc = 0;

	if (t >= CASTFS_GGUF_V_COUNT)
		return castfs_diag_set(c->d, -EINVAL,
				       "GGUF: array of unknown type %u", t);
	/* a string takes at least 8 bytes, a nested array 12: a count the
	 * file cannot hold fails before the walk */
	if ((t == CASTFS_GGUF_V_STRING || t == CASTFS_GGUF_V_ARRAY) &&
	    n > (c->size - c->off) / 8)
		return need(c, UINT64_MAX);
	if (t == CASTFS_GGUF_V_STRING) {
		for (uint64_t i = 0; !rc && i < n; i++)
			rc = str(c, NULL, NULL);
		return rc;
	}
	if (t == CASTFS_GGUF_V_ARRAY) {
		if (depth >= MAX_DEPTH)
			return castfs_diag_set(c->d, -EINVAL,
					       "GGUF: arrays nested too deep");
		for (uint64_t i = 0; !rc && i < n; i++) {
			uint32_t et = 0;
			uint64_t en = 0;

			rc = u32(c, &et);
			if (!rc)
				rc = u64(c, &en);
			if (!rc)
				rc = skip_array(c, et, en, depth + 1);
		}
		return rc;
	}
	if (castfs_ckd_mul(&bytes, n, vsize[t]))
		return need(c, UINT64_MAX);
	return take(c, NULL, bytes);
}

static int read_kv(struct cur *c, struct castfs_gguf_kv *kv)
{
	int rc = str(c, &kv->key, NULL);

	if (!rc)
		rc = u32(c, &kv->type);
	if (rc)
		return rc;
	if (kv->type >= CASTFS_GGUF_V_COUNT)
		return castfs_diag_set(c->d, -EINVAL,
				       "GGUF: KV '%.64s' of unknown type %u",
				       kv->key, kv->type);
	if (kv->type == CASTFS_GGUF_V_STRING)
		return str(c, &kv->str, &kv->str_len);
	if (kv->type != CASTFS_GGUF_V_ARRAY)
		return scalar(c, kv->type, kv);
	rc = u32(c, &kv->arr_type);
	if (!rc)
		rc = u64(c, &kv->arr_n);
	return rc ? rc : skip_array(c, kv->arr_type, kv->arr_n, 1);
}

/* ggml's type table, for names and sizes (ggml.c type_traits). */
static const struct {
	const char *name;
	uint16_t blck, bytes;
} ggml_types[] = {
	[0] = { "f32", 1, 4 },	     [1] = { "f16", 1, 2 },
	[2] = { "q4_0", 32, 18 },    [3] = { "q4_1", 32, 20 },
	[6] = { "q5_0", 32, 22 },    [7] = { "q5_1", 32, 24 },
	[8] = { "q8_0", 32, 34 },    [9] = { "q8_1", 32, 36 },
	[10] = { "q2_K", 256, 84 },  [11] = { "q3_K", 256, 110 },
	[12] = { "q4_K", 256, 144 }, [13] = { "q5_K", 256, 176 },
	[14] = { "q6_K", 256, 210 }, [15] = { "q8_K", 256, 292 },
	[24] = { "i8", 1, 1 },	     [25] = { "i16", 1, 2 },
	[26] = { "i32", 1, 4 },	     [27] = { "i64", 1, 8 },
	[28] = { "f64", 1, 8 },	     [30] = { "bf16", 1, 2 },
};

const char *castfs_gguf_type_name(uint32_t type, unsigned *blck,
				  unsigned *bytes)
{
	bool known = type < sizeof(ggml_types) / sizeof(ggml_types[0]) &&
		     ggml_types[type].name;

	if (blck)
		*blck = known ? ggml_types[type].blck : 0;
	if (bytes)
		*bytes = known ? ggml_types[type].bytes : 0;
	return known ? ggml_types[type].name : NULL;
}

const char *castfs_gguf_vtype_name(uint32_t type)
{
	static const char *const names[CASTFS_GGUF_V_COUNT] = {
		"u8",	"i8",	  "u16",   "i16", "u32", "i32", "f32",
		"bool", "string", "array", "u64", "i64", "f64",
	};

	return type < CASTFS_GGUF_V_COUNT ? names[type] : NULL;
}

static int read_ti(struct cur *c, struct castfs_gguf_ti *t)
{
	uint64_t nel = 1;
	unsigned blck, bytes;
	int rc = str(c, &t->name, NULL);

	if (!rc)
		rc = u32(c, &t->ndim);
	if (!rc && (t->ndim < 1 || t->ndim > 4))
		rc = castfs_diag_set(c->d, -EINVAL,
				     "GGUF: tensor '%.64s' has %u dimensions",
				     t->name, t->ndim);
	for (uint32_t i = 0; !rc && i < t->ndim; i++) {
		rc = u64(c, &t->ne[i]);
		if (!rc && castfs_ckd_mul(&nel, nel, t->ne[i]))
			rc = castfs_diag_set(c->d, -EINVAL,
					     "GGUF: tensor '%.64s' shape "
					     "overflows",
					     t->name);
	}
	if (!rc)
		rc = u32(c, &t->type);
	if (!rc)
		rc = u64(c, &t->offset);
	if (rc || !castfs_gguf_type_name(t->type, &blck, &bytes))
		return rc;
	if (t->ne[0] % blck || castfs_ckd_mul(&t->nbytes, nel / blck, bytes))
		return castfs_diag_set(c->d, -EINVAL,
				       "GGUF: tensor '%.64s' rows are not "
				       "whole %s blocks",
				       t->name, ggml_types[t->type].name);
	return 0;
}

/* general.alignment, when set: a u32 power of two. */
static int alignment(struct castfs_gguf_file *f, struct castfs_diag *d)
{
	const struct castfs_gguf_kv *kv =
		castfs_gguf_kv_find(f, "general.alignment");

	f->alignment = 32;
	if (!kv)
		return 0;
	if (kv->type != CASTFS_GGUF_V_U32 || !kv->v.u ||
	    (kv->v.u & (kv->v.u - 1)))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: general.alignment is not a "
				       "u32 power of two");
	f->alignment = (uint32_t)kv->v.u;
	return 0;
}

/* Data offsets aligned and within the file. */
static int check_data(struct castfs_gguf_file *f, struct castfs_diag *d)
{
	uint64_t start = f->data_start;

	for (uint64_t i = 0; i < f->ntensors; i++) {
		const struct castfs_gguf_ti *t = &f->t[i];
		uint64_t end;

		if (t->offset % f->alignment)
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: tensor '%.64s' offset "
					       "is not aligned",
					       t->name);
		if (castfs_ckd_add(&end, start, t->offset) ||
		    castfs_ckd_add(&end, end, t->nbytes) || end > f->size)
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: tensor '%.64s' ends "
					       "past the end of the file",
					       t->name);
	}
	return 0;
}

static int read_all(struct cur *c, struct castfs_gguf_file *f)
{
	uint8_t magic[4];
	int rc = take(c, magic, 4);

	if (!rc && memcmp(magic, "GGUF", 4))
		rc = castfs_diag_set(c->d, -EINVAL, "not a GGUF file");
	if (!rc)
		rc = u32(c, &f->version);
	if (!rc && f->version != 2 && f->version != 3)
		rc = castfs_diag_set(c->d, -EINVAL,
				     "GGUF: version %u (castfs reads 2, 3)",
				     f->version);
	if (!rc)
		rc = u64(c, &f->ntensors);
	if (!rc)
		rc = u64(c, &f->nkv);
	if (!rc && (f->ntensors > MAX_TENSORS || f->nkv > MAX_KVS))
		rc = castfs_diag_set(c->d, -EINVAL,
				     "GGUF: %llu tensors, %llu KVs",
				     (unsigned long long)f->ntensors,
				     (unsigned long long)f->nkv);
	/* each KV and tensor info takes at least 8 bytes */
	if (!rc)
		rc = need(c, (f->ntensors + f->nkv) * 8);
	if (!rc) {
		f->kv = calloc(f->nkv ? f->nkv : 1, sizeof(*f->kv));
		f->t = calloc(f->ntensors ? f->ntensors : 1, sizeof(*f->t));
		if (!f->kv || !f->t)
			rc = -ENOMEM;
	}
	for (uint64_t i = 0; !rc && i < f->nkv; i++)
		rc = read_kv(c, &f->kv[i]);
	for (uint64_t i = 0; !rc && i < f->ntensors; i++)
		rc = read_ti(c, &f->t[i]);
	if (!rc)
		rc = alignment(f, c->d);
	if (!rc) {
		f->data_start = (c->off + f->alignment - 1) / f->alignment *
				f->alignment;
		if (f->data_start > f->size && f->ntensors)
			rc = need(c, f->data_start - c->off);
	}
	return rc ? rc : check_data(f, c->d);
}

int castfs_gguf_read(const struct castfs_reader *r, uint64_t size,
		     struct castfs_gguf_file **out, struct castfs_diag *d)
{
	struct castfs_gguf_file *f = calloc(1, sizeof(*f));
	struct cur *c = malloc(sizeof(*c));
	int rc = f && c ? 0 : -ENOMEM;

	if (!rc) {
		*c = (struct cur){ .r = r, .size = size, .d = d };
		f->size = size;
		rc = read_all(c, f);
	}
	free(c);
	if (rc) {
		castfs_gguf_file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

void castfs_gguf_file_free(struct castfs_gguf_file *f)
{
	if (!f)
		return;
	for (uint64_t i = 0; f->kv && i < f->nkv; i++) {
		free(f->kv[i].key);
		free(f->kv[i].str);
	}
	for (uint64_t i = 0; f->t && i < f->ntensors; i++)
		free(f->t[i].name);
	free(f->kv);
	free(f->t);
	free(f);
}

const struct castfs_gguf_kv *
castfs_gguf_kv_find(const struct castfs_gguf_file *f, const char *key)
{
	for (uint64_t i = 0; i < f->nkv; i++)
		if (f->kv[i].key && !strcmp(f->kv[i].key, key))
			return &f->kv[i];
	return NULL;
}
