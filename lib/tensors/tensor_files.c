/* SPDX-License-Identifier: MIT */
/*
 * The per-tensor files of tensor trees: .npy layouts and plans, raw byte
 * plans, the .info text and __metadata__ JSON (docs/TENSOR_TREE.md).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "kernels/convert.h"
#include "plan/plan_build.h"
#include "common/strbuf.h"
#include "tensors/tensor_files.h"

/* A JSON string: names may hold quotes, control bytes and NULs. */
static void sb_json_str(struct castfs_strbuf *b, const char *s, size_t n)
{
	castfs_sb_put(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			castfs_sb_printf(b, "\\%c", c);
		else if (c == '\n')
			castfs_sb_put(b, "\\n", 2);
		else if (c == '\t')
			castfs_sb_put(b, "\\t", 2);
		else if (c < 0x20 || c == 0x7f)
			castfs_sb_printf(b, "\\u%04x", c);
		else
			castfs_sb_put(b, s + i, 1);
	}
	castfs_sb_put(b, "\"", 1);
}

/* ---- text made whole or per range ---- */

/*
 * Where a generated file's text goes: all of it into @b (the whole text),
 * or, with @pb, into plan extents: fixed text as MEM, long integer lists
 * as INTS made per read range. Both paths run the same emitting code, so
 * the plan's bytes are the whole text's.
 */
struct tgen {
	struct castfs_strbuf b;
	struct castfs_pb *pb; /* NULL: the whole text */
	int rc;
};

/* Shorter lists stay text: an extent and its index cost more. */
#define TGEN_INTS_MIN 64u

/* Move the pending text into a MEM extent. */
static void tg_flush(struct tgen *g)
{
	struct castfs_producer p = { .op = CASTFS_OP_MEM, .mem = g->b.p };

	if (g->b.oom && !g->rc)
		g->rc = -ENOMEM;
	if (!g->rc && g->b.len)
		g->rc = castfs_pb_append(g->pb, &p, g->b.len);
	g->b.len = 0;
}

/* @n integers @v joined by ", "; with a plan @v must outlive it. */
static void tg_ints(struct tgen *g, const uint64_t *v, uint64_t n)
{
	if (!g->pb || n < TGEN_INTS_MIN) {
		for (uint64_t i = 0; i < n; i++)
			castfs_sb_printf(&g->b, "%s%" PRIu64, i ? ", " : "",
					 v[i]);
		return;
	}
	tg_flush(g);
	if (!g->rc)
		g->rc = castfs_pb_append_ints(g->pb, v, n);
}

static void tg_shape(struct tgen *g, uint32_t ndim, const uint64_t *shape)
{
	castfs_sb_put(&g->b, "[", 1);
	tg_ints(g, shape, ndim);
	castfs_sb_put(&g->b, "]", 1);
}

/* The plan of what @g emitted. Consumes @g. */
static int tg_finish_plan(struct tgen *g, struct castfs_plan **out)
{
	tg_flush(g);
	castfs_sb_fini(&g->b);
	if (g->rc) {
		castfs_pb_free(g->pb);
		return g->rc;
	}
	return castfs_pb_finish_raw(g->pb, out);
}

/* The text, or NULL when an allocation failed. */
static char *sb_finish(struct castfs_strbuf *b, size_t *len)
{
	char *out;

	return castfs_sb_take(b, &out, len) ? NULL : out;
}

char *castfs_tinfo_shape_str(uint32_t ndim, const uint64_t *shape)
{
	struct tgen g = { .pb = NULL };

	tg_shape(&g, ndim, shape);
	return sb_finish(&g.b, NULL);
}

/* ---- .npy ---- */

#define NPY_ALIGN 64u
#define NPY_GROWTH_DIGITS 21 /* numpy's GROWTH_AXIS_MAX_DIGITS */

/* The shape numpy loads: dims @v[0, nv) of the tensor's, then @last if
 * @has_last. Borrowed, so that a huge shape is never copied. */
