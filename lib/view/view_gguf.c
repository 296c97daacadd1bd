/* SPDX-License-Identifier: MIT */
/*
 * GGUF views of diffusion checkpoints, as ComfyUI-GGUF's loader expects
 * them and its tools (convert.py, then llama-quantize with lcpp.patch)
 * make them: docs/FORMATS.md "GGUF views". The architecture comes from the
 * tensor names; a checkpoint whose architecture castfs does not know, or
 * that holds tensors GGUF cannot carry, gets no view (the reason is in the
 * diagnostic), never a file a loader would misread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "quant/quant_gguf.h"
#include "quant/quant_gguf_k.h"
#include "view/view_gguf.h"
#include "view/view_internal.h"

/* convert.py: at most this many elements stay F32 (QUANTIZATION_THRESHOLD). */
#define SMALL_TENSOR 1024u
/* convert.py shape_fix (sd1/sdxl): only from this many elements. */
#define REARRANGE_MIN 512u

/* One architecture: how it is recognised and what it keeps unquantised. */
struct gguf_arch {
	const char *name; /* general.architecture */
	const char *const *detect; /* all present: this architecture */
	const char *const *detect_alt; /* or all of these */
	const char *const *keep; /* name prefixes never quantised */
	bool shape_fix; /* sd1/sdxl reshape to (n / 256, 256) */
};

static const char *const flux_detect[] = {
	"double_blocks.0.img_attn.proj.weight", NULL
};
static const char *const flux_keep[] = {
	"txt_in.",	"img_in.",	"time_in.", "vector_in.",
	"guidance_in.", "final_layer.", NULL
};
static const char *const sd3_detect[] = {
	"joint_blocks.0.x_block.attn.qkv.weight", NULL
};
static const char *const sd3_keep[] = {
	"final_layer.",	   "time_text_embed.", "context_embedder.",
	"t_embedder.",	   "y_embedder.",      "x_embedder.",
	"proj_out.weight", "pos_embed",	       NULL
};
static const char *const sdxl_detect[] = {
	"input_blocks.3.0.op.weight", "input_blocks.6.0.op.weight",
	"output_blocks.2.2.conv.weight", "output_blocks.5.2.conv.weight", NULL
};
static const char *const sdxl_detect_alt[] = { "label_emb.0.0.weight", NULL };
static const char *const sd1_detect[] = { "input_blocks.3.0.op.weight",
					  "input_blocks.6.0.op.weight",
					  "input_blocks.9.0.op.weight",
					  "output_blocks.2.1.conv.weight",
					  "output_blocks.5.2.conv.weight",
					  "output_blocks.8.2.conv.weight",
					  NULL };
static const char *const unet_keep[] = {
	"class_embedding.", "time_embedding.",
	"add_embedding.",   "time_embed.",
	"label_emb.",	    "conv_in.",
	"conv_out.",	    "input_blocks.0.0.weight",
	"out.2.weight",	    NULL
};

/* In convert.py's detection order: sdxl before sd1. */
static const struct gguf_arch arches[] = {
	{ "flux", flux_detect, NULL, flux_keep, false },
	{ "sd3", sd3_detect, NULL, sd3_keep, false },
	{ "sdxl", sdxl_detect, sdxl_detect_alt, unet_keep, true },
	{ "sd1", sd1_detect, NULL, unet_keep, true },
};

/* The checkpoint being converted: its header and the stripped prefix. */
struct gguf_src {
	const struct castfs_header *h;
	const char *prefix;
	size_t plen;
};

static bool has_prefix(const char *s, size_t len, const char *p)
{
	size_t n = strlen(p);

	return len >= n && memcmp(s, p, n) == 0;
}

static bool src_has(const struct gguf_src *s, const char *key)
{
	char buf[256];
	int n = snprintf(buf, sizeof(buf), "%s%s", s->prefix, key);

	return n > 0 && (size_t)n < sizeof(buf) &&
	       castfs_header_find(s->h, buf, (size_t)n);
}

static bool has_all(const struct gguf_src *s, const char *const *keys)
{
	if (!keys)
		return false;
	for (; *keys; keys++) {
		if (!src_has(s, *keys))
			return false;
	}
	return true;
}

