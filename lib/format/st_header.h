/* SPDX-License-Identifier: MIT */
/*
 * safetensors headers: parse and validate with every rule of the reference
 * reader (safetensors tensor.rs read_metadata/validate), and emit exactly as
 * the official writer lays a header out.
 */
#ifndef CASTFS_ST_HEADER_H
#define CASTFS_ST_HEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/shared.h"
#include "format/dtype.h"
#include "common/reader.h"

/* The reference reader's cap on the header length N (MAX_HEADER_SIZE). */
#define CASTFS_HEADER_MAX 100000000u

struct castfs_side;

struct castfs_tensor {
	const char *name; /* NUL-terminated; may hold NULs, see name_len */
	size_t name_len;
	enum castfs_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape; /* ndim entries */
	uint64_t nelems; /* product of shape; 1 for rank 0 */
	uint64_t begin, end; /* data_offsets, relative to data_start */
};

struct castfs_meta_kv {
	const char *key, *value; /* NUL-terminated; may hold NULs */
	size_t key_len, value_len;
};

struct castfs_header {
	uint64_t header_len; /* N: the JSON and its padding */
	uint64_t data_start; /* 8 + N */
	uint64_t data_len; /* end offset of the last tensor */
	size_t ntensors;
	struct castfs_tensor *tensors; /* sorted by data offset */
	const struct castfs_tensor **by_name; /* sorted by name (bytewise) */
	bool has_metadata;
	size_t nmeta;
	struct castfs_meta_kv *meta; /* in file order */
	/* Data of a few small tensors (format/st_side.h), or NULL. */
	struct castfs_side *side;
	/*
	 * A cache, not part of the header's value: the "__metadata__" object
	 * as the views of this source write it, built by the first view plan
	 * that needs it (plan/plan.c) and shared by every plan built after,
	 * so that a large one is held once, not once per view. NULL until
	 * then; castfs_header_free() drops it. @meta_text points at
	 * @meta_store in a parsed header (a const header's plans may fill
	 * it), and is NULL (no sharing) in headers built by hand.
	 */
	_Atomic(struct castfs_shared *) *meta_text;
	_Atomic(struct castfs_shared *) meta_store;
};

/*
 * castfs_header_parse - parse and validate a safetensors header.
 * @buf: the first 8 + N bytes of the file (at least the 8 length bytes).
 * @buf_len: bytes available in @buf.
 * @file_size: the size of the whole file.
 * @out: on success, a new header owned by the caller (castfs_header_free()).
 * @d: optional diagnostic.
 *
 * Returns 0, -EINVAL (malformed, with the reason in @d), -E2BIG (N over
 * 100 MB), -EOVERFLOW (sizes that overflow 64 bits) or -ENOMEM. On error
 * *@out is untouched. Thread-safe.
 *
 * Stricter than the reference reader (safetensors 0.8.0), on purpose:
 * the header must begin with '{' (README "MUST"; 0.8 skips leading
 * whitespace); duplicate tensor names and duplicate __metadata__ keys are
 * rejected (serde keeps the last one); every number in the header, in
 * ignored fields too, must be a non-negative integer <= 2^53. Everything
 * else (trailing JSON whitespace, unknown fields, nesting up to 127
 * levels, escaped keys, "\u0000" in names) is accepted exactly as serde
 * accepts it. Tensors whose offsets tie (empty tensors) are ordered by
 * name. The whole header is one allocation.
 */
int castfs_header_parse(const void *buf, size_t buf_len, uint64_t file_size,
			struct castfs_header **out, struct castfs_diag *d);

/*
 * castfs_header_read - read the first 8 + N bytes through @r and parse them.
 * Same contract as castfs_header_parse(), plus the reader's errors.
 */
int castfs_header_read(const struct castfs_reader *r, uint64_t file_size,
		       struct castfs_header **out, struct castfs_diag *d);

/* castfs_header_free - release @h and every string in it; NULL is accepted. */
void castfs_header_free(struct castfs_header *h);

/* castfs_header_has_prefix - whether a tensor name of @h starts with
 * @pre (@len bytes): one binary search of the sorted names. */
bool castfs_header_has_prefix(const struct castfs_header *h, const char *pre,
			      size_t len);

/* castfs_header_find - the tensor named @name (@len bytes), or NULL.
 * The pointer is valid until castfs_header_free(). */
const struct castfs_tensor *castfs_header_find(const struct castfs_header *h,
					       const char *name, size_t len);

/* castfs_header_meta - the metadata value for @key, or NULL. */
const struct castfs_meta_kv *castfs_header_meta(const struct castfs_header *h,
						const char *key);

/* One tensor of a header to emit. */
struct castfs_emit_tensor {
	const char *name;
	size_t name_len;
	enum castfs_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes; /* must equal nelems * bits / 8 */
	uint64_t begin, end; /* written by castfs_header_emit() */
	uint32_t cookie; /* caller's; carried through the sort */
	/*
	 * Laid out after every tensor without it (same order among them):
	 * bytes that need a pass over a whole tensor, kept out of the pages
	 * a header read brings in (docs/FORMATS.md).
	 */
	bool late;
};

/*
 * castfs_header_emit - lay out and serialise a header as safetensors'
 * writer does: data sorted by dtype (descending enum order) then name
 * (the tensors marked late after all others),
 * compact JSON with "__metadata__" first, padded with spaces to a multiple
 * of 8, preceded by the 8-byte little-endian length.
 * @t: the tensors; sorted in place into data order, begin/end filled in.
 * @meta/@nmeta: metadata pairs, written in the order given; if @has_meta is
 *	false no "__metadata__" key is written.
 * @out/@out_len: on success a malloc'ed buffer of 8 + N bytes.
 *
 * Returns 0, -EINVAL (duplicate names, size not matching the shape), or
 * -E2BIG (N would exceed 100 MB), -EOVERFLOW, -ENOMEM. Thread-safe.
 * Names and metadata must be valid UTF-8, and no tensor may be named
 * "__metadata__" (-EINVAL). On error *@out is untouched, but @t may have
 * been reordered.
 */
int castfs_header_emit(struct castfs_emit_tensor *t, size_t n, bool has_meta,
		       const struct castfs_meta_kv *meta, size_t nmeta,
		       uint8_t **out, size_t *out_len, struct castfs_diag *d);

/*
 * castfs_tensor_nbytes - bytes of @nelems elements of @dtype into *@out.
 * Returns 0, -EOVERFLOW, or -EINVAL when the bits do not fill whole bytes.
 */
int castfs_tensor_nbytes(enum castfs_dtype dtype, uint64_t nelems,
			 uint64_t *out);

/* castfs_shape_nelems - product of @shape into *@out; -EOVERFLOW on overflow. */
int castfs_shape_nelems(const uint64_t *shape, uint32_t ndim, uint64_t *out);

#endif
