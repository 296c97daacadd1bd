/* SPDX-License-Identifier: MIT */
/*
 * Model-directory views: the names loaders look for, the config.json patch
 * (dtype, bitsandbytes quantization_config). cJSON validates the text
 * (castfs_md_parse); edits work on byte spans of it, so the rest stays as it was.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckd.h"
#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"

static const char st_ext[] = ".safetensors";
static const char index_stem[] = ".safetensors.index";
static const char json_ext[] = ".json";
#define LIT_LEN(s) (sizeof(s) - 1)

/* ---- names ---- */

static bool ends_with(const char *s, size_t n, const char *suf, size_t sn)
{
	return n > sn && memcmp(s + n - sn, suf, sn) == 0;
}

bool castfs_md_is_base_index(const char *name)
{
	size_t n = strlen(name);

	return n > LIT_LEN(json_ext) &&
	       ends_with(name, n - LIT_LEN(json_ext), index_stem,
			 LIT_LEN(index_stem)) &&
	       ends_with(name, n, json_ext, LIT_LEN(json_ext));
}

bool castfs_md_split_variant_index(const char *name, size_t *stem_len,
				   const char **view, size_t *view_len)
{
	size_t n = strlen(name), body;
	const char *dot;

	if (!ends_with(name, n, json_ext, LIT_LEN(json_ext)))
		return false;
	body = n - LIT_LEN(json_ext); /* "X.safetensors.index.<v>" */
	dot = memrchr(name, '.', body);
	if (!dot ||
	    !castfs_view_name_valid(dot + 1, (size_t)(name + body - dot - 1)))
		return false;
	if (!ends_with(name, (size_t)(dot - name), index_stem,
		       LIT_LEN(index_stem)))
		return false;
	*stem_len = (size_t)(dot - name);
	*view = dot + 1;
	*view_len = (size_t)(name + body - dot - 1);
	return true;
}

enum castfs_md_name castfs_md_name_kind(const char *name)
{
	size_t n = strlen(name), stem, vlen;
	const char *v;

	if (strcmp(name, "config.json") == 0)
		return CASTFS_MD_CONFIG;
	if (strcmp(name, "model_index.json") == 0)
		return CASTFS_MD_PIPELINE;
	if (ends_with(name, n, st_ext, LIT_LEN(st_ext)))
		return CASTFS_MD_WEIGHTS;
	if (castfs_md_is_base_index(name) ||
	    castfs_md_split_variant_index(name, &stem, &v, &vlen))
		return CASTFS_MD_INDEX;
	return CASTFS_MD_OTHER;
}

/* ---- reading JSON ---- */

static const struct castfs_md_member *
find_member(const char *js, const struct castfs_md_object *o, const char *key)
{
	for (size_t i = 0; i < o->n; i++) {
		if (castfs_md_key_is(js, &o->m[i], key))
			return &o->m[i];
	}
	return NULL;
}

/* A plain string member (no escapes) into @out (@size bytes), or "". */
static void config_str(const char *js, const struct castfs_md_member *m,
		       char *out, size_t size)
{
	size_t n = m ? m->val_len : 0;

	out[0] = '\0';
	if (n < 2 || js[m->val] != '"' || n - 2 >= size ||
	    memchr(js + m->val, '\\', n))
		return;
	memcpy(out, js + m->val + 1, n - 2);
	out[n - 2] = '\0';
}

/* Whether member @m is a JSON integer over 0 (a count of experts). */
static bool positive_int(const char *js, const struct castfs_md_member *m)
{
	size_t i = 0, n = m ? m->val_len : 0;

	if (!n || js[m->val] == '0')
		return false;
	while (i < n && js[m->val + i] >= '0' && js[m->val + i] <= '9')
		i++;
	return i == n;
}

/* The keys transformers' MoE configs count their experts with. */
static bool config_moe(const char *js, const struct castfs_md_object *o)
{
	static const char *const keys[] = { "num_local_experts", "num_experts",
					    "n_routed_experts" };

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (positive_int(js, find_member(js, o, keys[i])))
			return true;
	}
	return false;
}

/* The class names of "architectures" into @out (none unless every one
 * is a plain string that fits). */
static void config_archs(const char *js, const struct castfs_md_member *m,
			 struct castfs_md_config *out)
{
	cJSON *a = m ? cJSON_ParseWithLength(js + m->val, m->val_len) : NULL;
	const cJSON *e;
	unsigned n = 0;

