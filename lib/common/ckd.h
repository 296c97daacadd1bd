/* SPDX-License-Identifier: MIT */
/* Checked arithmetic: every size derived from a hostile header goes through these. */
#ifndef CASTFS_CKD_H
#define CASTFS_CKD_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns true on overflow and leaves *r unspecified (C23 ckd_* semantics). */
static inline bool castfs_ckd_add(uint64_t *r, uint64_t a, uint64_t b)
{
	return __builtin_add_overflow(a, b, r);
}

static inline bool castfs_ckd_mul(uint64_t *r, uint64_t a, uint64_t b)
{
	return __builtin_mul_overflow(a, b, r);
}

#endif