struct npy_dims {
	const uint64_t *v;
	uint32_t nv;
	bool has_last;
	uint64_t last;
};

/* The layout of a .npy file, computed without making its header. */
struct npy_geom {
	enum castfs_npy_kind kind;
	char descr[8];
	struct npy_dims d;
	size_t pre; /* magic, version and length: 10, or 12 (format 2.0) */
	uint64_t dict_len; /* the dict and its growth spaces */
	uint64_t pad; /* spaces before the final '\n' */
	uint64_t header_len, data_len, size;
};

static void npy_kind(enum castfs_dtype dt, struct npy_geom *n)
{
	const char *d = castfs_dtype_numpy(dt);

	if (d) {
		n->kind = CASTFS_NPY_COPY;
	} else if (castfs_convert_get(dt, CASTFS_DTYPE_F32, 0)) {
		n->kind = CASTFS_NPY_WIDEN;
		d = "<f4";
	} else {
		n->kind = CASTFS_NPY_BYTES;
		d = "|u1";
	}
	snprintf(n->descr, sizeof(n->descr), "%s", d);
}

/* The shape numpy loads: the tensor's, except for bit patterns of
 * sub-byte types (F4 pairs as torch packs them, else one flat row). */
static void npy_dims(const struct castfs_tensor *t, struct npy_geom *n)
{
	n->d = (struct npy_dims){ .v = t->shape, .nv = t->ndim };
	if (n->kind != CASTFS_NPY_BYTES || castfs_dtype_bits(t->dtype) == 8)
		return;
	n->d.has_last = true;
	if (t->dtype == CASTFS_DTYPE_F4 && t->ndim &&
	    t->shape[t->ndim - 1] % 2 == 0) {
		n->d.nv = t->ndim - 1;
		n->d.last = t->shape[t->ndim - 1] / 2;
		return;
	}
	n->d.nv = 0;
	n->d.last = t->end - t->begin;
}

static uint32_t dims_ndim(const struct npy_dims *d)
{
	return d->nv + (d->has_last ? 1 : 0);
}

static void tg_dims(struct tgen *g, const struct npy_dims *d)
{
	tg_ints(g, d->v, d->nv);
	if (d->has_last)
		castfs_sb_printf(&g->b, "%s%" PRIu64, d->nv ? ", " : "",
				 d->last);
}

static uint64_t dims_len(const struct npy_dims *d)
{
	uint64_t len = castfs_ints_len(d->v, d->nv);

	if (d->has_last)
		len += castfs_ints_len(&d->last, 1) + (d->nv ? 2 : 0);
	return len;
}

static int dict_head(const struct npy_geom *n, char *buf, size_t len)
{
	return snprintf(buf, len,
			"{'descr': '%s', 'fortran_order': False, 'shape': (",
			n->descr);
}

/* The spaces numpy leaves after the dict for the first axis to grow. */
static uint64_t growth(const struct npy_dims *d)
{
	uint64_t first = d->nv ? d->v[0] : d->last;

	if (!dims_ndim(d))
		return 0;
	return NPY_GROWTH_DIGITS - castfs_ints_len(&first, 1);
}

/* numpy's _write_array_header and _wrap_header, in lengths. */
static void npy_sizes(struct npy_geom *n)
{
	uint64_t hlen;

	n->dict_len = (uint64_t)dict_head(n, NULL, 0) + dims_len(&n->d) +
		      (dims_ndim(&n->d) == 1 ? 1 : 0) + 4 + growth(&n->d);
	hlen = n->dict_len + 1; /* the final '\n' */
	n->pre = 10; /* magic, version, u16 length */
	n->pad = NPY_ALIGN - (n->pre + hlen) % NPY_ALIGN;
	if (hlen + n->pad > 65535) {
		n->pre = 12; /* format 2.0: u32 length */
		n->pad = NPY_ALIGN - (n->pre + hlen) % NPY_ALIGN;
	}
	n->header_len = n->pre + hlen + n->pad;
}

