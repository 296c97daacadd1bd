/* SPDX-License-Identifier: MIT */
/*
 * View recipes: the built-in views, and views defined or overridden by a
 * JSON config file (docs/CONFIG.md), validated into plain structs.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "common/hash.h"
#include "format/gguf.h"
#include "plan/plan.h"
#include "kernels/convert.h"
#include "view/view.h"

static const struct castfs_view builtin_views[] = {
	{ .name = "fp32",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F32,
	  .listed = true,
	  .summary = "floating tensors as float32" },
	{ .name = "fp16",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F16,
	  .listed = true,
	  .summary = "floating tensors as float16 (RNE)" },
	{ .name = "bf16",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_BF16,
	  .listed = true,
	  .summary = "floating tensors as bfloat16 (RNE)" },
	/* torch >= 2.12 saturates e4m3fn casts (pytorch#178817). */
	{ .name = "fp8",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F8_E4M3,
	  .cvt_flags = CASTFS_CVT_SATURATE,
	  .listed = true,
	  .summary = "float8_e4m3fn as torch >= 2.12: overflow, Inf -> +-448" },
	{ .name = "fp8_e4m3fn",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F8_E4M3,
	  .cvt_flags = CASTFS_CVT_SATURATE,
	  .summary = "the same bytes as fp8" },
	{ .name = "fp8_nan",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F8_E4M3,
	  .summary = "float8_e4m3fn as torch < 2.12: |x| > 464, Inf -> NaN" },
	{ .name = "fp8_e5m2",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F8_E5M2,
	  .listed = true,
	  .summary = "float8_e5m2 as torch casts: overflow -> Inf" },
	{ .name = "fp8_e5m2_sat",
	  .kind = CASTFS_VIEW_CAST,
	  .dtype = CASTFS_DTYPE_F8_E5M2,
	  .cvt_flags = CASTFS_CVT_SATURATE,
	  .summary = "float8_e5m2, overflow and Inf clamped to +-57344" },
	{ .name = "nf4",
	  .kind = CASTFS_VIEW_BNB4,
	  .qtype = CASTFS_Q_NF4,
	  .nested = true,
	  .blocksize = 64,
	  .listed = true,
	  .summary = "bitsandbytes NF4, blocksize 64, double quantisation" },
	{ .name = "fp4",
	  .kind = CASTFS_VIEW_BNB4,
	  .qtype = CASTFS_Q_FP4,
	  .nested = true,
	  .blocksize = 64,
	  .listed = true,
	  .summary = "bitsandbytes FP4, blocksize 64, double quantisation" },
	{ .name = "nf4_nodq",
	  .kind = CASTFS_VIEW_BNB4,
	  .qtype = CASTFS_Q_NF4,
	  .blocksize = 64,
	  .summary = "bitsandbytes NF4, blocksize 64, float32 absmax" },
	{ .name = "fp4_nodq",
	  .kind = CASTFS_VIEW_BNB4,
	  .qtype = CASTFS_Q_FP4,
	  .blocksize = 64,
	  .summary = "bitsandbytes FP4, blocksize 64, float32 absmax" },
	{ .name = "int8",
	  .kind = CASTFS_VIEW_INT8,
	  .qtype = CASTFS_Q_INT8,
	  .listed = true,
	  .summary = "bitsandbytes LLM.int8: row-wise int8 + SCB" },
	{ .name = "fp8_dynamic",
	  .kind = CASTFS_VIEW_CT_FP8,
	  .summary = "compressed-tensors FP8_DYNAMIC: e4m3 + per-channel "
		     "weight_scale, as llm-compressor writes it" },
	{ .name = "fp8_block",
	  .kind = CASTFS_VIEW_CT_FP8,
	  .ct_block = 128,
	  .summary = "compressed-tensors FP8_BLOCK: e4m3 + a weight_scale per "
		     "128x128 block, as llm-compressor writes it" },
	{ .name = "w4a16",
	  .kind = CASTFS_VIEW_CT_W4,
	  .summary =
		  "compressed-tensors W4A16: packed int4, symmetric, a "
		  "weight_scale per 128 columns, as llm-compressor writes it" },
	{ .name = "nvfp4",
	  .kind = CASTFS_VIEW_CT_NVFP4,
	  .summary = "compressed-tensors NVFP4A16: packed fp4 e2m1, an e4m3 "
		     "weight_scale per 16 columns and a global scale, as "
		     "llm-compressor writes it" },
	{ .name = "fp8_scaled",
	  .kind = CASTFS_VIEW_COMFY_FP8,
	  .summary = "ComfyUI scaled fp8: e4m3 Linear weights, an F32 "
		     "weight_scale per tensor and the comfy_quant marker "
		     "(single files)" },
	/* GGUF files for ComfyUI-GGUF: names end in .gguf, so that the file
	 * is X.<name> (docs/FORMATS.md "GGUF views"). */
	{ .name = "f16.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_F16,
	  .summary = "GGUF, diffusion models: F16 (1-D, small in F32)" },
	{ .name = "bf16.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_BF16,
	  .summary = "GGUF, diffusion models: BF16 (1-D, small in F32)" },
	{ .name = "q8_0.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_Q8_0,
	  .summary = "GGUF, diffusion models: Q8_0 2-D weights" },
	{ .name = "q4_0.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_Q4_0,
	  .summary = "GGUF, diffusion models: Q4_0 2-D weights" },
	/* K-quant files as llama-quantize mixes them; model folders only
	 * (modeldir_gguf_mix.c) */
	{ .name = "q4_k_m.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_Q4_K,
	  .summary = "GGUF, model folders: llama-quantize's Q4_K_M mix" },
	{ .name = "q5_k_m.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_Q5_K,
	  .summary = "GGUF, model folders: llama-quantize's Q5_K_M mix" },
	{ .name = "q6_k.gguf",
	  .kind = CASTFS_VIEW_GGUF,
	  .gguf_type = CASTFS_GGML_Q6_K,
	  .summary = "GGUF, model folders: Q6_K (llama-quantize Q6_K)" },
};

