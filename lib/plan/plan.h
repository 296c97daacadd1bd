/* SPDX-License-Identifier: MIT */
/*
 * The plan: an immutable description of a virtual file as a sorted list of
 * extents that tile [0, size) exactly, and the stateless read that serves
 * any byte range of it. Every view, npy file and rewritten JSON is a plan.
 */
#ifndef CASTFS_PLAN_H
#define CASTFS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "format/dtype.h"
#include "common/reader.h"
#include "kernels/convert.h"
#include "quant/quant.h"

struct castfs_shared;

/* How an extent's bytes are produced. */
enum castfs_op {
	CASTFS_OP_MEM, /* bytes held by the plan */
	CASTFS_OP_COPY, /* source bytes, unchanged */
	CASTFS_OP_CAST, /* element-wise dtype conversion */
	CASTFS_OP_Q4_CODES, /* bnb 4-bit packed codes (U8) */
	CASTFS_OP_Q4_ABSMAX, /* bnb per-block absmax (F32) */
	CASTFS_OP_Q4_QABSMAX, /* bnb double-quantised absmax (U8) */
	CASTFS_OP_Q4_NESTED_ABSMAX, /* bnb absmax of 256 absmax (F32) */
	CASTFS_OP_Q4_STATE, /* quant_state JSON with nested_offset */
	CASTFS_OP_I8_CODES, /* LLM.int8 row-wise codes (I8) */
	CASTFS_OP_I8_SCB, /* LLM.int8 row absmax (F32) */
	CASTFS_OP_DEQ_FP8, /* FP8 block weight x its scale, cast (plan_gen_fp8.c) */
	CASTFS_OP_F8_CODES, /* compressed-tensors scaled F8_E4M3 weight */
	CASTFS_OP_I4_PACKED, /* compressed-tensors pack-quantized int4 */
	CASTFS_OP_CT_SCALE, /* their channel, block or group weight_scale */
	CASTFS_OP_CT_GSCALE, /* NVFP4 weight_global_scale (F32 [1]) */
	CASTFS_OP_GGUF_BLOCKS, /* ggml Q8_0 / Q4_0 blocks of 32 elements */
	CASTFS_OP_DEQ_MXFP4, /* gpt-oss MXFP4, transposed (plan_gen_mx.c) */
	CASTFS_OP_DEQ_Q4, /* bnb 4-bit source dequantized (plan_gen_q4deq.c) */
	CASTFS_OP_DEQ_W4, /* compressed-tensors int4 source (plan_gen_w4deq.c) */
	CASTFS_OP_DEQ_BF16, /* a dequantized weight as the bf16 view has it,
			     * then cast (GGUF of a quantized source) */
	CASTFS_OP_INTS, /* integers as text, ", "-joined (plan_ints.c) */
	CASTFS_OP_COUNT,
};

/* One run of output bytes [out_off, out_off + len) produced by one op. */
struct castfs_extent {
	uint64_t out_off;
	uint64_t len;
	/*
	 * COPY: source offset of this extent's first byte. CAST: source
	 * offset of its first element. Quantiser ops: unused (see qt).
	 */
	uint64_t src_off;
	const uint8_t *mem; /* MEM and Q4_STATE: bytes owned by the plan */
	uint32_t qt; /* quantiser ops: index into plan->qtensors */
	uint32_t unit; /* output bytes per unit of work; 1 = any byte */
	uint8_t op; /* enum castfs_op */
	uint8_t src_dtype; /* CAST */
	uint8_t dst_dtype; /* CAST */
	uint8_t flags; /* CAST: CASTFS_CVT_* */
	/* CAST: the kernel, resolved when the plan is built. */
	castfs_convert_fn cvt;
};

/* The most weights an NVFP4 global scale is shared by (q, k, v). */
#define CASTFS_QT_FUSE_MAX 3u

/*
 * A source tensor that a quantiser reads: where its elements are and how
 * it is quantised. Immutable once the plan is built.
 */
