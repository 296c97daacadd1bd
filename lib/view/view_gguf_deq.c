/* SPDX-License-Identifier: MIT */
/*
 * GGUF files of a quantized source: the GGUF builders (view_gguf.c,
 * modeldir/modeldir_gguf.c) read the source's bf16 view instead of its
 * stored tensors. Its plan (view_deq.c, whatever the layout) says, per
 * tensor of the bf16 view, where its bytes come from: a kept tensor is
 * copied from the source, a weight is a dequantizer record; a GGUF
 * quantiser then reads that record through castfs_deq_load(), rounded to
 * bf16, so each GGUF file equals the same file of the bf16 model.
 */
#include <errno.h>
#include <stdlib.h>

#include "view/qsrc.h"
#include "view/view_gguf.h"
#include "view/view_internal.h"

/* The view whose elements the GGUF quantisers read. */
static const struct castfs_view bf16_view = {
	.name = "bf16",
	.kind = CASTFS_VIEW_CAST,
	.dtype = CASTFS_DTYPE_BF16,
};

void castfs_gguf_deq_free(struct castfs_gguf_deq *g)
{
	if (!g)
		return;
	free(g->ent);
	castfs_header_free(g->h);
	castfs_plan_free(g->plan);
	free(g);
}

static bool is_dequantizer(enum castfs_op op)
{
	return op == CASTFS_OP_DEQ_FP8 || op == CASTFS_OP_DEQ_Q4 ||
	       op == CASTFS_OP_DEQ_W4;
}

/* Where tensor @i of the bf16 view comes from, into g->ent[i]. */
static int map_tensor(struct castfs_gguf_deq *g, size_t i,
		      struct castfs_diag *d)
{
	const struct castfs_tensor *t = &g->h->tensors[i];
	uint64_t off = g->h->data_start + t->begin;
	const struct castfs_extent *e;

	if (t->end == t->begin)
		return 0; /* an empty tensor reads nothing */
	e = &g->plan->extents[castfs_plan_find(g->plan, off)];
	if (e->op == CASTFS_OP_COPY &&
	    e->out_off + e->len >= off + (t->end - t->begin)) {
		g->ent[i].src_off = e->src_off + (off - e->out_off);
		return 0;
	}
	if (is_dequantizer((enum castfs_op)e->op) && e->out_off == off &&
	    e->len == t->end - t->begin && t->dtype == CASTFS_DTYPE_BF16) {
		g->ent[i].deq = true;
		g->ent[i].op = e->op;
		g->ent[i].qt = e->qt;
		return 0;
	}
	/* gpt-oss MXFP4 experts (DEQ_MXFP4) have no llama.cpp mapping here */
	return castfs_diag_set(d, -ENOTSUP,
			       "GGUF view: tensor '%s' of a quantized source "
			       "is made by '%s', which the GGUF quantisers "
			       "do not read",
			       t->name, castfs_op_name((enum castfs_op)e->op));
}

/* The bf16 view of @h (quantized: @q) and where each tensor comes from. */
static int deq_build(const struct castfs_header *h, const struct castfs_qsrc *q,
		     struct castfs_gguf_deq *g, struct castfs_diag *d)
{
	int rc = castfs_view_plan_deq(&bf16_view, h, q, NULL, &g->plan, d);

	if (!rc)
		rc = castfs_plan_header(g->plan, &g->h, d);
	if (!rc) {
		g->ent = calloc(g->h->ntensors ? g->h->ntensors : 1,
				sizeof(*g->ent));
		rc = g->ent ? 0 : -ENOMEM;
	}
	for (size_t i = 0; !rc && g->h && i < g->h->ntensors; i++)
		rc = map_tensor(g, i, d);
	return rc;
}

int castfs_gguf_deq_new(const struct castfs_header *h,
			const struct castfs_qsrc_opts *o,
			struct castfs_gguf_deq **out, struct castfs_diag *d)
{
	struct castfs_qsrc_opts so = o ? *o : (struct castfs_qsrc_opts){ 0 };
	struct castfs_gguf_deq *g;
	struct castfs_qsrc q;
	int rc;

	/* STRICT (a folder declaring FP8 blocks): an F8 weight without its
	 * scale is refused, never cast as a plain fp8 tensor */
	so.flags &= CASTFS_QSRC_STRICT;
	rc = castfs_qsrc_scan_opts(h, &so, &q, d);
	if (rc)
		return rc;
	if (q.nmxfp4) {
		castfs_qsrc_fini(&q);
		return castfs_diag_set(d, -ENOTSUP,
				       "GGUF view: gpt-oss MXFP4 experts have "
				       "no llama.cpp mapping in castfs");
	}
	if (!q.nfp8 && !q.nbnb4 && !q.nctw4) {
		castfs_qsrc_fini(&q);
		*out = NULL; /* not quantized: the stored tensors are read */
		return 0;
	}
	g = calloc(1, sizeof(*g));
	rc = g ? deq_build(h, &q, g, d) : -ENOMEM;
	castfs_qsrc_fini(&q);
	if (rc) {
		castfs_gguf_deq_free(g);
		return rc;
	}
	*out = g;
	return 0;
}

const struct castfs_gguf_deq_ent *
castfs_gguf_deq_ent(const struct castfs_gguf_deq *g,
		    const struct castfs_tensor *t)
{
	return &g->ent[t - g->h->tensors];
}

int castfs_gguf_deq_add_qt(struct castfs_pb *pb,
			   const struct castfs_gguf_deq *g,
			   const struct castfs_tensor *t,
			   struct castfs_qtensor *q, uint32_t *idx)
{
	const struct castfs_gguf_deq_ent *ent = castfs_gguf_deq_ent(g, t);
	uint32_t dq;
	int rc;

	if (!ent->deq)
		return -EINVAL;
	rc = castfs_pb_add_qtensor(pb, &g->plan->qtensors[ent->qt], &dq);
	if (rc)
		return rc;
	/* element k of the weight is BF16 byte 2k of a virtual source */
	q->src_off = 0;
	q->nelems = t->nelems;
	q->src_dtype = CASTFS_DTYPE_BF16;
	q->deq_op = ent->op;
	q->deq_qt = dq;
	return castfs_pb_add_qtensor(pb, q, idx);
}