	out->narch = 0;
	if (!cJSON_IsArray(a)) {
		cJSON_Delete(a);
		return;
	}
	cJSON_ArrayForEach(e, a) {
		if (!cJSON_IsString(e) || n == CASTFS_MD_ARCH_MAX ||
		    strlen(e->valuestring) >= sizeof(out->arch[0])) {
			n = 0;
			break;
		}
		strcpy(out->arch[n++], e->valuestring);
	}
	out->narch = n;
	cJSON_Delete(a);
}

/*
 * A multimodal model's "text_config" (member @m, or none): its language
 * model's model_type and experts, which the loader's quantisation meets
 * under the top level's class (LLaVA of a Mixtral: routers and experts
 * kept), into @out.
 */
static int config_text(const char *js, size_t len,
		       const struct castfs_md_member *m,
		       struct castfs_md_config *out)
{
	struct castfs_md_object t;
	int rc;

	out->text_model_type[0] = '\0';
	if (!m || js[m->val] != '{')
		return 0;
	rc = castfs_md_scan_object(js, len, m->val, &t);
	if (rc)
		return rc == -EINVAL ? 0 : rc;
	config_str(js, find_member(js, &t, "model_type"), out->text_model_type,
		   sizeof(out->text_model_type));
	out->moe = out->moe || config_moe(js, &t);
	castfs_md_object_fini(&t);
	return 0;
}

int castfs_md_config_read(const char *json, size_t len,
			  struct castfs_md_config *out, struct castfs_diag *d)
{
	struct castfs_md_object o;
	int rc = castfs_md_parse(json, len, NULL, d, "config.json");

	if (!rc)
		rc = castfs_md_top_object(json, len, &o);
	if (rc)
		return rc;
	out->diffusers = find_member(json, &o, "_class_name") ||
			 find_member(json, &o, "_diffusers_version");
	out->quantized = find_member(json, &o, "quantization_config") != NULL;
	config_str(json, find_member(json, &o, "model_type"), out->model_type,
		   sizeof(out->model_type));
	config_str(json, find_member(json, &o, "_class_name"), out->class_name,
		   sizeof(out->class_name));
	out->class_embeds =
		positive_int(json, find_member(json, &o, "num_class_embeds"));
	out->moe = config_moe(json, &o);
	config_archs(json, find_member(json, &o, "architectures"), out);
	rc = config_text(json, len, find_member(json, &o, "text_config"), out);
	castfs_md_object_fini(&o);
	return rc;
}

/* ---- which models get quantising views ---- */

/*
 * The classes whose quantising DIR.<view>/ loads as the loader's own
 * quantisation of the source does: every module class and parameter, and
 * the logits, of transformers + bitsandbytes (nf4, int8); with @ct, also
 * byte for byte llm-compressor's file, its ignore list included, loaded by
 * transformers with nothing missing (tests/compat: test_modeldir,
 * test_bnb, test_bnb_heads, test_ct, test_ct_moe, test_ct_w4_src,
 * test_requant; the bug hunts of stop 41; transformers 5.24,
 * llm-compressor 0.14). Sorted by name.
 */
struct quant_arch {
	const char *name;
	bool ct;
};

static const struct quant_arch quantisable[] = {
	{ "BartForConditionalGeneration", true },
	{ "BertForSequenceClassification", false }, /* ct: no lm_head */
	{ "BertModel", false },
	{ "BloomForCausalLM", true },
	{ "CLIPTextModel", false },
	{ "CLIPTextModelWithProjection", false },
	{ "CohereForCausalLM", true },
	{ "ElectraForMaskedLM", false }, /* ct: tied generator_lm_head */
	{ "GPT2LMHeadModel", true },
	{ "GPTBigCodeForCausalLM", false }, /* ct: w4a16 does not load */
	{ "GPTJForCausalLM", true },
	{ "GPTNeoXForCausalLM", true },
	{ "Gemma2ForCausalLM", true },
	{ "Gemma2Model", false },
	{ "Gemma3ForCausalLM", true },
	{ "GptOssForCausalLM", false }, /* ct: experts linearised */
	{ "LlamaForCausalLM", true },
	{ "LlamaForSequenceClassification", false },
	{ "LlavaForConditionalGeneration", false },
	{ "MT5EncoderModel", false },
	{ "MistralForCausalLM", true },
	{ "MixtralForCausalLM", true },
	{ "OPTForCausalLM", true },
	{ "Phi3ForCausalLM", true },
	{ "Qwen2ForCausalLM", true },
	{ "Qwen2_5_VLForConditionalGeneration", false },
	{ "Qwen3ForCausalLM", true },
	{ "Qwen3Model", false },
	{ "Qwen3MoeForCausalLM", true },
	{ "RobertaForTokenClassification", false }, /* ct: no lm_head */
	{ "StableLmForCausalLM", true },
	{ "Starcoder2ForCausalLM", true },
	{ "T5EncoderModel", false },
	{ "T5ForConditionalGeneration", false },
	{ "UMT5EncoderModel", false },
	{ "ViTForImageClassification", false }, /* ct: renamed on load */
	{ "XLMRobertaModel", false },
};

