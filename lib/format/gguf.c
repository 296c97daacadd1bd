/* SPDX-License-Identifier: MIT */
/*
 * GGUF v3 header bytes (ggml docs/gguf.md, src/gguf.cpp): little-endian
 * throughout, strings as u64 length + bytes, tensor dimensions fastest
 * first. The layout rules are the reader's checks in gguf.cpp, so that
 * ggml and gguf-py accept every file castfs writes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "common/strbuf.h"
#include "format/gguf.h"

enum {
	GGUF_T_UINT32 = 4,
	GGUF_T_INT32 = 5,
	GGUF_T_FLOAT32 = 6,
	GGUF_T_BOOL = 7,
	GGUF_T_STRING = 8,
	GGUF_T_ARRAY = 9
};

struct castfs_gguf_w {
	struct castfs_strbuf kv, ti;
	uint64_t nkv, nt;
	uint64_t data_len; /* running, each tensor padded */
};

int castfs_gguf_w_new(struct castfs_gguf_w **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void castfs_gguf_w_free(struct castfs_gguf_w *w)
{
	if (!w)
		return;
	castfs_sb_fini(&w->kv);
	castfs_sb_fini(&w->ti);
	free(w);
}

static void put_u32(struct castfs_strbuf *b, uint32_t v)
{
	uint8_t x[4];

	castfs_store_le32(x, v);
	castfs_sb_put(b, x, sizeof(x));
}

static void put_u64(struct castfs_strbuf *b, uint64_t v)
{
	uint8_t x[8];

	castfs_store_le64(x, v);
	castfs_sb_put(b, x, sizeof(x));
}

static void put_str(struct castfs_strbuf *b, const char *s, size_t n)
{
	put_u64(b, n);
	castfs_sb_put(b, s, n);
}

static void kv_key(struct castfs_gguf_w *w, const char *key, uint32_t type)
{
	put_str(&w->kv, key, strlen(key));
	put_u32(&w->kv, type);
	w->nkv++;
}

void castfs_gguf_kv_str(struct castfs_gguf_w *w, const char *key,
			const char *val)
{
	kv_key(w, key, GGUF_T_STRING);
	put_str(&w->kv, val, strlen(val));
}

void castfs_gguf_kv_u32(struct castfs_gguf_w *w, const char *key, uint32_t val)
{
	kv_key(w, key, GGUF_T_UINT32);
	put_u32(&w->kv, val);
}

void castfs_gguf_kv_i32_array(struct castfs_gguf_w *w, const char *key,
			      const int32_t *vals, size_t n)
{
	kv_key(w, key, GGUF_T_ARRAY);
	put_u32(&w->kv, GGUF_T_INT32);
	put_u64(&w->kv, n);
	for (size_t i = 0; i < n; i++)
		put_u32(&w->kv, (uint32_t)vals[i]);
}

void castfs_gguf_kv_f32(struct castfs_gguf_w *w, const char *key, float val)
{
	kv_key(w, key, GGUF_T_FLOAT32);
	put_u32(&w->kv, castfs_f32_bits(val));
}

void castfs_gguf_kv_bool(struct castfs_gguf_w *w, const char *key, bool val)
{
	uint8_t b = val ? 1 : 0;

	kv_key(w, key, GGUF_T_BOOL);
	castfs_sb_put(&w->kv, &b, 1);
}

void castfs_gguf_kv_array(struct castfs_gguf_w *w, const char *key,
			  uint32_t type, uint64_t n)
{
	kv_key(w, key, GGUF_T_ARRAY);
	put_u32(&w->kv, type);
	put_u64(&w->kv, n);
}

void castfs_gguf_arr_str(struct castfs_gguf_w *w, const char *s, size_t len)
{
	put_str(&w->kv, s, len);
}

void castfs_gguf_arr_i32(struct castfs_gguf_w *w, int32_t v)
{
	put_u32(&w->kv, (uint32_t)v);
}

void castfs_gguf_arr_f32(struct castfs_gguf_w *w, float v)
{
	put_u32(&w->kv, castfs_f32_bits(v));
}

unsigned castfs_gguf_blck(enum castfs_ggml_type type, unsigned *bytes)
{
	switch (type) {
	case CASTFS_GGML_F32:
		*bytes = 4;
		return 1;
	case CASTFS_GGML_F16:
	case CASTFS_GGML_BF16:
		*bytes = 2;
		return 1;
	case CASTFS_GGML_Q8_0:
		*bytes = 34;
		return 32;
	case CASTFS_GGML_Q4_0:
		*bytes = 18;
		return 32;
	case CASTFS_GGML_Q4_1:
		*bytes = 20;
		return 32;
	case CASTFS_GGML_Q5_0:
		*bytes = 22;
		return 32;
	case CASTFS_GGML_Q5_1:
		*bytes = 24;
		return 32;
	case CASTFS_GGML_Q4_K:
		*bytes = 144;
		return 256;
	case CASTFS_GGML_Q5_K:
		*bytes = 176;
		return 256;
	case CASTFS_GGML_Q6_K:
		*bytes = 210;
		return 256;
	}
	*bytes = 0;
	return 0;
}

int castfs_gguf_nbytes(enum castfs_ggml_type type, uint64_t nelems,
		       uint64_t ne0, uint64_t *out)
{
	unsigned bytes, blck = castfs_gguf_blck(type, &bytes);

	if (!blck || ne0 % blck)
		return -EINVAL;
	if (castfs_ckd_mul(out, nelems / blck, bytes))
		return -EOVERFLOW;
	return 0;
}

static uint64_t pad_to(uint64_t n, uint64_t a)
{
	return (n + a - 1) / a * a;
}

int castfs_gguf_tensor(struct castfs_gguf_w *w, const char *name, size_t len,
		       uint32_t ndim, const uint64_t *shape,
		       enum castfs_ggml_type type, uint64_t *data_off,
		       uint64_t *nbytes)
{
	uint64_t nelems = 1, end;
	int rc;

	if (len == 0 || len >= CASTFS_GGUF_NAME_MAX || memchr(name, 0, len) ||
	    ndim == 0 || ndim > CASTFS_GGUF_MAX_DIMS)
		return -EINVAL;
	for (uint32_t i = 0; i < ndim; i++) {
		if (castfs_ckd_mul(&nelems, nelems, shape[i]))
			return -EOVERFLOW;
	}
	rc = castfs_gguf_nbytes(type, nelems, shape[ndim - 1], nbytes);
	if (rc)
		return rc;
	if (castfs_ckd_add(&end, w->data_len, *nbytes) ||
	    end > UINT64_MAX - CASTFS_GGUF_ALIGN)
		return -EOVERFLOW;
	put_str(&w->ti, name, len);
	put_u32(&w->ti, ndim);
	for (uint32_t i = 0; i < ndim; i++)
		put_u64(&w->ti, shape[ndim - 1 - i]);
	put_u32(&w->ti, (uint32_t)type);
	put_u64(&w->ti, w->data_len);
	*data_off = w->data_len;
	w->data_len = pad_to(end, CASTFS_GGUF_ALIGN);
	w->nt++;
	return 0;
}

int castfs_gguf_w_finish(struct castfs_gguf_w *w, uint8_t **hdr, size_t *len,
			 uint64_t *data_len)
{
	struct castfs_strbuf b = { 0 };
	static const uint8_t zeros[CASTFS_GGUF_ALIGN];
	char *p;
	size_t n;

	if (w->kv.oom || w->ti.oom)
		return -ENOMEM;
	castfs_sb_put(&b, "GGUF", 4);
	put_u32(&b, 3);
	put_u64(&b, w->nt);
	put_u64(&b, w->nkv);
	if (w->kv.len)
		castfs_sb_put(&b, w->kv.p, w->kv.len);
	if (w->ti.len)
		castfs_sb_put(&b, w->ti.p, w->ti.len);
	castfs_sb_put(&b, zeros,
		      (size_t)(pad_to(b.len, CASTFS_GGUF_ALIGN) - b.len));
	if (castfs_sb_take(&b, &p, &n))
		return -ENOMEM;
	*hdr = (uint8_t *)p;
	*len = n;
	*data_len = w->data_len;
	return 0;
}

uint32_t castfs_gguf_file_type(enum castfs_ggml_type t)
{
	switch (t) {
	case CASTFS_GGML_F32:
		return 0;
	case CASTFS_GGML_F16:
		return 1;
	case CASTFS_GGML_Q4_0:
		return 2;
	case CASTFS_GGML_Q4_1:
		return 3;
	case CASTFS_GGML_Q8_0:
		return 7;
	case CASTFS_GGML_BF16:
		return 32;
	case CASTFS_GGML_Q5_0:
		return 8;
	case CASTFS_GGML_Q5_1:
		return 9;
	case CASTFS_GGML_Q4_K:
		return 15;
	case CASTFS_GGML_Q5_K:
		return 17;
	case CASTFS_GGML_Q6_K:
		return 18;
	}
	return 0;
}