/* convert.py strip_prefix: the first prefix any tensor has is stripped and
 * tensors without it (VAE, text encoders of a full checkpoint) dropped. */
static void find_prefix(struct gguf_src *s)
{
	static const char *const prefixes[] = { "model.diffusion_model.",
						"model." };

	s->prefix = "";
	for (size_t p = 0; p < 2; p++) {
		for (size_t i = 0; i < s->h->ntensors; i++) {
			const struct castfs_tensor *t = &s->h->tensors[i];

			if (has_prefix(t->name, t->name_len, prefixes[p])) {
				s->prefix = prefixes[p];
				s->plen = strlen(prefixes[p]);
				return;
			}
		}
	}
}

static const struct gguf_arch *detect_arch(const struct gguf_src *s)
{
	for (size_t i = 0; i < sizeof(arches) / sizeof(arches[0]); i++) {
		if (has_all(s, arches[i].detect) ||
		    has_all(s, arches[i].detect_alt))
			return &arches[i];
	}
	return NULL;
}

static bool is_quant(enum castfs_ggml_type t)
{
	return t == CASTFS_GGML_Q8_0 || t == CASTFS_GGML_Q4_0 ||
	       t == CASTFS_GGML_Q4_1;
}

/* The block type's quantiser and bytes per block of 32. */
static unsigned block_qtype(enum castfs_ggml_type t, uint32_t *unit)
{
	unsigned bytes;

	castfs_gguf_blck(t, &bytes);
	*unit = bytes;
	return (unsigned)castfs_gguf_block_qtype(t);
}

/* lcpp.patch's img_tensor_get_type "rules for ffn": names of a
 * feed-forward output, found anywhere in the name. */
static bool ffn_down(const char *name, size_t len)
{
	static const char *const parts[] = {
		"ffn_down",
		".ffn.2.weight",
		".ff.net.2.weight",
		".mlp.layer2.weight",
		".adaln_modulation_mlp.2.weight",
		".feed_forward.w2.weight",
	};

	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		if (memmem(name, len, parts[i], strlen(parts[i])))
			return true;
	}
	return memmem(name, len, "experts.", 8) &&
	       memmem(name, len, ".w2.weight", 10);
}

/* One output tensor: its stripped name, GGUF shape and type. */
struct gguf_out {
	const struct castfs_tensor *t;
	const char *name;
	size_t name_len;
	uint32_t ndim;
	uint64_t shape[CASTFS_GGUF_MAX_DIMS];
	bool reshaped;
	enum castfs_ggml_type type;
};

static bool keep_listed(const struct gguf_arch *a, const struct gguf_out *o)
{
	for (const char *const *k = a->keep; *k; k++) {
		if (has_prefix(o->name, o->name_len, *k))
			return true;
	}
	return false;
}

/*
 * The type of @o in view @v: convert.py's choice (1-D and small tensors
 * of F32/BF16 sources in F32, BF16 sources stay BF16, others F16), then
 * llama-quantize's for quantised views (2-D, whole blocks, not kept).
 */
static enum castfs_ggml_type out_type(const struct castfs_view *v,
				      const struct gguf_arch *a,
				      const struct gguf_out *o)
{
	enum castfs_dtype dt = o->t->dtype;
	enum castfs_ggml_type want = (enum castfs_ggml_type)v->gguf_type;
	enum castfs_ggml_type base;

	if (o->ndim == 1 || o->t->nelems <= SMALL_TENSOR)
		return dt == CASTFS_DTYPE_F32 || dt == CASTFS_DTYPE_BF16 ?
			       CASTFS_GGML_F32 :
			       CASTFS_GGML_F16;
	if (!is_quant(want))
		return want;
	base = dt == CASTFS_DTYPE_BF16 ? CASTFS_GGML_BF16 : CASTFS_GGML_F16;
	if (o->ndim != 2 || o->shape[1] % CASTFS_GGUF_QK || keep_listed(a, o))
		return base;
	/* lcpp.patch gives a Q4_0 file's feed-forward outputs Q4_1 */
	if (want == CASTFS_GGML_Q4_0 && ffn_down(o->name, o->name_len))
		return CASTFS_GGML_Q4_1;
	return want;
}