static int npy_geom(const struct castfs_tensor *t, struct npy_geom *n)
{
	*n = (struct npy_geom){ 0 };
	npy_kind(t->dtype, n);
	n->data_len = t->end - t->begin;
	if (n->kind == CASTFS_NPY_WIDEN &&
	    castfs_ckd_mul(&n->data_len, t->nelems, 4))
		return -EOVERFLOW;
	npy_dims(t, n);
	npy_sizes(n);
	if (n->header_len > UINT32_MAX ||
	    castfs_ckd_add(&n->size, n->header_len, n->data_len))
		return -EOVERFLOW;
	return 0;
}

/* The header's bytes, magic to '\n'. */
static void tg_npy_header(struct tgen *g, const struct npy_geom *n)
{
	uint8_t pre[12];
	char head[96];
	uint64_t len = n->header_len - n->pre;

	memcpy(pre, "\x93NUMPY", 6);
	pre[6] = n->pre == 10 ? 1 : 2;
	pre[7] = 0;
	if (n->pre == 10)
		castfs_store_le16(pre + 8, (uint16_t)len);
	else
		castfs_store_le32(pre + 8, (uint32_t)len);
	castfs_sb_put(&g->b, pre, n->pre);
	dict_head(n, head, sizeof(head));
	castfs_sb_puts(&g->b, head);
	tg_dims(g, &n->d);
	castfs_sb_printf(&g->b, "%s), }%*s%*s\n",
			 dims_ndim(&n->d) == 1 ? "," : "", (int)growth(&n->d),
			 "", (int)n->pad, "");
}

void castfs_npy_fini(struct castfs_npy *n)
{
	free(n->header);
	free(n->shape);
	n->header = NULL;
	n->shape = NULL;
}

/* The whole header into @out, checked against the lengths. */
static int npy_whole(const struct npy_geom *geo, struct castfs_npy *out)
{
	struct tgen g = { .pb = NULL };
	size_t len;

	tg_npy_header(&g, geo);
	out->header = (uint8_t *)sb_finish(&g.b, &len);
	if (!out->header)
		return -ENOMEM;
	assert(len == geo->header_len);
	out->header_len = len;
	out->shape = malloc((dims_ndim(&geo->d) + 1) * sizeof(*out->shape));
	if (!out->shape)
		return -ENOMEM;
	if (geo->d.nv)
		memcpy(out->shape, geo->d.v, geo->d.nv * sizeof(*out->shape));
	out->shape[geo->d.nv] = geo->d.last;
	return 0;
}

int castfs_npy_layout(const struct castfs_tensor *t, struct castfs_npy *out)
{
	struct castfs_npy n = { 0 };
	struct npy_geom geo;
	int rc = npy_geom(t, &geo);

	if (rc)
		return rc;
	n.kind = geo.kind;
	memcpy(n.descr, geo.descr, sizeof(n.descr));
	n.ndim = dims_ndim(&geo.d);
	n.data_len = geo.data_len;
	n.size = geo.size;
	rc = npy_whole(&geo, &n);
	if (rc) {
		castfs_npy_fini(&n);
		return rc;
	}
	*out = n;
	return 0;
}

/* The producer of a .npy file's data, read from @data_off. */
static struct castfs_producer npy_producer(const struct castfs_tensor *t,
					   const struct npy_geom *n,
					   uint64_t data_off)
{
	struct castfs_producer p = { .op = CASTFS_OP_COPY,
				     .src_off = data_off };

	if (n->kind == CASTFS_NPY_WIDEN) {
		p.op = CASTFS_OP_CAST;
		p.src_dtype = (uint8_t)t->dtype;
		p.dst_dtype = CASTFS_DTYPE_F32;
		p.unit = 4;
	}
	return p;
}

