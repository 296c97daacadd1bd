/* SPDX-License-Identifier: MIT */
/*
 * The compressed-tensors quantization_config of a model-directory view
 * (llm-compressor's FP8_DYNAMIC / FP8_BLOCK presets): which modules stay
 * unquantised, and the JSON text, in the layout of the config it joins.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"

/* The modules the presets' recipes ignore whatever the model. */
static const char ct_always_ignored[] = "lm_head";

static int ct_ignore_add(struct castfs_md_ct *q, size_t *cap, const char *s,
			 size_t n)
{
	char *copy;

	if (q->nignore == *cap) {
		size_t ncap = *cap ? *cap * 2 : 16;
		char **ni = realloc(q->ignore, ncap * sizeof(*ni));

		if (!ni)
			return -ENOMEM;
		q->ignore = ni;
		*cap = ncap;
	}
	copy = strndup(s, n);
	if (!copy)
		return -ENOMEM;
	q->ignore[q->nignore++] = copy;
	return 0;
}

static int ct_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sort and dedupe the ignore list after its first entry (lm_head). */
static void ct_sort_unique(struct castfs_md_ct *q)
{
	size_t w = 1;

	if (q->nignore > 2)
		qsort(q->ignore + 1, q->nignore - 1, sizeof(*q->ignore),
		      ct_cmp);
	for (size_t i = 1; i < q->nignore; i++) {
		if (strcmp(q->ignore[i], ct_always_ignored) == 0 ||
		    (w > 1 && strcmp(q->ignore[w - 1], q->ignore[i]) == 0))
			free(q->ignore[i]);
		else
			q->ignore[w++] = q->ignore[i];
	}
	q->nignore = w;
}

/*
 * Whether @t is an FP8 block weight of @h (an F8_E4M3 "P.weight" with its
 * "P.weight_scale_inv"): the view quantises its BF16 dequantized values.
 */
static bool ct_fp8_block(const struct castfs_header *h,
			 const struct castfs_tensor *t)
{
	static const char si[] = "_scale_inv";
	char name[512];

	if (t->dtype != CASTFS_DTYPE_F8_E4M3 ||
	    t->name_len + sizeof(si) > sizeof(name))
		return false;
	memcpy(name, t->name, t->name_len);
	memcpy(name + t->name_len, si, sizeof(si));
	return castfs_header_find(h, name, t->name_len + sizeof(si) - 1);
}

/* A Linear-like weight @t the view keeps: its module goes to "ignore". */
static int ct_weight(struct castfs_md_ct *q, size_t *cap,
		     const struct castfs_view *v, const struct castfs_header *h,
		     const struct castfs_tensor *t)
{
	static const char w[] = ".weight";
	const size_t wl = sizeof(w) - 1;
	struct castfs_tensor tb = *t;

	if (ct_fp8_block(h, t))
		tb.dtype = CASTFS_DTYPE_BF16;
	if (castfs_view_ct_converts(v, h, &tb)) {
		q->nquant++;
		return 0;
	}
	if (!castfs_view_linear_weight(t) || strlen(t->name) != t->name_len ||
	    t->name_len <= wl)
		return 0;
	return ct_ignore_add(q, cap, t->name, t->name_len - wl);
}

int castfs_md_ct_init(struct castfs_md_ct *q, const struct castfs_view *v,
		      const struct castfs_header *const *h, size_t nh)
{
	size_t cap = 0;
	int rc;

	*q = (struct castfs_md_ct){ 0 };
	if (!castfs_view_is_ct(v))
		return -EINVAL;
	q->w4 = v->kind == CASTFS_VIEW_CT_W4;
	q->nvfp4 = v->kind == CASTFS_VIEW_CT_NVFP4;
	q->block = q->w4 || q->nvfp4 ? 0 : v->ct_block;
	rc = ct_ignore_add(q, &cap, ct_always_ignored,
			   sizeof(ct_always_ignored) - 1);
	for (size_t i = 0; !rc && i < nh; i++)
		for (size_t j = 0; !rc && j < h[i]->ntensors; j++)
			rc = ct_weight(q, &cap, v, h[i], &h[i]->tensors[j]);
	if (rc) {
		castfs_md_ct_fini(q);
		return rc;
	}
	ct_sort_unique(q);
	return 0;
}

