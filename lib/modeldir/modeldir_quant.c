/* SPDX-License-Identifier: MIT */
/*
 * config.json of a quantized model: whether its quantization_config is a
 * layout castfs dequantizes (FP8 block, quant_method "fp8"), and the text
 * without it for the dequantized views.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"
#include "view/qsrc.h"

/*
 * Member @key: absent or null (per-tensor, or castfs's default), or
 * [bm, bn] of positive integers; @out gets [bm, bn] or [0, 0].
 */
static bool block_key(const cJSON *qc, const char *key, uint32_t out[2])
{
	const cJSON *b = cJSON_GetObjectItemCaseSensitive(qc, key);
	const cJSON *e;
	int n = 0;

	out[0] = out[1] = 0;
	if (!b || cJSON_IsNull(b))
		return true;
	if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2)
		return false;
	cJSON_ArrayForEach(e, b) {
		double v = cJSON_IsNumber(e) ? e->valuedouble : 0;

		if (v < 1 || v > CASTFS_MD_FP8_BLOCK_MAX || v != (uint32_t)v)
			return false;
		out[n++] = (uint32_t)v;
	}
	return n == 2;
}

/* weight_block_size of quant_method "fp8": any [bm, bn]. */
static bool block_ok(const cJSON *qc, uint32_t out[2])
{
	return block_key(qc, "weight_block_size", out);
}

/* compressed-tensors' block_structure: [128, 128], the one block castfs
 * pairs its scales with (qsrc_ct.c). */
static bool ct_block_ok(const cJSON *w)
{
	uint32_t b[2];

	return block_key(w, "block_structure", b) && b[0] == 128 && b[1] == 128;
}

/* A string member that is absent, or one of @ok (NULL-terminated). */
static bool str_in(const cJSON *qc, const char *key, const char *const *ok)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, key);

	if (!v || cJSON_IsNull(v))
		return true;
	if (!cJSON_IsString(v))
		return false;
	for (; *ok; ok++) {
		if (strcmp(v->valuestring, *ok) == 0)
			return true;
	}
	return false;
}

/* Whether @qc is the FP8 block layout of DeepSeek-V3 / transformers. */
static bool fp8_block(const cJSON *qc, uint32_t block[2])
{
	static const char *const fp8[] = { "fp8", NULL };
	static const char *const fmt[] = { "e4m3", NULL };
	static const char *const sfmt[] = { "float", "ue8m0", NULL };
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");

	return m && cJSON_IsString(m) && str_in(qc, "quant_method", fp8) &&
	       str_in(qc, "fmt", fmt) && str_in(qc, "scale_fmt", sfmt) &&
	       block_ok(qc, block);
}

/* Whether @qc is transformers' BitsAndBytesConfig of an 8-bit model. */
static bool bnb_int8(const cJSON *qc)
{
	static const char *const bnb[] = { "bitsandbytes", NULL };
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
	const cJSON *l8 = cJSON_GetObjectItemCaseSensitive(qc, "load_in_8bit");
	const cJSON *l4 = cJSON_GetObjectItemCaseSensitive(qc, "load_in_4bit");

	return m && cJSON_IsString(m) && str_in(qc, "quant_method", bnb) &&
	       cJSON_IsTrue(l8) && !cJSON_IsTrue(l4);
}

/* Whether @qc is transformers' BitsAndBytesConfig of a 4-bit model whose
 * codes are stored as bytes: another bnb_4bit_quant_storage packs them
 * into bf16/fp16/fp32 elements, which castfs does not read (a weight of
 * a shard could pass for a plain float one). */
static bool bnb_4bit(const cJSON *qc)
{
	static const char *const bnb[] = { "bitsandbytes", NULL };
	static const char *const u8[] = { "uint8", NULL };
	const cJSON *l8 = cJSON_GetObjectItemCaseSensitive(qc, "load_in_8bit");
	const cJSON *l4 = cJSON_GetObjectItemCaseSensitive(qc, "load_in_4bit");

	return str_in(qc, "quant_method", bnb) && cJSON_IsTrue(l4) &&
	       !cJSON_IsTrue(l8) && str_in(qc, "bnb_4bit_quant_storage", u8);
}

