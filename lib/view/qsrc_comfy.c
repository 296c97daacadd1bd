/* SPDX-License-Identifier: MIT */
/*
 * ComfyUI scaled fp8 sources (../shared/reference/QUANTIZED.md §6): an
 * F8_E4M3 "M.weight" with one F32 scale per tensor, dequantized as
 * ComfyUI's ops do, in the compute dtype (docs/FORMATS.md). Its layers are
 * named by a "scaled_fp8" marker (legacy), by "M.comfy_quant" tensors, or
 * by the header's "_quantization_metadata" (comfy/utils.py
 * convert_old_quants).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/escape.h"
#include "format/st_side.h"
#include "view/qsrc_internal.h"

/* The largest name castfs builds a companion name from. */

struct comfy_form {
	const char *scale; /* the weight's scale: "scale_weight" */
	const char *input; /* dropped: the activation scale */
	const char *marker; /* per layer, dropped; NULL: none */
};

/* Legacy scaled_fp8 (ComfyUI before 2026) and its successor. */
static const struct comfy_form legacy = { "scale_weight", "scale_input", NULL };
static const struct comfy_form current = { "weight_scale", "input_scale",
					   "comfy_quant" };

static int comfy_reject(struct castfs_diag *d, const struct castfs_tensor *t,
			const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': ComfyUI scaled fp8 %s; castfs "
			       "does not dequantize this layout: no views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

static bool scalar_f32(const struct castfs_tensor *s)
{
	return s->dtype == CASTFS_DTYPE_F32 && s->nelems == 1 &&
	       (s->ndim == 0 || (s->ndim == 1 && s->shape[0] == 1));
}

static void mark(const struct castfs_header *h, struct castfs_qsrc *q,
		 const struct castfs_tensor *t, enum castfs_qrole role)
{
	if (t)
		q->t[t - h->tensors].role = (uint8_t)role;
}

/*
 * @s (a scale of form @f) and the weight of its module: the weight must be
 * a 2-D F8_E4M3 tensor and @s one F32 scalar (ComfyUI's float8_e4m3fn;
 * e5m2 weights and block scales are refused).
 */
static int comfy_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		      const struct castfs_tensor *s, size_t mod,
		      const struct comfy_form *f, struct castfs_diag *d)
{
	const struct castfs_tensor *w =
		castfs_qsrc_sibling(h, s, s->name_len - mod, "weight", NULL);
	struct castfs_qinfo *qi;

	if (!w)
		return comfy_reject(d, s, "scale without its weight");
	if (w->dtype != CASTFS_DTYPE_F8_E4M3 || w->ndim != 2 ||
	    w->nelems == 0 || !scalar_f32(s))
		return comfy_reject(d, s,
				    "layer that is not an F8_E4M3 weight "
				    "with one F32 scale");
	qi = &q->t[w - h->tensors];
	*qi = (struct castfs_qinfo){
		.role = CASTFS_QR_FP8_BLOCK,
		.rule = CASTFS_QRULE_COMPUTE,
		.scale = (uint32_t)(s - h->tensors),
		.brows = (uint32_t)w->shape[0],
		.bcols = (uint32_t)w->shape[1],
	};
	if (w->shape[0] > UINT32_MAX || w->shape[1] > UINT32_MAX)
		return comfy_reject(d, w, "weight too large");
	mark(h, q, s, CASTFS_QR_SCALE);
	mark(h, q, castfs_qsrc_sibling(h, s, s->name_len - mod, f->input, NULL),
	     CASTFS_QR_SCALE);
	if (f->marker)
		mark(h, q,
		     castfs_qsrc_sibling(h, s, s->name_len - mod, f->marker,
					 NULL),
		     CASTFS_QR_SCALE);
	q->nfp8++;
	q->ncomfy++;
	return 0;
}

/*
 * Layer marker @m ("M.comfy_quant"): ComfyUI json.loads() its bytes and
 * dequantizes by its "format", so only {"format": "float8_e4m3fn", ...}
 * is this layout (a bug hunt: castfs went by the tensors' dtypes alone
 * and dequantized an "nvfp4" or "float8_e5m2" marker, or no JSON at all,
 * as e4m3fn). Its bytes are side data (format/st_side.h).
 */
