/* SPDX-License-Identifier: MIT */
/*
 * ggml's K-quant reference quantisers (Q4_K, Q5_K, Q6_K: super-blocks of
 * 256 elements) and the 5-bit legacy ones (Q5_0, Q5_1: blocks of 32) that
 * llama-quantize falls back to (docs/FORMATS.md "GGUF block formats").
 * Pure functions of one block at a time, so any range of a tensor can be
 * computed alone. Scalar; private to lib/.
 */
#ifndef CASTFS_QUANT_GGUF_K_H
#define CASTFS_QUANT_GGUF_K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"

/* Elements per K-quant super-block (ggml QK_K). */
#define CASTFS_GGUF_QK_K 256u

/* Bytes per block (ggml-common.h block_q4_K, block_q5_K, block_q6_K,
 * block_q5_0, block_q5_1). */
#define CASTFS_GGUF_Q4_K_BYTES 144u
#define CASTFS_GGUF_Q5_K_BYTES 176u
#define CASTFS_GGUF_Q6_K_BYTES 210u
#define CASTFS_GGUF_Q5_0_BYTES 22u
#define CASTFS_GGUF_Q5_1_BYTES 24u
#define CASTFS_GGUF_Q4_1_BYTES 20u

/*
 * castfs_gguf_q4_k / _q5_k / _q6_k / _q5_0 / _q5_1 - quantise @nblocks
 * blocks of float32 values @x into @dst exactly as ggml's
 * quantize_row_<type>_ref (no importance matrix, as llama-quantize without
 * --imatrix), evaluated in float32 without FMA contraction. Non-finite
 * inputs give the bytes the x86 build of the reference gives. Pure;
 * thread-safe; no allocation.
 */
void castfs_gguf_q4_k(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);
void castfs_gguf_q5_k(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);
void castfs_gguf_q6_k(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);
void castfs_gguf_q5_0(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);
void castfs_gguf_q5_1(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);

/* castfs_gguf_q4_1 - the same for Q4_1 (quantize_row_q4_1_ref), the type
 * ComfyUI-GGUF's llama-quantize gives an image model's feed-forward
 * output weights in its Q4_0 files (docs/FORMATS.md). */
void castfs_gguf_q4_1(uint8_t *restrict dst, const float *restrict x,
		      size_t nblocks);

/*
 * castfs_gguf_block_qtype - the castfs_qtype (quant/quant.h) that computes
 * blocks of GGUF type @t, or -1 when @t is not a block type castfs
 * quantises to (F32, F16, BF16). Pure.
 */
int castfs_gguf_block_qtype(enum castfs_ggml_type t);

/*
 * castfs_gguf_quantize - quantise @nblocks blocks of castfs_qtype @qt (a
 * CASTFS_Q_GGUF_* value) from @x into @dst. Returns 0, or -EINVAL for a
 * @qt that is not a GGUF block type. Pure; thread-safe.
 */
int castfs_gguf_quantize(unsigned qt, uint8_t *restrict dst,
			 const float *restrict x, size_t nblocks);

/*
 * castfs_gguf_quantize16 - castfs_gguf_quantize() straight from
 * 32 * @nblocks little-endian BF16 (F16 when @f16) values @x, the same
 * bytes as of their float32 widening, for the types that have such a
 * kernel (Q8_0, Q4_0). Returns 0, or -ENOTSUP for any other @qt (the
 * caller widens and calls castfs_gguf_quantize()). Pure; thread-safe.
 */
int castfs_gguf_quantize16(unsigned qt, uint8_t *restrict dst,
			   const void *restrict x, size_t nblocks, bool f16);

#endif
