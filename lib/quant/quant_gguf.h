/* SPDX-License-Identifier: MIT */
/*
 * GGUF block quantisers (ggml's reference rules, docs/FORMATS.md "GGUF
 * views"): pure functions of one 32-element block at a time, so any range
 * of a tensor can be computed alone. The scalar functions below are the
 * reference; castfs_gguf_kernels_get() gives the SIMD variants chosen for
 * this CPU, bit-identical to them. Private to lib/.
 */
#ifndef CASTFS_QUANT_GGUF_H
#define CASTFS_QUANT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/convert.h"

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

/*
 * The Q8_0 / Q4_0 quantisers of one ISA (quant_gguf.c for scalar,
 * quant_gguf_avx2.c), each entry bit-identical to the scalar reference
 * above for every input (NaN, Inf, -0.0, subnormals, ties). Kernels cannot
 * fail and accept unaligned pointers.
 */
struct castfs_gguf_kernels {
	/* castfs_gguf_q8_0() / castfs_gguf_q4_0() of float32 values. */
	void (*q8_0)(uint8_t *restrict dst, const float *restrict x,
		     size_t nblocks);
	void (*q4_0)(uint8_t *restrict dst, const float *restrict x,
		     size_t nblocks);
	/*
	 * The same bytes from 32 * @nblocks little-endian BF16 (or F16 when
	 * @f16) values @x, as the float32 ones of their exact widening
	 * (castfs_convert_get(BF16/F16, F32)), without staging that widening:
	 * most checkpoints are BF16.
	 */
	void (*q8_0_16)(uint8_t *restrict dst, const void *restrict x,
			size_t nblocks, bool f16);
	void (*q4_0_16)(uint8_t *restrict dst, const void *restrict x,
			size_t nblocks, bool f16);
};

/* The scalar table (the reference the others are tested against). */
extern const struct castfs_gguf_kernels castfs_gguf_scalar;

/*
 * castfs_gguf_kernels_get - the kernels of the ISA castfs_isa_selected()
 * chose for this process (CASTFS_ISA overrides it). Never NULL.
 * Thread-safe.
 */
const struct castfs_gguf_kernels *castfs_gguf_kernels_get(void);

/*
 * castfs_gguf_kernels_isa - the kernels of @isa, or NULL when @isa is not
 * built in or this CPU cannot run it. For tests and benchmarks.
 */
const struct castfs_gguf_kernels *castfs_gguf_kernels_isa(enum castfs_isa isa);

#endif
