/* SPDX-License-Identifier: MIT */
/*
 * Private to the quantiser files: the code tables the kernels share and
 * the per-ISA kernel tables that quant.c chooses from.
 */
#ifndef CASTFS_QUANT_INTERNAL_H
#define CASTFS_QUANT_INTERNAL_H

#include <float.h>

#include "quant/quant.h"

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

union castfs_q_f32x256 {
	uint32_t u[256];
	float f[256];
};

/* The midpoints of the 8-bit dynamic map (quant.c), entry 255 +Inf. */
extern const union castfs_q_f32x256 castfs_q8_mids;

/*
 * The same 256 values by search level, m = castfs_q8_mids.f: [0, 16)
 * m[16j + 15] (the bounds of 16 buckets of 16 codes), [16, 32) m[16b + 7],
 * [32, 64) m[16b + 8c + 3], [64, 128) m[16b + 4c + 1], [128, 256)
 * m[16b + 2c], entry (level start + b * width + c).
 */
extern const union castfs_q_f32x256 castfs_q8_tree;

/* Offsets of the levels in castfs_q8_tree. */
enum {
	CASTFS_Q8_T16 = 0,
	CASTFS_Q8_T8 = 16,
	CASTFS_Q8_T4 = 32,
	CASTFS_Q8_T2 = 64,
	CASTFS_Q8_T1 = 128,
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
extern const struct castfs_quant_kernels castfs_quant_avx2;
extern const struct castfs_quant_kernels castfs_quant_avx512;
#endif

/* Scalar pieces that SIMD tables reuse (tails, kernels not yet vectorised). */
void castfs_q4_encode_block(uint8_t *dst, const float *x, size_t m, float scale,
			    enum castfs_qtype qt);
void castfs_absmax_scalar(float *restrict amax, const float *restrict x,
			  size_t n, size_t bs);
void castfs_i8_scalar(int8_t *restrict dst, const float *restrict x, size_t n,
		      float scale);
void castfs_absmax16_scalar(float *restrict amax, const void *restrict x,
			    size_t n, size_t bs, bool f16);
void castfs_q4_16_scalar(uint8_t *restrict dst, float *restrict amax,
			 const void *restrict x, size_t n, size_t bs,
			 enum castfs_qtype qt, bool f16);
void castfs_q8_scalar(uint8_t *restrict dst, const float *restrict amax,
		      size_t n, float offset, float scale);

/* The AVX-512 kernels of 16-bit inputs and of double quantisation
 * (quant_avx512_16.c), entries of castfs_quant_avx512. */
#if CASTFS_HAVE_X86_QUANT
void castfs_absmax16_avx512(float *restrict amax, const void *restrict x,
			    size_t n, size_t bs, bool f16);
void castfs_q4_16_avx512(uint8_t *restrict dst, float *restrict amax,
			 const void *restrict x, size_t n, size_t bs,
			 enum castfs_qtype qt, bool f16);
void castfs_q8_avx512(uint8_t *restrict dst, const float *restrict amax,
		      size_t n, float offset, float scale);
#endif

#endif