bool castfs_md_quant_dequantized(const struct castfs_md_quant *q)
{
	return q->fp8_block || q->bnb_int8 || q->mxfp4 || q->ct_fp8 ||
	       q->ct_fp4 || q->bnb_4bit || q->ct_w4;
}

/* A member that is absent, null, or an empty object. */
static bool ct_empty(const cJSON *qc, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, key);

	return !v || cJSON_IsNull(v) || (cJSON_IsObject(v) && !v->child);
}

unsigned castfs_md_quant_kinds(const struct castfs_md_quant *q)
{
	unsigned k = 0;

	if (!q->quantized)
		return 0;
	k |= q->fp8_block ? CASTFS_QK_FP8_BLOCK : 0;
	k |= q->ct_fp8 ? CASTFS_QK_CT_FP8 : 0;
	k |= q->bnb_int8 ? CASTFS_QK_INT8 : 0;
	k |= q->bnb_4bit ? CASTFS_QK_BNB4 : 0;
	k |= q->mxfp4 ? CASTFS_QK_MXFP4 : 0;
	k |= q->ct_w4 ? CASTFS_QK_CT_W4 : 0;
	if (q->ct_fp4)
		k |= q->ct_fp4_mx ? CASTFS_QK_CT_MXFP4 : CASTFS_QK_NVFP4;
	return k;
}

static bool ct_num(const cJSON *o, const char *key, double want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) && v->valuedouble == want;
}

/* Weights of FP8 E4M3, symmetric, static, per tensor, per channel or per
 * 128x128 block: what castfs dequantizes (qsrc_ct.c); their strategy
 * (CASTFS_QSTRAT_*) added to *@strat. */
static bool ct_fp8_weights(const cJSON *w, unsigned *strat)
{
	static const char *const strats[] = { "tensor", "channel", "block",
					      NULL };
	static const char *const ty[] = { "float", NULL };
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(w, "strategy");
	const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
	const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(w, "dynamic");

	if (!cJSON_IsObject(w) || !ct_num(w, "num_bits", 8) ||
	    !cJSON_IsString(st) || !str_in(w, "strategy", strats) ||
	    !str_in(w, "type", ty) || cJSON_IsFalse(sym) || cJSON_IsTrue(dyn))
		return false;
	if (strcmp(st->valuestring, "block") == 0) {
		*strat |= CASTFS_QSTRAT_BLOCK;
		return ct_block_ok(w);
	}
	*strat |= strcmp(st->valuestring, "tensor") == 0 ?
			  CASTFS_QSTRAT_TENSOR :
			  CASTFS_QSTRAT_CHANNEL;
	return true;
}

/* compressed-tensors "float-quantized" (or "naive-quantized") FP8
 * weights, nothing else; their strategies into *@strat. */
static bool ct_fp8(const cJSON *qc, unsigned *strat)
{
	static const char *const ct[] = { "compressed-tensors", NULL };
	/* llm-compressor names FP8 weights without quantized activations
	 * "naive-quantized": the same tensors and decompressor. */
	static const char *const fmt[] = { "float-quantized", "naive-quantized",
					   NULL };
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
	const cJSON *groups =
		cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
	const cJSON *g;
	int n = 0;

	if (!cJSON_IsString(m) || !str_in(qc, "quant_method", ct) ||
	    !str_in(qc, "format", fmt) || !ct_empty(qc, "kv_cache_scheme") ||
	    !ct_empty(qc, "sparsity_config") ||
	    !ct_empty(qc, "transform_config") || !cJSON_IsObject(groups))
		return false;
	cJSON_ArrayForEach(g, groups) {
		if (!cJSON_IsObject(g) || !str_in(g, "format", fmt) ||
		    !ct_fp8_weights(cJSON_GetObjectItemCaseSensitive(g,
								     "weights"),
				    strat) ||
		    !ct_empty(g, "output_activations"))
			return false;
		n++;
	}
	return n > 0;
}

/* Weights of static int4, per group or channel, no activation ordering:
 * what castfs dequantizes (qsrc_ctw4.c). *@asym: symmetric false (the
 * decompressor then reads zero points; absent means true). */