static int cmp_arch(const void *key, const void *e)
{
	return strcmp(key, ((const struct quant_arch *)e)->name);
}

/*
 * diffusers classes whose quantising views load as diffusers' own
 * bitsandbytes quantisation of the source (test_modeldir: UNet, Flux;
 * the bug hunt of stop 42: SD3, PixArt, AutoencoderKL and SDXL's UNet,
 * every module class and parameter). Others are not: nn.Embedding tables
 * by other names (DiT's class_embedder.embedding_table), Linears of
 * _keep_in_fp32_modules (Wan's time_embedder) were quantised and loaded
 * as codes. Sorted.
 */
static const char *const quantisable_diffusers[] = {
	"AutoencoderKL",
	"FluxTransformer2DModel",
	"PixArtTransformer2DModel",
	"SD3Transformer2DModel",
	"UNet2DConditionModel",
};

static int cmp_name(const void *key, const void *e)
{
	return strcmp(key, *(const char *const *)e);
}

static bool diffusers_quantisable(const struct castfs_md_config *c)
{
	if (!bsearch(c->class_name, quantisable_diffusers,
		     sizeof(quantisable_diffusers) /
			     sizeof(quantisable_diffusers[0]),
		     sizeof(quantisable_diffusers[0]), cmp_name))
		return false;
	/* num_class_embeds makes class_embedding an nn.Embedding. */
	return !(c->class_embeds &&
		 strcmp(c->class_name, "UNet2DConditionModel") == 0);
}

bool castfs_md_quantisable(const struct castfs_md_config *c, bool ct)
{
	if (c->diffusers)
		return diffusers_quantisable(c);
	/* A language model with keep rules inside a multimodal class (LLaVA
	 * of a GPT-2: Conv1D kept): the loader renames the checkpoint's
	 * modules (language_model.model.* to model.language_model.*), so
	 * the skip list would name none of them, and the kept Conv1D
	 * weights would load into Linear4bit modules (a bug hunt). */
	if (!castfs_md_keep_id(c->model_type) &&
	    castfs_md_keep_id(c->text_model_type))
		return false;
	for (unsigned i = 0; i < c->narch; i++) {
		const struct quant_arch *e =
			bsearch(c->arch[i], quantisable,
				sizeof(quantisable) / sizeof(quantisable[0]),
				sizeof(quantisable[0]), cmp_arch);

		if (!e || (ct && !e->ct))
			return false;
	}
	return c->narch > 0;
}

/* ---- modules the loader keeps in full precision ---- */

/*
 * transformers 5.24 _keep_in_fp32_modules entries that are Linear layers,
 * per model_type, as globs on tensor names. The loader skips a module if
 * its name starts with the entry up to a dot or ends with it
 * (should_convert_module), hence "X.*" and "*X.weight". Also 2-D weights
 * of modules that are not nn.Linear, which no quantizer replaces: gpt-oss's
 * GptOssTopKRouter (its experts are 3-D, never quantised by castfs). And
 * GPT-2-style Conv1D weights, stored [in, out]: transformers quantises
 * their transpose, castfs the rows as stored, so they stay as they are
 * (listed), never codes of the wrong orientation. @fp32: the entries of
 * _keep_in_fp32_modules, which only the bitsandbytes views keep:
 * llm-compressor quantises every Linear it targets, those included (the
 * compressed-tensors views are its file, byte for byte).
 */