int castfs_views_builtin(struct castfs_views *vs)
{
	vs->n = sizeof(builtin_views) / sizeof(builtin_views[0]);
	vs->v = malloc(sizeof(builtin_views));
	if (!vs->v)
		return -ENOMEM;
	memcpy(vs->v, builtin_views, sizeof(builtin_views));
	return 0;
}

static void view_free_rules(struct castfs_view *v)
{
	for (size_t i = 0; i < v->nrules; i++)
		free(v->rules[i].pattern);
	free(v->rules);
	v->rules = NULL;
	v->nrules = 0;
}

static void view_release(struct castfs_view *v)
{
	view_free_rules(v);
	free(v->owned_summary);
	v->owned_summary = NULL;
}

void castfs_views_fini(struct castfs_views *vs)
{
	if (!vs->v)
		return;
	for (size_t i = 0; i < vs->n; i++)
		view_release(&vs->v[i]);
	free(vs->v);
	vs->v = NULL;
	vs->n = 0;
}

const struct castfs_view *castfs_view_builtin(const char *name)
{
	for (size_t i = 0; i < sizeof(builtin_views) / sizeof(*builtin_views);
	     i++) {
		if (!strcmp(builtin_views[i].name, name))
			return &builtin_views[i];
	}
	return NULL;
}

static const struct castfs_view *find_exact(const struct castfs_views *vs,
					    const char *name, size_t len)
{
	for (size_t i = 0; i < vs->n; i++) {
		if (strlen(vs->v[i].name) == len &&
		    memcmp(vs->v[i].name, name, len) == 0)
			return &vs->v[i];
	}
	return NULL;
}

const struct castfs_view *castfs_views_find(const struct castfs_views *vs,
					    const char *name, size_t len)
{
	const struct castfs_view *v = find_exact(vs, name, len);
	char buf[CASTFS_VIEW_NAME_MAX];

	/* "q8_0" names the GGUF view "q8_0.gguf" when nothing else is. */
	if (v || len + 6 > sizeof(buf))
		return v;
	memcpy(buf, name, len);
	memcpy(buf + len, ".gguf", 5);
	return find_exact(vs, buf, len + 5);
}

