/* SPDX-License-Identifier: MIT */
/*
 * The GGUF v3 header writer (docs/FORMATS.md "GGUF views"): metadata KVs
 * and tensor infos collected in call order, tensor data offsets laid out
 * with ggml's rules (each tensor padded to the alignment, offsets exactly
 * sequential), the header padded to the alignment. Sizes only: no tensor
 * byte is read.
 */
#ifndef CASTFS_GGUF_H
#define CASTFS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The ggml types castfs writes (ggml.h enum ggml_type). */
enum castfs_ggml_type {
	CASTFS_GGML_F32 = 0,
	CASTFS_GGML_F16 = 1,
	CASTFS_GGML_Q4_0 = 2,
	CASTFS_GGML_Q4_1 = 3,
	CASTFS_GGML_Q5_0 = 6,
	CASTFS_GGML_Q5_1 = 7,
	CASTFS_GGML_Q8_0 = 8,
	CASTFS_GGML_Q4_K = 12,
	CASTFS_GGML_Q5_K = 13,
	CASTFS_GGML_Q6_K = 14,
	CASTFS_GGML_BF16 = 30,
};

/* GGUF's default alignment (gguf.h GGUF_DEFAULT_ALIGNMENT). */
#define CASTFS_GGUF_ALIGN 32u

/* Tensor names must be shorter than this: llama.cpp's GGML_MAX_NAME is
 * 64, ComfyUI-GGUF's patched build and convert.py allow 127 characters;
 * the view builders apply the limit of their reader. */
#define CASTFS_GGUF_NAME_MAX 128u

/* At most this many dimensions (GGML_MAX_DIMS). */
#define CASTFS_GGUF_MAX_DIMS 4u

struct castfs_gguf_w;

/* castfs_gguf_w_new - an empty writer. Returns 0 or -ENOMEM. */
int castfs_gguf_w_new(struct castfs_gguf_w **out);

/* castfs_gguf_w_free - release @w; NULL is fine. */
void castfs_gguf_w_free(struct castfs_gguf_w *w);

/*
 * castfs_gguf_kv_str / _u32 / _i32_array - append a metadata KV (copied).
 * Keys are not checked for duplicates: the caller writes each once.
 * Allocation failure is sticky and reported by castfs_gguf_w_finish().
 */
void castfs_gguf_kv_str(struct castfs_gguf_w *w, const char *key,
			const char *val);
void castfs_gguf_kv_u32(struct castfs_gguf_w *w, const char *key, uint32_t val);
void castfs_gguf_kv_i32_array(struct castfs_gguf_w *w, const char *key,
			      const int32_t *vals, size_t n);

void castfs_gguf_kv_f32(struct castfs_gguf_w *w, const char *key, float val);
void castfs_gguf_kv_bool(struct castfs_gguf_w *w, const char *key, bool val);

/*
 * castfs_gguf_kv_array - start an array KV of @n elements of GGUF value
 * type @type (CASTFS_GGUF_T_*); the elements follow, in order, through
 * castfs_gguf_arr_str / _i32 / _f32 (exactly @n of them).
 */
void castfs_gguf_kv_array(struct castfs_gguf_w *w, const char *key,
			  uint32_t type, uint64_t n);
void castfs_gguf_arr_str(struct castfs_gguf_w *w, const char *s, size_t len);
void castfs_gguf_arr_i32(struct castfs_gguf_w *w, int32_t v);
void castfs_gguf_arr_f32(struct castfs_gguf_w *w, float v);

/* GGUF value types of array elements. */
#define CASTFS_GGUF_T_INT32 5u
#define CASTFS_GGUF_T_FLOAT32 6u
#define CASTFS_GGUF_T_STRING 8u

/*
 * castfs_gguf_blck - elements per block and bytes per block of @type;
 * 0 when castfs does not write @type.
 */
unsigned castfs_gguf_blck(enum castfs_ggml_type type, unsigned *bytes);

/*
 * castfs_gguf_nbytes - bytes of a tensor of @nelems elements of @type whose
 * last torch dimension is @ne0. Returns 0 into *@out, -EINVAL when @ne0 is
 * not a whole number of blocks or @type unknown, -EOVERFLOW.
 */
int castfs_gguf_nbytes(enum castfs_ggml_type type, uint64_t nelems,
		       uint64_t ne0, uint64_t *out);

/*
 * castfs_gguf_tensor - append a tensor info: @name (@len bytes, < 64,
 * no NUL), @ndim (1..4) dimensions @shape in torch order (written
 * reversed), @type. Its data offset (relative to the data section) goes
 * to *@data_off and its size to *@nbytes. Returns 0, -EINVAL (name, rank,
 * rows not whole blocks), -EOVERFLOW, -ENOMEM.
 */
int castfs_gguf_tensor(struct castfs_gguf_w *w, const char *name, size_t len,
		       uint32_t ndim, const uint64_t *shape,
		       enum castfs_ggml_type type, uint64_t *data_off,
		       uint64_t *nbytes);

/*
 * castfs_gguf_w_finish - the header bytes (magic, counts, KVs, tensor
 * infos, zero padding to CASTFS_GGUF_ALIGN), malloc'ed into *@hdr, its
 * length in *@len, and the data section's size (every tensor padded) in
 * *@data_len. @w is left as it was. Returns 0 or -ENOMEM.
 */
int castfs_gguf_w_finish(struct castfs_gguf_w *w, uint8_t **hdr, size_t *len,
			 uint64_t *data_len);

/* castfs_gguf_file_type - the llama_ftype (general.file_type) of a file
 * whose large tensors are of type @t: 0 F32, 1 F16, 2 Q4_0, 7 Q8_0,
 * 32 BF16, 8 Q5_0, 9 Q5_1; a K type names llama-quantize's mix castfs
 * builds for it: Q4_K 15 (Q4_K_M), Q5_K 17 (Q5_K_M), Q6_K 18. Pure. */
uint32_t castfs_gguf_file_type(enum castfs_ggml_type t);

#endif