static const struct {
	const char *model_type;
	const char *keep[6];
	bool fp32;
} keep_table[] = {
#define CONV1D                                                      \
	{                                                           \
		"*c_attn.weight", "*q_attn.weight", "*c_fc.weight", \
			"*c_proj.weight"                            \
	}
	{ "gpt2", CONV1D, false },
	{ "openai-gpt", CONV1D, false },
	{ "imagegpt", CONV1D, false },
	{ "decision_transformer", CONV1D, false },
	{ "clvp", CONV1D, false },
	{ "t5", { "*wo.weight" }, true },
	{ "mt5", { "*wo.weight" }, true },
	{ "umt5", { "*wo.weight" }, true },
	{ "pop2piano", { "*wo.weight" }, true },
	{ "udop", { "*wo.weight" }, true },
	{ "blip-2", { "qformer.*", "*qformer.weight" }, true },
	{ "deepseek_v32", { "*indexer.weights_proj.weight" }, true },
	{ "glm_moe_dsa", { "*indexer.weights_proj.weight" }, true },
	{ "mistral_large4", { "*indexer.weights_proj.weight" }, true },
	{ "mistral_large4_text", { "*indexer.weights_proj.weight" }, true },
	{ "axk2", { "*indexer.weights_proj.weight" }, true },
	{ "gpt_oss", { "*mlp.router.weight" }, false },
	{ "deepseek_v4",
	  { "*self_attn.compressor.kv_proj.weight",
	    "*self_attn.compressor.gate_proj.weight",
	    "*self_attn.compressor.indexer.kv_proj.weight",
	    "*self_attn.compressor.indexer.gate_proj.weight",
	    "*self_attn.compressor.indexer.scorer.weights_proj.weight" },
	  true },
};

#define KEEP_COUNT (sizeof(keep_table) / sizeof(keep_table[0]))

int castfs_md_keep_id(const char *model_type)
{
	for (size_t i = 0; i < KEEP_COUNT; i++) {
		if (strcmp(keep_table[i].model_type, model_type) == 0)
			return (int)i + 1;
	}
	return 0;
}

int castfs_md_keep_of(const struct castfs_md_config *c)
{
	return castfs_md_keep_id(c->model_type) |
	       (c->moe ? CASTFS_MD_KEEP_MOE : 0);
}

/*
 * A mixture of experts' routers: Mixtral's block_sparse_moe.gate, the
 * mlp.gate of Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3 and the other models
 * transformers maps to them. Not nn.Linear in transformers 5.24, so no
 * quantizer replaces them (llm-compressor lists them in "ignore").
 */
static const char *const moe_routers[] = { "*block_sparse_moe.gate.weight",
					   "*mlp.gate.weight" };

/* Per-expert weights ("...experts.<i>.w1.weight"), which transformers
 * fuses into one 3-D parameter per layer on load (MergeModulelist). */
static const char *const moe_experts[] = { "*.experts.*" };

#define KEEP_MAX 9 /* a table entry, routers and experts */

/* The patterns of keep set @keep for view @v into @k; how many. */
static size_t keep_patterns(const struct castfs_view *v, int keep,
			    const char *k[KEEP_MAX])
{
	int id = keep & ~CASTFS_MD_KEEP_MOE;
	bool table = id && !(keep_table[id - 1].fp32 && castfs_view_is_ct(v));
	size_t n = 0;

	for (size_t i = 0; table && i < 6 && keep_table[id - 1].keep[i]; i++)
		k[n++] = keep_table[id - 1].keep[i];
	if (!(keep & CASTFS_MD_KEEP_MOE))
		return n;
	for (size_t i = 0; i < 2; i++)
		k[n++] = moe_routers[i];
	if (!castfs_view_is_ct(v))
		k[n++] = moe_experts[0];
	return n;
}

int castfs_md_view_keep(const struct castfs_view *v, int keep,
			struct castfs_md_view *out)
{
	const char *k[KEEP_MAX];
	int id = keep & ~CASTFS_MD_KEEP_MOE;
	size_t nk;

