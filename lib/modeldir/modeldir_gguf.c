/* SPDX-License-Identifier: MIT */
/*
 * A transformers causal-LM folder as one llama.cpp GGUF file, as
 * convert_hf_to_gguf.py and llama-quantize make it (docs/FORMATS.md "GGUF
 * of model directories"): the hyper-parameter KVs from config.json, the
 * BPE tokenizer from tokenizer.json, llama.cpp's tensor names and the Q/K
 * row permutation of rotary llama models. What castfs cannot map exactly
 * gets no file and a reason, never a model that loads and talks nonsense.
 * The tokenizer's KVs are modeldir_gguf_tok.c's.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/reader.h"
#include "format/gguf.h"
#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"
#include "plan/plan_build.h"
#include "modeldir/modeldir_gguf_mix.h"
#include "modeldir/modeldir_gguf_tok.h"
#include "quant/quant_gguf_k.h"
#include "view/view_gguf.h"

/* The model families castfs maps, by config.json "architectures". */
struct llm_arch {
	const char *hf; /* architectures[0] */
	const char *name; /* general.architecture */
	bool permute_qk; /* convert_hf_to_gguf LlamaModel.permute */
	/* The head_dim transformers' config class gives a config.json
	 * without one: convert_hf_to_gguf reads AutoConfig's to_dict() and
	 * writes attention.key_length from it. HEAD_DIM_SPLIT: hidden /
	 * heads, also for a null one (LlamaConfig, MistralConfig); 0: none
	 * (Qwen2Config has no such field); else that default, for an absent
	 * one only (Qwen3Config: 128; AutoConfig fails on a null one, and
	 * the script falls back to config.json as it stands). */
	uint32_t head_dim_default;
};

#define HEAD_DIM_SPLIT UINT32_MAX

static const struct llm_arch llm_arches[] = {
	{ "LlamaForCausalLM", "llama", true, HEAD_DIM_SPLIT },
	{ "MistralForCausalLM", "llama", true, HEAD_DIM_SPLIT },
	{ "Qwen2ForCausalLM", "qwen2", false, 0 },
	{ "Qwen3ForCausalLM", "qwen3", false, 128 },
};

/* What the builder knows of the model. */
struct llm {
	const struct llm_arch *arch;
	const cJSON *cfg;
	uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_ctx, head_dim;
	bool has_head_dim;
	double rope_theta, rms_eps;
	uint32_t vocab_size;
};

/* m->head_dim of a config.json without an integer "head_dim", and whether
 * the GGUF says it, as convert_hf_to_gguf does (llm_arch.head_dim_default):
 * a Qwen3 of hidden 64 and 4 heads has heads of 128, not 16. */
static void head_dim_default(struct llm *m)
{
	uint32_t def = m->arch->head_dim_default;
	bool absent = !cJSON_GetObjectItemCaseSensitive(m->cfg, "head_dim");

	m->head_dim = m->n_embd / m->n_head;
	if (def == HEAD_DIM_SPLIT) {
		m->has_head_dim = true;
	} else if (def && absent) {
		m->head_dim = def;
		m->has_head_dim = true;
	}
}

static int cfg_u32(const cJSON *cfg, const char *key, uint32_t *out,
		   bool required, struct castfs_diag *d)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);

	if (!v || cJSON_IsNull(v)) {
		if (!required)
			return 1;
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json has no %s", key);
	}
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
	    v->valuedouble > UINT32_MAX ||
	    v->valuedouble != (double)(uint32_t)v->valuedouble)
		return castfs_diag_set(
			d, -EINVAL, "GGUF: config.json %s is not a count", key);
	*out = (uint32_t)v->valuedouble;
	return 0;
}

static const struct llm_arch *find_arch(const cJSON *cfg)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
	const cJSON *first = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;

	if (!cJSON_IsString(first) || cJSON_GetArraySize(a) != 1)
		return NULL;
	for (size_t i = 0; i < sizeof(llm_arches) / sizeof(llm_arches[0]); i++)
		if (!strcmp(first->valuestring, llm_arches[i].hf))
			return &llm_arches[i];
	return NULL;
}

/* Whether rope settings @r (rope_scaling or transformers 5's
 * rope_parameters) ask for anything but plain RoPE (llama.cpp's converter
 * writes rope_freqs or scaling keys for those; castfs writes neither). */