/* Shape, with convert.py's sd1/sdxl reshape, and type of tensor @t. */
static int describe(const struct castfs_view *v, const struct gguf_arch *a,
		    const struct castfs_tensor *t, size_t plen,
		    struct gguf_out *o, struct castfs_diag *d)
{
	*o = (struct gguf_out){ .t = t,
				.name = t->name + plen,
				.name_len = t->name_len - plen };
	if (!castfs_dtype_is_castable(t->dtype))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF view: tensor '%s' is %s, not a "
				       "float",
				       t->name, castfs_dtype_name(t->dtype));
	if (t->ndim > CASTFS_GGUF_MAX_DIMS)
		return castfs_diag_set(d, -EINVAL,
				       "GGUF view: tensor '%s' has more than 4 "
				       "dimensions",
				       t->name);
	o->ndim = t->ndim ? t->ndim : 1; /* a scalar is written as [1] */
	o->shape[0] = 1;
	memcpy(o->shape, t->shape, t->ndim * sizeof(*t->shape));
	if (a->shape_fix && t->ndim > 1 && t->nelems >= REARRANGE_MIN &&
	    t->nelems % 256 == 0 && t->shape[t->ndim - 1] % 256) {
		o->ndim = 2;
		o->shape[0] = t->nelems / 256;
		o->shape[1] = 256;
		o->reshaped = true;
	}
	o->type = out_type(v, a, o);
	return 0;
}

/* convert.py's orig_shape KV for a reshaped tensor. */
static int add_orig_shape(struct castfs_gguf_w *w, const struct gguf_out *o)
{
	char key[192];
	int32_t dims[CASTFS_GGUF_MAX_DIMS];
	int n = snprintf(key, sizeof(key), "comfy.gguf.orig_shape.%.*s",
			 (int)o->name_len, o->name);

	if (n < 0 || (size_t)n >= sizeof(key))
		return -EINVAL;
	for (uint32_t i = 0; i < o->t->ndim; i++) {
		if (o->t->shape[i] > INT32_MAX)
			return -EINVAL;
		dims[i] = (int32_t)o->t->shape[i];
	}
	castfs_gguf_kv_i32_array(w, key, dims, o->t->ndim);
	return 0;
}

static enum castfs_dtype ggml_dtype(enum castfs_ggml_type t)
{
	switch (t) {
	case CASTFS_GGML_F32:
		return CASTFS_DTYPE_F32;
	case CASTFS_GGML_F16:
		return CASTFS_DTYPE_F16;
	case CASTFS_GGML_BF16:
		return CASTFS_DTYPE_BF16;
	case CASTFS_GGML_Q8_0:
	case CASTFS_GGML_Q4_0:
	case CASTFS_GGML_Q4_1:
	case CASTFS_GGML_Q5_0:
	case CASTFS_GGML_Q5_1:
	case CASTFS_GGML_Q4_K:
	case CASTFS_GGML_Q5_K:
	case CASTFS_GGML_Q6_K:
		break;
	}
	return CASTFS_DTYPE_INVALID;
}

/* The data of each output tensor, for castfs_view_gguf_assemble(). */
struct gguf_data {
	const struct castfs_header *h;
	const struct castfs_gguf_deq *g; /* a quantized source's bf16 view */
	const struct gguf_out *o;
	const uint64_t *nbytes;
};

/* Dequantized weight @o: the bf16 view's elements quantised or cast. */
static int add_deq(const struct gguf_data *gd, struct castfs_pb *pb,
		   const struct gguf_out *o, uint64_t nbytes)
{
	enum castfs_dtype dst = ggml_dtype(o->type);
	struct castfs_producer p = { .op = CASTFS_OP_DEQ_BF16,
				     .dst_dtype = (uint8_t)dst };
	struct castfs_qtensor q = {
		.rows = o->shape[0],
		.cols = o->shape[1],
		.blocksize = 1,
	};
	int rc;

	if (is_quant(o->type)) {
		p.op = CASTFS_OP_GGUF_BLOCKS;
		q.blocksize = CASTFS_GGUF_QK;
		q.qtype = (uint8_t)block_qtype(o->type, &p.unit);
	} else {
		p.unit = castfs_dtype_bits(dst) / 8;
	}
	rc = castfs_gguf_deq_add_qt(pb, gd->g, o->t, &q, &p.qt);
	return rc ? rc : castfs_pb_append(pb, &p, nbytes);
}