bool castfs_view_name_valid(const char *name, size_t len)
{
	if (len == 0 || len >= CASTFS_VIEW_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* ---- JSON config ---- */

/* Whether a member of @obj before @it has @it's key: cJSON keeps repeated
 * keys, and the last would win unseen. */
static bool key_repeated(const cJSON *obj, const cJSON *it)
{
	for (const cJSON *k = obj->child; k && k != it; k = k->next)
		if (k->string && it->string && !strcmp(k->string, it->string))
			return true;
	return false;
}

static bool key_is(const cJSON *item, const char *k)
{
	return strcmp(item->string, k) == 0;
}

static int parse_dtype(const cJSON *j, enum castfs_dtype *out, const char *view,
		       struct castfs_diag *d)
{
	static const struct {
		const char *alias;
		enum castfs_dtype dt;
	} aliases[] = {
		{ "fp32", CASTFS_DTYPE_F32 },
		{ "fp16", CASTFS_DTYPE_F16 },
		{ "bf16", CASTFS_DTYPE_BF16 },
		{ "fp8", CASTFS_DTYPE_F8_E4M3 },
		{ "fp8_e4m3fn", CASTFS_DTYPE_F8_E4M3 },
		{ "fp8_e5m2", CASTFS_DTYPE_F8_E5M2 },
	};
	const char *s = cJSON_GetStringValue(j);
	enum castfs_dtype dt;

	if (!s)
		return castfs_diag_set(
			d, -EINVAL, "view '%s': dtype must be a string", view);
	dt = castfs_dtype_from_name(s, strlen(s));
	for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
		if (strcmp(s, aliases[i].alias) == 0)
			dt = aliases[i].dt;
	}
	if (dt == CASTFS_DTYPE_INVALID)
		return castfs_diag_set(
			d, -EINVAL, "view '%s': unknown dtype '%s'", view, s);
	*out = dt;
	return 0;
}

static int parse_int(const cJSON *j, int lo, int hi, int *out, const char *what,
		     const char *view, struct castfs_diag *d)
{
	double v;

	if (!cJSON_IsNumber(j))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': %s must be a number", view,
				       what);
	v = j->valuedouble;
	if (v != (double)(int)v || v < lo || v > hi)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': %s must be an integer in "
				       "[%d, %d]",
				       view, what, lo, hi);
	*out = (int)v;
	return 0;
}

static int parse_bool(const cJSON *j, bool *out, const char *what,
		      const char *view, struct castfs_diag *d)
{
	if (!cJSON_IsBool(j))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': %s must be true or false",
				       view, what);
	*out = cJSON_IsTrue(j);
	return 0;
}

static int parse_rule_dtypes(const cJSON *j, struct castfs_rule *r,
			     const char *view, struct castfs_diag *d)
{
	const cJSON *it;

	if (!cJSON_IsArray(j))
		return castfs_diag_set(
			d, -EINVAL, "view '%s': rule dtypes must be an array",
			view);
	cJSON_ArrayForEach(it, j) {
		enum castfs_dtype dt;
		int rc = parse_dtype(it, &dt, view, d);

		if (rc)
			return rc;
		r->dtype_mask |= 1u << dt;
	}
	return 0;
}

static int parse_rule_field(const cJSON *f, struct castfs_rule *r,
			    bool *has_convert, const char *view,
			    struct castfs_diag *d)
{
	if (key_is(f, "match")) {
		if (!cJSON_IsString(f))
			return castfs_diag_set(
				d, -EINVAL,
				"view '%s': rule match must be a "
				"string",
				view);
		free(r->pattern);
		r->pattern = strdup(f->valuestring);
		return r->pattern ? 0 : -ENOMEM;
	}
	if (key_is(f, "dtypes"))
		return parse_rule_dtypes(f, r, view, d);
	if (key_is(f, "min_rank"))
		return parse_int(f, 0, 64, &r->min_rank, "min_rank", view, d);
	if (key_is(f, "max_rank"))
		return parse_int(f, 0, 64, &r->max_rank, "max_rank", view, d);
	if (key_is(f, "rank")) {
		int rc = parse_int(f, 0, 64, &r->min_rank, "rank", view, d);

		r->max_rank = r->min_rank;
		return rc;
	}
	if (key_is(f, "convert")) {
		*has_convert = true;
		return parse_bool(f, &r->convert, "convert", view, d);
	}
	return castfs_diag_set(d, -EINVAL, "view '%s': unknown rule key '%s'",
			       view, f->string);
}