	if (id < 0 || (size_t)id > KEEP_COUNT ||
	    (keep & ~(CASTFS_MD_KEEP_MOE | 0xFF)) || keep == 0)
		return -EINVAL;
	nk = keep_patterns(v, keep, k);
	out->v = *v;
	out->v.owned_summary = NULL;
	out->v.rules = calloc(nk + v->nrules ? nk + v->nrules : 1,
			      sizeof(*out->v.rules));
	out->v.nrules = 0;
	out->nkeep = 0;
	if (!out->v.rules)
		return -ENOMEM;
	for (; out->nkeep < nk; out->nkeep++) {
		struct castfs_rule *r = &out->v.rules[out->nkeep];

		*r = (struct castfs_rule){ .pattern = strdup(k[out->nkeep]),
					   .min_rank = 2,
					   .max_rank = 2 };
		if (!r->pattern) {
			castfs_md_view_fini(out);
			return -ENOMEM;
		}
	}
	for (size_t i = 0; i < v->nrules; i++)
		out->v.rules[nk + i] = v->rules[i];
	out->v.nrules = nk + v->nrules;
	return 0;
}

void castfs_md_view_fini(struct castfs_md_view *mv)
{
	for (size_t i = 0; i < mv->nkeep; i++)
		free(mv->v.rules[i].pattern);
	free(mv->v.rules);
	mv->v.rules = NULL;
	mv->v.nrules = 0;
	mv->nkeep = 0;
}

/* ---- the bitsandbytes quantization_config ---- */

static int skip_add(struct castfs_md_bnb *q, size_t *cap, const char *s,
		    size_t n)
{
	char *copy;

	if (q->nskip == *cap) {
		size_t ncap = *cap ? *cap * 2 : 16;
		char **ns = realloc(q->skip, ncap * sizeof(*ns));

		if (!ns)
			return -ENOMEM;
		q->skip = ns;
		*cap = ncap;
	}
	copy = strndup(s, n);
	if (!copy)
		return -ENOMEM;
	q->skip[q->nskip++] = copy;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void skip_sort_unique(struct castfs_md_bnb *q)
{
	size_t w = 0;

	if (q->nskip)
		qsort(q->skip, q->nskip, sizeof(*q->skip), cmp_str);
	for (size_t i = 0; i < q->nskip; i++) {
		if (w && strcmp(q->skip[w - 1], q->skip[i]) == 0)
			free(q->skip[i]);
		else
			q->skip[w++] = q->skip[i];
	}
	q->nskip = w;
}

/* The module path of 2-D weight @t ("a.b.weight" -> 5), or 0. */
static size_t weight_module_len(const struct castfs_tensor *t)
{
	static const char w[] = ".weight";

	if (t->ndim != 2 || strlen(t->name) != t->name_len ||
	    !ends_with(t->name, t->name_len, w, LIT_LEN(w)))
		return 0;
	return t->name_len - LIT_LEN(w);
}

/* The dtype quant_state names for a source dtype (as view_bnb.c). */
static const char *bnb_compute_dtype(enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F64)
		return "float32";
	if (dt == CASTFS_DTYPE_F8_E4M3 || dt == CASTFS_DTYPE_F8_E5M2)
		return "bfloat16";
	return castfs_dtype_torch(dt);
}

/* One 2-D weight: quantised (fixing the compute dtype on the first), or
 * listed. */
static int bnb_weight(struct castfs_md_bnb *q, size_t *cap,
		      const struct castfs_view *v,
		      const struct castfs_tensor *t)
{
	size_t mod = weight_module_len(t);

	if (!mod)
		return 0;
	if (castfs_view_converts(v, t)) {
		if (!q->compute_dtype && !q->load_in_8bit)
			q->compute_dtype = bnb_compute_dtype(t->dtype);
		return 0;
	}
	return skip_add(q, cap, t->name, mod);
}

/* Whether @v quantises an lm_head.weight of @h (a config rule can): then
 * the loader must build lm_head quantised, and it is not listed. */
static bool quantises_lm_head(const struct castfs_view *v,
			      const struct castfs_header *const *h, size_t nh)
{
	static const char lm[] = "lm_head.weight";

	for (size_t i = 0; i < nh; i++) {
		const struct castfs_tensor *t =
			castfs_header_find(h[i], lm, LIT_LEN(lm));

		if (t && weight_module_len(t) && castfs_view_converts(v, t))
			return true;
	}
	return false;
}

