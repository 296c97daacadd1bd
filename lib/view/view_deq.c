/* SPDX-License-Identifier: MIT */
/*
 * Views of a quantized source: every FP8 block weight becomes its
 * dequantized values in a cast view's dtype (CASTFS_OP_DEQ_FP8), or the
 * bitsandbytes quantisation of its BF16 dequantized values; its scale is
 * left out, and every other tensor is what the view makes of it.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "kernels/convert.h"
#include "view/view_internal.h"

/* The quantised-tensor record of FP8 block weight @w with scale @s. */
static void fp8_qtensor(const struct castfs_header *h,
			const struct castfs_tensor *w,
			const struct castfs_tensor *s,
			const struct castfs_qinfo *qi,
			struct castfs_qtensor *qt)
{
	*qt = (struct castfs_qtensor){
		.src_off = h->data_start + w->begin,
		.nelems = w->nelems,
		.rows = w->shape[w->ndim - 2],
		.cols = w->shape[w->ndim - 1],
		.src_dtype = (uint8_t)w->dtype,
		.scale_off = h->data_start + s->begin,
		.srows = s->ndim >= 2 ? s->shape[s->ndim - 2] : 1,
		.scols = s->ndim >= 2 ? s->shape[s->ndim - 1] : 1,
		.code_dtype = (uint8_t)w->dtype,
		.brows = qi->brows,
		.bcols = qi->bcols,
		.scale_dtype = (uint8_t)s->dtype,
		.prod_round = s->dtype == CASTFS_DTYPE_BF16 &&
					      qi->rule != CASTFS_QRULE_WIDE ?
				      (uint8_t)CASTFS_DTYPE_BF16 :
				      0,
	};
	if (qi->rule == CASTFS_QRULE_INT8)
		qt->srows = s->shape[0]; /* SCB: one scale per row */
	if (qi->rule == CASTFS_QRULE_NVFP4 || qi->rule == CASTFS_QRULE_MXFP4)
		qt->code_dtype = CASTFS_DTYPE_U8; /* packed E2M1 pairs */
	if (qi->rule == CASTFS_QRULE_NVFP4)
		qt->gscale_off = h->data_start + h->tensors[qi->gscale].begin;
}

/*
 * ComfyUI multiplies in the compute dtype: the scale is rounded to the
 * view's dtype first when that is bf16 or fp16 (fp32 and the fp8 views
 * compute in fp32); the product of an fp8 code and a bf16/fp16 scale is
 * exact in fp32, so one fp32 multiply then RNE is torch's bf16/fp16 one.
 */
static void comfy_round(struct castfs_qtensor *qt,
			const struct castfs_qinfo *qi, enum castfs_dtype dtype)
{
	if (qi->rule == CASTFS_QRULE_COMPUTE &&
	    (dtype == CASTFS_DTYPE_BF16 || dtype == CASTFS_DTYPE_F16))
		qt->scale_round = (uint8_t)dtype;
}

int castfs_view_add_dequant(struct castfs_pb *pb, const struct castfs_view *v,
			    const struct castfs_qtensor *qt, enum castfs_op op,
			    const char *name, size_t name_len,
			    enum castfs_dtype dtype, unsigned flags,
			    uint32_t ndim, const uint64_t *shape,
			    struct castfs_diag *d)
{
	struct castfs_producer p;
	uint32_t idx;
	int rc;

	if (dtype != CASTFS_DTYPE_F8_E4M3 && dtype != CASTFS_DTYPE_F8_E5M2)
		flags &= ~(unsigned)CASTFS_CVT_SATURATE;
	if (!castfs_convert_get(CASTFS_DTYPE_F32, dtype, flags))
		return castfs_diag_set(d, -ENOTSUP,
				       "view '%s': no F32 -> %s kernel",
				       v->name, castfs_dtype_name(dtype));
	rc = castfs_pb_add_qtensor(pb, qt, &idx);
	if (rc)
		return rc;
	p = (struct castfs_producer){
		.op = (uint8_t)op,
		.dst_dtype = (uint8_t)dtype,
		.flags = (uint8_t)flags,
		.unit = castfs_dtype_bits(dtype) / 8,
		.src_off = qt->src_off,
		.qt = idx,
	};
	return castfs_pb_add_tensor(pb, name, name_len, dtype, ndim, shape, &p);
}

