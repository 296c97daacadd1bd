/* SPDX-License-Identifier: MIT */
/* Private to lib/: the kind-specific view builders. */
#ifndef CASTFS_VIEW_INTERNAL_H
#define CASTFS_VIEW_INTERNAL_H

#include "plan/plan_build.h"
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

int castfs_view_plan_cast(const struct castfs_view *v,
			  const struct castfs_header *h,
			  struct castfs_plan **out, struct castfs_diag *d);
int castfs_view_plan_bnb(const struct castfs_view *v,
			 const struct castfs_header *h,
			 struct castfs_plan **out, struct castfs_diag *d);
int castfs_view_plan_gguf(const struct castfs_view *v,
			  const struct castfs_header *h,
			  struct castfs_plan **out, struct castfs_diag *d);

/*
 * castfs_view_copy_metadata - add the source's __metadata__ to @pb, with
 * "format": "pt" first when the source has no "format" (transformers
 * refuses files without one). Returns 0 or -ENOMEM.
 */
int castfs_view_copy_metadata(struct castfs_pb *pb,
			      const struct castfs_header *h);

#endif
