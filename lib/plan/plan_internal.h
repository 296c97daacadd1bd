/* SPDX-License-Identifier: MIT */
/*
 * Private to plan/: what a generator sees while serving a read, the
 * generators of the quantiser ops, and the tensor-wide statistics.
 */
#ifndef CASTFS_PLAN_INTERNAL_H
#define CASTFS_PLAN_INTERNAL_H

#include <pthread.h>

#include "plan/plan_build.h"

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

/* The generator of CASTFS_OP_INTS (plan_ints.c). */
int castfs_gen_ints(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t first,
		    uint64_t count, uint8_t *dst);

/* The generators of the bitsandbytes ops (plan_gen_bnb.c). */
int castfs_gen_q4_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);
int castfs_gen_q4_absmax(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst);
int castfs_gen_q4_qabsmax(const struct castfs_read_env *env,
			  const struct castfs_extent *e, uint64_t first,
			  uint64_t count, uint8_t *dst);
int castfs_gen_q4_nested_absmax(const struct castfs_read_env *env,
				const struct castfs_extent *e, uint64_t first,
				uint64_t count, uint8_t *dst);
int castfs_gen_q4_state(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);
int castfs_gen_i8_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);
int castfs_gen_i8_scb(const struct castfs_read_env *env,
		      const struct castfs_extent *e, uint64_t first,
		      uint64_t count, uint8_t *dst);

/*
 * The generator of ggml blocks (plan_gen_gguf.c): of source elements, or,
 * when castfs_qtensor_deq(q), of a quantized source's weight as the bf16
 * view has it (castfs_deq_load() rounded to bf16).
 */
int castfs_gen_gguf_blocks(const struct castfs_read_env *env,
			   const struct castfs_extent *e, uint64_t first,
			   uint64_t count, uint8_t *dst);

/* The generator of CASTFS_OP_DEQ_BF16 (plan_gen_gguf.c): a dequantized
 * weight (castfs_qtensor_deq(q)) rounded to bf16, then cast to e->dst_dtype. */
int castfs_gen_deq_bf16(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);

/*
 * castfs_gguf_deq_elem - the element of dequantizing qtensor @q that unit
 * @unit of extent @e (GGUF_BLOCKS or DEQ_BF16) starts at: e->src_off is
 * the BF16 byte offset of the extent's first element relative to
 * q->src_off (a permuted row's extent starts inside the tensor).
 */
uint64_t castfs_gguf_deq_elem(const struct castfs_qtensor *q,
			      const struct castfs_extent *e, uint64_t unit);

/*
 * castfs_fp8_dequant - elements [@k, @k + @n) of FP8 block weight @q
 * (deq geometry set), dequantized to fp32 into @f, reading @src; @codes
 * (@n bytes) and @sbuf (@slen bytes, at least one scale row: the plan
 * checked it) are scratch. Returns 0 or the reader's negative errno.
 */
int castfs_fp8_dequant(const struct castfs_reader *src,
		       const struct castfs_qtensor *q, uint64_t k, size_t n,
		       float *f, uint8_t *codes, uint8_t *sbuf, size_t slen);

/*
 * castfs_fp4_dequant - castfs_fp8_dequant() for a compressed-tensors
 * packed FP4 weight (@q->code_dtype U8, plan_gen_fp4.c): the values
 * compressed-tensors' decompressor gives, in bf16, widened to fp32.
 * @codes holds at least @n / 2 + 1 bytes, @sbuf @slen >= 64. Returns 0
 * or the reader's negative errno.
 */
int castfs_fp4_dequant(const struct castfs_reader *src,
		       const struct castfs_qtensor *q, uint64_t k, size_t n,
		       float *f, uint8_t *codes, uint8_t *sbuf, size_t slen);

/* The generator of CASTFS_OP_DEQ_FP8 (plan_gen_fp8.c): extent src_off is
 * the source offset of its first F8 element; e->qt the weight. */
int castfs_gen_deq_fp8(const struct castfs_read_env *env,
		       const struct castfs_extent *e, uint64_t first,
		       uint64_t count, uint8_t *dst);

/* The generator of CASTFS_OP_DEQ_MXFP4 (plan_gen_mx.c): extent src_off
 * is that of its qtensor; unit @first is output element @first. */
int castfs_gen_deq_mxfp4(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst);

/* The generator of CASTFS_OP_DEQ_Q4 and CASTFS_OP_DEQ_W4 (plan_deq.c):
 * a bitsandbytes 4-bit weight dequantized as bnb's dequantize_4bit, or a
 * compressed-tensors pack-quantized int4 weight as its decompressor does
 * (castfs_q4_dequant / castfs_w4_dequant), then cast. */
int castfs_gen_deq_packed(const struct castfs_read_env *env,
			  const struct castfs_extent *e, uint64_t first,
			  uint64_t count, uint8_t *dst);

/*
 * castfs_q4_dequant / castfs_w4_dequant - elements [@k, @k + @n) of a
 * DEQ_Q4 / DEQ_W4 qtensor @q dequantized (rounded to its out_round) as
 * fp32 into @f, reading @src; @work (@wlen bytes, 8-aligned) is scratch,
 * used in rounds that fit it. Returns 0, -ENOMEM when not even one
 * element's codes and scales fit, or the reader's negative errno.
 */
int castfs_q4_dequant(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, uint64_t k, size_t n,
		      float *f, uint8_t *work, size_t wlen);