static bool rope_scaled(const cJSON *r)
{
	static const char *const kinds[] = { "rope_type", "type" };
	const cJSON *e;

	if (!r || cJSON_IsNull(r))
		return false;
	if (!cJSON_IsObject(r))
		return true;
	cJSON_ArrayForEach(e, r) {
		if (cJSON_IsObject(e))
			return true; /* per layer type (Gemma 3's) */
	}
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		e = cJSON_GetObjectItemCaseSensitive(r, kinds[i]);
		if (e && !(cJSON_IsString(e) &&
			   strcmp(e->valuestring, "default") == 0))
			return true;
	}
	return false;
}

/* Whether layer_types names a layer that is not full attention. */
static bool windowed_layers(const cJSON *lt)
{
	const cJSON *e;

	if (!lt || cJSON_IsNull(lt))
		return false;
	if (!cJSON_IsArray(lt))
		return true;
	cJSON_ArrayForEach(e, lt) {
		if (!cJSON_IsString(e) ||
		    strcmp(e->valuestring, "full_attention") != 0)
			return true;
	}
	return false;
}

/*
 * Settings whose meaning a GGUF written by castfs would drop, so that
 * llama.cpp computed another model than transformers (a bug hunt: logits
 * off by as much as the logits themselves for each of these).
 */
static int cfg_unsupported(const cJSON *cfg, struct castfs_diag *d)
{
	/* quantization_config: accepted over quantized weights (build_deq) */
	static const char *const keys[] = { "rope_scaling", "mlp_bias",
					    "use_sliding_window" };
	const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_act");

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);

		if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: config.json %s is not "
					       "supported",
					       keys[i]);
	}
	if (rope_scaled(
		    cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters")))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json rope_parameters "
				       "other than the default rope are not "
				       "supported");
	if (windowed_layers(
		    cJSON_GetObjectItemCaseSensitive(cfg, "layer_types")))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json layer_types other "
				       "than full_attention are not supported");
	if (act &&
	    !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json hidden_act other "
				       "than silu is not supported");
	return 0;
}

/* @key of @cfg, @def when absent or null; -EINVAL for anything else
 * (a rope_theta of "1e6" read as the default was another model). */
static int cfg_double(const cJSON *cfg, const char *key, double def,
		      double *out, struct castfs_diag *d)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);

	*out = cJSON_IsNumber(v) ? v->valuedouble : def;
	if (v && !cJSON_IsNumber(v) && !cJSON_IsNull(v))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json %s is not a number",
				       key);
	return 0;
}

static int read_config(struct llm *m, const cJSON *cfg, struct castfs_diag *d)
{
	int rc;

	m->cfg = cfg;
	m->arch = find_arch(cfg);
	if (!m->arch)
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: config.json architectures is "
				       "not one castfs maps (Llama, Mistral, "
				       "Qwen2, Qwen3 causal LMs)");
	rc = cfg_unsupported(cfg, d);
	if (!rc)
		rc = cfg_u32(cfg, "num_hidden_layers", &m->n_layer, true, d);
	if (!rc)
		rc = cfg_u32(cfg, "hidden_size", &m->n_embd, true, d);
	if (!rc)
		rc = cfg_u32(cfg, "intermediate_size", &m->n_ff, true, d);
	if (!rc)
		rc = cfg_u32(cfg, "num_attention_heads", &m->n_head, true, d);
	if (!rc)
		rc = cfg_u32(cfg, "max_position_embeddings", &m->n_ctx, true,
			     d);
	if (!rc)
		rc = cfg_u32(cfg, "vocab_size", &m->vocab_size, true, d);
	if (rc)
		return rc;
	if (cfg_u32(cfg, "num_key_value_heads", &m->n_head_kv, false, d))
		m->n_head_kv = m->n_head;
	m->has_head_dim = cfg_u32(cfg, "head_dim", &m->head_dim, false, d) == 0;
	/* the largest vocabularies are ~256k; the tokens are held in memory */
	if (m->vocab_size == 0 || m->vocab_size > (4u << 20))
		return castfs_diag_set(d, -EINVAL, "GGUF: vocab_size %u",
				       m->vocab_size);
	if (!m->n_head || !m->n_head_kv || m->n_head % m->n_head_kv)
		return castfs_diag_set(d, -EINVAL, "GGUF: head counts");
	if (!m->has_head_dim)
		head_dim_default(m);
	if (!m->head_dim || m->head_dim % 2)
		return castfs_diag_set(d, -EINVAL, "GGUF: odd head_dim");
	rc = cfg_double(cfg, "rope_theta", 10000.0, &m->rope_theta, d);
	if (!rc && !cJSON_GetObjectItemCaseSensitive(cfg, "rope_theta"))
		rc = cfg_double(cJSON_GetObjectItemCaseSensitive(
					cfg, "rope_parameters"),
				"rope_theta", 10000.0, &m->rope_theta, d);
	if (!rc)
		rc = cfg_double(cfg, "rms_norm_eps", 1e-6, &m->rms_eps, d);
	return rc;
}

