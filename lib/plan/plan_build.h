/* SPDX-License-Identifier: MIT */
/*
 * The plan builder, for the layers above plan/ that describe files: a
 * safetensors-shaped file is a list of output tensors with their producers,
 * a raw file (npy, JSON) a list of appended extents.
 */
#ifndef CASTFS_PLAN_BUILD_H
#define CASTFS_PLAN_BUILD_H

#include "format/st_header.h"
#include "plan/plan.h"

/* What produces a tensor's (or a raw extent's) bytes. */
struct castfs_producer {
	uint8_t op; /* enum castfs_op */
	uint8_t src_dtype; /* CAST */
	uint8_t dst_dtype; /* CAST; tensors: set from the tensor's dtype */
	uint8_t flags; /* CAST: CASTFS_CVT_* */
	uint32_t unit; /* bytes per unit; 0 means 1 */
	uint64_t src_off; /* COPY / CAST: absolute source offset */
	const void *mem; /* MEM / Q4_STATE: copied into the plan, unless */
	bool mem_kept; /* it lives as long as the plan: castfs_pb_alloc()'s,
			* or static */
	uint32_t qt; /* quantiser ops */
};

struct castfs_pb;

/* castfs_pb_new - an empty builder. Returns 0 or -ENOMEM. */
int castfs_pb_new(struct castfs_pb **out);

/* castfs_pb_free - release a builder that was not finished; NULL is fine. */
void castfs_pb_free(struct castfs_pb *pb);

/*
 * castfs_pb_append - raw files (npy, JSON): append @len bytes produced by
 * @p at the current end. MEM bytes are copied. Returns 0, -ENOMEM,
 * -EOVERFLOW.
 */
int castfs_pb_append(struct castfs_pb *pb, const struct castfs_producer *p,
		     uint64_t len);

/*
 * castfs_pb_append_ints - raw files: append the decimal text of the @n
 * integers @v joined by ", " ("4096, 11008"), produced per read range
 * (CASTFS_OP_INTS). @v is borrowed and must outlive the plan; the plan
 * keeps an index of n / 256 offsets. Nothing is appended for @n 0.
 * Returns 0, -ENOMEM or -EOVERFLOW.
 */
int castfs_pb_append_ints(struct castfs_pb *pb, const uint64_t *v, uint64_t n);

/* castfs_ints_len - the bytes of that text, without making it. Pure. */
uint64_t castfs_ints_len(const uint64_t *v, uint64_t n);

/*
 * castfs_pb_add_tensor - safetensors files: add an output tensor; @name and
 * @shape are copied. Its size is derived from @dtype and @shape. Returns 0,
 * -ENOMEM, -EOVERFLOW, -EINVAL (sub-byte size).
 */
int castfs_pb_add_tensor(struct castfs_pb *pb, const char *name,
			 size_t name_len, enum castfs_dtype dtype,
			 uint32_t ndim, const uint64_t *shape,
			 const struct castfs_producer *p);

/*
 * castfs_pb_mark_late - lay the tensor added last out in the late run with
 * the bytes that need a pass over a whole tensor (docs/FORMATS.md): for
 * small constant tensors whose odd sizes would otherwise misalign that
 * run. No-op on an empty builder.
 */
void castfs_pb_mark_late(struct castfs_pb *pb);

/* castfs_pb_add_meta - a metadata pair, written in call order; @key and
 * @value are borrowed until castfs_pb_finish_*() or castfs_pb_free(). */
int castfs_pb_add_meta(struct castfs_pb *pb, const char *key, size_t key_len,
		       const char *value, size_t value_len);

/*
 * castfs_pb_share_meta - let castfs_pb_finish_safetensors() borrow the
 * header's metadata object from *@slot (a source header's meta_text),
 * building it there on first use, when it is at least
 * CASTFS_META_SHARE_MIN bytes: the views of a source with a large
 * __metadata__ then hold it once. The pairs added must be the same for
 * every builder given @slot, or the text is not shared (the bytes are
 * compared). @slot must outlive the builder.
 */
#define CASTFS_META_SHARE_MIN 4096u
void castfs_pb_share_meta(struct castfs_pb *pb,
			  _Atomic(struct castfs_shared *) *slot);

/* castfs_pb_add_qtensor - register a quantised source tensor; its index
 * goes to *@idx. Returns 0 or -ENOMEM. */
int castfs_pb_add_qtensor(struct castfs_pb *pb, const struct castfs_qtensor *q,
			  uint32_t *idx);

/* castfs_pb_alloc - @n zeroed bytes owned by the finished plan (or freed
 * with the builder). NULL on -ENOMEM. */
void *castfs_pb_alloc(struct castfs_pb *pb, size_t n);

/* castfs_pb_finish_raw - the plan of the appended extents. The builder is
 * consumed whatever the result. Returns 0 or -ENOMEM. */
int castfs_pb_finish_raw(struct castfs_pb *pb, struct castfs_plan **out);

/*
 * castfs_pb_finish_safetensors - emit the header of the added tensors
 * (official layout, metadata as added) and the plan of header + data.
 * The builder is consumed whatever the result. Errors of
 * castfs_header_emit().
 */
int castfs_pb_finish_safetensors(struct castfs_pb *pb, struct castfs_plan **out,
				 struct castfs_diag *d);

#endif
