/* SPDX-License-Identifier: MIT */
/* Placeholder until the bitsandbytes views land. */
#include <errno.h>

#include "view_internal.h"

int castfs_view_plan_bnb(const struct castfs_view *v,
			 const struct castfs_header *h,
			 struct castfs_plan **out, struct castfs_diag *d)
{
	(void)h;
	(void)out;
	return castfs_diag_set(d, -ENOTSUP, "view '%s': not implemented",
			       v->name);
}