static void write_hparams(struct castfs_gguf_w *w, const struct llm *m)
{
	char key[96];
	const char *a = m->arch->name;

#define KEY(k) (snprintf(key, sizeof(key), "%s." k, a), key)
	castfs_gguf_kv_u32(w, KEY("context_length"), m->n_ctx);
	castfs_gguf_kv_u32(w, KEY("embedding_length"), m->n_embd);
	castfs_gguf_kv_u32(w, KEY("feed_forward_length"), m->n_ff);
	castfs_gguf_kv_u32(w, KEY("block_count"), m->n_layer);
	castfs_gguf_kv_u32(w, KEY("attention.head_count"), m->n_head);
	castfs_gguf_kv_u32(w, KEY("attention.head_count_kv"), m->n_head_kv);
	castfs_gguf_kv_f32(w, KEY("rope.freq_base"), (float)m->rope_theta);
	castfs_gguf_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"),
			   (float)m->rms_eps);
	if (m->has_head_dim) {
		castfs_gguf_kv_u32(w, KEY("attention.key_length"), m->head_dim);
		castfs_gguf_kv_u32(w, KEY("attention.value_length"),
				   m->head_dim);
	}
	if (m->arch->permute_qk)
		castfs_gguf_kv_u32(w, KEY("rope.dimension_count"), m->head_dim);
	castfs_gguf_kv_u32(w, KEY("vocab_size"), m->vocab_size);
#undef KEY
}

/* ---- tensors ---- */

/* HF name suffix (after "model.layers.N.") -> llama.cpp's (after "blk.N."). */
static const char *const layer_names[][2] = {
	{ "input_layernorm.weight", "attn_norm.weight" },
	{ "self_attn.q_proj.weight", "attn_q.weight" },
	{ "self_attn.k_proj.weight", "attn_k.weight" },
	{ "self_attn.v_proj.weight", "attn_v.weight" },
	{ "self_attn.o_proj.weight", "attn_output.weight" },
	{ "self_attn.q_proj.bias", "attn_q.bias" },
	{ "self_attn.k_proj.bias", "attn_k.bias" },
	{ "self_attn.v_proj.bias", "attn_v.bias" },
	{ "self_attn.q_norm.weight", "attn_q_norm.weight" },
	{ "self_attn.k_norm.weight", "attn_k_norm.weight" },
	{ "post_attention_layernorm.weight", "ffn_norm.weight" },
	{ "mlp.gate_proj.weight", "ffn_gate.weight" },
	{ "mlp.up_proj.weight", "ffn_up.weight" },
	{ "mlp.down_proj.weight", "ffn_down.weight" },
};

/* The llama.cpp name of HF tensor @t into @buf, or false (unmapped). */
static bool map_name(const struct castfs_tensor *t, const struct llm *m,
		     char *buf, size_t len)
{
	static const char pfx[] = "model.layers.";
	unsigned layer;
	int used = 0;

	if (!strcmp(t->name, "model.embed_tokens.weight"))
		return snprintf(buf, len, "token_embd.weight") > 0;
	if (!strcmp(t->name, "model.norm.weight"))
		return snprintf(buf, len, "output_norm.weight") > 0;
	if (!strcmp(t->name, "lm_head.weight"))
		return snprintf(buf, len, "output.weight") > 0;
	if (strncmp(t->name, pfx, sizeof(pfx) - 1) ||
	    sscanf(t->name + sizeof(pfx) - 1, "%u.%n", &layer, &used) != 1 ||
	    !used || layer >= m->n_layer)
		return false;
	for (size_t i = 0; i < sizeof(layer_names) / sizeof(layer_names[0]);
	     i++) {
		if (!strcmp(t->name + sizeof(pfx) - 1 + used,
			    layer_names[i][0]))
			return snprintf(buf, len, "blk.%u.%s", layer,
					layer_names[i][1]) > 0;
	}
	return false;
}

