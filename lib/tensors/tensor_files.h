/* SPDX-License-Identifier: MIT */
/*
 * The files that show one tensor: a NumPy .npy file, the human-readable
 * .info text, the raw bytes, and a checkpoint's __metadata__ as JSON. Each
 * is a plan (MEM, COPY, CAST extents), so that any byte range is served
 * like a view's. Shared by the mount's tensor trees and `castfs info`.
 */
#ifndef CASTFS_TENSOR_FILES_H
#define CASTFS_TENSOR_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "plan/plan.h"
#include "format/st_header.h"

/* How a .npy file holds a tensor. */
enum castfs_npy_kind {
	CASTFS_NPY_COPY, /* numpy has the dtype: the bytes as stored */
	CASTFS_NPY_WIDEN, /* BF16, F8_E4M3, F8_E5M2: widened to float32 */
	CASTFS_NPY_BYTES, /* no numpy dtype, no kernel: uint8 bit patterns */
};

/* The layout of a tensor's .npy file. */
struct castfs_npy {
	enum castfs_npy_kind kind;
	char descr[8]; /* "<f4", "|u1", ... */
	uint8_t *header; /* magic to '\n' (malloc'ed); data starts after */
	size_t header_len; /* a multiple of 64, as numpy aligns it */
	uint32_t ndim; /* of the array numpy loads */
	uint64_t *shape; /* malloc'ed; ndim entries */
	uint64_t data_len;
	uint64_t size; /* header_len + data_len */
};

/*
 * castfs_npy_layout - the .npy layout of @t (format 1.0, or 2.0 when the
 * header outgrows 64 KiB), byte-identical to numpy.save() of the same
 * array. Fills @out (release with castfs_npy_fini()). Returns 0, -ENOMEM
 * or -EOVERFLOW. Thread-safe.
 */
int castfs_npy_layout(const struct castfs_tensor *t, struct castfs_npy *out);

/* castfs_npy_fini - release what castfs_npy_layout() allocated. */
void castfs_npy_fini(struct castfs_npy *n);

/*
 * castfs_npy_plan - the plan of @t's .npy file whose data (the tensor's
 * bytes as stored) begin at @data_off of the plan's source: the header of
 * castfs_npy_layout(), a long shape in it made per read range. @t's
 * shape is borrowed: its header must outlive the plan. The caller owns
 * *@out. Returns 0, -ENOMEM, -EOVERFLOW or -ENOTSUP.
 */
int castfs_npy_plan(const struct castfs_tensor *t, uint64_t data_off,
		    struct castfs_plan **out);

/* What a file's tensors are described against. */
struct castfs_tfile_ctx {
	const struct castfs_header *h; /* the file shown */
	const char *file; /* its name, as the text shows it */
	/* Views only; NULL for a source file: */
	const char *view; /* the view's name */
	const struct castfs_plan *plan; /* the view's plan */
	const struct castfs_header *src_h; /* the source's header */
	const char *src_file; /* the source's name */
};

/* Where the bytes of a tensor of a view come from. */
struct castfs_torigin {
	enum castfs_op op; /* of the tensor's first extent */
	const struct castfs_tensor *src; /* NULL: generated (MEM) */
	enum castfs_dtype from, to; /* CAST; quantisers: from */
	unsigned flags; /* CAST: CASTFS_CVT_* */
	int qtype; /* quantisers: enum castfs_qtype */
};

/*
 * castfs_torigin_find - the origin of tensor @t of @c's file: for a source
 * file the tensor itself, copied. Pure; borrowed pointers live as long as
 * @c's headers.
 */
void castfs_torigin_find(const struct castfs_tfile_ctx *c,
			 const struct castfs_tensor *t,
			 struct castfs_torigin *o);

/* castfs_torigin_str - "cast BF16 -> F8_E4M3", "copy", ... into @buf
 * (truncated to @len, NUL-terminated). */
void castfs_torigin_str(const struct castfs_torigin *o, char *buf, size_t len);

/*
 * castfs_tinfo_text - the .info text of tensor @t of @c's file: name,
 * dtype, shape, element count, bytes, data and file offsets, the .npy and
 * raw layouts, and for views the source tensor and the conversion.
 * Returns a malloc'ed text (length to *@len), or NULL on -ENOMEM.
 */
char *castfs_tinfo_text(const struct castfs_tfile_ctx *c,
			const struct castfs_tensor *t, size_t *len);

/*
 * castfs_tinfo_plan - the plan of the same .info text, byte for byte: its
 * long shapes made per read range (CASTFS_OP_INTS), the rest held. Its
 * size is known without making the text; the plan holds the fixed text
 * and an index of 8 bytes per 256 dimensions. The shapes of @t and of its
 * source tensor are borrowed: their headers must outlive the plan. The
 * caller owns *@out. Returns 0, -ENOMEM or -EOVERFLOW.
 */
int castfs_tinfo_plan(const struct castfs_tfile_ctx *c,
		      const struct castfs_tensor *t, struct castfs_plan **out);

/* castfs_meta_json - @h's __metadata__ as a malloc'ed JSON object ("{}"
 * when absent) with a final newline; length to *@len. NULL on -ENOMEM. */
char *castfs_meta_json(const struct castfs_header *h, size_t *len);

/* castfs_tinfo_shape_str - "[4096, 11008]" (malloc'ed), or NULL on -ENOMEM. */
char *castfs_tinfo_shape_str(uint32_t ndim, const uint64_t *shape);

#endif