static int parse_rule(const cJSON *j, struct castfs_rule *r, const char *view,
		      struct castfs_diag *d)
{
	bool has_convert = false;
	const cJSON *f;
	int rc;

	*r = (struct castfs_rule){ .min_rank = -1, .max_rank = -1 };
	if (!cJSON_IsObject(j))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': a rule must be an object",
				       view);
	cJSON_ArrayForEach(f, j) {
		/* one spelling of a rule only, as everywhere else */
		if (key_repeated(j, f) ||
		    (key_is(f, "rank") &&
		     (cJSON_GetObjectItemCaseSensitive(j, "min_rank") ||
		      cJSON_GetObjectItemCaseSensitive(j, "max_rank"))))
			return castfs_diag_set(d, -EINVAL,
					       "view '%s': rule key '%s' given "
					       "twice",
					       view, f->string);
		rc = parse_rule_field(f, r, &has_convert, view, d);
		if (rc)
			return rc;
	}
	if (!has_convert)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': rule without \"convert\"",
				       view);
	if (r->min_rank >= 0 && r->max_rank >= 0 && r->min_rank > r->max_rank)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': rule min_rank %d over "
				       "max_rank %d: it matches nothing",
				       view, r->min_rank, r->max_rank);
	return 0;
}

static int parse_rules(const cJSON *j, struct castfs_view *v,
		       struct castfs_diag *d)
{
	int n = cJSON_GetArraySize(j);
	const cJSON *it;
	size_t i = 0;

	if (!cJSON_IsArray(j))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': rules must be an array",
				       v->name);
	view_free_rules(v);
	v->rules = calloc(n ? (size_t)n : 1, sizeof(*v->rules));
	if (!v->rules)
		return -ENOMEM;
	cJSON_ArrayForEach(it, j) {
		int rc = parse_rule(it, &v->rules[i], v->name, d);

		v->nrules = ++i; /* so that view_free_rules frees it */
		if (rc)
			return rc;
	}
	return 0;
}

static int parse_kind(const cJSON *j, struct castfs_view *v,
		      struct castfs_diag *d)
{
	const char *s = cJSON_GetStringValue(j);

	if (s && strcmp(s, "cast") == 0)
		v->kind = CASTFS_VIEW_CAST;
	else if (s && strcmp(s, "bnb4") == 0)
		v->kind = CASTFS_VIEW_BNB4;
	else if (s && strcmp(s, "int8") == 0)
		v->kind = CASTFS_VIEW_INT8;
	else
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': kind must be \"cast\", "
				       "\"bnb4\" or \"int8\"",
				       v->name);
	return 0;
}

static int parse_quant_type(const cJSON *j, struct castfs_view *v,
			    struct castfs_diag *d)
{
	const char *s = cJSON_GetStringValue(j);

	if (s && strcmp(s, "nf4") == 0)
		v->qtype = CASTFS_Q_NF4;
	else if (s && strcmp(s, "fp4") == 0)
		v->qtype = CASTFS_Q_FP4;
	else
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': quant_type must be \"nf4\" "
				       "or \"fp4\"",
				       v->name);
	return 0;
}

static int parse_view_field(const cJSON *f, struct castfs_view *v,
			    struct castfs_diag *d)
{
	bool b = false;
	int i = 0, rc;

