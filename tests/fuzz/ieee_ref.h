/* SPDX-License-Identifier: MIT */
/*
 * An element cast written from the IEEE-754 rules and docs/FORMATS.md
 * ("Plain casts", "NaN policy"), sharing no code with lib/kernels: the
 * outside oracle of the fuzz replays and of tests/unit/test_plan.c. Slow
 * on purpose (one element at a time, through double).
 */
#ifndef CASTFS_IEEE_REF_H
#define CASTFS_IEEE_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"

/*
 * ieee_ref_cast - cast @n elements of dtype @from at @src to @to at @dst,
 * as torch's tensor.to() does on CPU; @saturate selects the clamping fp8
 * rule (CASTFS_CVT_SATURATE). Returns false (and writes nothing) when
 * @from or @to is not one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2.
 * Unaligned buffers are fine. Thread-safe (no state).
 */
bool ieee_ref_cast(enum castfs_dtype from, enum castfs_dtype to, bool saturate,
		   void *dst, const void *src, size_t n);

#endif
