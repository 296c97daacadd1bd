/* SPDX-License-Identifier: MIT */
/* Private to lib/: the kind-specific view builders. */
#ifndef CASTFS_VIEW_INTERNAL_H
#define CASTFS_VIEW_INTERNAL_H

#include "plan_internal.h"
#include "view.h"

int castfs_view_plan_cast(const struct castfs_view *v,
			  const struct castfs_header *h,
			  struct castfs_plan **out, struct castfs_diag *d);
int castfs_view_plan_bnb(const struct castfs_view *v,
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