static void bnb_kind(struct castfs_md_bnb *q, const struct castfs_view *v)
{
	q->load_in_8bit = v->kind == CASTFS_VIEW_INT8;
	q->double_quant = !q->load_in_8bit && v->nested;
	q->quant_type = !q->load_in_8bit && v->qtype == CASTFS_Q_NF4 ? "nf4" :
								       "fp4";
}

int castfs_md_bnb_init(struct castfs_md_bnb *q, const struct castfs_view *v,
		       const struct castfs_header *const *h, size_t nh,
		       bool diffusers)
{
	size_t cap = 0;
	int rc = 0;

	*q = (struct castfs_md_bnb){ 0 };
	if (v->kind != CASTFS_VIEW_BNB4 && v->kind != CASTFS_VIEW_INT8)
		return -EINVAL;
	bnb_kind(q, v);
	for (size_t i = 0; !rc && i < nh; i++) {
		for (size_t j = 0; !rc && j < h[i]->ntensors; j++)
			rc = bnb_weight(q, &cap, v, &h[i]->tensors[j]);
	}
	if (!rc && !diffusers && !quantises_lm_head(v, h, nh))
		rc = skip_add(q, &cap, "lm_head", 7);
	if (rc) {
		castfs_md_bnb_fini(q);
		return rc;
	}
	skip_sort_unique(q);
	if (!q->compute_dtype)
		q->compute_dtype = "float32";
	/* transformers' null keeps lm_head, tied weights and the module of
	 * the last named parameter, in the model's order, which no
	 * checkpoint shows: a score or text_projection head castfs
	 * quantised was built plain around its codes. So the list, with
	 * lm_head unless a rule quantised it. diffusers' null keeps
	 * nothing. */
	q->skip_null = diffusers && q->nskip == 0;
	return 0;
}

void castfs_md_bnb_fini(struct castfs_md_bnb *q)
{
	for (size_t i = 0; i < q->nskip; i++)
		free(q->skip[i]);
	free(q->skip);
	q->skip = NULL;
	q->nskip = 0;
}

/* ---- editing config.json ---- */

const char *castfs_md_view_dtype(const struct castfs_view *v)
{
	if (v->kind != CASTFS_VIEW_CAST)
		return NULL;
	if (v->dtype == CASTFS_DTYPE_F32 || v->dtype == CASTFS_DTYPE_F16 ||
	    v->dtype == CASTFS_DTYPE_BF16)
		return castfs_dtype_torch(v->dtype);
	return NULL;
}

static void style_of(const char *js, const struct castfs_md_member *m,
		     struct castfs_md_style *s)
{
	const char *nl;

	s->lead = js + m->lead;
	s->lead_len = m->lead_len;
	s->sep = js + m->key + m->key_len;
	s->sep_len = m->val - (m->key + m->key_len);
	nl = memrchr(s->lead, '\n', s->lead_len);
	s->pretty = nl != NULL;
	s->unit = nl ? nl + 1 : "";
	s->unit_len = nl ? (size_t)(s->lead + s->lead_len - nl - 1) : 0;
}

/* The whitespace before a member @depth levels below the styled one. */
static void put_lead(struct castfs_strbuf *b, const struct castfs_md_style *s,
		     int depth)
{
	castfs_sb_put(b, s->lead, s->lead_len);
	for (int i = 0; i < depth; i++)
		castfs_sb_put(b, s->unit, s->unit_len);
}

void castfs_md_put_next(struct castfs_strbuf *b,
			const struct castfs_md_style *s, int depth, bool first)
{
	if (!first)
		castfs_sb_put(b, ",", 1);
	if (s->pretty)
		put_lead(b, s, depth);
	else if (!first)
		castfs_sb_put(b, " ", 1);
}

void castfs_md_put_close(struct castfs_strbuf *b,
			 const struct castfs_md_style *s, int depth, char c)
{
	if (s->pretty)
		put_lead(b, s, depth);
	castfs_sb_put(b, &c, 1);
}

static void put_skip_list(struct castfs_strbuf *b,
			  const struct castfs_md_style *s,
			  const struct castfs_md_bnb *q)
{
	if (q->skip_null) {
		castfs_sb_puts(b, "null");
		return;
	}
	castfs_sb_put(b, "[", 1);
	for (size_t i = 0; i < q->nskip; i++) {
		castfs_md_put_next(b, s, 2, i == 0);
		castfs_md_put_str(b, q->skip[i], strlen(q->skip[i]));
	}
	castfs_md_put_close(b, s, 1, ']');
}