	if (key_is(f, "base"))
		return 0; /* applied before the other fields */
	if (key_is(f, "kind"))
		return parse_kind(f, v, d);
	if (key_is(f, "dtype"))
		return parse_dtype(f, &v->dtype, v->name, d);
	if (key_is(f, "quant_type"))
		return parse_quant_type(f, v, d);
	if (key_is(f, "rules"))
		return parse_rules(f, v, d);
	if (key_is(f, "blocksize")) {
		rc = parse_int(f, 64, 4096, &i, "blocksize", v->name, d);
		if (!rc && (i & (i - 1)))
			rc = castfs_diag_set(d, -EINVAL,
					     "view '%s': blocksize must be a "
					     "power of two",
					     v->name);
		if (!rc)
			v->blocksize = (uint32_t)i;
		return rc;
	}
	if (key_is(f, "saturate") || key_is(f, "double_quant") ||
	    key_is(f, "listed")) {
		rc = parse_bool(f, &b, f->string, v->name, d);
		if (rc)
			return rc;
		if (key_is(f, "saturate"))
			v->cvt_flags = b ? CASTFS_CVT_SATURATE : 0;
		else if (key_is(f, "double_quant"))
			v->nested = b;
		else
			v->listed = b;
		return 0;
	}
	if (key_is(f, "summary")) {
		if (!cJSON_IsString(f))
			return castfs_diag_set(d, -EINVAL,
					       "view '%s': summary must be a "
					       "string",
					       v->name);
		free(v->owned_summary);
		v->owned_summary = strdup(f->valuestring);
		v->summary = v->owned_summary;
		return v->owned_summary ? 0 : -ENOMEM;
	}
	return castfs_diag_set(d, -EINVAL, "view '%s': unknown key '%s'",
			       v->name, f->string);
}

/* Cross-field checks once every field is read. */
static int view_check(const struct castfs_view *v, struct castfs_diag *d)
{
	if (v->kind == CASTFS_VIEW_CAST && v->dtype == CASTFS_DTYPE_INVALID)
		return castfs_diag_set(
			d, -EINVAL,
			"view '%s': no dtype (give \"dtype\", or "
			"a \"base\" view to start from)",
			v->name);
	if (v->kind == CASTFS_VIEW_CAST && !castfs_dtype_is_castable(v->dtype))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': cannot cast to %s", v->name,
				       castfs_dtype_name(v->dtype));
	if (v->kind == CASTFS_VIEW_CAST && v->dtype == CASTFS_DTYPE_F64)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': F64 is not a cast target",
				       v->name);
	if (v->cvt_flags && v->kind == CASTFS_VIEW_CAST &&
	    v->dtype != CASTFS_DTYPE_F8_E4M3 &&
	    v->dtype != CASTFS_DTYPE_F8_E5M2)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': saturate needs an fp8 dtype "
				       "(a base fp8 view saturates: give "
				       "\"saturate\": false)",
				       v->name);
	if (v->kind == CASTFS_VIEW_BNB4 && !v->blocksize)
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': bnb4 needs a blocksize",
				       v->name);
	return 0;
}

/* Deep-copy @src into @dst: rules and the summary are not shared. */
static int view_copy(struct castfs_view *dst, const struct castfs_view *src)
{
	*dst = *src;
	dst->rules = NULL;
	dst->nrules = 0;
	dst->owned_summary = NULL;
	if (src->owned_summary) {
		dst->owned_summary = strdup(src->owned_summary);
		if (!dst->owned_summary)
			return -ENOMEM;
		dst->summary = dst->owned_summary;
	}
	if (!src->nrules)
		return 0;
	dst->rules = calloc(src->nrules, sizeof(*dst->rules));
	if (!dst->rules)
		return -ENOMEM;
	for (size_t i = 0; i < src->nrules; i++) {
		dst->rules[i] = src->rules[i];
		dst->rules[i].pattern = NULL;
		dst->nrules = i + 1;
		if (src->rules[i].pattern &&
		    !(dst->rules[i].pattern = strdup(src->rules[i].pattern)))
			return -ENOMEM;
	}
	return 0;
}