struct castfs_qtensor {
	uint64_t src_off; /* absolute source offset of element 0 */
	uint64_t nelems;
	uint64_t rows, cols; /* 2-D view of the weight (int8 is row-wise) */
	uint32_t blocksize; /* 4-bit: elements per absmax block */
	uint8_t src_dtype;
	uint8_t qtype; /* enum castfs_qtype */
	bool nested; /* 4-bit double quantisation */
	uint32_t state_off; /* Q4_STATE: where nested_offset is written */
	uint32_t state_width;
	/* DEQ_FP8: the scale grid of each [rows, cols] matrix (nelems /
	 * (rows * cols) of them, one after the other), one scale per block
	 * of brows x bcols elements, edge blocks partial.
	 * DEQ_MXFP4: src_off holds [E][rows][cols / 2] code bytes, scale_off
	 * [E][rows][cols / 32] scale bytes; the output is each [rows, cols]
	 * matrix dequantized and transposed. */
	uint64_t scale_off; /* absolute source offset of scale 0 */
	uint64_t srows, scols;
	uint32_t brows, bcols;
	uint8_t scale_dtype; /* F32, F8_E8M0, BF16, F16; DEQ_MXFP4: also
			      * U8 */
	/* 0, or BF16: the fp32 product rounded to bf16 first, as
	 * compressed-tensors multiplies an fp8 weight by a bf16 scale
	 * (an FP8 block's bf16 scale is widened, its product fp32). */
	uint8_t prod_round;
	/* 0, or BF16 / F16: the scale is first rounded to that dtype, the
	 * compute dtype ComfyUI multiplies in (docs/FORMATS.md). */
	uint8_t scale_round;
	/* GGUF_BLOCKS: the source elements rounded to F16 before they are
	 * quantised (ComfyUI-GGUF's convert.py writes an F32 source as F16,
	 * which llama-quantize then quantises), or false. */
	bool via_f16;
	/* DEQ_FP8: the codes' dtype: F8_E4M3 (0 reads as that), or I8 for
	 * LLM.int8 (bitsandbytes: code * row scale, then * fp32(1/127)), or
	 * U8 for compressed-tensors packed E2M1 pairs (plan_gen_fp4.c: an
	 * F8_E4M3 scale per 1 x bcols with the F32 global divisor at
	 * gscale_off, NVFP4; or a U8 exponent per 1 x bcols, MXFP4). */
	uint8_t code_dtype;
	uint64_t gscale_off; /* NVFP4 source: its weight_global_scale */
	/* Quantiser ops: the elements are those of a quantized source weight
	 * dequantized (qtensor deq_qt of the plan, by its op deq_op: DEQ_FP8,
	 * DEQ_Q4 or DEQ_W4) and rounded to src_dtype (BF16), as the bf16 view
	 * has them, not src_dtype elements read as they are (plan_deq.c).
	 * deq_op is CASTFS_OP_MEM (0, never a dequantizer) for stored
	 * elements: castfs_qtensor_deq() says which. */
	uint8_t deq_op; /* enum castfs_op */
	uint32_t deq_qt;
	/*
	 * F8: elements sharing one scale: blk_rows x blk_cols (1 x cols for a
	 * channel, 128 x 128 for blocks; edge blocks are cut by the matrix).
	 */
	uint64_t blk_rows, blk_cols;
	/*
	 * NVFP4: the weights whose joint absmax gives the global scale (the
	 * tensor itself and its fused siblings, q/k/v or gate/up: one global
	 * scale for the group, as vLLM needs), each at fuse_off with fuse_n
	 * elements of src_dtype; or, where fuse_op[i] is a dequantizer op
	 * (DEQ_FP8, DEQ_Q4, DEQ_W4; 0 for stored elements), fuse_n[i]
	 * elements of a quantized source weight, read as castfs_deq_load()
	 * reads a deq tensor from the dequantizer record fuse_qt[i] of the
	 * plan and rounded to BF16, as the bf16 view has them.
	 */
	uint64_t fuse_off[CASTFS_QT_FUSE_MAX];
	uint64_t fuse_n[CASTFS_QT_FUSE_MAX];
	uint32_t fuse_qt[CASTFS_QT_FUSE_MAX];
	uint8_t fuse_op[CASTFS_QT_FUSE_MAX];
	uint8_t nfuse;
	/*
	 * DEQ_Q4: a bitsandbytes 4-bit source (qtype NF4/FP4, blocksize,
	 * nested): codes at src_off, absmax at scale_off (F32, or U8 when
	 * nested, then nabs_off holds F32 per nested_block absmax and
	 * nmap_off the 256 F32 nested_quant_map, plus noffset); each
	 * product is rounded to out_round (quant_state dtype) first.
	 */
	uint64_t nabs_off, nmap_off;
	uint32_t nested_block;
	float noffset;
	uint8_t out_round;
	bool fp4_negzero; /* FP4 code 8 is -0.0 (bnb's C kernel) */
	/* DEQ_W4: codes at src_off (rows of ceil(cols / 8) I32 words),
	 * scales at scale_off ([rows][scols] of scale_dtype, one per bcols
	 * elements of a row); products rounded to out_round. With w4_zp,
	 * the zero points at zp_off: [ceil(rows / 8)][scols] I32 words, the
	 * one of (row r, group g) at bits 4 (r % 8) of word (r / 8, g). */
	uint64_t zp_off;
	bool w4_zp;
};

struct castfs_header;
struct castfs_qstats; /* tensor-wide statistics, computed on first need */
struct castfs_qcache; /* which tensors keep double-quantised absmax */