/* BitsAndBytesConfig.to_dict(), keys sorted as save_pretrained writes. */
static void put_bnb(struct castfs_strbuf *b, const struct castfs_md_style *s,
		    const struct castfs_md_bnb *q)
{
	const char *b4 = q->load_in_8bit ? "false" : "true";
	const char *b8 = q->load_in_8bit ? "true" : "false";
	char cdt[48], qt[16];
	const struct {
		const char *key, *val; /* NULL: the skip list */
	} kv[] = {
		{ "_load_in_4bit", b4 },
		{ "_load_in_8bit", b8 },
		{ "bnb_4bit_compute_dtype", cdt },
		{ "bnb_4bit_quant_storage", "\"uint8\"" },
		{ "bnb_4bit_quant_type", qt },
		{ "bnb_4bit_use_double_quant",
		  q->double_quant ? "true" : "false" },
		{ "llm_int8_enable_fp32_cpu_offload", "false" },
		{ "llm_int8_has_fp16_weight", "false" },
		{ "llm_int8_skip_modules", NULL },
		{ "llm_int8_threshold", "6.0" }, /* must be a JSON float */
		{ "load_in_4bit", b4 },
		{ "load_in_8bit", b8 },
		{ "quant_method", "\"bitsandbytes\"" },
	};

	snprintf(cdt, sizeof(cdt), "\"%s\"", q->compute_dtype);
	snprintf(qt, sizeof(qt), "\"%s\"", q->quant_type);
	castfs_sb_put(b, "{", 1);
	for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
		castfs_md_put_next(b, s, 1, i == 0);
		castfs_md_put_str(b, kv[i].key, strlen(kv[i].key));
		castfs_sb_put(b, s->sep, s->sep_len);
		if (kv[i].val)
			castfs_sb_puts(b, kv[i].val);
		else
			put_skip_list(b, s, q);
	}
	castfs_md_put_close(b, s, 0, '}');
}

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn)
{
	int c = memcmp(a, b, an < bn ? an : bn);

	return c ? c : (an > bn) - (an < bn);
}

/* Compare the keys of @a and @b (quoted raw text; quotes compare equal). */
static int key_cmp(const char *js, const struct castfs_md_member *a,
		   const char *key)
{
	return cmp_bytes(js + a->key + 1, a->key_len - 2, key, strlen(key));
}

static bool keys_sorted(const char *js, const struct castfs_md_object *o)
{
	for (size_t i = 1; i < o->n; i++) {
		const struct castfs_md_member *a = &o->m[i - 1], *b = &o->m[i];

		if (cmp_bytes(js + a->key, a->key_len, js + b->key,
			      b->key_len) >= 0)
			return false;
	}
	return true;
}

/* How to write a new member's value in a given style. */
typedef void (*put_value_fn)(struct castfs_strbuf *b,
			     const struct castfs_md_style *s, const void *ctx);

static void put_member(struct castfs_strbuf *b, const struct castfs_md_style *s,
		       const char *key, put_value_fn put, const void *ctx)
{
	castfs_md_put_str(b, key, strlen(key));
	castfs_sb_put(b, s->sep, s->sep_len);
	put(b, s, ctx);
}

/*
 * The layout between two members of @o: the lead of its second member
 * (the first has none in compact JSON), or of the only one when pretty,
 * else json.dumps' default ", ".
 */
static void style_between(const char *js, const struct castfs_md_object *o,
			  struct castfs_md_style *s)
{
	style_of(js, &o->m[o->n > 1 ? 1 : 0], s);
	if (o->n == 1 && !s->pretty) {
		s->lead = " ";
		s->lead_len = 1;
	}
}

/* @js with member @key added as sorted keys place it, styled like its
 * neighbours. @o is the top-level object of @js. */
