/* SPDX-License-Identifier: MIT */
/*
 * llama-quantize's per-tensor type choice (llama.cpp src/llama-quant.cpp
 * llama_tensor_get_type, no imatrix, no overrides) for the GGUF files of
 * model directories: which ggml type each llama.cpp-named tensor gets in
 * a file of a given type or K-quant mix (docs/FORMATS.md "Which type each
 * tensor gets"). Pure; private to lib/.
 */
#ifndef CASTFS_MODELDIR_GGUF_MIX_H
#define CASTFS_MODELDIR_GGUF_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"

/* What the choice needs to know of the model. */
struct castfs_md_mix {
	uint32_t n_layer; /* hparams n_layer: use_more_bits() counts these */
	bool tied; /* no output.weight: token_embd is the output matrix */
	bool is_70b; /* llama.cpp's LLM_TYPE_70B (attn_v Q4_K -> Q5_K) */
};

/*
 * castfs_md_gguf_type - the type of tensor @name (llama.cpp's name, e.g.
 * "blk.3.attn_v.weight") with @ndim dimensions, @ne0 elements per row, in
 * a file whose view type is @want: F32 for 1-D tensors; @want itself for
 * F16/BF16; for a block type the llama-quantize mix: Q8_0 and Q4_0 as
 * LLAMA_FTYPE_MOSTLY_Q8_0 / _Q4_0, Q4_K as _Q4_K_M, Q5_K as _Q5_K_M,
 * Q6_K as _Q6_K, with llama-quantize's fallbacks for rows that are not
 * whole blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 where
 * llama-quantize would have to give up). Pure; thread-safe.
 */
enum castfs_ggml_type castfs_md_gguf_type(enum castfs_ggml_type want,
					  const char *name, uint32_t ndim,
					  uint64_t ne0,
					  const struct castfs_md_mix *m);

#endif