/* Weight @w dequantized to @dtype (CASTFS_CVT_* @flags). */
static int add_deq(struct castfs_pb *pb, const struct castfs_view *v,
		   const struct castfs_header *h, const struct castfs_tensor *w,
		   const struct castfs_qinfo *qi, enum castfs_dtype dtype,
		   unsigned flags, struct castfs_diag *d)
{
	struct castfs_qtensor qt;

	fp8_qtensor(h, w, &h->tensors[qi->scale], qi, &qt);
	comfy_round(&qt, qi, dtype);
	return castfs_view_add_dequant(pb, v, &qt, CASTFS_OP_DEQ_FP8, w->name,
				       w->name_len, dtype, flags, w->ndim,
				       w->shape, d);
}

/* Views whose quantiser is view_ct.c's (compressed-tensors, ComfyUI). */
static bool requant_ct(const struct castfs_view *v)
{
	return castfs_view_is_ct(v) || v->kind == CASTFS_VIEW_COMFY_FP8;
}

/*
 * An FP8 block weight in view @v: dequantized to the cast views' dtype;
 * in bitsandbytes views quantised from its BF16 values, or kept as those
 * (a weight the view does not quantise, such as fused 3-D experts).
 */
static int add_fp8(struct castfs_pb *pb, const struct castfs_view *v,
		   const struct castfs_header *h, const struct castfs_tensor *w,
		   const struct castfs_qinfo *qi, struct castfs_diag *d)
{
	struct castfs_tensor wb = *w;
	struct castfs_qtensor qt;

	if (v->kind == CASTFS_VIEW_CAST)
		return add_deq(pb, v, h, w, qi, v->dtype, v->cvt_flags, d);
	/* The view's rules see the bf16 dequantization: an I8 weight is no
	 * integer tensor to copy, and the compressed-tensors views quantise
	 * the values the bf16 view shows. */
	wb.dtype = CASTFS_DTYPE_BF16;
	if (!castfs_view_converts(
		    v,
		    qi->rule == CASTFS_QRULE_INT8 || requant_ct(v) ? &wb : w))
		return add_deq(pb, v, h, w, qi, CASTFS_DTYPE_BF16, 0, d);
	fp8_qtensor(h, w, &h->tensors[qi->scale], qi, &qt);
	comfy_round(&qt, qi, CASTFS_DTYPE_BF16);
	return castfs_view_requant(pb, v, h, w, &qt, CASTFS_OP_DEQ_FP8, d);
}

void castfs_view_deq_apply(struct castfs_qtensor *qt,
			   const struct castfs_deqsrc *deq)
{
	if (!deq)
		return;
	/* MEM is the "stored elements" value of deq_op (plan.h). */
	assert(deq->op != CASTFS_OP_MEM);
	qt->src_dtype = CASTFS_DTYPE_BF16;
	qt->deq_op = deq->op;
	qt->deq_qt = deq->qt;
}

int castfs_view_requant(struct castfs_pb *pb, const struct castfs_view *v,
			const struct castfs_header *h,
			const struct castfs_tensor *w,
			const struct castfs_qtensor *dq, enum castfs_op op,
			struct castfs_diag *d)
{
	struct castfs_deqsrc ds = { .op = (uint8_t)op };
	struct castfs_tensor wb = *w;
	int rc;