void castfs_md_ct_fini(struct castfs_md_ct *q)
{
	for (size_t i = 0; i < q->nignore; i++)
		free(q->ignore[i]);
	free(q->ignore);
	q->ignore = NULL;
	q->nignore = 0;
}

/* A member's key @depth levels down, up to its value. */
static void ct_key(struct castfs_strbuf *b, const struct castfs_md_style *s,
		   int depth, bool first, const char *key)
{
	castfs_md_put_next(b, s, depth, first);
	castfs_md_put_str(b, key, strlen(key));
	castfs_sb_put(b, s->sep, s->sep_len);
}

/* A member key/value pair of literal JSON; a NULL value skips it. */
struct ct_kv {
	const char *key, *val;
};

/* An object of literal members whose key is @depth levels down. */
static void ct_object(struct castfs_strbuf *b, const struct castfs_md_style *s,
		      int depth, const struct ct_kv *kv, size_t n)
{
	bool first = true;

	castfs_sb_put(b, "{", 1);
	for (size_t i = 0; i < n; i++) {
		if (!kv[i].val)
			continue;
		ct_key(b, s, depth + 1, first, kv[i].key);
		castfs_sb_puts(b, kv[i].val);
		first = false;
	}
	castfs_md_put_close(b, s, depth, '}');
}

/* An array of strings (@quote) or literal values, @depth levels down. */
static void ct_array(struct castfs_strbuf *b, const struct castfs_md_style *s,
		     int depth, const char *const *v, size_t n, bool quote)
{
	castfs_sb_put(b, "[", 1);
	for (size_t i = 0; i < n; i++) {
		castfs_md_put_next(b, s, depth + 1, i == 0);
		if (quote)
			castfs_md_put_str(b, v[i], strlen(v[i]));
		else
			castfs_sb_puts(b, v[i]);
	}
	castfs_md_put_close(b, s, depth, ']');
}

/* "weights" of W4A16: int 4, symmetric, static, groups of 128. */
static void ct_weights_w4(struct castfs_strbuf *b,
			  const struct castfs_md_style *s, int depth)
{
	static const struct ct_kv kv[] = {
		{ "dynamic", "false" },
		{ "group_size", "128" },
		{ "num_bits", "4" },
		{ "observer", "\"memoryless_minmax\"" },
		{ "strategy", "\"group\"" },
		{ "symmetric", "true" },
		{ "type", "\"int\"" },
	};

	ct_object(b, s, depth, kv, sizeof(kv) / sizeof(kv[0]));
}

/*
 * "weights" of NVFP4A16: float 4, symmetric, static, tensor_group 16. No
 * scale_dtype: compressed-tensors <= 0.12 forbids the key, and without it
 * every release still stores and reads the scale as float8_e4m3fn.
 */
static void ct_weights_nvfp4(struct castfs_strbuf *b,
			     const struct castfs_md_style *s, int depth)
{
	static const struct ct_kv kv[] = {
		{ "dynamic", "false" },
		{ "group_size", "16" },
		{ "num_bits", "4" },
		{ "observer", "\"memoryless_minmax\"" },
		{ "strategy", "\"tensor_group\"" },
		{ "symmetric", "true" },
		{ "type", "\"float\"" },
	};

	ct_object(b, s, depth, kv, sizeof(kv) / sizeof(kv[0]));
}

