/* SPDX-License-Identifier: MIT */
/*
 * Model directories (transformers and diffusers): which file names a
 * loader looks at, the config.json a directory view needs, and the
 * rewritten *.safetensors.index.json. Text in, text out: no I/O.
 */
#ifndef CASTFS_MODELDIR_H
#define CASTFS_MODELDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "format/st_header.h"
#include "view/view.h"

/* What a file name is to a loader. */
enum castfs_md_name {
	CASTFS_MD_OTHER,
	CASTFS_MD_WEIGHTS, /* "*.safetensors" */
	CASTFS_MD_INDEX, /* "*.safetensors.index.json" and variants of it
			     * ("*.safetensors.index.fp16.json") */
	CASTFS_MD_CONFIG, /* "config.json" */
	CASTFS_MD_PIPELINE, /* "model_index.json" (a diffusers pipeline) */
};

/* castfs_md_name_kind - what file name @name is. Pure function. */
enum castfs_md_name castfs_md_name_kind(const char *name);

/* castfs_md_is_base_index - true for "X.safetensors.index.json" (not a
 * variant of it): the names that get variant spellings. */
bool castfs_md_is_base_index(const char *name);

/*
 * castfs_md_split_variant_index - "X.safetensors.index.<v>.json" (the
 * spelling of variant=<v> in transformers and diffusers): the length of
 * "X.safetensors.index" into *@stem_len and <v> (not NUL-terminated) into
 * *@view / *@view_len. Returns false if @name is not spelled so.
 */
bool castfs_md_split_variant_index(const char *name, size_t *stem_len,
				   const char **view, size_t *view_len);

/* What a config.json says that matters to castfs. */
struct castfs_md_config {
	bool diffusers; /* "_class_name" or "_diffusers_version": no dtype */
	bool quantized; /* has "quantization_config": castfs offers no views */
	char model_type[48]; /* transformers "model_type", or "" */
	/* A multimodal model's language model: "text_config"'s model_type,
	 * or "" (one with keep rules makes the model not quantisable). */
	char text_model_type[48];
	/* A mixture of experts: "num_local_experts", "num_experts" or
	 * "n_routed_experts" over 0, at the top level or in "text_config". */
	bool moe;
	/* "architectures": its class names (up to CASTFS_MD_ARCH_MAX) when
	 * it is a list of plain strings that fit, else @narch is 0. */
	unsigned narch;
	char arch[4][64];
	/* diffusers: its "_class_name" (a plain string that fits, or ""),
	 * and whether "num_class_embeds" is a count (a UNet's
	 * class_embedding is then an nn.Embedding). */
	char class_name[64];
	bool class_embeds;
};

#define CASTFS_MD_ARCH_MAX 4

/*
 * castfs_md_quantisable - whether castfs offers the bitsandbytes views
 * (the compressed-tensors ones with @ct) of a transformers folder with
 * config @c: every class of its "architectures" is one whose DIR.<view>/
 * was checked against the loader's own quantisation (docs/MODELDIR.md).
 * castfs sees tensor names, not module classes: a 2-D weight of a module
 * that is no nn.Linear (an embedding by another name, FalconLinear, a
 * tied output embedding) would be quantised and built as a Linear around
 * its codes. A diffusers folder likewise by its "_class_name" (the
 * classes checked against diffusers' own bitsandbytes quantisation; a
 * UNet2DConditionModel without class embeddings). Pure function.
 */
bool castfs_md_quantisable(const struct castfs_md_config *c, bool ct);

/*
 * castfs_md_config_read - parse config.json text @json (@len bytes, not
 * NUL-terminated) into @out. Returns 0 or -EINVAL (not a JSON object; @d
 * says why) or -ENOMEM. Thread-safe.
 */
int castfs_md_config_read(const char *json, size_t len,
			  struct castfs_md_config *out, struct castfs_diag *d);

/* The largest edge of a weight_block_size castfs accepts (FP8 block). */
#define CASTFS_MD_FP8_BLOCK_MAX 65536