/* Start a config view from its base (a known view) or from defaults. */
static int view_init(struct castfs_view *v, const char *name, const cJSON *j,
		     const struct castfs_views *vs, struct castfs_diag *d)
{
	const cJSON *base = cJSON_GetObjectItemCaseSensitive(j, "base");
	const struct castfs_view *b = NULL;
	int rc = 0;

	*v = (struct castfs_view){ .kind = CASTFS_VIEW_CAST,
				   .dtype = CASTFS_DTYPE_INVALID,
				   .blocksize = 64 };
	if (base) {
		const char *bn = cJSON_GetStringValue(base);

		b = bn ? castfs_views_find(vs, bn, strlen(bn)) : NULL;
		if (!b)
			return castfs_diag_set(d, -EINVAL,
					       "view '%s': unknown base view",
					       name);
	} else {
		/* A known view's name alone: that view, changed by the
		 * fields given ({"nf4": {"listed": false}} hides nf4). */
		b = find_exact(vs, name, strlen(name));
	}
	if (b && b->kind == CASTFS_VIEW_GGUF)
		/* GGUF views are named with their extension, which config
		 * view names cannot hold: such a view would list and never
		 * open. */
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': a GGUF view cannot be a "
				       "config view's base",
				       name);
	if (b)
		rc = view_copy(v, b);
	if (base || !b) /* a view changed in place keeps its listing */
		v->listed = true;
	strcpy(v->name, name);
	return rc;
}

static int parse_view(const cJSON *j, const struct castfs_views *vs,
		      struct castfs_view *v, struct castfs_diag *d)
{
	const char *name = j->string;
	const cJSON *f;
	int rc;

	if (!castfs_view_name_valid(name, strlen(name)))
		return castfs_diag_set(
			d, -EINVAL, "view name '%s': use 1-31 of a-z 0-9 _ -",
			name);
	if (!cJSON_IsObject(j))
		return castfs_diag_set(d, -EINVAL,
				       "view '%s': must be an object", name);
	rc = view_init(v, name, j, vs, d);
	if (rc)
		return rc;
	cJSON_ArrayForEach(f, j) {
		rc = key_repeated(j, f) ?
			     castfs_diag_set(d, -EINVAL,
					     "view '%s': '%s' is given twice",
					     name, f->string) :
			     parse_view_field(f, v, d);
		if (rc)
			return rc;
	}
	return view_check(v, d);
}

/* Add @nv to @vs, replacing a view of the same name. Takes ownership. */
static int views_put(struct castfs_views *vs, struct castfs_view *nv)
{
	struct castfs_view *grown;

	for (size_t i = 0; i < vs->n; i++) {
		if (strcmp(vs->v[i].name, nv->name) == 0) {
			view_release(&vs->v[i]);
			vs->v[i] = *nv;
			return 0;
		}
	}
	grown = realloc(vs->v, (vs->n + 1) * sizeof(*vs->v));
	if (!grown)
		return -ENOMEM;
	vs->v = grown;
	vs->v[vs->n++] = *nv;
	return 0;
}

static uint64_t fp_u64(uint64_t h, uint64_t v)
{
	return castfs_fnv1a(h, &v, sizeof(v));
}

uint64_t castfs_view_fingerprint(const struct castfs_view *v)
{
	uint64_t h = CASTFS_FNV_SEED;

	/* Only the fields the kind reads: a cast view made from defaults
	 * (blocksize 64) converts as the built-in one (blocksize 0). */
	h = fp_u64(h, (uint64_t)v->kind);
	if (v->kind == CASTFS_VIEW_CAST) {
		h = fp_u64(h, (uint64_t)v->dtype);
		h = fp_u64(h, v->cvt_flags);
	} else if (v->kind == CASTFS_VIEW_BNB4) {
		h = fp_u64(h, v->qtype);
		h = fp_u64(h, v->nested);
		h = fp_u64(h, v->blocksize);
	} else if (v->kind == CASTFS_VIEW_CT_FP8) {
		h = fp_u64(h, v->ct_block);
	} else if (v->kind == CASTFS_VIEW_GGUF) {
		h = fp_u64(h, v->gguf_type);
	}
	h = fp_u64(h, v->nrules);
	for (size_t i = 0; i < v->nrules; i++) {
		const struct castfs_rule *r = &v->rules[i];
		const char *p = r->pattern ? r->pattern : "";

		h = fp_u64(h, r->pattern != NULL);
		h = castfs_fnv1a(fp_u64(h, strlen(p)), p, strlen(p));
		h = fp_u64(h, (uint64_t)(int64_t)r->min_rank);
		h = fp_u64(h, (uint64_t)(int64_t)r->max_rank);
		h = fp_u64(h, r->dtype_mask);
		h = fp_u64(h, r->convert);
	}
	h = castfs_mix64(h);
	return h ? h : 1;
}

