/* SPDX-License-Identifier: MIT */
/* Private to lib/: the kind-specific view builders. */
#ifndef CASTFS_VIEW_INTERNAL_H
#define CASTFS_VIEW_INTERNAL_H

#include "plan/plan_build.h"
#include "view/qsrc.h"
#include "view/view.h"

/* Adds tensor @t of @h to @pb as view @v makes it. 0 or a negative errno. */
typedef int (*castfs_view_add_fn)(struct castfs_pb *pb,
				  const struct castfs_view *v,
				  const struct castfs_header *h,
				  const struct castfs_tensor *t,
				  struct castfs_diag *d);

/*
 * castfs_view_build - the plan of a safetensors view: the source's
 * metadata (castfs_view_copy_metadata), then every tensor through @add,
 * laid out as the official writer does. Errors of @add and of
 * castfs_pb_finish_safetensors().
 */
int castfs_view_build(const struct castfs_view *v,
		      const struct castfs_header *h, castfs_view_add_fn add,
		      struct castfs_plan **out, struct castfs_diag *d);

/* castfs_view_cast_add - castfs_view_add_fn of the cast views: tensor @t
 * cast to @v's dtype, or copied. */
int castfs_view_cast_add(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *t, struct castfs_diag *d);

/* castfs_view_qsrc_quantized - whether scan @q found a quantized weight
 * (FP8 block, MXFP4, bitsandbytes 4-bit, compressed-tensors int4/FP4).
 * Pure function. */
bool castfs_view_qsrc_quantized(const struct castfs_qsrc *q);

/*
 * castfs_view_plan_deq - the plan of view @v over a checkpoint with FP8
 * block weights (@q from castfs_qsrc_scan() of @h): each such weight
 * dequantized and cast (cast views), or quantised from its BF16
 * dequantized values (bitsandbytes views; BF16 where the view keeps the
 * weight), its scale left out, every other tensor as the view makes it.
 * An nvfp4 @v with fuse_h (a shard of an indexed folder) finds its fused
 * siblings in the bf16 view of fuse_h, scanned with @o (NULL: defaults).
 * Errors of the builder and of castfs_qsrc_scan_opts().
 */
int castfs_view_plan_deq(const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_qsrc *q,
			 const struct castfs_qsrc_opts *o,
			 struct castfs_plan **out, struct castfs_diag *d);

/*
 * castfs_qsrc_mxfp4 - castfs_qsrc_scan()'s test of tensor @i of @h for a
 * gpt-oss MXFP4 expert weight ("*.experts.{gate_up,down}_proj_blocks" U8
 * [E, R, G, 16] beside its "_scales" [E, R, G]); marks it and its scale
 * in @q. Returns 0 (paired), 1 (not such a weight), -ENOTSUP (named so,
 * shaped otherwise; @d says why) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_mxfp4(const struct castfs_header *h, struct castfs_qsrc *q,
		      size_t i, struct castfs_diag *d);

/*
 * castfs_qsrc_ctfp8 - castfs_qsrc_scan()'s test of tensor @i of @h for a
 * compressed-tensors FP8 scale: "M.weight_scale" (F32/BF16; per tensor,
 * per channel [out, 1] or per 128x128 block) of F8_E4M3 "M.weight" is
 * paired with it as an FP8_BLOCK weight; a one-value "M.input_scale"
 * beside them is marked a scale. Returns 0, 1 (no such tensor), -ENOTSUP
 * (a scale that does not fit; @d says why) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_ctfp8(const struct castfs_header *h, struct castfs_qsrc *q,
		      size_t i, struct castfs_diag *d);

/*
 * castfs_view_add_mxfp4 - gpt-oss MXFP4 weight @t (scale per @qi) of @h
 * in view @v: dequantized and transposed as transformers'
 * convert_moe_packed_tensors() makes it ("P" [E, 32 G, R], in the cast
 * view's dtype, BF16 in other views), named without "_blocks". Errors of
 * the builder; -ENOTSUP (no F32 kernel to the view's dtype).
 */
int castfs_view_add_mxfp4(struct castfs_pb *pb, const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_tensor *t,
			  const struct castfs_qinfo *qi, struct castfs_diag *d);

/*
 * castfs_view_add_bnb4 - bitsandbytes 4-bit source weight @w of @h
 * (described by @s) in view @v: its quant_state shape, dequantized as
 * bnb's dequantize_4bit and cast to the cast view's dtype. Errors of the
 * builder; -ENOTSUP (@v is not a cast view, or has no F32 kernel).
 */
int castfs_view_add_bnb4(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *w,
			 const struct castfs_q4src *s, struct castfs_diag *d);

/*
 * castfs_view_add_ctw4 - compressed-tensors pack-quantized int4 weight
 * @w of @h (scale and group per @qi) in view @v: "M.weight" [rows, cols],
 * dequantized as the decompressor does and cast to the cast view's dtype.
 * Errors of the builder; -ENOTSUP (@v is not a cast view, or has no F32
 * kernel).
 */
int castfs_view_add_ctw4(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *w,
			 const struct castfs_qinfo *qi, struct castfs_diag *d);

/* castfs_view_bnb_add - castfs_view_add_fn of the bitsandbytes views:
 * tensor @t quantised when @v converts it, else copied. */
int castfs_view_bnb_add(struct castfs_pb *pb, const struct castfs_view *v,
			const struct castfs_header *h,
			const struct castfs_tensor *t, struct castfs_diag *d);

/* castfs_view_ct_add - castfs_view_add_fn of the compressed-tensors and
 * ComfyUI views: tensor @t quantised when @v converts it, else copied. */