/* What a config.json's quantization_config says (top level, or a copy
 * nested in "text_config"). */
struct castfs_md_quant {
	bool quantized; /* it has one */
	bool fp8_block; /* quant_method "fp8" with weight_block_size
			 * [bm, bn] or null: the layout castfs dequantizes */
	/* fp8_block: weight_block_size [bm, bn]; 0, 0 when absent or null
	 * (castfs then pairs 128x128 blocks and per-tensor scales). */
	uint32_t block_rows, block_cols;
	/* quant_method "bitsandbytes" with load_in_8bit (LLM.int8): its
	 * I8 weights and SCB are dequantized too. */
	bool bnb_int8;
	bool mxfp4; /* quant_method "mxfp4" (gpt-oss): dequantized too */
	/* quant_method "bitsandbytes" with load_in_4bit: its nf4/fp4
	 * weights are dequantized too. */
	bool bnb_4bit;
	/* compressed-tensors "pack-quantized" int4 (W4A16[_ASYM], group
	 * or channel): dequantized too. */
	bool ct_w4;
	bool ct_w4_asym; /* ct_w4 with symmetric false: zero points */
	bool ct_fp8; /* compressed-tensors float-quantized FP8 weights
		      * (tensor, channel, 128x128 block): dequantized too */
	unsigned ct_fp8_strategies; /* ct_fp8: its CASTFS_QSTRAT_* */
	bool ct_fp4; /* compressed-tensors nvfp4-/mxfp4-pack-quantized:
		      * dequantized too */
	bool ct_fp4_mx; /* ct_fp4 of the mxfp4 format */
	char method[32]; /* its quant_method, for messages ("?" if none) */
	/* For a compressed-tensors config castfs does not dequantize, what
	 * rules it out, for the refusal (" (format 'mixed-precision')"), or
	 * "". */
	char detail[80];
};

/*
 * castfs_md_quant_kinds - the CASTFS_QK_* layouts @q declares (0 when it
 * declares none), each file's quantized weights to be checked against
 * (castfs_qsrc_opts.declared). Pure; thread-safe.
 */
unsigned castfs_md_quant_kinds(const struct castfs_md_quant *q);

/*
 * castfs_md_quant_dequantized - whether @q's layout is one castfs
 * dequantizes (FP8 block, LLM.int8), so that the directory keeps its
 * dequantizing views. Pure; thread-safe.
 */
bool castfs_md_quant_dequantized(const struct castfs_md_quant *q);

/*
 * castfs_md_quant_read - the quantization_config of config.json text
 * @json (@len bytes). Returns 0, -EINVAL (not a JSON object; @d says why)
 * or -ENOMEM. Thread-safe.
 */
int castfs_md_quant_read(const char *json, size_t len,
			 struct castfs_md_quant *out, struct castfs_diag *d);

/*
 * castfs_md_config_unquant - config.json text @json without its
 * "quantization_config" members (the top-level one and the copy in
 * "text_config"), for views whose weights are dequantized; everything
 * else is kept byte for byte. @out: a malloc'ed NUL-terminated text, its
 * length in *@out_len. Returns 0, -EINVAL or -ENOMEM. Thread-safe.
 */
int castfs_md_config_unquant(const char *json, size_t len, char **out,
			     size_t *out_len, struct castfs_diag *d);

/*
 * The bitsandbytes quantization_config of a view, as
 * BitsAndBytesConfig.to_dict() writes it (docs/LOADERS.md §3.1).
 */
struct castfs_md_bnb {
	bool load_in_8bit; /* else 4-bit */
	bool double_quant; /* 4-bit */
	const char *quant_type; /* "nf4" or "fp4" ("fp4" for 8-bit) */
	const char *compute_dtype; /* torch dtype name */
	bool skip_null; /* "llm_int8_skip_modules": null */
	size_t nskip;
	char **skip; /* sorted, unique module paths (owned) */
};