int castfs_npy_plan(const struct castfs_tensor *t, uint64_t data_off,
		    struct castfs_plan **out)
{
	struct castfs_producer data;
	struct tgen g = { .pb = NULL };
	struct npy_geom n;
	int rc = npy_geom(t, &n);

	if (rc)
		return rc;
	rc = castfs_pb_new(&g.pb);
	if (rc)
		return rc;
	tg_npy_header(&g, &n);
	tg_flush(&g);
	data = npy_producer(t, &n, data_off);
	if (!g.rc)
		g.rc = castfs_pb_append(g.pb, &data, n.data_len);
	return tg_finish_plan(&g, out);
}

/* ---- where a view's tensor comes from ---- */

/* The tensor of @h whose bytes hold absolute file offset @off. */
static const struct castfs_tensor *tensor_at(const struct castfs_header *h,
					     uint64_t off)
{
	size_t lo = 0, hi = h->ntensors;
	uint64_t rel;

	if (off < h->data_start)
		return NULL;
	rel = off - h->data_start;
	/* Ends never decrease: the first tensor ending after @rel. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (h->tensors[mid].end <= rel)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < h->ntensors && h->tensors[lo].begin <= rel)
		return &h->tensors[lo];
	return NULL;
}

static void origin_extent(const struct castfs_tfile_ctx *c,
			  const struct castfs_extent *e, uint64_t rel,
			  struct castfs_torigin *o)
{
	const struct castfs_qtensor *q;
	uint64_t src_off;

	o->op = (enum castfs_op)e->op;
	switch ((enum castfs_op)e->op) {
	case CASTFS_OP_MEM:
	case CASTFS_OP_INTS:
		return; /* generated: code tables and the like */
	case CASTFS_OP_COPY:
		src_off = e->src_off + rel;
		break;
	case CASTFS_OP_CAST:
		o->from = (enum castfs_dtype)e->src_dtype;
		o->to = (enum castfs_dtype)e->dst_dtype;
		o->flags = e->flags;
		src_off = e->src_off +
			  rel / e->unit * (castfs_dtype_bits(o->from) / 8);
		break;
	case CASTFS_OP_DEQ_FP8:
		o->from = CASTFS_DTYPE_F8_E4M3;
		o->to = (enum castfs_dtype)e->dst_dtype;
		o->flags = e->flags;
		src_off = e->src_off + rel / e->unit;
		if (e->qt < c->plan->nqt &&
		    c->plan->qtensors[e->qt].code_dtype == CASTFS_DTYPE_U8) {
			o->from = CASTFS_DTYPE_U8; /* packed FP4 pairs */
			src_off = e->src_off + rel / e->unit / 2;
		}
		break;
	case CASTFS_OP_DEQ_MXFP4:
		o->from = CASTFS_DTYPE_U8;
		o->to = (enum castfs_dtype)e->dst_dtype;
		o->flags = e->flags;
		src_off = e->src_off; /* the codes of a transposed matrix */
		break;
	case CASTFS_OP_DEQ_W4:
		o->from = CASTFS_DTYPE_I32;
		o->to = (enum castfs_dtype)e->dst_dtype;
		o->flags = e->flags;
		src_off = e->src_off; /* rows padded to whole words */
		break;
	case CASTFS_OP_DEQ_Q4:
		o->from = CASTFS_DTYPE_U8;
		o->to = (enum castfs_dtype)e->dst_dtype;
		o->flags = e->flags;
		src_off = e->src_off + rel / e->unit / 2;
		break;
	case CASTFS_OP_Q4_CODES:
	case CASTFS_OP_Q4_ABSMAX:
	case CASTFS_OP_Q4_QABSMAX:
	case CASTFS_OP_Q4_NESTED_ABSMAX:
	case CASTFS_OP_Q4_STATE:
	case CASTFS_OP_I8_CODES:
	case CASTFS_OP_I8_SCB:
	case CASTFS_OP_F8_CODES:
	case CASTFS_OP_I4_PACKED:
	case CASTFS_OP_CT_SCALE:
	case CASTFS_OP_CT_GSCALE:
	case CASTFS_OP_GGUF_BLOCKS:
	case CASTFS_OP_DEQ_BF16: /* GGUF files only: not in tensor trees */
		if (e->qt >= c->plan->nqt)
			return;
		q = &c->plan->qtensors[e->qt];
		o->from = castfs_qtensor_deq(q) ?
				  CASTFS_DTYPE_F8_E4M3 :
				  (enum castfs_dtype)q->src_dtype;
		o->qtype = q->qtype;
		src_off = q->src_off;
		break;
	case CASTFS_OP_COUNT:
	default:
		return;
	}
	o->src = tensor_at(c->src_h, src_off);
}