static int marker_format(const struct castfs_header *h,
			 const struct castfs_tensor *m, struct castfs_diag *d)
{
	size_t len = 0;
	const uint8_t *js = castfs_header_side(h, m, &len);
	cJSON *o = js ? castfs_qsrc_json_loads(js, len) : NULL;
	const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
	int rc = 0;

	if (!js)
		rc = comfy_reject(d, m,
				  "marker whose JSON castfs did not read");
	else if (!cJSON_IsObject(o) || !cJSON_IsString(fmt))
		rc = comfy_reject(d, m,
				  "marker that is not a JSON object with a "
				  "\"format\" string");
	else if (strcmp(fmt->valuestring, "float8_e4m3fn"))
		rc = castfs_diag_set(d, -ENOTSUP,
				     "tensor '%.*s': ComfyUI format '%.40s' "
				     "(only float8_e4m3fn is dequantized): "
				     "no views",
				     (int)(m->name_len > 120 ? 120 :
							       m->name_len),
				     m->name, fmt->valuestring);
	cJSON_Delete(o);
	return rc;
}

/* The legacy marker: a tensor "scaled_fp8" (any prefix), F8 or F32. */
static const struct castfs_tensor *legacy_marker(const struct castfs_header *h)
{
	size_t mod;

	for (size_t i = 0; i < h->ntensors; i++) {
		if (castfs_qsrc_leaf(&h->tensors[i], "scaled_fp8", &mod))
			return &h->tensors[i];
	}
	return NULL;
}

/* Every tensor that the form's layers leave: an F8 weight must have been
 * paired, a layer marker must have found its weight. */
static int comfy_check(const struct castfs_header *h,
		       const struct castfs_qsrc *q, struct castfs_diag *d)
{
	size_t mod;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (q->t[i].role != CASTFS_QR_PLAIN)
			continue;
		if (t->dtype == CASTFS_DTYPE_F8_E4M3 ||
		    t->dtype == CASTFS_DTYPE_F8_E5M2)
			return comfy_reject(d, t,
					    "file: fp8 tensor without "
					    "its scale");
		if (castfs_qsrc_leaf(t, "comfy_quant", &mod))
			return comfy_reject(d, t,
					    "layer without an F8_E4M3 "
					    "weight and weight_scale");
	}
	return 0;
}

static bool any_leaf(const struct castfs_header *h, const char *leaf)
{
	size_t mod;

	for (size_t i = 0; i < h->ntensors; i++) {
		if (castfs_qsrc_leaf(&h->tensors[i], leaf, &mod))
			return true;
	}
	return false;
}

/* Refuse layer @name (@len bytes) of the metadata for @why. */
static int meta_reject(struct castfs_diag *d, const char *name, size_t len,
		       const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "layer '%.*s' of _quantization_metadata: "
			       "ComfyUI %s; castfs does not dequantize this "
			       "layout: no views",
			       (int)(len > 120 ? 120 : len), name, why);
}

/* The tensor "@layer.@leaf" of @h, or NULL (*@err: -ENOMEM). */
static const struct castfs_tensor *layer_tensor(const struct castfs_header *h,
						const char *layer, size_t len,
						const char *leaf, int *err)
{
	size_t llen = strlen(leaf);
	const struct castfs_tensor *t;
	char *buf = malloc(len + 1 + llen + 1);

	if (!buf) {
		*err = -ENOMEM;
		return NULL;
	}
	memcpy(buf, layer, len);
	buf[len] = '.';
	memcpy(buf + len + 1, leaf, llen + 1);
	t = castfs_header_find(h, buf, len + 1 + llen);
	free(buf);
	return t;
}

/*
 * One layer @l of the metadata's "layers": ComfyUI gives it a comfy_quant
 * of its JSON value, so only a {"format": "float8_e4m3fn", ...} object
 * with an F8_E4M3 weight and an F32 scalar weight_scale is dequantized.
 */