struct castfs_plan {
	uint64_t size;
	size_t nextents;
	struct castfs_extent *extents; /* sorted, tiling [0, size) */
	size_t nqt;
	struct castfs_qtensor *qtensors;
	struct castfs_qstats *qstats; /* nqt entries; the only mutable part */
	struct castfs_qcache *qcache; /* with qstats; NULL when nqt is 0 */
	/* Private: allocations owned by the plan, and the bytes they take
	 * (what the checkpoint cache charges for the plan with its extents:
	 * header text, kept bytes, quantiser records). */
	void *arena;
	size_t arena_bytes;
	/* The source's metadata text that a MEM extent of the header
	 * borrows (castfs_pb_share_meta), or NULL. */
	struct castfs_shared *meta_text;
};

/*
 * Per-thread working memory for castfs_plan_read(): source bytes are read
 * into it and converted from it. Never shared between threads.
 */
struct castfs_scratch {
	uint8_t *buf; /* source bytes are read here */
	size_t len;
	uint8_t *bounce; /* CASTFS_BOUNCE_LEN bytes: one unit cut by a range */
	/* Asked between chunks of a pass over a whole tensor (the
	 * statistics of double quantisation): true stops the read with
	 * -EINTR, and the pass starts over at the next read that needs it.
	 * NULL (castfs_scratch_init()): never. Called from the reading
	 * thread; must be cheap. */
	bool (*cancelled)(void *ctx);
	void *cancel_ctx;
};

/* castfs_scratch_cancelled - whether the read using @s is to stop. */
static inline bool castfs_scratch_cancelled(const struct castfs_scratch *s)
{
	return s->cancelled && s->cancelled(s->cancel_ctx);
}

/*
 * castfs_qtensor_deq - whether quantiser record @q reads a dequantized
 * source weight (deq_op on qtensor deq_qt, plan_deq.c) rather than its
 * src_dtype elements as stored. Pure; thread-safe on an immutable plan.
 */
static inline bool castfs_qtensor_deq(const struct castfs_qtensor *q)
{
	return q->deq_op != CASTFS_OP_MEM;
}

/* The largest extent unit (a 4-bit block of 4096 elements). */
#define CASTFS_BOUNCE_LEN 4096u

/* The scratch size castfs_scratch_init() allocates (bytes). */
#define CASTFS_SCRATCH_LEN (2u << 20)

/* castfs_scratch_init - allocate the scratch. Returns 0 or -ENOMEM. */
int castfs_scratch_init(struct castfs_scratch *s);

/* castfs_scratch_fini - release the scratch; safe on a zeroed struct. */
void castfs_scratch_fini(struct castfs_scratch *s);

/*
 * castfs_plan_read - produce bytes [@off, @off + @len) of the virtual file.
 * @p: the plan (shared, read-only; tensor statistics are computed and cached
 *	behind a lock on first need).
 * @src: the source the plan was built from.
 * @s: the calling thread's scratch.
 *
 * Reads past the end are clipped. Ranges that cut an element or a
 * quantisation block compute the whole element or block and copy out the
 * part asked for. Returns the number of bytes written (0 at or past EOF) or
 * a negative errno from the source. Thread-safe; allocates nothing except
 * the once-per-tensor statistics.
 */
ssize_t castfs_plan_read(const struct castfs_plan *p,
			 const struct castfs_reader *src,
			 struct castfs_scratch *s, void *buf, size_t len,
			 uint64_t off);

/* castfs_plan_free - release @p; NULL is accepted. No reader may be using it. */
void castfs_plan_free(struct castfs_plan *p);

/* castfs_plan_find - index of the extent holding byte @off (< p->size). */
size_t castfs_plan_find(const struct castfs_plan *p, uint64_t off);

/*
 * castfs_plan_src_off - the source offset that byte @off (< p->size) is
 * computed from (the first source byte of its unit, element, block or
 * row), or UINT64_MAX for bytes the plan holds. For read-ahead hints:
 * thread-safe, O(log extents).
 */
uint64_t castfs_plan_src_off(const struct castfs_plan *p, uint64_t off);

/* castfs_plan_new_range - a plan copying @len source bytes from @off (the raw
 * bytes of a tensor). Caller owns *@out. Returns 0 or -ENOMEM. */
int castfs_plan_new_range(uint64_t off, uint64_t len, struct castfs_plan **out);

/* castfs_plan_new_mem - a plan of @len bytes of @data (copied). Caller owns
 * *@out. Returns 0 or -ENOMEM. */
int castfs_plan_new_mem(const void *data, size_t len, struct castfs_plan **out);

/*
 * castfs_plan_header - parse the header a safetensors plan @p (a view)
 * starts with. The caller owns *@out (castfs_header_free()). Returns 0,
 * -EINVAL (the plan does not start with a whole header in memory) or the
 * errors of castfs_header_parse().
 */
int castfs_plan_header(const struct castfs_plan *p, struct castfs_header **out,
		       struct castfs_diag *d);

/* castfs_op_name - "mem", "copy", "cast", ...; for .info files and logs. */
const char *castfs_op_name(enum castfs_op op);

#endif