/*
 * castfs_md_bnb_init - the quantization_config of bitsandbytes view @v
 * over a model whose weights are the tensors of @h[0..@nh).
 * @diffusers: the model is a diffusers one (no default skips in the
 *	loader: null only if every 2-D weight is quantised); else
 *	transformers (null when the view applies its default rule, whose
 *	unquantised 2-D weights are exactly those the loader's default keeps;
 *	otherwise the full module path of every unquantised 2-D "*.weight"
 *	plus "lm_head").
 * The compute dtype is the dtype the quantised weights come back in.
 * Returns 0, -EINVAL (@v is not a bitsandbytes view) or -ENOMEM; on
 * success castfs_md_bnb_fini() releases @q.
 */
int castfs_md_bnb_init(struct castfs_md_bnb *q, const struct castfs_view *v,
		       const struct castfs_header *const *h, size_t nh,
		       bool diffusers);

/* castfs_md_bnb_fini - free the skip list; safe on a zeroed struct. */
void castfs_md_bnb_fini(struct castfs_md_bnb *q);

/*
 * castfs_md_keep_id - the set of modules transformers keeps unquantised
 * for @model_type (its _keep_in_fp32_modules that name Linear layers, as
 * of transformers 5.24: T5's "wo", BLIP-2's "qformer", ...), as a small
 * positive id, or 0 for none. Pure function.
 */
int castfs_md_keep_id(const char *model_type);

/* Added to a keep id: the model is a mixture of experts (below). */
#define CASTFS_MD_KEEP_MOE 0x100

/*
 * castfs_md_keep_of - castfs_md_keep_id() of @c's model type, with
 * CASTFS_MD_KEEP_MOE for a mixture of experts: its routers (transformers'
 * TopKRouter modules, no nn.Linear) stay unquantised in every quantising
 * view, and for bitsandbytes views its per-expert weights too, which
 * transformers fuses into 3-D parameters on load (a fused parameter of
 * codes would load as values). Pure function.
 */
int castfs_md_keep_of(const struct castfs_md_config *c);

/* A view with a model's keep rules in front of its own. */
struct castfs_md_view {
	struct castfs_view v;
	size_t nkeep; /* rules of ours, owning their patterns */
};

/*
 * castfs_md_view_keep - @v with rules that keep the 2-D weights of keep
 * set @keep (castfs_md_keep_id(), castfs_md_keep_of()) unconverted in front
 * of its own rules,
 * into @out (castfs_md_view_fini() releases it; @v must outlive it).
 * Returns 0, -EINVAL (no such set) or -ENOMEM.
 */
int castfs_md_view_keep(const struct castfs_view *v, int keep,
			struct castfs_md_view *out);

/* castfs_md_view_fini - release what castfs_md_view_keep() made. */
void castfs_md_view_fini(struct castfs_md_view *mv);

/*
 * The compressed-tensors quantization_config of a view (llm-compressor's
 * FP8_DYNAMIC / FP8_BLOCK / W4A16 presets), with the minimal key set that
 * compressed-tensors readers old and new accept (docs/FORMATS.md).
 */
struct castfs_md_ct {
	bool w4; /* W4A16 (pack-quantized int4, group 128); else FP8 */
	bool nvfp4; /* NVFP4A16 (nvfp4-pack-quantized, group 16) */
	uint32_t block; /* FP8: 0 per-channel weight scales, else N x N */
	size_t nignore;
	char **ignore; /* "lm_head", then sorted unique module paths (owned) */
	size_t nquant; /* weights the view quantises: 0, no config at all */
};

/*
 * castfs_md_ct_init - the quantization_config of compressed-tensors view
 * @v over a model whose weights are the tensors of @h[0..@nh): "ignore"
 * names lm_head (as the presets' recipes do) and the module path of every
 * 2-D "*.weight" of a Linear-like module (castfs_view_linear_weight()) the
 * view keeps unquantised. Returns 0, -EINVAL (@v is not such a view) or
 * -ENOMEM; on success castfs_md_ct_fini() releases @q. Thread-safe.
 */
int castfs_md_ct_init(struct castfs_md_ct *q, const struct castfs_view *v,
		      const struct castfs_header *const *h, size_t nh);