	/* nvfp4: a weight whose fused group is not whole in the bf16 view
	 * (or mixes dtypes) is kept as the bf16 view has it. */
	wb.dtype = CASTFS_DTYPE_BF16;
	if (v->deqfuse && !castfs_view_ct_converts(v, v->deqfuse->h, &wb))
		return castfs_view_add_dequant(pb, v, dq, op, w->name,
					       w->name_len, CASTFS_DTYPE_BF16,
					       0, w->ndim, w->shape, d);
	rc = castfs_pb_add_qtensor(pb, dq, &ds.qt);
	if (rc)
		return rc;
	if (requant_ct(v))
		return castfs_view_ct_quantise(pb, v, h, w, &ds, d);
	return castfs_view_bnb_quantise(pb, v, h, w, &ds, d);
}

/*
 * A tensor that is not part of a quantized layout: kept as stored in the
 * cast views, as DeepSeek's fp8_cast_bf16.py keeps it, so that a loader
 * gets what it gets from the source (DeepSeek-V3's F32
 * e_score_correction_bias, which transformers keeps in fp32, stays exact);
 * what a bitsandbytes view makes of it otherwise.
 */
static int add_plain(struct castfs_pb *pb, const struct castfs_view *v,
		     const struct castfs_header *h,
		     const struct castfs_tensor *t, struct castfs_diag *d)
{
	if (v->kind == CASTFS_VIEW_CAST)
		return castfs_view_add_copy(pb, h, t);
	if (requant_ct(v))
		return castfs_view_ct_add(pb, v, h, t, d);
	return castfs_view_bnb_add(pb, v, h, t, d);
}

static int plan_deq_build(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc *q, struct castfs_plan **out,
			  struct castfs_diag *d)
{
	struct castfs_pb *pb;
	int rc = castfs_pb_new(&pb);

	if (rc)
		return rc;
	rc = castfs_view_copy_metadata(pb, h);
	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		struct castfs_tensor unpacked;
		uint64_t shape[2];

		switch ((enum castfs_qrole)q->t[i].role) {
		case CASTFS_QR_PLAIN:
			rc = add_plain(pb, v, h, t, d);
			break;
		case CASTFS_QR_FP8_BLOCK:
			/* A packed FP4 weight stands for "M.weight". */
			t = castfs_qsrc_weight(t, &q->t[i], &unpacked, shape);
			rc = add_fp8(pb, v, h, t, &q->t[i], d);
			break;
		case CASTFS_QR_MXFP4:
			rc = castfs_view_add_mxfp4(pb, v, h, t, &q->t[i], d);
			break;
		case CASTFS_QR_BNB4:
			rc = castfs_view_add_bnb4(pb, v, h, t,
						  &q->q4[q->t[i].scale], d);
			break;
		case CASTFS_QR_CTW4:
			rc = castfs_view_add_ctw4(pb, v, h, t, &q->t[i], d);
			break;
		case CASTFS_QR_SCALE:
			break; /* folded into its weight */
		}
	}
	if (rc) {
		castfs_pb_free(pb);
		return rc;
	}
	return castfs_pb_finish_safetensors(pb, out, d);
}

/*
 * The bf16 view of @h (@q its scan) into @bp: of @v->fuse_h instead when
 * set (a shard of an indexed folder: its fused siblings may sit in other
 * shards, and their dequantizer records then point into the composite
 * source, as the shard's own tensors do), scanned with @o.
 */
static int plan_deq_bf16(const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_qsrc *q,
			 const struct castfs_qsrc_opts *o,
			 struct castfs_plan **bp, struct castfs_diag *d)
{
	struct castfs_qsrc_opts ao = o ? *o : (struct castfs_qsrc_opts){ 0 };
	struct castfs_view b = *v;
	struct castfs_qsrc qa;
	int rc;

	b.kind = CASTFS_VIEW_CAST;
	b.dtype = CASTFS_DTYPE_BF16;
	b.cvt_flags = 0;
	b.nrules = 0; /* the bf16 view: every tensor by the default rule */
	b.rules = NULL;
	b.fuse_h = NULL;
	if (!v->fuse_h)
		return plan_deq_build(&b, h, q, bp, d);
	ao.flags = 0; /* every shard was checked when it loaded */
	rc = castfs_qsrc_scan_opts(v->fuse_h, &ao, &qa, d);
	if (rc)
		return rc;
	rc = plan_deq_build(&b, v->fuse_h, &qa, bp, d);
	castfs_qsrc_fini(&qa);
	return rc;
}