/* Append the data of tensor @i of @ctx (a struct gguf_data). */
static int add_data(void *ctx, struct castfs_pb *pb, size_t i)
{
	const struct gguf_data *gd = ctx;
	const struct gguf_out *o = &gd->o[i];
	struct castfs_producer p = { .src_off =
					     gd->h->data_start + o->t->begin };
	enum castfs_dtype dst = ggml_dtype(o->type);
	int rc;

	if (gd->g && castfs_gguf_deq_ent(gd->g, o->t)->deq)
		return add_deq(gd, pb, o, gd->nbytes[i]);
	if (gd->g) /* a kept tensor of the bf16 view: the source's bytes */
		p.src_off = castfs_gguf_deq_ent(gd->g, o->t)->src_off;
	if (is_quant(o->type)) {
		struct castfs_qtensor q = {
			.src_off = p.src_off,
			.nelems = o->t->nelems,
			.rows = o->shape[0],
			.cols = o->shape[1],
			.blocksize = CASTFS_GGUF_QK,
			.src_dtype = o->t->dtype,
			/* convert.py writes an F32 or F64 source as F16
			 * (BF16 stays; F8 widens exactly) before
			 * llama-quantize */
			.via_f16 = o->t->dtype == CASTFS_DTYPE_F32 ||
				   o->t->dtype == CASTFS_DTYPE_F64,
		};

		q.qtype = (uint8_t)block_qtype(o->type, &p.unit);
		rc = castfs_pb_add_qtensor(pb, &q, &p.qt);
		if (rc)
			return rc;
		p.op = CASTFS_OP_GGUF_BLOCKS;
	} else if (dst == o->t->dtype) {
		p.op = CASTFS_OP_COPY;
	} else {
		p.op = CASTFS_OP_CAST;
		p.src_dtype = o->t->dtype;
		p.dst_dtype = dst;
		p.unit = castfs_dtype_bits(dst) / 8;
		/* numpy's cast, as convert.py's (torch's rounds twice) */
		if (o->t->dtype == CASTFS_DTYPE_F64 && dst == CASTFS_DTYPE_F16)
			p.flags = CASTFS_CVT_ONE_ROUNDING;
	}
	return castfs_pb_append(pb, &p, gd->nbytes[i]);
}

/* The zeros padding @nbytes of data to CASTFS_GGUF_ALIGN. */
static int add_pad(struct castfs_pb *pb, uint64_t nbytes)
{
	static const uint8_t zeros[CASTFS_GGUF_ALIGN];
	struct castfs_producer z = { .op = CASTFS_OP_MEM, .mem = zeros };
	uint64_t pad = (CASTFS_GGUF_ALIGN - nbytes % CASTFS_GGUF_ALIGN) %
		       CASTFS_GGUF_ALIGN;

	return pad ? castfs_pb_append(pb, &z, pad) : 0;
}

int castfs_view_gguf_assemble(struct castfs_gguf_w *w, size_t n,
			      const uint64_t *nbytes, castfs_gguf_data_fn add,
			      void *ctx, struct castfs_plan **out)
{
	struct castfs_producer hp = { .op = CASTFS_OP_MEM };
	struct castfs_pb *pb = NULL;
	uint64_t data_len;
	uint8_t *hdr = NULL;
	size_t hdr_len;
	int rc = castfs_gguf_w_finish(w, &hdr, &hdr_len, &data_len);

	if (!rc)
		rc = castfs_pb_new(&pb);
	hp.mem = hdr;
	if (!rc)
		rc = castfs_pb_append(pb, &hp, hdr_len);
	for (size_t i = 0; !rc && i < n; i++) {
		rc = add(ctx, pb, i);
		if (!rc)
			rc = add_pad(pb, nbytes[i]);
	}
	if (!rc) {
		rc = castfs_pb_finish_raw(pb, out);
		pb = NULL;
	}
	castfs_pb_free(pb);
	free(hdr);
	return rc;
}

/* The tensors of @s that the view holds, in name order, described. */
static int collect(const struct castfs_view *v, const struct gguf_arch *a,
		   const struct gguf_src *s, struct gguf_out **out, size_t *n,
		   struct castfs_diag *d)
{
	struct gguf_out *o =
		calloc(s->h->ntensors ? s->h->ntensors : 1, sizeof(*o));
	size_t k = 0;
	int rc = 0;