/* The flags the view's casts from @from to @to carry (saturating e4m3),
 * for an empty tensor, which has no extent of its own to say (a bug hunt:
 * its .info said "cast BF16 -> F8_E4M3" where the others said
 * "(saturating)"). 0 when the view casts no element so. */
static unsigned cast_flags_of(const struct castfs_plan *p,
			      enum castfs_dtype from, enum castfs_dtype to)
{
	for (size_t i = 0; i < p->nextents; i++) {
		const struct castfs_extent *e = &p->extents[i];

		if (e->op == CASTFS_OP_CAST && e->src_dtype == from &&
		    e->dst_dtype == to)
			return e->flags;
	}
	return 0;
}

void castfs_torigin_find(const struct castfs_tfile_ctx *c,
			 const struct castfs_tensor *t,
			 struct castfs_torigin *o)
{
	uint64_t off = c->h->data_start + t->begin;
	const struct castfs_extent *e;

	*o = (struct castfs_torigin){
		.op = CASTFS_OP_COPY,
		.src = t,
		.from = t->dtype,
		.to = t->dtype,
		.qtype = -1,
	};
	if (!c->plan)
		return;
	o->src = NULL;
	if (t->end == t->begin || off >= c->plan->size) {
		/* No bytes to trace: an empty tensor keeps its name. */
		o->src = castfs_header_find(c->src_h, t->name, t->name_len);
		if (o->src && o->src->dtype != t->dtype) {
			o->op = CASTFS_OP_CAST;
			o->from = o->src->dtype;
			o->flags = cast_flags_of(c->plan, o->from, o->to);
		}
		return;
	}
	e = &c->plan->extents[castfs_plan_find(c->plan, off)];
	origin_extent(c, e, off - e->out_off, o);
}

static const char *qtype_name(int q)
{
	switch (q) {
	case CASTFS_Q_NF4:
		return "nf4";
	case CASTFS_Q_FP4:
		return "fp4";
	case CASTFS_Q_INT8:
		return "int8";
	case CASTFS_Q_F8:
		return "fp8";
	case CASTFS_Q_W4:
		return "int4";
	case CASTFS_Q_NVFP4:
		return "nvfp4";
	case CASTFS_Q_COMFY_F8:
		return "comfy fp8";
	default:
		return "?";
	}
}

