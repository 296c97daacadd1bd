/* SPDX-License-Identifier: MIT */
/* Placeholder until the bitsandbytes quantisers land: no generators. */
#include "plan_internal.h"

castfs_gen_fn castfs_quant_gen(enum castfs_op op)
{
	(void)op;
	return NULL;
}
