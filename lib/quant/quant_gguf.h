/* SPDX-License-Identifier: MIT */
/*
 * GGUF block quantisers (ggml's reference rules, docs/FORMATS.md "GGUF
 * views"): pure functions of one 32-element block at a time, so any range
 * of a tensor can be computed alone. Scalar; private to lib/.
 */
#ifndef CASTFS_QUANT_GGUF_H
#define CASTFS_QUANT_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Elements per Q8_0 / Q4_0 block (ggml QK8_0, QK4_0). */
#define CASTFS_GGUF_QK 32u

/* Bytes per block: f16 scale + 32 int8 codes; f16 scale + 16 nibble bytes. */
#define CASTFS_GGUF_Q8_0_BYTES 34u
#define CASTFS_GGUF_Q4_0_BYTES 18u

/*
 * castfs_gguf_q8_0 - quantise @nblocks blocks of 32 float32 values @x into
 * @dst (34 bytes each) as ggml's quantize_row_q8_0_ref: d = amax / 127 in
 * float32, id = 1 / d (0 when d is 0), scale stored as fp16(d) rounded to
 * nearest even, codes roundf(x * id) (half away from zero). Non-finite
 * inputs give the codes of the x86 conversion (0 for NaN and out of range).
 * Pure; thread-safe.
 */
void castfs_gguf_q8_0(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);

/*
 * castfs_gguf_q4_0 - quantise @nblocks blocks of 32 float32 values @x into
 * @dst (18 bytes each) as ggml's quantize_row_q4_0_ref built without FMA
 * contraction: max = the value of largest |x| (first one on ties), d =
 * max / -8, id = 1 / d (0 when d is 0), code = min(15, trunc(fl32(fl32(x
 * * id) + 8.5))); element j in the low nibble of byte j, element j + 16 in
 * its high nibble. Pure; thread-safe.
 */
void castfs_gguf_q4_0(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);

/* castfs_gguf_fp16 - @f rounded to IEEE half, nearest even (overflow to
 * infinity, NaN to 0x7e00 as ggml_compute_fp32_to_fp16). */
uint16_t castfs_gguf_fp16(float f);

#endif