int castfs_w4_dequant(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, uint64_t k, size_t n,
		      float *f, uint8_t *work, size_t wlen);

/*
 * castfs_deq_load - elements [@k, @k + @n) of quantiser qtensor @q of
 * plan @p whose elements are a dequantized source
 * (castfs_qtensor_deq(@q)): the fp32 values the source's dequantizer
 * (@q->deq_op on qtensor @q->deq_qt) gives, before any cast; the caller
 * rounds them to @q->src_dtype.
 * @work (@wlen >= 2 * @n bytes, 8-aligned) is scratch. Returns 0 or a
 * negative errno (the reader's). Thread-safe: reads only @p.
 */
int castfs_deq_load(const struct castfs_plan *p,
		    const struct castfs_reader *src,
		    const struct castfs_qtensor *q, uint64_t k, size_t n,
		    float *f, uint8_t *work, size_t wlen);

/* castfs_deq_load_bf16 - castfs_deq_load() with the values rounded to
 * BF16 and kept as fp32: the elements the bf16 view serves, as the
 * quantisers that read a dequantized weight (GGUF blocks, the absmax of
 * a tensor-wide scale) see them. Same arguments and errors. */
int castfs_deq_load_bf16(const struct castfs_plan *p,
			 const struct castfs_reader *src,
			 const struct castfs_qtensor *q, uint64_t k, size_t n,
			 float *f, uint8_t *work, size_t wlen);

/* castfs_deq_src_off - the source offset of element @k of @q
 * (castfs_qtensor_deq(@q)). */
uint64_t castfs_deq_src_off(const struct castfs_plan *p,
			    const struct castfs_qtensor *q, uint64_t k);

/* The source offset of the code word of element @k of DEQ_W4 @q. */
uint64_t castfs_w4_src_off(const struct castfs_qtensor *q, uint64_t k);

/* The source byte of the code of output element @k of DEQ_MXFP4 @q. */
uint64_t castfs_mxfp4_src_off(const struct castfs_qtensor *q, uint64_t k);

/* The generators of the compressed-tensors ops (plan_gen_f8.c). */
int castfs_gen_f8_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);
int castfs_gen_i4_packed(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst);
int castfs_gen_ct_scale(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst);

int castfs_gen_ct_gscale(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst);

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
	float gscale; /* NVFP4: the weight_global_scale */
	uint64_t nnested;
	float *nested_absmax; /* 4-bit nested: per 256 blocks */
	/*
	 * 4-bit nested: the Q4_QABSMAX bytes (one per block) that Q4_CODES
	 * reads computed on the way, kept for the Q4_QABSMAX read that comes
	 * after them in a sequential read; compressed-tensors: the CT_SCALE
	 * bytes its codes' reads computed. Byte b is valid when bit b of
	 * qc_valid is. NULL when not held (plan_qcache.c). Under @lock.
	 */
	uint8_t *qc;
	uint64_t *qc_valid;
	uint64_t qc_served; /* bytes served from qc: dropped at all */
	uint64_t qc_len; /* bytes of qc */
	uint64_t qc_used_ms; /* last save or take (CLOCK_MONOTONIC_COARSE) */
	uint64_t qc_refused_ms; /* last time no room was found for a qc */
	/*
	 * 4-bit nested, until @ready: what Q4_CODES reads learnt of whole
	 * nested blocks on the way (plan_gen_bnb.c), so the statistics read
	 * only the rest of the tensor. NULL when none. Under @lock.
	 */
	struct castfs_q4_groups *groups;
};

/* Free what castfs_qstats.groups points to (NULL is fine). */
void castfs_q4_groups_free(struct castfs_q4_groups *g);

/* The tensors holding a qc, oldest first (evicted first once idle). */
struct castfs_qcache {
	pthread_mutex_t lock; /* taken before any qstats lock */
	uint32_t n;
	uint32_t *qt; /* room for every quantised tensor of the plan */
};

/*
 * castfs_qcache_wants - whether quantised tensor @idx of @p may keep its
 * @len double-quantised absmax or scale bytes: the plan has a cache, @len
 * is within its per-tensor limit, and the tensor was not refused room
 * too recently to ask again. Callers check it before making the bytes
 * they would save. Thread-safe (the tensor's qstats lock).
 */
bool castfs_qcache_wants(const struct castfs_plan *p, uint32_t idx,
			 uint64_t len);

/*
 * castfs_qcache_save - keep @bytes, bytes [@b, @b + @k) of the @len
 * Q4_QABSMAX or CT_SCALE bytes of quantised tensor @idx of @p,
 * within the plan's budget (holders idle for a while are evicted to make
 * room). Best effort: without room or memory nothing is kept. Thread-safe
 * (the qcache lock, then the tensor's qstats lock).
 */
void castfs_qcache_save(const struct castfs_plan *p, uint32_t idx, uint64_t len,
			uint64_t b, const uint8_t *bytes, size_t k);

/*
 * castfs_qcache_take - copy bytes [@first, @first + @count) of tensor
 * @idx's kept bytes to @dst if all of them are kept; true then. The cache
 * is dropped once @len bytes were served. Thread-safe.
 */
bool castfs_qcache_take(const struct castfs_plan *p, uint32_t idx, uint64_t len,
			uint64_t first, uint64_t count, uint8_t *dst);

#endif