void castfs_torigin_str(const struct castfs_torigin *o, char *buf, size_t len)
{
	switch (o->op) {
	case CASTFS_OP_COPY:
		snprintf(buf, len, "copy");
		break;
	case CASTFS_OP_MEM:
	case CASTFS_OP_INTS:
		snprintf(buf, len, "generated");
		break;
	case CASTFS_OP_CAST:
		snprintf(buf, len, "cast %s -> %s%s",
			 castfs_dtype_name(o->from), castfs_dtype_name(o->to),
			 o->flags & CASTFS_CVT_SATURATE ? " (saturating)" : "");
		break;
	case CASTFS_OP_DEQ_FP8:
		if (o->from == CASTFS_DTYPE_U8) {
			snprintf(buf, len,
				 "dequantize packed FP4 x group scale -> %s%s",
				 castfs_dtype_name(o->to),
				 o->flags & CASTFS_CVT_SATURATE ?
					 " (saturating)" :
					 "");
			break;
		}
		snprintf(buf, len, "dequantize FP8 block x scale -> %s%s",
			 castfs_dtype_name(o->to),
			 o->flags & CASTFS_CVT_SATURATE ? " (saturating)" : "");
		break;
	case CASTFS_OP_DEQ_MXFP4:
		snprintf(buf, len,
			 "dequantize MXFP4 blocks x 2^scale, transposed -> %s",
			 castfs_dtype_name(o->to));
		break;
	case CASTFS_OP_DEQ_W4:
		snprintf(buf, len, "dequantize int4 codes x group scale -> %s",
			 castfs_dtype_name(o->to));
		break;
	case CASTFS_OP_DEQ_Q4:
		snprintf(buf, len,
			 "dequantize bitsandbytes 4-bit codes x absmax -> %s",
			 castfs_dtype_name(o->to));
		break;
	case CASTFS_OP_Q4_CODES:
	case CASTFS_OP_Q4_ABSMAX:
	case CASTFS_OP_Q4_QABSMAX:
	case CASTFS_OP_Q4_NESTED_ABSMAX:
	case CASTFS_OP_Q4_STATE:
	case CASTFS_OP_I8_CODES:
	case CASTFS_OP_I8_SCB:
	case CASTFS_OP_F8_CODES:
	case CASTFS_OP_I4_PACKED:
	case CASTFS_OP_CT_SCALE:
	case CASTFS_OP_CT_GSCALE:
	case CASTFS_OP_GGUF_BLOCKS:
	case CASTFS_OP_DEQ_BF16:
	case CASTFS_OP_COUNT:
	default:
		if (o->qtype == CASTFS_Q_COMFY_F8) {
			snprintf(buf, len, "ComfyUI scaled fp8 %s of %s",
				 castfs_op_name(o->op),
				 castfs_dtype_name(o->from));
			break;
		}
		if (o->qtype == CASTFS_Q_F8 || o->qtype == CASTFS_Q_W4 ||
		    o->qtype == CASTFS_Q_NVFP4) {
			snprintf(buf, len, "compressed-tensors %s of %s",
				 castfs_op_name(o->op),
				 castfs_dtype_name(o->from));
			break;
		}
		snprintf(buf, len, "bitsandbytes %s %s of %s",
			 qtype_name(o->qtype), castfs_op_name(o->op),
			 castfs_dtype_name(o->from));
		break;
	}
}

/* ---- .info ---- */

static void info_npy(struct tgen *g, const struct castfs_tensor *t)
{
	struct castfs_strbuf *b = &g->b;
	struct npy_geom n;

	if (npy_geom(t, &n)) {
		b->oom = true; /* as the whole text always failed here */
		return;
	}
	castfs_sb_printf(b, "npy: %s [", n.descr);
	tg_dims(g, &n.d);
	castfs_sb_put(b, "]", 1);
	if (n.kind == CASTFS_NPY_WIDEN)
		castfs_sb_printf(b, ", widened to float32 (numpy has no %s)",
				 castfs_dtype_name(t->dtype));
	else if (n.kind == CASTFS_NPY_BYTES)
		castfs_sb_printf(b,
				 ", the raw bit patterns as uint8 (numpy has "
				 "no %s)",
				 castfs_dtype_name(t->dtype));
	else
		castfs_sb_printf(b, ", the bytes as stored");
	castfs_sb_printf(b, "; %" PRIu64 " bytes, data at %" PRIu64 "\n",
			 n.size, n.header_len);
}

static void info_offsets(struct castfs_strbuf *b, const char *what,
			 const struct castfs_header *h,
			 const struct castfs_tensor *t)
{
	castfs_sb_printf(b, "%s[%" PRIu64 ", %" PRIu64 "]", what,
			 h->data_start + t->begin, h->data_start + t->end);
}