/* castfs_md_ct_fini - free the ignore list; safe on a zeroed struct. */
void castfs_md_ct_fini(struct castfs_md_ct *q);

/* What a view changes in config.json. */
struct castfs_md_patch {
	const char *dtype; /* transformers: the "dtype" to write, or NULL */
	const struct castfs_md_bnb *bnb; /* quantization_config, or NULL */
	const struct castfs_md_ct *ct; /* quantization_config, or NULL */
};

/*
 * castfs_md_view_dtype - the "dtype" a transformers config.json of view
 * @v says: the view's dtype for float32/float16/bfloat16 casts; NULL
 * (keep the source's) for every other view, because transformers cannot
 * hold a model in fp8 and loads bitsandbytes weights in the source dtype.
 */
const char *castfs_md_view_dtype(const struct castfs_view *v);

/*
 * castfs_md_config_patch - config.json text @json with @p applied: every
 * top-level "dtype" and "torch_dtype" set to @p->dtype (a "dtype" member
 * added when there is none), and "quantization_config" added. Everything
 * else is kept byte for byte; new members go where sorted keys put them
 * (after the last member if the keys are not sorted) and are indented
 * like their neighbours, as json.dumps(indent=N, sort_keys=True) writes.
 * @out: on success a malloc'ed NUL-terminated text, its length in
 *	*@out_len.
 * Returns 0, -EINVAL (not a JSON object, or it already has a
 * quantization_config while @p->bnb is set) or -ENOMEM. Thread-safe.
 */
int castfs_md_config_patch(const char *json, size_t len,
			   const struct castfs_md_patch *p, char **out,
			   size_t *out_len, struct castfs_diag *d);

/*
 * The output header of one shard of an index through the view, for
 * castfs_md_index_rewrite(). @name is the shard's file name as the source
 * index gives it. On success *@out is a header the rewrite frees. Returns
 * 0 or a negative errno that aborts the rewrite.
 */
typedef int (*castfs_md_shard_fn)(void *ctx, const char *name,
				  struct castfs_header **out);

/*
 * castfs_md_index_rewrite - a *.safetensors.index.json for the converted
 * shards: "weight_map" maps every tensor of every shard the source index
 * names to its shard (the file name itself, or "X.<@variant>.safetensors"
 * for "X.safetensors" when @variant is set), and "metadata"."total_size"
 * is the sum of the shards' tensor bytes, as huggingface_hub counts it.
 * Other metadata and top-level members are kept as they were. Written as
 * json.dumps(index, indent=2, sort_keys=True) + "\n".
 * Returns 0, -EINVAL (malformed index, or a shard name that is not a
 * plain "*.safetensors" file name; @d says why), -ENOMEM, or the error of
 * @shard. Thread-safe if @shard is.
 */
int castfs_md_index_rewrite(const char *json, size_t len, const char *variant,
			    castfs_md_shard_fn shard, void *ctx, char **out,
			    size_t *out_len, struct castfs_diag *d);

/*
 * castfs_md_index_check - whether castfs_md_index_rewrite() would accept
 * the shape of index @json (@len bytes): a JSON object whose "weight_map"
 * is an object of plain "*.safetensors" file names; on success the length
 * of the longest such name into *@longest (if not NULL), so that a caller
 * knows which variant spellings of the shards fit NAME_MAX. Reads no
 * shard, so a listing can afford it. Returns 0, -EINVAL, -E2BIG (@d says
 * why) or -ENOMEM. Thread-safe.
 */
int castfs_md_index_check(const char *json, size_t len, size_t *longest,
			  struct castfs_diag *d);

/*
 * castfs_md_gguf_plan - the llama.cpp GGUF file of a transformers
 * causal-LM folder whose weights are the one checkpoint @h: the text of its
 * config.json, tokenizer.json and (optional, NULL) tokenizer_config.json,
 * seen through GGUF view @v (docs/FORMATS.md "GGUF of model directories").
 * The plan reads @h's file. Returns 0, -EINVAL with the reason in @d
 * (an architecture, option, tokenizer or tensor castfs does not map),
 * -EOVERFLOW or -ENOMEM. Thread-safe; the caller owns *@out.
 */
