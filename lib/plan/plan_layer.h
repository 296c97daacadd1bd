/* SPDX-License-Identifier: MIT */
/*
 * A plan read through another plan: the tensor files of a view are plans
 * over the view's bytes (a .npy of an fp8 view widens the fp8 the view
 * computes), so their source is a reader that serves the view's plan.
 */
#ifndef CASTFS_PLAN_LAYER_H
#define CASTFS_PLAN_LAYER_H

#include "plan/plan.h"
#include "common/reader.h"

struct castfs_plan_layer {
	struct castfs_reader r; /* reads the bytes of @base */
	const struct castfs_plan *base;
	const struct castfs_reader *src; /* what @base reads */
	struct castfs_scratch inner; /* @base's share of the scratch */
};

/*
 * castfs_plan_layer_init - make @l a reader of the virtual file @base built
 * over @src, and split the caller thread's scratch @s between the two
 * levels: @outer receives the part for the plan read through @l. Nothing
 * is allocated; @l and @outer live as long as @s and are per thread.
 */
void castfs_plan_layer_init(struct castfs_plan_layer *l,
			    const struct castfs_plan *base,
			    const struct castfs_reader *src,
			    const struct castfs_scratch *s,
			    struct castfs_scratch *outer);

#endif