static bool ct_w4_weights(const cJSON *w, bool *asym)
{
	static const char *const strat[] = { "group", "channel", NULL };
	static const char *const ty[] = { "int", NULL };
	const cJSON *sym = cJSON_GetObjectItemCaseSensitive(w, "symmetric");
	const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(w, "dynamic");

	*asym = cJSON_IsFalse(sym);
	return cJSON_IsObject(w) && ct_num(w, "num_bits", 4) &&
	       str_in(w, "strategy", strat) && str_in(w, "type", ty) &&
	       (!sym || cJSON_IsBool(sym)) && !cJSON_IsTrue(dyn) &&
	       ct_empty(w, "actorder");
}

/* compressed-tensors "pack-quantized" int4 weights (W4A16, W4A16_ASYM),
 * nothing else; *@asym: every group asymmetric (groups that disagree are
 * refused: a file cannot say which group a weight belongs to). */
static bool ct_w4(const cJSON *qc, bool *asym)
{
	static const char *const ct[] = { "compressed-tensors", NULL };
	static const char *const fmt[] = { "pack-quantized", NULL };
	const cJSON *groups =
		cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
	const cJSON *g;
	int n = 0, nasym = 0;
	bool a = false;

	if (!str_in(qc, "quant_method", ct) || !str_in(qc, "format", fmt) ||
	    !ct_empty(qc, "kv_cache_scheme") ||
	    !ct_empty(qc, "sparsity_config") ||
	    !ct_empty(qc, "transform_config") || !cJSON_IsObject(groups))
		return false;
	cJSON_ArrayForEach(g, groups) {
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(g, "format");

		if (!cJSON_IsObject(g) || (f && !str_in(g, "format", fmt)) ||
		    !ct_w4_weights(cJSON_GetObjectItemCaseSensitive(g,
								    "weights"),
				   &a) ||
		    !ct_empty(g, "input_activations") ||
		    !ct_empty(g, "output_activations"))
			return false;
		n++;
		nasym += a;
	}
	*asym = n > 0 && nasym == n;
	return n > 0 && (nasym == 0 || nasym == n);
}

/*
 * What rules out compressed-tensors config @qc, for the refusal: a member
 * no scheme castfs reads may carry, else a format castfs does not know
 * (llm-compressor's "mixed-precision", "int-quantized", ...), else the
 * config groups themselves.
 */
static void ct_detail(const cJSON *qc, char *buf, size_t n)
{
	static const char *const keys[] = { "kv_cache_scheme",
					    "sparsity_config",
					    "transform_config" };
	static const char *const known[] = {
		"float-quantized",	"naive-quantized",
		"pack-quantized",	"nvfp4-pack-quantized",
		"mxfp4-pack-quantized", NULL
	};
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(qc, "format");

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (!ct_empty(qc, keys[i])) {
			snprintf(buf, n, " (%s set)", keys[i]);
			return;
		}
	}
	if (cJSON_IsString(f) && !str_in(qc, "format", known))
		snprintf(buf, n, " (format '%.40s')", f->valuestring);
	else
		snprintf(buf, n, " (a config_groups scheme it does not read)");
}

static const cJSON *find_qc(const cJSON *root)
{
	const cJSON *qc, *tc;

	qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
	if (qc)
		return qc;
	tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
	return cJSON_GetObjectItemCaseSensitive(tc, "quantization_config");
}

/* Why a bitsandbytes 4-bit config is not read: its code storage. */
static void bnb_detail(const cJSON *qc, char *buf, size_t n)
{
	const cJSON *st =
		cJSON_GetObjectItemCaseSensitive(qc, "bnb_4bit_quant_storage");
	const cJSON *l4 = cJSON_GetObjectItemCaseSensitive(qc, "load_in_4bit");

	if (cJSON_IsTrue(l4) && cJSON_IsString(st))
		snprintf(buf, n, " (bnb_4bit_quant_storage '%.32s')",
			 st->valuestring);
}

int castfs_md_quant_read(const char *json, size_t len,
			 struct castfs_md_quant *out, struct castfs_diag *d)
{
	static const char *const mxfp4_format[] = { "mxfp4-pack-quantized",
						    NULL };
	const cJSON *qc, *m;
	uint32_t b[2] = { 0, 0 };
	cJSON *root;
	int rc = castfs_md_parse(json, len, &root, d, "config.json");

