/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: the per-ISA kernel tables that quant_dispatch.c
 * chooses from and the scalar pieces the SIMD kernels reuse.
 */
#ifndef CASTFS_QUANT_INTERNAL_H
#define CASTFS_QUANT_INTERNAL_H

#include <float.h>

#include "quant/quant.h"
#include "quant/quant_table.h"

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

/* The AVX2 16-bit kernels: the entries of castfs_quant_avx2, with a fast
 * path for finite BF16 blocks (quant_avx2_16.c), and the general ones
 * for every block (quant_avx2.c) that the entries fall back to. */
void castfs_absmax16_avx2(float *restrict amax, const void *restrict x,
			  size_t n, size_t bs, bool f16);
void castfs_q4_16_avx2(uint8_t *restrict dst, float *restrict amax,
		       const void *restrict x, size_t n, size_t bs,
		       enum castfs_qtype qt, bool f16);
void castfs_absmax16_avx2_any(float *restrict amax, const void *restrict x,
			      size_t n, size_t bs, bool f16);
void castfs_q4_16_avx2_any(uint8_t *restrict dst, float *restrict amax,
			   const void *restrict x, size_t n, size_t bs,
			   enum castfs_qtype qt, bool f16);
#endif

#endif
