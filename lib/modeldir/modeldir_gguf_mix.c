/* SPDX-License-Identifier: MIT */
/*
 * llama-quantize's type mix (llama.cpp src/llama-quant.cpp
 * llama_tensor_get_type_impl and tensor_type_fallback), for the dense
 * architectures castfs maps (no experts, no imatrix, default parameters).
 * llama-quantize visits tensors layer by layer (the loader's weights_map
 * orders "blk.N." names by N), so its running attn_v / ffn_down counters
 * are the layer number; castfs reads it from the name.
 */
#include <stdio.h>
#include <string.h>

#include "modeldir/modeldir_gguf_mix.h"

enum category {
	CAT_OTHER,
	CAT_OUTPUT,
	CAT_TOKEN_EMBD,
	CAT_ATTN_V,
	CAT_FFN_DOWN
};

/* tensor_get_category, reduced to the categories a dense mix uses. */
static enum category category(const char *name)
{
	if (!strcmp(name, "output.weight"))
		return CAT_OUTPUT;
	if (!strcmp(name, "token_embd.weight"))
		return CAT_TOKEN_EMBD;
	/* category_is_attn_v: attn_v, attn_qkv, attn_kv_b */
	if (strstr(name, "attn_qkv.weight") ||
	    strstr(name, "attn_kv_b.weight") || strstr(name, "attn_v.weight"))
		return CAT_ATTN_V;
	if (strstr(name, "ffn_down"))
		return CAT_FFN_DOWN;
	return CAT_OTHER;
}

/* use_more_bits: the first and last eighth of the layers and every third
 * one between. */
static bool use_more_bits(int i_layer, int n_layers)
{
	return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
	       (i_layer - n_layers / 8) % 3 == 2;
}

static int layer_of(const char *name)
{
	int layer = -1;

	if (sscanf(name, "blk.%d.", &layer) != 1)
		return -1;
	return layer;
}

static bool is_k_mix(enum castfs_ggml_type want)
{
	return want == CASTFS_GGML_Q4_K || want == CASTFS_GGML_Q5_K;
}

/* llama_tensor_get_type_impl for the ftypes castfs offers. */
static enum castfs_ggml_type mix(enum castfs_ggml_type want, const char *name,
				 uint64_t ne0, const struct castfs_md_mix *m)
{
	enum category cat = category(name);
	unsigned bytes, blck = castfs_gguf_blck(want, &bytes);
	int n = (int)m->n_layer, layer = layer_of(name);
	enum castfs_ggml_type t = want;

	if (cat == CAT_OUTPUT || (m->tied && cat == CAT_TOKEN_EMBD)) {
		if (ne0 % blck)
			return CASTFS_GGML_Q8_0;
		return want != CASTFS_GGML_Q8_0 ? CASTFS_GGML_Q6_K : want;
	}
	if (cat == CAT_ATTN_V) {
		if (is_k_mix(want) && layer >= 0 && use_more_bits(layer, n))
			t = CASTFS_GGML_Q6_K;
		if (m->is_70b && t == CASTFS_GGML_Q4_K)
			t = CASTFS_GGML_Q5_K;
	} else if (cat == CAT_FFN_DOWN) {
		if (is_k_mix(want) && layer >= 0 && use_more_bits(layer, n))
			t = CASTFS_GGML_Q6_K;
	}
	return t;
}

/* tensor_type_fallback; F16 where llama-quantize has no fallback. */
static enum castfs_ggml_type fallback(enum castfs_ggml_type t, uint64_t ne0)
{
	unsigned bytes;

	if (ne0 % castfs_gguf_blck(t, &bytes) == 0)
		return t;
	if (t == CASTFS_GGML_Q4_K)
		t = CASTFS_GGML_Q5_0;
	else if (t == CASTFS_GGML_Q5_K)
		t = CASTFS_GGML_Q5_1;
	else if (t == CASTFS_GGML_Q6_K)
		t = CASTFS_GGML_Q8_0;
	else
		return CASTFS_GGML_F16;
	return ne0 % castfs_gguf_blck(t, &bytes) ? CASTFS_GGML_F16 : t;
}

enum castfs_ggml_type castfs_md_gguf_type(enum castfs_ggml_type want,
					  const char *name, uint32_t ndim,
					  uint64_t ne0,
					  const struct castfs_md_mix *m)
{
	if (ndim < 2)
		return CASTFS_GGML_F32;
	if (want == CASTFS_GGML_F16 || want == CASTFS_GGML_BF16 ||
	    want == CASTFS_GGML_F32)
		return want;
	return fallback(mix(want, name, ne0, m), ne0);
}