/*
 * nvfp4: the global scale of a weight is over its fused siblings' values
 * as the bf16 view shows them, so the bf16 view is planned first and @v
 * (a copy pointing at it) finds each sibling, and how to read it, there.
 */
static int plan_deq_nvfp4(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc *q,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_plan **out, struct castfs_diag *d)
{
	struct castfs_view n = *v;
	struct castfs_deqfuse f = { 0 };
	struct castfs_plan *bp = NULL;
	struct castfs_header *hb = NULL;
	int rc;

	rc = plan_deq_bf16(v, h, q, o, &bp, d);
	if (!rc)
		rc = castfs_plan_header(bp, &hb, d);
	if (!rc) {
		f.h = hb;
		f.plan = bp;
		n.deqfuse = &f;
		rc = plan_deq_build(&n, h, q, out, d);
	}
	castfs_header_free(hb);
	castfs_plan_free(bp);
	return rc;
}

int castfs_view_plan_deq(const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_qsrc *q,
			 const struct castfs_qsrc_opts *o,
			 struct castfs_plan **out, struct castfs_diag *d)
{
	if (v->kind == CASTFS_VIEW_CT_NVFP4 && !v->deqfuse)
		return plan_deq_nvfp4(v, h, q, o, out, d);
	return plan_deq_build(v, h, q, out, d);
}

/* A castfs_deqfuse that owns its parts (castfs_view_deqfuse_new()). */
struct deqfuse_owned {
	struct castfs_deqfuse f; /* first: the pointer handed out */
	struct castfs_header *h;
	struct castfs_plan *plan;
};

/* Whether @fuse_h, scanned with @o's block sizes, has a quantized weight. */
static int fuse_quantized(const struct castfs_header *fuse_h,
			  const struct castfs_qsrc_opts *o, bool *yes,
			  struct castfs_diag *d)
{
	struct castfs_qsrc_opts ao = o ? *o : (struct castfs_qsrc_opts){ 0 };
	struct castfs_qsrc qa;
	int rc;

	ao.flags = 0; /* every shard was checked when it loaded */
	rc = castfs_qsrc_scan_opts(fuse_h, &ao, &qa, d);
	if (rc)
		return rc;
	*yes = castfs_view_qsrc_quantized(&qa);
	castfs_qsrc_fini(&qa);
	return 0;
}

int castfs_view_deqfuse_new(const struct castfs_view *v,
			    const struct castfs_qsrc_opts *o,
			    struct castfs_deqfuse **out, struct castfs_diag *d)
{
	struct deqfuse_owned *f;
	bool quantized = false;
	int rc;

	if (v->kind != CASTFS_VIEW_CT_NVFP4 || !v->fuse_h || v->deqfuse)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': no shards to fuse over",
				       v->name);
	rc = fuse_quantized(v->fuse_h, o, &quantized, d);
	if (rc || !quantized) {
		if (!rc)
			*out = NULL;
		return rc;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	/* the pre-plan plan_deq_nvfp4() would build for each shard */
	rc = plan_deq_bf16(v, v->fuse_h, NULL, o, &f->plan, d);
	if (!rc)
		rc = castfs_plan_header(f->plan, &f->h, d);
	if (rc) {
		castfs_view_deqfuse_free(&f->f);
		return rc;
	}
	f->f.h = f->h;
	f->f.plan = f->plan;
	*out = &f->f;
	return 0;
}

const struct castfs_plan *
castfs_view_deqfuse_plan(const struct castfs_deqfuse *f)
{
	return f->plan;
}

void castfs_view_deqfuse_free(struct castfs_deqfuse *f)
{
	struct deqfuse_owned *o = (struct deqfuse_owned *)f;

	if (!o)
		return;
	castfs_header_free(o->h);
	castfs_plan_free(o->plan);
	free(o);
}