static void info_view(struct tgen *g, const struct castfs_tfile_ctx *c,
		      const struct castfs_tensor *t)
{
	struct castfs_strbuf *b = &g->b;
	struct castfs_torigin o;
	char how[128];

	castfs_torigin_find(c, t, &o);
	castfs_torigin_str(&o, how, sizeof(how));
	castfs_sb_put(b, "view: ", 6);
	sb_json_str(b, c->view, strlen(c->view));
	castfs_sb_put(b, "\nsource: ", 9);
	if (o.src) {
		sb_json_str(b, o.src->name, o.src->name_len);
		castfs_sb_put(b, " in ", 4);
		sb_json_str(b, c->src_file, strlen(c->src_file));
		castfs_sb_printf(b, " (%s ", castfs_dtype_name(o.src->dtype));
		tg_shape(g, o.src->ndim, o.src->shape);
		info_offsets(b, ", file_offsets ", c->src_h, o.src);
		castfs_sb_put(b, ")", 1);
	} else {
		castfs_sb_put(b, "none (generated by castfs)", 26);
	}
	castfs_sb_printf(b, "\nconversion: %s\n", how);
}

static void info_emit(struct tgen *g, const struct castfs_tfile_ctx *c,
		      const struct castfs_tensor *t)
{
	struct castfs_strbuf *b = &g->b;

	castfs_sb_put(b, "name: ", 6);
	sb_json_str(b, t->name, t->name_len);
	castfs_sb_put(b, "\nfile: ", 7);
	sb_json_str(b, c->file, strlen(c->file));
	castfs_sb_printf(b,
			 "\ndtype: %s\nshape: ", castfs_dtype_name(t->dtype));
	tg_shape(g, t->ndim, t->shape);
	castfs_sb_printf(b,
			 "\nelements: %" PRIu64 "\nbytes: %" PRIu64
			 "\ndata_offsets: [%" PRIu64 ", %" PRIu64 "]\n",
			 t->nelems, t->end - t->begin, t->begin, t->end);
	info_offsets(b, "file_offsets: ", c->h, t);
	castfs_sb_put(b, "\n", 1);
	if (c->view)
		info_view(g, c, t);
	info_npy(g, t);
	castfs_sb_printf(b,
			 "raw: %" PRIu64 " bytes as stored (little-endian, "
			 "C order)\n",
			 t->end - t->begin);
}

char *castfs_tinfo_text(const struct castfs_tfile_ctx *c,
			const struct castfs_tensor *t, size_t *len)
{
	struct tgen g = { .pb = NULL };

	info_emit(&g, c, t);
	return sb_finish(&g.b, len);
}

int castfs_tinfo_plan(const struct castfs_tfile_ctx *c,
		      const struct castfs_tensor *t, struct castfs_plan **out)
{
	struct tgen g = { .pb = NULL };
	int rc = castfs_pb_new(&g.pb);

	if (rc)
		return rc;
	info_emit(&g, c, t);
	return tg_finish_plan(&g, out);
}

char *castfs_meta_json(const struct castfs_header *h, size_t *len)
{
	struct castfs_strbuf b = { 0 };

	castfs_sb_put(&b, "{", 1);
	for (size_t i = 0; i < h->nmeta; i++) {
		const struct castfs_meta_kv *kv = &h->meta[i];

		castfs_sb_put(&b, i ? ",\n  " : "\n  ", i ? 4 : 3);
		sb_json_str(&b, kv->key, kv->key_len);
		castfs_sb_put(&b, ": ", 2);
		sb_json_str(&b, kv->value, kv->value_len);
	}
	castfs_sb_put(&b, h->nmeta ? "\n}\n" : "}\n", h->nmeta ? 3 : 2);
	return sb_finish(&b, len);
}