/* "weights": float 8, symmetric, static, per channel or per block. */
static void ct_weights(struct castfs_strbuf *b, const struct castfs_md_style *s,
		       int depth, const struct castfs_md_ct *q)
{
	char edge[16];
	const char *const blk[2] = { edge, edge };

	castfs_sb_put(b, "{", 1);
	if (q->block) {
		snprintf(edge, sizeof(edge), "%u", q->block);
		ct_key(b, s, depth + 1, true, "block_structure");
		ct_array(b, s, depth + 1, blk, 2, false);
	}
	ct_key(b, s, depth + 1, !q->block, "dynamic");
	castfs_sb_puts(b, "false");
	{
		const struct ct_kv kv[] = {
			{ "num_bits", "8" },
			{ "observer", "\"memoryless_minmax\"" },
			{ "strategy", q->block ? "\"block\"" : "\"channel\"" },
			{ "symmetric", "true" },
			{ "type", "\"float\"" },
		};

		for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
			ct_key(b, s, depth + 1, false, kv[i].key);
			castfs_sb_puts(b, kv[i].val);
		}
	}
	castfs_md_put_close(b, s, depth, '}');
}

/* The compressed-tensors format name, quoted. */
static const char *ct_format(const struct castfs_md_ct *q)
{
	if (q->nvfp4)
		return "\"nvfp4-pack-quantized\"";
	return q->w4 ? "\"pack-quantized\"" : "\"float-quantized\"";
}

/* "group_0": Linear targets, dynamic fp8 activations (per token or group). */
static void ct_group(struct castfs_strbuf *b, const struct castfs_md_style *s,
		     int depth, const struct castfs_md_ct *q)
{
	static const char *const targets[] = { "Linear" };
	char group[16];
	const struct ct_kv act[] = {
		{ "dynamic", "true" },
		{ "group_size", q->block ? group : NULL },
		{ "num_bits", "8" },
		{ "strategy", q->block ? "\"group\"" : "\"token\"" },
		{ "symmetric", "true" },
		{ "type", "\"float\"" },
	};

	snprintf(group, sizeof(group), "%u", q->block);
	castfs_sb_put(b, "{", 1);
	ct_key(b, s, depth + 1, true, "format");
	castfs_sb_puts(b, ct_format(q));
	ct_key(b, s, depth + 1, false, "input_activations");
	if (q->w4 || q->nvfp4)
		castfs_sb_puts(b, "null");
	else
		ct_object(b, s, depth + 1, act, sizeof(act) / sizeof(act[0]));
	ct_key(b, s, depth + 1, false, "output_activations");
	castfs_sb_puts(b, "null");
	ct_key(b, s, depth + 1, false, "targets");
	ct_array(b, s, depth + 1, targets, 1, true);
	ct_key(b, s, depth + 1, false, "weights");
	if (q->nvfp4)
		ct_weights_nvfp4(b, s, depth + 1);
	else if (q->w4)
		ct_weights_w4(b, s, depth + 1);
	else
		ct_weights(b, s, depth + 1, q);
	castfs_md_put_close(b, s, depth, '}');
}

void md_put_ct(struct castfs_strbuf *b, const struct castfs_md_style *s,
	       const struct castfs_md_ct *q)
{
	castfs_sb_put(b, "{", 1);
	ct_key(b, s, 1, true, "config_groups");
	castfs_sb_put(b, "{", 1);
	ct_key(b, s, 2, true, "group_0");
	ct_group(b, s, 2, q);
	castfs_md_put_close(b, s, 1, '}');
	ct_key(b, s, 1, false, "format");
	castfs_sb_puts(b, ct_format(q));
	ct_key(b, s, 1, false, "ignore");
	ct_array(b, s, 1, (const char *const *)q->ignore, q->nignore, true);
	ct_key(b, s, 1, false, "quant_method");
	castfs_sb_puts(b, "\"compressed-tensors\"");
	ct_key(b, s, 1, false, "quantization_status");
	castfs_sb_puts(b, "\"compressed\"");
	castfs_md_put_close(b, s, 0, '}');
}