int castfs_md_gguf_plan(const struct castfs_view *v, const char *config,
			size_t config_len, const char *tokenizer,
			size_t tokenizer_len, const char *tok_config,
			size_t tok_config_len, const struct castfs_header *h,
			struct castfs_plan **out, struct castfs_diag *d);

struct castfs_qsrc_opts;

/* One file of a model folder's additional_chat_templates/. */
struct castfs_md_xtmpl {
	const char *name; /* its name, ending in ".jinja" */
	const char *text; /* its bytes, or NULL: no readable regular file */
	size_t len;
};

/* What a model folder's GGUF file is made of: its text files and its
 * weights, one checkpoint or the shards of an index. Borrowed. */
struct castfs_md_gguf_src {
	const char *config, *tokenizer, *tok_config; /* tok_config: NULL */
	size_t config_len, tokenizer_len, tok_config_len;
	/* chat_template.jinja and chat_template.json, each NULL when absent:
	 * the chat template when tokenizer_config.json has none */
	const char *chat_jinja, *chat_json;
	size_t chat_jinja_len, chat_json_len;
	/* the files of additional_chat_templates/, read beside chat_template.jinja
	 * only, sorted by name */
	const struct castfs_md_xtmpl *xtmpl;
	size_t nxtmpl;
	/* why the GGUF is refused if it reads them (too many, a link), or
	 * NULL */
	const char *xtmpl_why;
	/* The model.safetensors.index.json text of sharded weights (else
	 * NULL), and its shards' file names in castfs_md_gguf_shards()
	 * order, shard k's header in h[k]. */
	const char *index;
	size_t index_len;
	const char *const *shards;
	const struct castfs_header *const *h;
	size_t nh;
	/* The quantized layout its config.json gives (the FP8 block size;
	 * view/qsrc.h), or NULL. A quantized shard is read as its bf16 view
	 * (docs/FORMATS.md "GGUF of a quantized source"). */
	const struct castfs_qsrc_opts *qopts;
};

/*
 * castfs_md_gguf_plan_src - castfs_md_gguf_plan() of weights in one or
 * several files: shard k's bytes are part k of the plan's source
 * (castfs_part_off(), read through a castfs_multi_reader), and the
 * tensors are in convert_hf_to_gguf.py's order (shard by shard, each
 * shard's by name). Sharded weights must match the index exactly: every
 * tensor of shard k mapped to s->shards[k] and nothing else mapped
 * (-EINVAL otherwise, as convert_hf_to_gguf.py stops). Errors and
 * ownership as castfs_md_gguf_plan(). Thread-safe.
 */
int castfs_md_gguf_plan_src(const struct castfs_view *v,
			    const struct castfs_md_gguf_src *s,
			    struct castfs_plan **out, struct castfs_diag *d);

/*
 * castfs_md_gguf_shards - the shard file names of index @json (@len
 * bytes), each once, sorted bytewise (convert_hf_to_gguf.py reads the
 * parts in sorted order), into a malloc'ed array *@names of *@n
 * malloc'ed strings (free with castfs_md_gguf_shards_free()). A name must
 * be a plain file name ending in ".safetensors". Returns 0, -EINVAL (@d
 * says why) or -ENOMEM; nothing is written on error. Thread-safe.
 */
int castfs_md_gguf_shards(const char *json, size_t len, char ***names,
			  size_t *n, struct castfs_diag *d);

/* castfs_md_gguf_shards_free - free what castfs_md_gguf_shards() gave;
 * NULL is accepted. */
void castfs_md_gguf_shards_free(char **names, size_t n);

/*
 * castfs_md_gguf_check_map - whether the index of @s maps every tensor of
 * every shard to that shard's name and names no other tensor. Returns 0,
 * -EINVAL (@d says which tensor) or -ENOMEM. Thread-safe.
 */
int castfs_md_gguf_check_map(const struct castfs_md_gguf_src *s,
			     struct castfs_diag *d);

#endif