/* A config view's id salt: 0 where it converts as the built-in of its
 * name, so that ids, NFS handles among them, stay those of the built-in
 * views across a reload; else its fingerprint. */
static uint64_t view_id_salt(const struct castfs_view *v)
{
	uint64_t fp = castfs_view_fingerprint(v);
	const struct castfs_view *b = castfs_view_builtin(v->name);

	return b && castfs_view_fingerprint(b) == fp ? 0 : fp;
}

static int load_views(struct castfs_views *vs, const cJSON *views,
		      struct castfs_diag *d)
{
	const cJSON *j;

	if (!cJSON_IsObject(views))
		return castfs_diag_set(d, -EINVAL,
				       "config: \"views\" must be an object");
	cJSON_ArrayForEach(j, views) {
		struct castfs_view v = { .nrules = 0 };
		int rc = 0;

		if (key_repeated(views, j))
			return castfs_diag_set(d, -EINVAL,
					       "view '%s' is defined twice",
					       j->string);
		rc = parse_view(j, vs, &v, d);

		if (!rc)
			v.id_salt = view_id_salt(&v);
		if (!rc)
			rc = views_put(vs, &v);
		if (rc) {
			view_release(&v);
			return rc;
		}
	}
	return 0;
}

/* Deep copy, so that a failed load leaves the caller's set unchanged. */
static int views_clone(const struct castfs_views *src, struct castfs_views *dst)
{
	dst->n = 0;
	dst->v = calloc(src->n ? src->n : 1, sizeof(*dst->v));
	if (!dst->v)
		return -ENOMEM;
	for (size_t i = 0; i < src->n; i++) {
		int rc = view_copy(&dst->v[i], &src->v[i]);

		dst->n = i + 1;
		if (rc)
			return rc;
	}
	return 0;
}

int castfs_views_load(struct castfs_views *vs, const char *json, size_t len,
		      struct castfs_diag *d)
{
	struct castfs_views nvs;
	const char *end = NULL;
	const cJSON *f;
	cJSON *root;
	int rc;

	/* The parse-end pointer, not cJSON's global error pointer. */
	root = cJSON_ParseWithLengthOpts(json, len, &end, false);
	while (root && end < json + len && strchr(" \t\r\n", *end) && *end)
		end++;
	if (!root || end != json + len) {
		cJSON_Delete(root);
		return castfs_diag_set(d, -EINVAL,
				       "config: not valid JSON near byte %zu",
				       (size_t)(end ? end - json : 0));
	}
	rc = views_clone(vs, &nvs);
	if (!rc && !cJSON_IsObject(root))
		rc = castfs_diag_set(d, -EINVAL,
				     "config: top level must be an object");
	for (f = cJSON_IsObject(root) ? root->child : NULL; f && !rc;
	     f = f->next) {
		if (key_repeated(root, f))
			rc = castfs_diag_set(d, -EINVAL,
					     "config: '%s' is given twice",
					     f->string);
		else if (key_is(f, "views"))
			rc = load_views(&nvs, f, d);
		else
			rc = castfs_diag_set(d, -EINVAL,
					     "config: unknown key '%s'",
					     f->string);
	}
	cJSON_Delete(root);
	if (rc) {
		castfs_views_fini(&nvs);
		return rc;
	}
	castfs_views_fini(vs);
	*vs = nvs;
	return 0;
}

static const char *kind_name(enum castfs_view_kind k)
{
	switch (k) {
	case CASTFS_VIEW_CAST:
		return "cast";
	case CASTFS_VIEW_BNB4:
		return "bnb4";
	case CASTFS_VIEW_INT8:
		return "int8";
	case CASTFS_VIEW_CT_FP8:
		return "ct_fp8";
	case CASTFS_VIEW_CT_W4:
		return "ct_w4";
	case CASTFS_VIEW_CT_NVFP4:
		return "ct_nvfp4";
	case CASTFS_VIEW_COMFY_FP8:
		return "comfy_fp8";
	case CASTFS_VIEW_GGUF:
		return "gguf";
	}
	return "?";
}

