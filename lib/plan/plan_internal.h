/* SPDX-License-Identifier: MIT */
/* Private to lib/: the plan builder and the per-op generators. */
#ifndef CASTFS_PLAN_INTERNAL_H
#define CASTFS_PLAN_INTERNAL_H

#include <pthread.h>

#include "plan/plan.h"
#include "format/st_header.h"

/* What produces a tensor's (or a raw extent's) bytes. */
struct castfs_producer {
	uint8_t op; /* enum castfs_op */
	uint8_t src_dtype; /* CAST */
	uint8_t dst_dtype; /* CAST; tensors: set from the tensor's dtype */
	uint8_t flags; /* CAST: CASTFS_CVT_* */
	uint32_t unit; /* bytes per unit; 0 means 1 */
	uint64_t src_off; /* COPY / CAST: absolute source offset */
	const void *mem; /* MEM / Q4_STATE: copied into the plan */
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
 * castfs_pb_add_tensor - safetensors files: add an output tensor; @name and
 * @shape are copied. Its size is derived from @dtype and @shape. Returns 0,
 * -ENOMEM, -EOVERFLOW, -EINVAL (sub-byte size).
 */
int castfs_pb_add_tensor(struct castfs_pb *pb, const char *name,
			 size_t name_len, enum castfs_dtype dtype,
			 uint32_t ndim, const uint64_t *shape,
			 const struct castfs_producer *p);

/* castfs_pb_add_meta - a metadata pair, copied; written in call order. */
int castfs_pb_add_meta(struct castfs_pb *pb, const char *key, size_t key_len,
		       const char *value, size_t value_len);

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

/* Everything a generator may use while serving one read. */
struct castfs_read_env {
	const struct castfs_plan *plan;
	const struct castfs_reader *src;
	struct castfs_scratch *s;
};

/*
 * A generator writes units [@first, @first + @count) of extent @e to @dst:
 * @count * e->unit bytes, fewer for a short last unit. For unit 1 these are
 * plain byte offsets relative to the extent. Returns 0 or a negative errno.
 */
typedef int (*castfs_gen_fn)(const struct castfs_read_env *env,
			     const struct castfs_extent *e, uint64_t first,
			     uint64_t count, uint8_t *dst);

/* Generators of the quantiser ops (lib/quant_ops.c). */
castfs_gen_fn castfs_quant_gen(enum castfs_op op);

/* Generators of the compressed-tensors fp8 ops (plan_gen_f8.c). */
castfs_gen_fn castfs_f8_gen(enum castfs_op op);

/* castfs_f8_scale_elem - the first element of scale @i's block of @q. */
uint64_t castfs_f8_scale_elem(const struct castfs_qtensor *q, uint64_t i);

/*
 * Tensor-wide statistics of a quantised tensor: computed once, on first
 * need, under the lock; read-only afterwards.
 */
struct castfs_qstats {
	pthread_mutex_t lock;
	bool ready;
	float offset; /* 4-bit nested: mean of the block absmax */
	uint64_t nnested;
	float *nested_absmax; /* 4-bit nested: per 256 blocks */
	/*
	 * 4-bit nested: the Q4_QABSMAX bytes (one per block) that Q4_CODES
	 * reads computed on the way, kept for the Q4_QABSMAX read that comes
	 * right after them in a sequential read; byte b is valid when bit b
	 * of qc_valid is. NULL when not held (lib/quant_ops.c). Under @lock.
	 */
	uint8_t *qc;
	uint64_t *qc_valid;
	uint64_t qc_served; /* bytes served from qc: dropped at all */
};

/* At most this many tensors of a plan hold a qc at a time. */
#define CASTFS_QCACHE_TENSORS 4u

/* The tensors holding a qc, oldest first (evicted first). */
struct castfs_qcache {
	pthread_mutex_t lock; /* taken before any qstats lock */
	uint32_t n;
	uint32_t qt[CASTFS_QCACHE_TENSORS];
};

#endif
