/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors views (llm-compressor's FP8_DYNAMIC preset): every
 * weight the rules select becomes its F8_E4M3 codes under the same name and
 * a "<name>_scale" in the weight's dtype, per channel ([out, 1]) or per
 * block; the other tensors are copied. See docs/FORMATS.md.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "plan/plan_build.h"
#include "view/view_internal.h"

/* The scratch elements a tile may hold (plan_gen_f8.c stages 4 + 4 bytes
 * per element at most). */
#define CT_TILE_ELEMS (CASTFS_SCRATCH_LEN / 8u)

static uint64_t ct_blk_rows(const struct castfs_view *v)
{
	return v->kind == CASTFS_VIEW_CT_FP8 && v->ct_block ? v->ct_block : 1;
}

static uint64_t ct_blk_cols(const struct castfs_view *v,
			    const struct castfs_tensor *t)
{
	if (v->kind == CASTFS_VIEW_CT_W4)
		return CASTFS_CT_W4_GROUP;
	if (v->kind == CASTFS_VIEW_CT_NVFP4)
		return CASTFS_CT_NVFP4_GROUP;
	return v->ct_block ? v->ct_block : t->shape[1];
}

bool castfs_view_ct_fits(const struct castfs_view *v,
			 const struct castfs_tensor *t)
{
	return t->ndim == 2 && ct_blk_cols(v, t) <= CT_TILE_ELEMS &&
	       ct_blk_rows(v) * ct_blk_cols(v, t) <= CT_TILE_ELEMS;
}

/* Add tensor "<@t's name>@suffix"; the name is copied by the builder. */
static int ct_add_named(struct castfs_pb *pb, const struct castfs_tensor *t,
			const char *suffix, enum castfs_dtype dtype,
			uint32_t ndim, const uint64_t *shape,
			const struct castfs_producer *p)
{
	size_t sl = strlen(suffix);
	char *name = malloc(t->name_len + sl + 1);
	int rc;

	if (!name)
		return -ENOMEM;
	memcpy(name, t->name, t->name_len);
	memcpy(name + t->name_len, suffix, sl + 1);
	rc = castfs_pb_add_tensor(pb, name, t->name_len + sl, dtype, ndim,
				  shape, p);
	free(name);
	return rc;
}

/* "<name>_scale": the weight's scale, as compressed-tensors names it. */
static int ct_add_scale(struct castfs_pb *pb, const struct castfs_tensor *t,
			const struct castfs_qtensor *qt, uint32_t idx)
{
	uint64_t shape[2] = {
		qt->rows / qt->blk_rows + (qt->rows % qt->blk_rows != 0),
		qt->cols / qt->blk_cols + (qt->cols % qt->blk_cols != 0),
	};
	const struct castfs_producer p = {
		.op = CASTFS_OP_CT_SCALE,
		.unit = castfs_dtype_bits(t->dtype) / 8,
		.qt = idx,
	};

	return ct_add_named(pb, t, "_scale", t->dtype, 2, shape, &p);
}

/*
 * An int4 weight "P.weight": "P.weight_packed" (I32 [out, in / 8], bytes
 * made by I4_PACKED), "P.weight_scale" and "P.weight_shape" (I64 [2]).
 */
static int ct_add_w4(struct castfs_pb *pb, const struct castfs_tensor *t,
		     const struct castfs_qtensor *qt, uint32_t idx)
{
	const uint64_t packed[2] = { qt->rows, qt->cols / 8 }, two = 2;
	const struct castfs_producer codes = { .op = CASTFS_OP_I4_PACKED,
					       .qt = idx };
	struct castfs_producer shape = { .op = CASTFS_OP_MEM };
	uint8_t *mem = castfs_pb_alloc(pb, 16);
	int rc;

	if (!mem)
		return -ENOMEM;
	castfs_store_le64(mem, qt->rows);
	castfs_store_le64(mem + 8, qt->cols);
	shape.mem = mem;
	rc = ct_add_named(pb, t, "_packed", CASTFS_DTYPE_I32, 2, packed,
			  &codes);
	if (!rc)
		rc = ct_add_named(pb, t, "_shape", CASTFS_DTYPE_I64, 1, &two,
				  &shape);
	if (!rc)
		rc = ct_add_scale(pb, t, qt, idx);
	return rc;
}

/*
 * An NVFP4 weight "P.weight": "P.weight_packed" (U8 [out, in / 2], made by
 * I4_PACKED), "P.weight_scale" (F8_E4M3 [out, in / 16]) and
 * "P.weight_global_scale" (F32 [1]).
 */
static int ct_add_nvfp4(struct castfs_pb *pb, const struct castfs_tensor *t,
			const struct castfs_qtensor *qt, uint32_t idx)
{
	const uint64_t packed[2] = { qt->rows, qt->cols / 2 }, one = 1;
	const uint64_t scale[2] = { qt->rows, qt->cols / qt->blk_cols };
	const struct castfs_producer codes = { .op = CASTFS_OP_I4_PACKED,
					       .qt = idx };
	const struct castfs_producer sp = { .op = CASTFS_OP_CT_SCALE,
					    .unit = 1,
					    .qt = idx };
	const struct castfs_producer gp = { .op = CASTFS_OP_CT_GSCALE,
					    .unit = 4,
					    .qt = idx };
	int rc = ct_add_named(pb, t, "_packed", CASTFS_DTYPE_U8, 2, packed,
			      &codes);

	if (!rc)
		rc = ct_add_named(pb, t, "_scale", CASTFS_DTYPE_F8_E4M3, 2,
				  scale, &sp);
	if (!rc)
		rc = ct_add_named(pb, t, "_global_scale", CASTFS_DTYPE_F32, 1,
				  &one, &gp);
	return rc;
}

/* The fused groups that share one NVFP4 global scale (llm-compressor
 * FUSED_LAYER_NAMES); NULL-terminated. */
static const char *const ct_fused[][CASTFS_QT_FUSE_MAX + 1] = {
	{ "gate_proj", "up_proj", NULL },
	{ "q_proj", "k_proj", "v_proj", NULL },
	{ "q_a_proj", "kv_a_proj_with_mqa", NULL },
	{ "w1", "w3", NULL },
};

/* The fused group of module @mod (@n bytes), or NULL. */
static const char *const *ct_group_of(const char *mod, size_t n)
{
	for (size_t g = 0; g < sizeof(ct_fused) / sizeof(ct_fused[0]); g++)
		for (size_t i = 0; ct_fused[g][i]; i++)
			if (strlen(ct_fused[g][i]) == n &&
			    memcmp(ct_fused[g][i], mod, n) == 0)
				return ct_fused[g];
	return NULL;
}

/*
 * Visit @t's fused siblings in @h (@t included): each converted one goes to
 * @fn. Returns false when a sibling of the group is not in @h.
 */
static bool ct_siblings(const struct castfs_view *v,
			const struct castfs_header *h,
			const struct castfs_tensor *t,
			void (*fn)(const struct castfs_tensor *, void *),
			void *arg)
{
	static const char w[] = ".weight";
	const size_t wl = sizeof(w) - 1;
	const char *mod, *end = t->name + t->name_len - wl;
	const char *const *grp;
	char name[512];

	if (t->name_len <= wl || memcmp(end, w, wl) != 0)
		return true;
	mod = end;
	while (mod > t->name && mod[-1] != '.')
		mod--;
	grp = ct_group_of(mod, (size_t)(end - mod));
	if (!grp) {
		fn(t, arg);
		return true;
	}
	for (size_t i = 0; grp[i]; i++) {
		const struct castfs_tensor *s;
		int n = snprintf(name, sizeof(name), "%.*s%s%s",
				 (int)(mod - t->name), t->name, grp[i], w);

		if (n < 0 || (size_t)n >= sizeof(name))
			return false;
		s = castfs_header_find(h, name, (size_t)n);
		if (!s)
			return false;
		if (castfs_view_converts(v, s))
			fn(s, arg);
	}
	return true;
}

/* Whether every converted sibling has the dtype of the first one seen. */
struct ct_same {
	bool any, ok;
	enum castfs_dtype dt;
};

static void ct_same_fn(const struct castfs_tensor *s, void *arg)
{
	struct ct_same *c = arg;

	if (c->any && s->dtype != c->dt)
		c->ok = false;
	c->any = true;
	c->dt = s->dtype;
}

/*
 * Whether ComfyUI reads @t of @h through its mixed-precision ops: in a
 * full checkpoint (a "model.diffusion_model." part) only the diffusion
 * model's layers are built so, its text encoders and VAE not; and a
 * LoRA's matrices are added as they are (a bug hunt: their codes would
 * be used as values).
 */
static bool comfy_reads(const struct castfs_header *h,
			const struct castfs_tensor *t)
{
	static const char dm[] = "model.diffusion_model.";
	const size_t dl = sizeof(dm) - 1;

	if (memmem(t->name, t->name_len, "lora_", 5) ||
	    memmem(t->name, t->name_len, "lora.", 5))
		return false;
	return (t->name_len > dl && memcmp(t->name, dm, dl) == 0) ||
	       !castfs_header_has_prefix(h, dm, dl);
}

bool castfs_view_ct_converts(const struct castfs_view *v,
			     const struct castfs_header *h,
			     const struct castfs_tensor *t)
{
	static const char w[] = ".weight";
	const size_t wl = sizeof(w) - 1;
	struct ct_same same = { .ok = true };

	if (!castfs_view_converts(v, t))
		return false;
	/* ComfyUI's marker is named after the module: "P.weight" only. */
	if (v->kind == CASTFS_VIEW_COMFY_FP8)
		return t->name_len > wl &&
		       memcmp(t->name + t->name_len - wl, w, wl) == 0 &&
		       comfy_reads(h, t);
	if (v->kind != CASTFS_VIEW_CT_NVFP4)
		return true;
	/* One global scale over the group: its weights share one dtype. */
	return ct_siblings(v, h, t, ct_same_fn, &same) && same.ok;
}

/* Where the weights of @qt's fused group are. */
struct ct_fuse {
	const struct castfs_header *h;
	struct castfs_qtensor *qt;
};

static void ct_fuse_fn(const struct castfs_tensor *s, void *arg)
{
	struct ct_fuse *f = arg;

	if (f->qt->nfuse < CASTFS_QT_FUSE_MAX &&
	    s->dtype == (enum castfs_dtype)f->qt->src_dtype) {
		f->qt->fuse_off[f->qt->nfuse] = f->h->data_start + s->begin;
		f->qt->fuse_n[f->qt->nfuse++] = s->nelems;
	}
}

/*
 * Where the weights of @qt's fused group are in a quantized source: each
 * sibling of the bf16 view (@f) is read as that view's extent reads it,
 * its stored BF16 elements (COPY) or its dequantizer, whose record is
 * added to @pb for the global scale's pass.
 */
struct ct_fuse_deq {
	struct castfs_pb *pb;
	const struct castfs_deqfuse *f;
	struct castfs_qtensor *qt;
	int rc;
};

static void ct_fuse_deq_fn(const struct castfs_tensor *s, void *arg)
{
	struct ct_fuse_deq *c = arg;
	const struct castfs_plan *p = c->f->plan;
	const struct castfs_extent *e;
	struct castfs_qtensor *qt = c->qt;
	uint8_t n = qt->nfuse;
	uint64_t off;

	if (c->rc || n >= CASTFS_QT_FUSE_MAX)
		return;
	/* A weight alone is the source's tensor: its bf16 one by name. */
	s = castfs_header_find(c->f->h, s->name, s->name_len);
	if (!s) {
		c->rc = -ENOTSUP; /* unreachable: the bf16 view has it */
		return;
	}
	if (s->dtype != (enum castfs_dtype)qt->src_dtype)
		return;
	off = c->f->h->data_start + s->begin;
	e = &p->extents[castfs_plan_find(p, off)];
	qt->fuse_n[n] = s->nelems;
	if (e->op == CASTFS_OP_COPY) {
		/* a COPY extent may cover more than this tensor */
		qt->fuse_off[n] = e->src_off + (off - e->out_off);
	} else if (e->op == CASTFS_OP_DEQ_FP8 || e->op == CASTFS_OP_DEQ_Q4 ||
		   e->op == CASTFS_OP_DEQ_W4) {
		qt->fuse_op[n] = e->op;
		c->rc = castfs_pb_add_qtensor(c->pb, &p->qtensors[e->qt],
					      &qt->fuse_qt[n]);
	} else {
		c->rc = -ENOTSUP; /* unreachable: the bf16 view has no other */
	}
	qt->nfuse++;
}

/* Fill @qt's fused group (nvfp4): from @h, or from the bf16 view of a
 * quantized source when the view has one (v->deqfuse). */
static int ct_fuse(struct castfs_pb *pb, const struct castfs_view *v,
		   const struct castfs_header *h, const struct castfs_tensor *t,
		   struct castfs_qtensor *qt)
{
	struct ct_fuse f = { .h = h, .qt = qt };
	struct ct_fuse_deq c = { .pb = pb, .f = v->deqfuse, .qt = qt };

	if (!v->deqfuse) {
		f.h = v->fuse_h ? v->fuse_h : h; /* siblings in other shards */
		ct_siblings(v, f.h, t, ct_fuse_fn, &f);
		return 0;
	}
	ct_siblings(v, v->deqfuse->h, t, ct_fuse_deq_fn, &c);
	return c.rc;
}

static int ct_add_fp8(struct castfs_pb *pb, const struct castfs_view *v,
		      const struct castfs_header *h,
		      const struct castfs_tensor *t,
		      const struct castfs_deqsrc *deq)
{
	struct castfs_qtensor qt = {
		.src_off = h->data_start + t->begin,
		.nelems = t->nelems,
		.rows = t->shape[0],
		.cols = t->shape[1],
		.src_dtype = (uint8_t)t->dtype,
		.qtype = v->kind == CASTFS_VIEW_CT_W4	 ? CASTFS_Q_W4 :
			 v->kind == CASTFS_VIEW_CT_NVFP4 ? CASTFS_Q_NVFP4 :
							   CASTFS_Q_F8,
		.blk_rows = ct_blk_rows(v),
		.blk_cols = ct_blk_cols(v, t),
	};
	struct castfs_producer p = { .op = CASTFS_OP_F8_CODES };
	int rc = 0;

	castfs_view_deq_apply(&qt, deq);
	if (v->kind == CASTFS_VIEW_CT_NVFP4)
		rc = ct_fuse(pb, v, h, t, &qt);
	if (!rc)
		rc = castfs_pb_add_qtensor(pb, &qt, &p.qt);
	if (!rc && v->kind == CASTFS_VIEW_CT_NVFP4)
		return ct_add_nvfp4(pb, t, &qt, p.qt);
	if (!rc && v->kind == CASTFS_VIEW_CT_W4)
		return ct_add_w4(pb, t, &qt, p.qt);
	if (!rc)
		rc = castfs_pb_add_tensor(pb, t->name, t->name_len,
					  CASTFS_DTYPE_F8_E4M3, 2, t->shape,
					  &p);
	if (!rc)
		rc = ct_add_scale(pb, t, &qt, p.qt);
	return rc;
}

/* ComfyUI's marker: json.dumps({"format": "float8_e4m3fn"}) as U8. */
static const char comfy_quant[] = "{\"format\": \"float8_e4m3fn\"}";

/*
 * A ComfyUI scaled-fp8 weight "P.weight": its F8_E4M3 codes under the same
 * name, "P.weight_scale" (F32 [], one per tensor) and "P.comfy_quant" (U8,
 * the marker ComfyUI's loader reads: comfy/ops.py _load_quantized_module).
 */
static int ct_add_comfy(struct castfs_pb *pb, const struct castfs_header *h,
			const struct castfs_tensor *t,
			const struct castfs_deqsrc *deq)
{
	static const char w[] = ".weight";
	const size_t wl = sizeof(w) - 1, ml = sizeof(comfy_quant) - 1;
	struct castfs_qtensor qt = {
		.src_off = h->data_start + t->begin,
		.nelems = t->nelems,
		.rows = t->shape[0],
		.cols = t->shape[1],
		.src_dtype = (uint8_t)t->dtype,
		.qtype = CASTFS_Q_COMFY_F8,
		.blk_rows = 1,
		.blk_cols = 1,
		.nfuse = 1,
	};
	struct castfs_producer p = { .op = CASTFS_OP_F8_CODES };
	struct castfs_producer sp = { .op = CASTFS_OP_CT_GSCALE, .unit = 4 };
	struct castfs_producer mp = { .op = CASTFS_OP_MEM };
	const uint64_t mlen = ml;
	struct castfs_tensor base = *t;
	uint8_t *mem = castfs_pb_alloc(pb, ml);
	int rc;

	qt.fuse_off[0] = qt.src_off;
	qt.fuse_n[0] = qt.nelems;
	castfs_view_deq_apply(&qt, deq); /* its scale: of the bf16 values */
	if (deq) {
		qt.fuse_op[0] = deq->op;
		qt.fuse_qt[0] = deq->qt;
	}
	rc = castfs_pb_add_qtensor(pb, &qt, &p.qt);
	if (!rc)
		rc = castfs_pb_add_tensor(pb, t->name, t->name_len,
					  CASTFS_DTYPE_F8_E4M3, 2, t->shape,
					  &p);
	sp.qt = p.qt;
	if (!rc)
		rc = ct_add_named(pb, t, "_scale", CASTFS_DTYPE_F32, 0, NULL,
				  &sp);
	/* "P.comfy_quant": the module's name, without ".weight". */
	base.name_len = t->name_len - wl;
	if (!rc && !mem)
		rc = -ENOMEM;
	if (!rc) {
		memcpy(mem, comfy_quant, ml);
		mp.mem = mem;
		rc = ct_add_named(pb, &base, ".comfy_quant", CASTFS_DTYPE_U8, 1,
				  &mlen, &mp);
	}
	/* In the late run too: left after the codes, its 27 bytes would put
	 * the F32 scales that follow at an odd offset, the late run would be
	 * given up, and the scales would be back after the header. */
	if (!rc)
		castfs_pb_mark_late(pb);
	return rc;
}

int castfs_view_ct_quantise(struct castfs_pb *pb, const struct castfs_view *v,
			    const struct castfs_header *h,
			    const struct castfs_tensor *t,
			    const struct castfs_deqsrc *deq,
			    struct castfs_diag *d)
{
	struct castfs_tensor tb = *t;
	int rc;

	tb.dtype = CASTFS_DTYPE_BF16; /* the scales' dtype */
	if (v->kind == CASTFS_VIEW_COMFY_FP8)
		rc = ct_add_comfy(pb, h, &tb, deq);
	else
		rc = ct_add_fp8(pb, v, h, &tb, deq);
	if (rc)
		castfs_diag_set(d, rc,
				"view '%s': tensor '%s': cannot quantise",
				v->name, t->name);
	return rc;
}

int castfs_view_ct_add(struct castfs_pb *pb, const struct castfs_view *v,
		       const struct castfs_header *h,
		       const struct castfs_tensor *t, struct castfs_diag *d)
{
	int rc;

	/* nvfp4: fused groups are the bf16 view's (a quantized source) or
	 * the whole model's (a shard of a sharded one). */
	if (!castfs_view_ct_converts(v,
				     v->deqfuse ? v->deqfuse->h :
				     v->fuse_h	? v->fuse_h :
						  h,
				     t))
		return castfs_view_add_copy(pb, h, t);
	if (v->kind == CASTFS_VIEW_COMFY_FP8)
		rc = ct_add_comfy(pb, h, t, NULL);
	else
		rc = ct_add_fp8(pb, v, h, t, NULL);
	if (rc)
		castfs_diag_set(d, rc,
				"view '%s': tensor '%s': cannot quantise",
				v->name, t->name);
	return rc;
}

int castfs_view_plan_ct(const struct castfs_view *v,
			const struct castfs_header *h, struct castfs_plan **out,
			struct castfs_diag *d)
{
	return castfs_view_build(v, h, castfs_view_ct_add, out, d);
}