int castfs_view_ct_add(struct castfs_pb *pb, const struct castfs_view *v,
		       const struct castfs_header *h,
		       const struct castfs_tensor *t, struct castfs_diag *d);

/*
 * A quantized source weight that a quantiser reads dequantized: its
 * dequantizer's qtensor, already in the plan (index @qt), and that
 * dequantizer's op (CASTFS_OP_DEQ_FP8, DEQ_Q4 or DEQ_W4).
 */
struct castfs_deqsrc {
	uint8_t op;
	uint32_t qt;
};

/*
 * The bf16 view of a quantized source, in which an nvfp4 view finds the
 * fused siblings of a weight it quantises (one global scale over the
 * group, computed from the values the bf16 view shows): @h is the bf16
 * view's header (names, true shapes, BF16 weights) and @plan its plan,
 * whose extent for each tensor says how its values are read (COPY of
 * stored elements, or a dequantizer op on a record of @plan). Both are
 * borrowed for the build.
 */
struct castfs_deqfuse {
	const struct castfs_header *h;
	const struct castfs_plan *plan;
};

/* castfs_view_deq_apply - make quantiser record @qt read @deq's values
 * rounded to BF16 (plan_deq.c) instead of its stored elements. */
void castfs_view_deq_apply(struct castfs_qtensor *qt,
			   const struct castfs_deqsrc *deq);

/*
 * castfs_view_requant - quantised weight @w (BF16, its true 2-D shape,
 * named as the source weight) of quantized source @h in non-cast view @v,
 * from its dequantizer record @dq (op @op): @dq is added to the plan and
 * the view's quantiser reads it, so that the result is the view of the
 * bf16 view. Errors of the builder.
 */
int castfs_view_requant(struct castfs_pb *pb, const struct castfs_view *v,
			const struct castfs_header *h,
			const struct castfs_tensor *w,
			const struct castfs_qtensor *dq, enum castfs_op op,
			struct castfs_diag *d);

/*
 * castfs_view_ct_quantise - 2-D weight @t of @h quantised by
 * compressed-tensors view @v (fp8_dynamic, fp8_block, w4a16) from its
 * values dequantized and rounded to BF16 (@deq), as if the source were the
 * bf16 model; the scales are BF16. Errors of the builder.
 */
int castfs_view_ct_quantise(struct castfs_pb *pb, const struct castfs_view *v,
			    const struct castfs_header *h,
			    const struct castfs_tensor *t,
			    const struct castfs_deqsrc *deq,
			    struct castfs_diag *d);

/*
 * castfs_view_bnb_quantise - tensor @t quantised by bitsandbytes view @v;
 * with @deq (a quantized source weight), from its values dequantized and
 * rounded to BF16 instead of its stored elements. Errors of the builder.
 */
int castfs_view_bnb_quantise(struct castfs_pb *pb, const struct castfs_view *v,
			     const struct castfs_header *h,
			     const struct castfs_tensor *t,
			     const struct castfs_deqsrc *deq,
			     struct castfs_diag *d);

int castfs_view_plan_cast(const struct castfs_view *v,
			  const struct castfs_header *h,
			  struct castfs_plan **out, struct castfs_diag *d);
/*
 * castfs_view_ct_fits - true if one scale block of @t under compressed-
 * tensors view @v fits a read tile (a channel of at most 256 Ki columns).
 */
bool castfs_view_ct_fits(const struct castfs_view *v,
			 const struct castfs_tensor *t);

int castfs_view_plan_ct(const struct castfs_view *v,
			const struct castfs_header *h, struct castfs_plan **out,
			struct castfs_diag *d);
int castfs_view_plan_bnb(const struct castfs_view *v,
			 const struct castfs_header *h,
			 struct castfs_plan **out, struct castfs_diag *d);
/* The GGUF view of @h (view_gguf.c); a quantized source (layout options
 * @qo, may be NULL) is read as its bf16 view (view_gguf_deq.c). */
int castfs_view_plan_gguf(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc_opts *qo,
			  struct castfs_plan **out, struct castfs_diag *d);

/*
 * castfs_view_add_dequant - tensor @name (@name_len bytes, @ndim @shape)
 * of the view: the source weight @qt dequantized by generator @op to
 * @dtype (CASTFS_CVT_* @flags; saturation applies to FP8 outputs only).
 * Every dequantizing source layout adds its weights through this.
 * Returns 0, -ENOTSUP (no F32 -> @dtype kernel; @d says so) or -ENOMEM.
 */
int castfs_view_add_dequant(struct castfs_pb *pb, const struct castfs_view *v,
			    const struct castfs_qtensor *qt, enum castfs_op op,
			    const char *name, size_t name_len,
			    enum castfs_dtype dtype, unsigned flags,
			    uint32_t ndim, const uint64_t *shape,
			    struct castfs_diag *d);

/*
 * castfs_view_add_copy - add tensor @t of @h to @pb unchanged: its bytes
 * copied from the source. Returns castfs_pb_add_tensor()'s result.
 */
int castfs_view_add_copy(struct castfs_pb *pb, const struct castfs_header *h,
			 const struct castfs_tensor *t);

/*
 * castfs_view_copy_metadata - add the source's __metadata__ to @pb, with
 * "format": "pt" first when the source has no "format" (transformers
 * refuses files without one), less ComfyUI's "_quantization_metadata"
 * (a view holds no quantized ComfyUI layer). Returns 0 or -ENOMEM.
 */
int castfs_view_copy_metadata(struct castfs_pb *pb,
			      const struct castfs_header *h);

#endif