	if (rc)
		return rc;
	*out = (struct castfs_md_quant){ 0 };
	qc = find_qc(root);
	if (qc) {
		out->quantized = true;
		out->fp8_block = cJSON_IsObject(qc) && fp8_block(qc, b);
		out->block_rows = out->fp8_block ? b[0] : 0;
		out->block_cols = out->fp8_block ? b[1] : 0;
		out->bnb_int8 = cJSON_IsObject(qc) && bnb_int8(qc);
		out->bnb_4bit = cJSON_IsObject(qc) && bnb_4bit(qc);
		m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
		out->mxfp4 = cJSON_IsObject(qc) && cJSON_IsString(m) &&
			     strcmp(m->valuestring, "mxfp4") == 0;
		out->ct_fp8 = cJSON_IsObject(qc) &&
			      ct_fp8(qc, &out->ct_fp8_strategies);
		out->ct_fp4 = cJSON_IsObject(qc) && castfs_md_ct_fp4(qc);
		out->ct_fp4_mx = out->ct_fp4 &&
				 str_in(qc, "format", mxfp4_format);
		out->ct_w4 = cJSON_IsObject(qc) && ct_w4(qc, &out->ct_w4_asym);
		snprintf(out->method, sizeof(out->method), "%s",
			 cJSON_IsString(m) ? m->valuestring : "?");
		if (cJSON_IsString(m) &&
		    strcmp(m->valuestring, "compressed-tensors") == 0 &&
		    !castfs_md_quant_dequantized(out))
			ct_detail(qc, out->detail, sizeof(out->detail));
		if (cJSON_IsObject(qc) && !castfs_md_quant_dequantized(out))
			bnb_detail(qc, out->detail, sizeof(out->detail));
	}
	cJSON_Delete(root);
	return 0;
}

/* Remove member @key of the object at @at in @b's text, if present. */
static int drop_member(struct castfs_strbuf *b, size_t at, const char *key)
{
	struct castfs_strbuf next = { 0 };
	struct castfs_md_object o;
	size_t from = 0, to = 0, i;
	int rc = castfs_md_scan_object(b->p, b->len, at, &o);

	if (rc)
		return rc;
	for (i = 0; i < o.n && !castfs_md_key_is(b->p, &o.m[i], key); i++)
		;
	if (i < o.n) {
		/* The member and the comma that separates it; the first
		 * member's lead stays, for the member that moves up. */
		if (i == 0 && o.n > 1) {
			from = o.m[0].key;
			to = o.m[1].key;
		} else if (i + 1 < o.n) {
			from = o.m[i].lead;
			to = o.m[i + 1].lead;
		} else {
			from = i ? o.m[i - 1].val + o.m[i - 1].val_len :
				   o.m[i].lead;
			to = o.m[i].val + o.m[i].val_len;
		}
		castfs_sb_put(&next, b->p, from);
		castfs_sb_put(&next, b->p + to, b->len - to);
		castfs_sb_fini(b);
		*b = next;
		rc = b->oom ? -ENOMEM : 0;
	}
	castfs_md_object_fini(&o);
	return rc;
}

/* The offset of the object value of top-level member @key, or 0. */
static size_t member_object(const struct castfs_strbuf *b, const char *key)
{
	struct castfs_md_object o;
	size_t at = 0;

	if (castfs_md_top_object(b->p, b->len, &o))
		return 0;
	for (size_t i = 0; i < o.n; i++) {
		if (castfs_md_key_is(b->p, &o.m[i], key) &&
		    b->p[o.m[i].val] == '{')
			at = o.m[i].val;
	}
	castfs_md_object_fini(&o);
	return at;
}

int castfs_md_config_unquant(const char *json, size_t len, char **out,
			     size_t *out_len, struct castfs_diag *d)
{
	struct castfs_strbuf b = { 0 };
	size_t tc;
	int rc = castfs_md_parse(json, len, NULL, d, "config.json");

	if (rc)
		return rc;
	castfs_sb_put(&b, json, len);
	rc = b.oom ? -ENOMEM : 0;
	tc = rc ? 0 : member_object(&b, "text_config");
	if (!rc && tc)
		rc = drop_member(&b, tc, "quantization_config");
	if (!rc)
		rc = drop_member(&b, castfs_json_skip_ws(b.p, b.len, 0),
				 "quantization_config");
	if (rc) {
		castfs_sb_fini(&b);
		return rc;
	}
	return castfs_sb_take(&b, out, out_len);
}