static void insert_member(struct castfs_strbuf *b, const char *js, size_t len,
			  const struct castfs_md_object *o, const char *key,
			  put_value_fn put, const void *ctx)
{
	static const struct castfs_md_style compact = { "",    0,  ": ", 2,
							false, "", 0 };
	struct castfs_md_style s;
	size_t i = 0, at;

	if (o->n == 0) {
		castfs_sb_put(b, js, o->open + 1);
		put_member(b, &compact, key, put, ctx);
		castfs_sb_put(b, js + o->open + 1, len - o->open - 1);
		return;
	}
	if (keys_sorted(js, o)) {
		while (i < o->n && key_cmp(js, &o->m[i], key) < 0)
			i++;
	} else {
		i = o->n;
	}
	style_between(js, o, &s);
	if (i < o->n) {
		at = o->m[i].key;
		castfs_sb_put(b, js, at);
		put_member(b, &s, key, put, ctx);
		castfs_sb_put(b, ",", 1);
		castfs_sb_put(b, s.lead, s.lead_len);
	} else {
		at = o->m[i - 1].val + o->m[i - 1].val_len;
		castfs_sb_put(b, js, at);
		castfs_sb_put(b, ",", 1);
		castfs_sb_put(b, s.lead, s.lead_len);
		put_member(b, &s, key, put, ctx);
	}
	castfs_sb_put(b, js + at, len - at);
}

static void put_dtype_value(struct castfs_strbuf *b,
			    const struct castfs_md_style *s, const void *ctx)
{
	(void)s;
	castfs_md_put_str(b, ctx, strlen(ctx));
}

static void put_bnb_value(struct castfs_strbuf *b,
			  const struct castfs_md_style *s, const void *ctx)
{
	put_bnb(b, s, ctx);
}

static void put_ct_value(struct castfs_strbuf *b,
			 const struct castfs_md_style *s, const void *ctx)
{
	md_put_ct(b, s, ctx);
}

/* @js with every top-level "dtype"/"torch_dtype" set to @dtype. */
static void set_dtype(struct castfs_strbuf *b, const char *js, size_t len,
		      const struct castfs_md_object *o, const char *dtype)
{
	size_t at = 0;
	bool found = false;

	for (size_t i = 0; i < o->n; i++) {
		const struct castfs_md_member *m = &o->m[i];

		if (!castfs_md_key_is(js, m, "dtype") &&
		    !castfs_md_key_is(js, m, "torch_dtype"))
			continue;
		castfs_sb_put(b, js + at, m->val - at);
		castfs_md_put_str(b, dtype, strlen(dtype));
		at = m->val + m->val_len;
		found = true;
	}
	if (!found) {
		insert_member(b, js, len, o, "dtype", put_dtype_value, dtype);
		return;
	}
	castfs_sb_put(b, js + at, len - at);
}

/*
 * Apply one edit to the text in @cur (replaced by the result): add
 * "quantization_config" written by @put from @ctx, or with @put NULL set
 * the dtype.
 */
static int patch_step(struct castfs_strbuf *cur,
		      const struct castfs_md_patch *p, put_value_fn put,
		      const void *ctx)
{
	struct castfs_strbuf next = { 0 };
	struct castfs_md_object o;
	int rc = castfs_md_top_object(cur->p, cur->len, &o);

	if (rc)
		return rc;
	if (put)
		insert_member(&next, cur->p, cur->len, &o,
			      "quantization_config", put, ctx);
	else
		set_dtype(&next, cur->p, cur->len, &o, p->dtype);
	castfs_md_object_fini(&o);
	castfs_sb_fini(cur);
	*cur = next;
	return cur->oom ? -ENOMEM : 0;
}

int castfs_md_config_patch(const char *json, size_t len,
			   const struct castfs_md_patch *p, char **out,
			   size_t *out_len, struct castfs_diag *d)
{
	struct castfs_md_config info;
	struct castfs_strbuf b = { 0 };
	int rc = castfs_md_config_read(json, len, &info, d);

	if (rc)
		return rc;
	if ((p->bnb || p->ct) && info.quantized)
		return castfs_diag_set(d, -EINVAL,
				       "config.json: already quantised");
	castfs_sb_put(&b, json, len);
	rc = b.oom ? -ENOMEM : 0;
	if (!rc && p->dtype)
		rc = patch_step(&b, p, NULL, NULL);
	if (!rc && p->bnb)
		rc = patch_step(&b, p, put_bnb_value, p->bnb);
	if (!rc && p->ct)
		rc = patch_step(&b, p, put_ct_value, p->ct);
	if (rc) {
		castfs_sb_fini(&b);
		return rc;
	}
	return castfs_sb_take(&b, out, out_len);
}
