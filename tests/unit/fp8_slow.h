/* SPDX-License-Identifier: MIT */
/*
 * The slow FP8 block-dequantization oracle of the unit tests, written from
 * the OCP spec and the bf16 rounding rule (no castfs code), and the data
 * generators that feed it. Shared by test_qsrc.c, test_qsrc_xshard.c and
 * test_qsrc_ct4.c. All functions are pure (the fills advance their PRNG).
 */
#ifndef CASTFS_FP8_SLOW_H
#define CASTFS_FP8_SLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* E4M3FN as the OCP spec defines it (bias 7, no Inf, S.1111.111 NaN). */
float slow_e4m3(uint8_t b);
/* Round to nearest even, as an integer computation on the fp32 bits. */
uint16_t slow_bf16(float f);
/* Scale @i of @s: an F32 (little-endian bytes) or, with @e8m0, 2^(s[i]-127). */
float slow_scale(const uint8_t *s, bool e8m0, size_t i);

/* tu_fill_fn generators; @ctx is a uint64_t tu_rand() state. */
/* Random E4M3 codes, never NaN (a finite reference). */
void fill_codes(uint8_t *dst, size_t n, void *ctx);
/* Random positive F32 scales. */
void fill_scales(uint8_t *dst, size_t n, void *ctx);
/* Random E8M0 scales around 2^-17 .. 2^12. */
void fill_e8m0(uint8_t *dst, size_t n, void *ctx);

#endif