	if (!o)
		return -ENOMEM;
	for (size_t i = 0; !rc && i < s->h->ntensors; i++) {
		const struct castfs_tensor *t = s->h->by_name[i];

		if (!has_prefix(t->name, t->name_len, s->prefix))
			continue;
		rc = describe(v, a, t, s->plen, &o[k], d);
		k++;
	}
	if (rc) {
		free(o);
		return rc;
	}
	*out = o;
	*n = k;
	return 0;
}

/* KVs and tensor infos into @w; the data offsets of the tensors. */
static int write_header(const struct castfs_view *v, const struct gguf_arch *a,
			struct castfs_gguf_w *w, const struct gguf_out *o,
			size_t n, uint64_t *nbytes, struct castfs_diag *d)
{
	uint64_t off;
	int rc = 0;

	castfs_gguf_kv_str(w, "general.architecture", a->name);
	castfs_gguf_kv_u32(w, "general.quantization_version", 2);
	castfs_gguf_kv_u32(
		w, "general.file_type",
		castfs_gguf_file_type((enum castfs_ggml_type)v->gguf_type));
	for (size_t i = 0; !rc && i < n; i++) {
		if (o[i].reshaped)
			rc = add_orig_shape(w, &o[i]);
		if (!rc)
			rc = castfs_gguf_tensor(w, o[i].name, o[i].name_len,
						o[i].ndim, o[i].shape,
						o[i].type, &off, &nbytes[i]);
		if (rc)
			return castfs_diag_set(
				d, rc,
				"GGUF view: tensor '%.*s' cannot "
				"be written (name of 128 bytes "
				"or more, or size)",
				(int)o[i].name_len, o[i].name);
	}
	return 0;
}

static int build(const struct castfs_view *v, const struct castfs_header *h,
		 const struct castfs_gguf_deq *g, const struct gguf_arch *a,
		 const struct gguf_src *s, struct castfs_plan **out,
		 struct castfs_diag *d)
{
	struct gguf_out *o = NULL;
	struct castfs_gguf_w *w = NULL;
	uint64_t *nbytes = NULL;
	size_t n = 0;
	int rc = collect(v, a, s, &o, &n, d);

	if (!rc)
		rc = castfs_gguf_w_new(&w);
	if (!rc) {
		nbytes = calloc(n ? n : 1, sizeof(*nbytes));
		rc = nbytes ? 0 : -ENOMEM;
	}
	if (!rc)
		rc = write_header(v, a, w, o, n, nbytes, d);
	if (!rc) {
		struct gguf_data gd = {
			.h = h, .g = g, .o = o, .nbytes = nbytes
		};

		rc = castfs_view_gguf_assemble(w, n, nbytes, add_data, &gd,
					       out);
	}
	free(nbytes);
	castfs_gguf_w_free(w);
	free(o);
	return rc;
}

int castfs_view_plan_gguf(const struct castfs_view *v,
			  const struct castfs_header *h,
			  const struct castfs_qsrc_opts *qo,
			  struct castfs_plan **out, struct castfs_diag *d)
{
	struct castfs_gguf_deq *g = NULL;
	struct gguf_src s = { .h = h };
	const struct gguf_arch *a;
	int rc;

	if (!is_quant((enum castfs_ggml_type)v->gguf_type) &&
	    castfs_gguf_block_qtype((enum castfs_ggml_type)v->gguf_type) >= 0)
		return castfs_diag_set(d, -EINVAL,
				       "GGUF view: K-quant mixes are built "
				       "for model folders only, not for "
				       "diffusion checkpoints");
	/* A quantized source is converted as its bf16 view. */
	rc = castfs_gguf_deq_new(h, qo, &g, d);
	if (rc)
		return rc;
	if (g)
		s.h = g->h;
	find_prefix(&s);
	a = detect_arch(&s);
	if (!a)
		rc = castfs_diag_set(d, -EINVAL,
				     "GGUF view: not a diffusion model "
				     "ComfyUI-GGUF knows (flux, sd3, sdxl, "
				     "sd1 in the original key layout)");
	else
		rc = build(v, h, g, a, &s, out, d);
	castfs_gguf_deq_free(g);
	return rc;
}
