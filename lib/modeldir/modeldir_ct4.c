/* SPDX-License-Identifier: MIT */
/*
 * config.json of a compressed-tensors FP4 model (nvfp4-pack-quantized,
 * mxfp4-pack-quantized): whether its quantization_config is the layout
 * castfs dequantizes exactly (docs/FORMATS.md, "compressed-tensors NVFP4
 * / MXFP4"). Anything else keeps the directory's views refused.
 */
#include <cjson/cJSON.h>
#include <string.h>

#include "modeldir/modeldir_internal.h"

/* A member that is absent, null, or an empty object. */
static bool ct4_empty(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return !v || cJSON_IsNull(v) || (cJSON_IsObject(v) && !v->child);
}

/* String member @key equals @want. */
static bool ct4_is(const cJSON *o, const char *key, const char *want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* Member @key absent, null, or the string @want. */
static bool ct4_opt(const cJSON *o, const char *key, const char *want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return !v || cJSON_IsNull(v) || ct4_is(o, key, want);
}

static bool ct4_num(const cJSON *o, const char *key, double want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) && v->valuedouble == want;
}

/* The weights of format @fmt as its preset (NVFP4A16 / MXFP4A16) has them. */
static bool ct4_weights(const cJSON *w, bool nv)
{
	const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
	const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(w, "dynamic");

	if (!cJSON_IsObject(w) || !ct4_num(w, "num_bits", 4) ||
	    !ct4_is(w, "type", "float") || cJSON_IsFalse(sym) ||
	    (dyn && !cJSON_IsFalse(dyn)) || !ct4_empty(w, "actorder") ||
	    !ct4_empty(w, "block_structure"))
		return false;
	if (nv)
		return ct4_is(w, "strategy", "tensor_group") &&
		       ct4_num(w, "group_size", 16) &&
		       ct4_opt(w, "scale_dtype", "torch.float8_e4m3fn");
	return ct4_is(w, "strategy", "group") && ct4_num(w, "group_size", 32) &&
	       ct4_opt(w, "scale_dtype", "torch.uint8");
}

/* One config group of format @fmt. */
static bool ct4_group(const cJSON *g, const char *fmt)
{
	if (!cJSON_IsObject(g) || !ct4_opt(g, "format", fmt) ||
	    !ct4_empty(g, "output_activations"))
		return false;
	return ct4_weights(cJSON_GetObjectItemCaseSensitive(g, "weights"),
			   strcmp(fmt, "nvfp4-pack-quantized") == 0);
}

bool castfs_md_ct_fp4(const cJSON *qc)
{
	static const char *const fmts[] = { "nvfp4-pack-quantized",
					    "mxfp4-pack-quantized" };
	const cJSON *groups =
		cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
	const cJSON *g;
	const char *fmt = NULL;
	int n = 0;

	for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
		if (ct4_is(qc, "format", fmts[i]))
			fmt = fmts[i];
	}
	if (!fmt || !ct4_is(qc, "quant_method", "compressed-tensors") ||
	    !ct4_empty(qc, "kv_cache_scheme") ||
	    !ct4_empty(qc, "sparsity_config") ||
	    !ct4_empty(qc, "transform_config") || !cJSON_IsObject(groups))
		return false;
	cJSON_ArrayForEach(g, groups) {
		if (!ct4_group(g, fmt))
			return false;
		n++;
	}
	return n > 0;
}
