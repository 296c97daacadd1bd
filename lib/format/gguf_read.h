/* SPDX-License-Identifier: MIT */
/*
 * A strict GGUF (v2/v3) header reader for `castfs info`: the KVs (scalars
 * kept, arrays summarised by element type and count), the tensor infos,
 * and the data section's start, every offset and count checked against
 * the file size. Reads only the header, never tensor data.
 */
#ifndef CASTFS_GGUF_READ_H
#define CASTFS_GGUF_READ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/reader.h"

/* GGUF value types (gguf.h enum gguf_type). */
enum castfs_gguf_vtype {
	CASTFS_GGUF_V_U8,
	CASTFS_GGUF_V_I8,
	CASTFS_GGUF_V_U16,
	CASTFS_GGUF_V_I16,
	CASTFS_GGUF_V_U32,
	CASTFS_GGUF_V_I32,
	CASTFS_GGUF_V_F32,
	CASTFS_GGUF_V_BOOL,
	CASTFS_GGUF_V_STRING,
	CASTFS_GGUF_V_ARRAY,
	CASTFS_GGUF_V_U64,
	CASTFS_GGUF_V_I64,
	CASTFS_GGUF_V_F64,
	CASTFS_GGUF_V_COUNT,
};

/* One metadata KV. */
struct castfs_gguf_kv {
	char *key;
	uint32_t type; /* enum castfs_gguf_vtype */
	uint32_t arr_type; /* ARRAY: the element type */
	uint64_t arr_n; /* ARRAY: the element count */
	union {
		uint64_t u; /* unsigned integers, bool */
		int64_t i; /* signed integers */
		double f; /* F32, F64 */
	} v;
	char *str; /* STRING (NUL-terminated copy; may hold NULs) */
	uint64_t str_len;
};

/* One tensor info; shape in GGUF order (ne[0] first, fastest). */
struct castfs_gguf_ti {
	char *name;
	uint32_t ndim;
	uint64_t ne[4];
	uint32_t type; /* ggml type id */
	uint64_t offset; /* relative to the data section */
	uint64_t nbytes; /* 0 when the type is unknown to castfs */
};

struct castfs_gguf_file {
	uint32_t version;
	uint32_t alignment;
	uint64_t nkv, ntensors;
	struct castfs_gguf_kv *kv;
	struct castfs_gguf_ti *t;
	uint64_t data_start; /* absolute; a multiple of alignment */
	uint64_t size; /* the file's size */
};

/*
 * castfs_gguf_read - parse the GGUF header of the @size-byte file behind
 * @r. Rejects (-EINVAL, reason in @d) a bad magic or version, counts or
 * lengths the file cannot hold, unknown value types, arrays nested deeper
 * than 4, a non power-of-two general.alignment, tensor infos with more
 * than 4 dimensions, misaligned offsets, and tensors of a known type that
 * end past the file. On success *@out is the caller's, freed with
 * castfs_gguf_file_free(). -ENOMEM, or the reader's errno. Reentrant.
 */
int castfs_gguf_read(const struct castfs_reader *r, uint64_t size,
		     struct castfs_gguf_file **out, struct castfs_diag *d);

/* castfs_gguf_file_free - release @f; NULL is fine. */
void castfs_gguf_file_free(struct castfs_gguf_file *f);

/* castfs_gguf_type_name - ggml's name of type id @type ("q8_0"), or NULL
 * for ids castfs does not know; with its block size in elements and
 * bytes (@blck, @bytes may be NULL). Pure. */
const char *castfs_gguf_type_name(uint32_t type, unsigned *blck,
				  unsigned *bytes);

/* castfs_gguf_vtype_name - the value type's name ("u32"), or NULL. */
const char *castfs_gguf_vtype_name(uint32_t type);

/* castfs_gguf_kv_find - the KV named @key in @f, or NULL. */
const struct castfs_gguf_kv *
castfs_gguf_kv_find(const struct castfs_gguf_file *f, const char *key);

#endif