/* One output tensor. */
struct llm_out {
	const struct castfs_tensor *t;
	const struct castfs_header *h; /* its shard's header */
	uint64_t base; /* its shard's part of the source (castfs_part_off) */
	/* A quantized shard's bf16 view (t is one of its tensors), or NULL */
	const struct castfs_gguf_deq *g;
	uint64_t src; /* the source offset of element 0 (0 if dequantized) */
	char name[64];
	enum castfs_ggml_type type;
	uint32_t heads; /* > 0: rows permuted in this many heads */
};

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && !strcmp(s + n - k, suffix);
}

/* llama-quantize's type for @o (modeldir_gguf_mix.c). */
static enum castfs_ggml_type llm_type(const struct castfs_view *v,
				      const struct llm *m,
				      const struct llm_out *o, bool tied)
{
	struct castfs_md_mix mx = {
		.n_layer = m->n_layer,
		.tied = tied,
		/* llama.cpp's LLM_TYPE_70B: llama with GQA, qwen2 */
		.is_70b = m->n_layer == 80 &&
			  ((!strcmp(m->arch->name, "llama") &&
			    m->n_head != m->n_head_kv) ||
			   !strcmp(m->arch->name, "qwen2")),
	};

	return castfs_md_gguf_type((enum castfs_ggml_type)v->gguf_type, o->name,
				   o->t->ndim, o->t->shape[o->t->ndim - 1],
				   &mx);
}

/* Whether a shard before @k holds tensor @name (named twice). */
static bool seen_before(const struct castfs_md_gguf_src *s, size_t k,
			const char *name, size_t len)
{
	for (size_t j = 0; j < k; j++)
		if (castfs_header_find(s->h[j], name, len))
			return true;
	return false;
}

/* Whether any shard holds tensor @name. */
static bool has_tensor(const struct castfs_md_gguf_src *s, const char *name)
{
	return seen_before(s, s->nh, name, strlen(name));
}

/* Tensor @t of shard @k (bf16 view @g, or NULL) into @x: named twice, or
 * past what a part of a composite source can address, is refused. */
static int place(const struct castfs_md_gguf_src *s, size_t k,
		 const struct castfs_gguf_deq *g, const struct castfs_tensor *t,
		 struct llm_out *x, struct castfs_diag *d)
{
	if (seen_before(s, k, t->name, t->name_len))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tensor '%s' is in two shards",
				       t->name);
	if (!g && s->nh > 1 &&
	    s->h[k]->data_start + t->end >= UINT64_C(1) << CASTFS_PART_SHIFT)
		return castfs_diag_set(d, -EOVERFLOW,
				       "GGUF: shard %zu is too large", k);
	x->t = t;
	x->h = s->h[k];
	x->base = castfs_part_off(k, 0);
	x->g = g;
	x->src = x->base + x->h->data_start + t->begin;
	if (g) /* offsets of a bf16 view's tensor are the source's already */
		x->src = castfs_gguf_deq_ent(g, t)->src_off;
	return 0;
}

/* Whether @o is a dequantized weight (read through castfs_deq_load). */
static bool is_deq(const struct llm_out *o)
{
	return o->g && castfs_gguf_deq_ent(o->g, o->t)->deq;
}

/* Name, permutation and type of the tensor placed in @x. */
static int describe(const struct castfs_view *v, const struct llm *m, bool tied,
		    struct llm_out *x, struct castfs_diag *d)
{
	const struct castfs_tensor *t = x->t;

	if (!castfs_dtype_is_castable(t->dtype) || t->ndim == 0 ||
	    t->ndim > 2 || strlen(t->name) != t->name_len ||
	    !map_name(t, m, x->name, sizeof(x->name)))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tensor '%s' has no "
				       "llama.cpp counterpart castfs "
				       "knows",
				       t->name);
	x->heads = 0;
	if (m->arch->permute_qk && (ends_with(t->name, "q_proj.weight") ||
				    ends_with(t->name, "q_proj.bias")))
		x->heads = m->n_head;
	if (m->arch->permute_qk && (ends_with(t->name, "k_proj.weight") ||
				    ends_with(t->name, "k_proj.bias")))
		x->heads = m->n_head_kv;
	if (x->heads && t->shape[0] % (2u * x->heads))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: '%s' rows do not split "
				       "into heads",
				       t->name);
	x->type = llm_type(v, m, x, tied);
	return 0;
}

