/* SPDX-License-Identifier: MIT */
/* Oracles shared by the plan-building fuzz targets. */
#ifndef CASTFS_FUZZ_UTIL_H
#define CASTFS_FUZZ_UTIL_H

#include "plan/plan.h"
#include "view/view.h"

/* fuzz_check_plan - abort unless @p's extents are sorted, non-empty,
 * gap-free and tile [0, size) exactly, casts a whole number of units. */
void fuzz_check_plan(const struct castfs_plan *p);

/* fuzz_scratch - this process's scratch for castfs_plan_read(). */
struct castfs_scratch *fuzz_scratch(void);

/* fuzz_check_cast_output - abort unless @out (the whole file a cast view
 * @v made of @src, whose header is @h) equals a slow materialisation:
 * parse @out's header, then copy each tensor or convert it with
 * ieee_ref.c (the cast written from the IEEE rules, not castfs's
 * kernels), one tensor at a time. */
void fuzz_check_cast_output(const struct castfs_view *v,
			    const struct castfs_header *h, const uint8_t *src,
			    const uint8_t *out, uint64_t out_len);

#endif
