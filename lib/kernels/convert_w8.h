/* SPDX-License-Identifier: MIT */
/*
 * The constants of the fp8 casts on 16-bit lanes (convert_avx512.c,
 * convert_avx2.c): a bf16 or f16 widens to float32 exactly, so
 * narrow_e4m3()'s and narrow_e5m2()'s integer rounding (convert_scalar.c)
 * can run on the 16 bits alone. A struct w8 holds one pair's constants
 * (folded: every use is inlined with a literal).
 */
#ifndef CASTFS_KERNELS_CONVERT_W8_H
#define CASTFS_KERNELS_CONVERT_W8_H

#include <stdint.h>

struct w8 {
	unsigned ms; /* the source's mantissa bits */
	unsigned shift; /* ms minus the destination's mantissa bits */
	uint16_t rebias; /* the exponent rebiased, plus half an ulp less 1 */
	uint16_t norm; /* |x| from here on is normal in the destination */
	uint16_t smallc; /* below norm: code = M >> (smallc - E), ties even */
	uint16_t big, bigcode; /* not saturating: |x| >= big gives bigcode */
	uint16_t inf; /* the source's Inf: above it NaN, code 0x7f */
	uint16_t max; /* saturating: |x| clamped here (the largest finite) */
};

/* clang-format off */
static const struct w8 W8_BF16_E4M3 = { 7, 4, 7 - (120 << 7), 121 << 7, 125,
					0x43f0 /* 480 */, 0x7f, 0x7f80,
					0x43e0 /* 448 */ };
static const struct w8 W8_BF16_E5M2 = { 7, 5, 15 - (112 << 7), 113 << 7, 118,
					0x4780 /* 65536 */, 0x7c, 0x7f80,
					0x4760 /* 57344 */ };
static const struct w8 W8_F16_E4M3 = { 10, 7, 63 - (8 << 10), 9 << 10, 16,
				       0x5f80 /* 480 */, 0x7f, 0x7c00,
				       0x5f00 /* 448 */ };
/* clang-format on */

#endif