/* The layer of llama.cpp name @name, -1 for none ("blk.%d."). */
static int name_layer(const char *name)
{
	int layer = -1;

	return sscanf(name, "blk.%d.", &layer) == 1 ? layer : -1;
}

/* llama_model_loader's weight_name_comparer: by layer (tensors of no
 * layer first), then by name. */
static int quantize_order(const void *a, const void *b)
{
	const struct llm_out *x = a, *y = b;
	int lx = name_layer(x->name), ly = name_layer(y->name);

	if (lx != ly)
		return lx < ly ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * Whether the file of view @v is one only llama-quantize makes:
 * convert_hf_to_gguf.py writes F32, F16, BF16 and Q8_0 itself (in its
 * tensor order); llama-quantize writes the others in the order of its
 * loader's weights_map (quantize_order), whatever the input's order.
 */
static bool quantize_made(const struct castfs_view *v)
{
	enum castfs_ggml_type t = (enum castfs_ggml_type)v->gguf_type;

	return t != CASTFS_GGML_F32 && t != CASTFS_GGML_F16 &&
	       t != CASTFS_GGML_BF16 && t != CASTFS_GGML_Q8_0;
}

/* Every tensor in the order of the tool that writes the file: for
 * convert_hf_to_gguf.py shard by shard (the shards sorted by file name),
 * each shard's tensors by name; for llama-quantize quantize_order(). */
static int describe_all(const struct castfs_view *v, const struct llm *m,
			const struct castfs_md_gguf_src *s,
			struct castfs_gguf_deq *const *g, struct llm_out *o,
			size_t *n, struct castfs_diag *d)
{
	bool tied = !has_tensor(s, "lm_head.weight");
	int rc = 0;

	*n = 0;
	for (size_t k = 0; !rc && k < s->nh; k++) {
		for (size_t i = 0; !rc && i < s->h[k]->ntensors; i++) {
			rc = place(s, k, g[k], s->h[k]->by_name[i], &o[*n], d);
			if (!rc)
				rc = describe(v, m, tied, &o[*n], d);
			if (!rc)
				(*n)++;
		}
	}
	if (!rc && quantize_made(v))
		qsort(o, *n, sizeof(*o), quantize_order);
	return rc;
}

static enum castfs_dtype plain_dtype(enum castfs_ggml_type t)
{
	return t == CASTFS_GGML_F32 ? CASTFS_DTYPE_F32 :
	       t == CASTFS_GGML_F16 ? CASTFS_DTYPE_F16 :
				      CASTFS_DTYPE_BF16;
}

/* The producer of @rows rows of @o starting at source row @row. */
static int add_rows(struct castfs_pb *pb, const struct llm_out *o, uint32_t qt,
		    uint64_t row, uint64_t rows)
{
	const struct castfs_tensor *t = o->t;
	uint64_t cols = t->ndim == 2 ? t->shape[1] : 1;
	size_t in_sz = castfs_dtype_bits(t->dtype) / 8;
	struct castfs_producer p = {
		.src_off = o->src + row * cols * in_sz,
	};
	unsigned bytes, blck = castfs_gguf_blck(o->type, &bytes);

	if (castfs_gguf_block_qtype(o->type) >= 0) {
		p.op = CASTFS_OP_GGUF_BLOCKS;
		p.qt = qt;
		p.unit = bytes;
	} else if (is_deq(o)) { /* the bf16 view's element, then cast */
		p.op = CASTFS_OP_DEQ_BF16;
		p.qt = qt;
		p.dst_dtype = (uint8_t)plain_dtype(o->type);
		p.unit = bytes;
	} else if (plain_dtype(o->type) == t->dtype) {
		p.op = CASTFS_OP_COPY;
	} else {
		p.op = CASTFS_OP_CAST;
		p.src_dtype = t->dtype;
		p.dst_dtype = plain_dtype(o->type);
		p.unit = bytes;
	}
	return castfs_pb_append(pb, &p, rows * cols / blck * bytes);
}

/* The data of tensor @i of @ctx (the struct llm_out array), for
 * castfs_view_gguf_assemble(). convert_hf_to_gguf LlamaModel.permute:
 * output row h*hd + 2i + j is source row h*hd + j*hd/2 + i. */
static int add_data(void *ctx, struct castfs_pb *pb, size_t i)
{
	const struct llm_out *o = (const struct llm_out *)ctx + i;
	uint64_t rows = o->t->shape[0];
	uint32_t qt = 0;
	int rc = 0;

	if (castfs_gguf_block_qtype(o->type) >= 0 || is_deq(o)) {
		unsigned bytes;
		struct castfs_qtensor q = {
			.src_off = o->src,
			.nelems = o->t->nelems,
			.blocksize = castfs_gguf_blck(o->type, &bytes),
			.src_dtype = o->t->dtype,
			.qtype = (uint8_t)castfs_gguf_block_qtype(o->type),
		};

		if (is_deq(o))
			rc = castfs_gguf_deq_add_qt(pb, o->g, o->t, &q, &qt);
		else
			rc = castfs_pb_add_qtensor(pb, &q, &qt);
	}
	if (!rc && !o->heads) {
		rc = add_rows(pb, o, qt, 0, rows);
	} else if (!rc) {
		uint64_t hd = rows / o->heads, half = hd / 2;

		/* a bias permutes like the rows it adds to */
		for (uint64_t r = 0; !rc && r < rows; r++) {
			uint64_t src =
				r / hd * hd + (r % 2) * half + r % hd / 2;

			rc = add_rows(pb, o, qt, src, 1);
		}
	}
	return rc;
}

static void write_versions(struct castfs_gguf_w *w, const struct castfs_view *v)
{
	castfs_gguf_kv_u32(w, "general.quantization_version", 2);
	castfs_gguf_kv_u32(
		w, "general.file_type",
		castfs_gguf_file_type((enum castfs_ggml_type)v->gguf_type));
}

static size_t count_tensors(const struct castfs_md_gguf_src *s)
{
	size_t n = 0;

	for (size_t k = 0; k < s->nh; k++)
		n += s->h[k]->ntensors;
	return n ? n : 1;
}

/* The tokenizer KVs of the folder's text files. */
static int write_tokenizer(struct castfs_gguf_w *w, const struct llm *m,
			   const cJSON *tok, const cJSON *tc,
			   const struct castfs_md_gguf_src *s,
			   struct castfs_diag *d)
{
	const struct castfs_md_tok_src ts = {
		.tok = tok,
		.tc = tc,
		.cfg = m->cfg,
		.jinja = s->chat_jinja,
		.jinja_len = s->chat_jinja_len,
		.ct_json = s->chat_json,
		.ct_json_len = s->chat_json_len,
		.xtmpl = s->xtmpl,
		.nxtmpl = s->nxtmpl,
		.xtmpl_why = s->xtmpl_why,
	};

	return castfs_md_gguf_tokenizer(w, m->vocab_size, &ts, d);
}

static int build(const struct castfs_view *v, const struct llm *m,
		 const cJSON *tok, const cJSON *tc,
		 const struct castfs_md_gguf_src *s,
		 struct castfs_gguf_deq *const *g, struct castfs_plan **out,
		 struct castfs_diag *d)
{
	struct llm_out *o = calloc(count_tensors(s), sizeof(*o));
	uint64_t *nbytes = calloc(count_tensors(s), 8);
	struct castfs_gguf_w *w = NULL;
	uint64_t off;
	size_t n = 0;
	int rc = o && nbytes ? castfs_gguf_w_new(&w) : -ENOMEM;

	if (!rc)
		rc = describe_all(v, m, s, g, o, &n, d);
	if (!rc) {
		castfs_gguf_kv_str(w, "general.architecture", m->arch->name);
		if (!quantize_made(v))
			write_versions(w, v);
		write_hparams(w, m);
		rc = write_tokenizer(w, m, tok, tc, s, d);
	}
	/* llama-quantize sets both after copying the input's KVs: last */
	if (!rc && quantize_made(v))
		write_versions(w, v);
	for (size_t i = 0; !rc && i < n; i++)
		rc = castfs_gguf_tensor(w, o[i].name, strlen(o[i].name),
					o[i].t->ndim, o[i].t->shape, o[i].type,
					&off, &nbytes[i]);
	if (!rc)
		rc = castfs_view_gguf_assemble(w, n, nbytes, add_data, o, out);
	castfs_gguf_w_free(w);
	free(nbytes);
	free(o);
	return rc;
}

/*
 * build() over the shards as the GGUF quantisers read them: a quantized
 * shard as its bf16 view (castfs_md_gguf_deq(): names, shapes and
 * elements of the bf16 model), a plain one as stored. A config.json
 * quantization_config is accepted only when the weights are quantized.
 */
static int build_deq(const struct castfs_view *v, const struct llm *m,
		     const cJSON *tok, const cJSON *tc,
		     const struct castfs_md_gguf_src *s,
		     struct castfs_plan **out, struct castfs_diag *d)
{
	const cJSON *qc =
		cJSON_GetObjectItemCaseSensitive(m->cfg, "quantization_config");
	bool declared = qc && !cJSON_IsNull(qc) && !cJSON_IsFalse(qc);
	struct castfs_md_gguf_src es = *s;
	struct castfs_md_gguf_deq q = { 0 };
	int rc = castfs_md_gguf_deq(s, declared, &q, d);

	if (!rc && declared && !q.nquant)
		rc = castfs_diag_set(d, -EINVAL,
				     "GGUF: config.json quantization_config "
				     "is not supported");
	es.h = q.h;
	if (!rc)
		rc = build(v, m, tok, tc, &es, q.g, out, d);
	castfs_md_gguf_deq_fini(&q);
	return rc;
}

int castfs_md_gguf_plan(const struct castfs_view *v, const char *config,
			size_t config_len, const char *tokenizer,
			size_t tokenizer_len, const char *tok_config,
			size_t tok_config_len, const struct castfs_header *h,
			struct castfs_plan **out, struct castfs_diag *d)
{
	const struct castfs_md_gguf_src s = {
		.config = config,
		.config_len = config_len,
		.tokenizer = tokenizer,
		.tokenizer_len = tokenizer_len,
		.tok_config = tok_config,
		.tok_config_len = tok_config_len,
		.h = &h,
		.nh = 1,
	};

	return castfs_md_gguf_plan_src(v, &s, out, d);
}

/* 0 if no text of @s is over its cap of JSON values, which cJSON would
 * turn into ~80 bytes each, else -E2BIG (@d says which). */
static int texts_capped(const struct castfs_md_gguf_src *s,
			struct castfs_diag *d)
{
	int rc = castfs_md_json_cap(s->config, s->config_len,
				    CASTFS_MD_JSON_VALUES_MAX, d,
				    "GGUF: config.json");

	if (!rc)
		rc = castfs_md_json_cap(s->tokenizer, s->tokenizer_len,
					CASTFS_MD_TOK_VALUES_MAX, d,
					"GGUF: tokenizer.json");
	if (!rc && s->tok_config)
		rc = castfs_md_json_cap(s->tok_config, s->tok_config_len,
					CASTFS_MD_TOK_VALUES_MAX, d,
					"GGUF: tokenizer_config.json");
	return rc;
}

int castfs_md_gguf_plan_src(const struct castfs_view *v,
			    const struct castfs_md_gguf_src *s,
			    struct castfs_plan **out, struct castfs_diag *d)
{
	cJSON *cfg, *tok, *tc = NULL;
	struct llm m = { 0 };
	int rc = texts_capped(s, d);

	if (rc)
		return rc;
	cfg = cJSON_ParseWithLength(s->config, s->config_len);
	tok = cJSON_ParseWithLength(s->tokenizer, s->tokenizer_len);
	if (s->tok_config)
		tc = cJSON_ParseWithLength(s->tok_config, s->tok_config_len);
	if (v->kind != CASTFS_VIEW_GGUF)
		rc = castfs_diag_set(d, -EINVAL, "not a GGUF view");
	else if (!s->nh || s->nh > CASTFS_PART_MAX || (s->nh > 1 && !s->index))
		rc = castfs_diag_set(d, -EINVAL, "GGUF: %zu weight files",
				     s->nh);
	else if (!cJSON_IsObject(cfg) || !cJSON_IsObject(tok) ||
		 (s->tok_config && !cJSON_IsObject(tc)))
		rc = castfs_diag_set(d, -EINVAL,
				     "GGUF: config.json, tokenizer.json or "
				     "tokenizer_config.json is not a JSON "
				     "object");
	else
		rc = read_config(&m, cfg, d);
	if (!rc && s->index)
		rc = castfs_md_gguf_check_map(s, d);
	if (!rc)
		rc = build_deq(v, &m, tok, tc, s, out, d);
	cJSON_Delete(cfg);
	cJSON_Delete(tok);
	cJSON_Delete(tc);
	return rc;
}