static cJSON *view_json(const struct castfs_view *v)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		return NULL;
	cJSON_AddStringToObject(o, "name", v->name);
	cJSON_AddStringToObject(o, "kind", kind_name(v->kind));
	if (v->kind == CASTFS_VIEW_CAST) {
		cJSON_AddStringToObject(o, "dtype",
					castfs_dtype_name(v->dtype));
		cJSON_AddBoolToObject(o, "saturate",
				      v->cvt_flags & CASTFS_CVT_SATURATE);
	} else if (v->kind == CASTFS_VIEW_BNB4) {
		cJSON_AddStringToObject(o, "quant_type",
					v->qtype == CASTFS_Q_FP4 ? "fp4" :
								   "nf4");
		cJSON_AddBoolToObject(o, "double_quant", v->nested);
		cJSON_AddNumberToObject(o, "blocksize", v->blocksize);
	}
	cJSON_AddNumberToObject(o, "rules", (double)v->nrules);
	cJSON_AddBoolToObject(o, "listed", v->listed);
	if (v->summary)
		cJSON_AddStringToObject(o, "summary", v->summary);
	return o;
}

char *castfs_views_json(const struct castfs_views *vs)
{
	cJSON *arr = cJSON_CreateArray();
	char *out;

	if (!arr)
		return NULL;
	for (size_t i = 0; i < vs->n; i++)
		cJSON_AddItemToArray(arr, view_json(&vs->v[i]));
	out = cJSON_PrintUnformatted(arr);
	cJSON_Delete(arr);
	return out;
}

/* Apply (or with @apply false, only check) the comma-separated @list. */
static int views_select_pass(struct castfs_views *vs, const char *list,
			     bool apply, struct castfs_diag *d)
{
	const char *p = list;

	while (*p) {
		size_t n = strcspn(p, ",:");
		/* castfs_views_find: "q8_0" selects "q8_0.gguf" too */
		const struct castfs_view *f = n ? castfs_views_find(vs, p, n) :
						  NULL;
		struct castfs_view *v = f ? &vs->v[f - vs->v] : NULL;

		if (n && !v)
			return castfs_diag_set(d, -EINVAL,
					       "views: unknown view '%.*s'",
					       (int)n, p);
		if (v && apply)
			v->listed = true;
		p += n;
		if (*p)
			p++;
	}
	return 0;
}

int castfs_views_select(struct castfs_views *vs, const char *list,
			struct castfs_diag *d)
{
	int rc = views_select_pass(vs, list, false, d);

	if (rc)
		return rc;
	for (size_t i = 0; i < vs->n; i++)
		vs->v[i].listed = false;
	return views_select_pass(vs, list, true, d);
}

/* A path as a JSON string, escaped so that the text stays valid UTF-8
 * (castfs_escape). */
static void add_path(cJSON *o, const char *key, const char *path)
{
	char *e = castfs_escape(path, strlen(path));

	if (e)
		cJSON_AddStringToObject(o, key, e);
	free(e);
}

char *castfs_config_render(const struct castfs_config_info *info)
{
	cJSON *root = cJSON_CreateObject();
	char *views, *out;

	if (!root)
		return NULL;
	add_path(root, "source", info->source);
	add_path(root, "mountpoint", info->mountpoint);
	if (info->config_file)
		add_path(root, "config", info->config_file);
	else
		cJSON_AddNullToObject(root, "config");
	cJSON_AddNumberToObject(root, "threads", info->threads);
	cJSON_AddNumberToObject(root, "timeout_s", info->timeout);
	cJSON_AddNumberToObject(root, "read_ahead_kb", info->read_ahead_kb);
	views = castfs_views_json(info->views);
	cJSON_AddItemToObject(root, "views",
			      views ? cJSON_Parse(views) : cJSON_CreateNull());
	free(views);
	out = cJSON_Print(root);
	cJSON_Delete(root);
	return out;
}