static int meta_layer(const struct castfs_header *h, struct castfs_qsrc *q,
		      const cJSON *l, struct castfs_diag *d)
{
	const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(l, "format");
	const char *name = l->string;
	size_t len = strlen(name);
	const struct castfs_tensor *w, *s;
	int err = 0;

	if (!cJSON_IsObject(l) || !cJSON_IsString(fmt))
		return meta_reject(d, name, len,
				   "layer without a \"format\" string");
	if (strcmp(fmt->valuestring, "float8_e4m3fn"))
		return castfs_diag_set(
			d, -ENOTSUP,
			"layer '%.*s' of _quantization_metadata: "
			"ComfyUI format '%.40s' (only "
			"float8_e4m3fn is dequantized): no views",
			(int)(len > 120 ? 120 : len), name, fmt->valuestring);
	w = layer_tensor(h, name, len, "weight", &err);
	s = layer_tensor(h, name, len, "weight_scale", &err);
	if (err)
		return err;
	if (!w || !s)
		return meta_reject(d, name, len,
				   "layer without its weight and "
				   "weight_scale in this file");
	if (q->t[w - h->tensors].role != CASTFS_QR_PLAIN)
		return meta_reject(d, name, len, "layer named twice");
	return comfy_pair(h, q, s, len + 1, &current, d);
}

/* The most JSON values of a "_quantization_metadata": a few per layer,
 * and a checkpoint of a million layers is not made. */
#define COMFY_META_VALUES ((size_t)1 << 20)

/*
 * The "_quantization_metadata" form: a JSON {"layers": {"<layer>": {...}}}
 * in the header's __metadata__, which convert_old_quants turns into one
 * "<layer>.comfy_quant" per entry (and then ignores any legacy marker).
 */
static int comfy_meta(const struct castfs_header *h, struct castfs_qsrc *q,
		      const struct castfs_meta_kv *kv, struct castfs_diag *d)
{
	const char *end = NULL, *lim = kv->value + kv->value_len;
	cJSON *o;
	const cJSON *layers, *l;
	int rc = 0;

	/* cJSON spends ~80 bytes a value: a 100 MB header of "0," in this
	 * string took the daemon to 4.9 GB (a bug hunt). */
	if (castfs_json_values(kv->value, kv->value_len, COMFY_META_VALUES) >
	    COMFY_META_VALUES)
		return castfs_diag_set(d, -E2BIG,
				       "_quantization_metadata of more than "
				       "%zu JSON values",
				       (size_t)COMFY_META_VALUES);
	o = cJSON_ParseWithLengthOpts(kv->value, kv->value_len, &end, false);
	layers = cJSON_GetObjectItemCaseSensitive(o, "layers");
	/* json.loads allows only whitespace after the value. */
	if (o && end)
		end += castfs_json_skip_ws(end, (size_t)(lim - end), 0);
	if (!cJSON_IsObject(o) || end != lim || !cJSON_IsObject(layers))
		rc = castfs_diag_set(d, -ENOTSUP,
				     "_quantization_metadata that is not a "
				     "JSON object with a \"layers\" object: "
				     "ComfyUI refuses it; no views");
	for (l = rc ? NULL : layers->child; l && !rc; l = l->next)
		rc = meta_layer(h, q, l, d);
	cJSON_Delete(o);
	return rc;
}

int castfs_qsrc_comfy(const struct castfs_header *h, struct castfs_qsrc *q,
		      struct castfs_diag *d)
{
	const struct castfs_meta_kv *meta =
		castfs_header_meta(h, "_quantization_metadata");
	const struct castfs_tensor *marker = legacy_marker(h);
	const struct comfy_form *f = marker ? &legacy : &current;
	size_t mod;
	int rc = 0;

	if (!marker && !meta && !any_leaf(h, "comfy_quant"))
		return 0;
	/* With the metadata, convert_old_quants skips the legacy form: its
	 * scale_weight would be left unread beside a plain fp8 cast. */
	if (marker && meta)
		return comfy_reject(d, marker,
				    "marker beside _quantization_metadata");
	if (meta)
		rc = comfy_meta(h, q, meta, d);
	if (marker)
		mark(h, q, marker, CASTFS_QR_SCALE);
	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (!castfs_qsrc_leaf(t, f->scale, &mod) ||
		    q->t[i].role != CASTFS_QR_PLAIN)
			continue; /* not a scale, or paired by the metadata */
		/* comfy_quant form: only layers that carry the marker. */
		if (f->marker) {
			const struct castfs_tensor *m = castfs_qsrc_sibling(
				h, t, t->name_len - mod, f->marker, NULL);

			if (!m)
				continue;
			rc = marker_format(h, m, d);
		}
		if (!rc)
			rc = comfy_pair(h, q, t, mod, f, d);
	}
	return rc ? rc : comfy_check(h, q, d);
}
