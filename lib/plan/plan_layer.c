/* SPDX-License-Identifier: MIT */
/* A reader over a plan, for plans built on top of a view (tensor_layer.h). */
#include "plan/plan_layer.h"

static ssize_t layer_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct castfs_plan_layer *l = ctx;

	return castfs_plan_read(l->base, l->src, &l->inner, buf, n, off);
}

void castfs_plan_layer_init(struct castfs_plan_layer *l,
			    const struct castfs_plan *base,
			    const struct castfs_reader *src,
			    const struct castfs_scratch *s,
			    struct castfs_scratch *outer)
{
	/* castfs_scratch_init() lays out buf[len] then bounce[BOUNCE_LEN]:
	 * the outer level keeps the first half and the bounce, the inner one
	 * gets the second half less a bounce of its own at its end. */
	size_t half = s->len / 2 & ~(size_t)63;

	*outer = (struct castfs_scratch){
		.buf = s->buf,
		.len = half,
		.bounce = s->bounce,
		.cancelled = s->cancelled,
		.cancel_ctx = s->cancel_ctx,
	};
	l->inner = (struct castfs_scratch){
		.buf = s->buf + half,
		.len = s->len - half - CASTFS_BOUNCE_LEN,
		.bounce = s->buf + s->len - CASTFS_BOUNCE_LEN,
		.cancelled = s->cancelled,
		.cancel_ctx = s->cancel_ctx,
	};
	l->base = base;
	l->src = src;
	l->r.pread = layer_pread;
	l->r.ctx = l;
	l->r.visit = NULL;
	l->r.map = NULL;
}
