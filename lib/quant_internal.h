/* SPDX-License-Identifier: MIT */
/*
 * Private to the quantiser files: the code tables the kernels share and
 * the per-ISA kernel tables that quant.c chooses from.
 */
#ifndef CASTFS_QUANT_INTERNAL_H
#define CASTFS_QUANT_INTERNAL_H

#include <float.h>

#include "quant.h"

/*
 * The rules are written for IEEE single precision evaluated as written:
 * no excess precision (FLT_EVAL_METHOD 0), and no expression of the form
 * a * b + c that a compiler could contract into an FMA.
 */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "castfs quantisers need FLT_EVAL_METHOD == 0 (SSE/NEON floats)"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CASTFS_HAVE_X86_QUANT 1
#else
#define CASTFS_HAVE_X86_QUANT 0
#endif

/* Float tables given by their bits (exact, whatever the compiler). */
union castfs_q_f32x16 {
	uint32_t u[16];
	float f[16];
};

/* Indexed by enum castfs_qtype (NF4, FP4). */
extern const union castfs_q_f32x16 castfs_q4_values[2];

/*
 * castfs_q4_mids[qt].f[k] is the float32 midpoint between the k-th and
 * (k+1)-th smallest code values (k < 15; entry 15 is +Inf, a sentinel),
 * computed as bitsandbytes computes its bucketize bounds.
 */
extern const union castfs_q_f32x16 castfs_q4_mids[2];

/* castfs_q4_order[qt][p]: the code of the p-th smallest value. */
extern const uint8_t castfs_q4_order[2][16];

extern const struct castfs_quant_kernels castfs_quant_scalar;
#if CASTFS_HAVE_X86_QUANT
extern const struct castfs_quant_kernels castfs_quant_avx512;
#endif

/* Scalar pieces that SIMD tables reuse (tails, kernels not yet vectorised). */
void castfs_q4_encode_block(uint8_t *dst, const float *x, size_t m,
			    float scale, enum castfs_qtype qt);
void castfs_absmax_scalar(float *restrict amax, const float *restrict x,
			  size_t n, size_t bs);
void castfs_i8_scalar(int8_t *restrict dst, const float *restrict x, size_t n,
		      float scale);

#endif
