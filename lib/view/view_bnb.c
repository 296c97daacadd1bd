/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes views: every weight the rules select becomes the tensors
 * Linear4bit (nf4/fp4) or Linear8bitLt (int8) save, under the same names,
 * dtypes and shapes; the other tensors are copied. See docs/FORMATS.md.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "kernels/convert.h"
#include "quant/quant.h"
#include "view/view_internal.h"

/* A tensor name built from a prefix and a suffix, owned by the caller. */
static char *bnb_name(const char *a, size_t a_len, const char *b, size_t *len)
{
	size_t b_len = strlen(b);
	char *s = malloc(a_len + b_len + 1);

	if (!s)
		return NULL;
	memcpy(s, a, a_len);
	memcpy(s + a_len, b, b_len + 1);
	*len = a_len + b_len;
	return s;
}

/* Add tensor @prefix@suffix; the name is copied by the builder. */
static int bnb_add(struct castfs_pb *pb, const struct castfs_tensor *t,
		   size_t prefix_len, const char *suffix,
		   enum castfs_dtype dtype, uint32_t ndim,
		   const uint64_t *shape, const struct castfs_producer *p)
{
	size_t len;
	char *name = bnb_name(t->name, prefix_len, suffix, &len);
	int rc;

	if (!name)
		return -ENOMEM;
	rc = castfs_pb_add_tensor(pb, name, len, dtype, ndim, shape, p);
	free(name);
	return rc;
}

/*
 * A copy of @n bytes that lives as long as the builder: the builder reads
 * MEM bytes when it lays the file out, after the tensors are added.
 */
static void *bnb_keep(struct castfs_pb *pb, const void *src, size_t n)
{
	void *dst = castfs_pb_alloc(pb, n);

	if (dst)
		memcpy(dst, src, n);
	return dst;
}

/*
 * The little-endian bytes of the constant float32 maps, made once: every
 * quantised tensor's quant_map and nested_quant_map point at them, where
 * each held two copies of its own (2.2 KB a tensor, 220 MB for 100,000).
 */
static uint8_t le_nf4[16 * 4], le_fp4[16 * 4], le_dynmap[256 * 4];
static pthread_once_t le_once = PTHREAD_ONCE_INIT;

static void le_store(uint8_t *dst, const float *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		castfs_store_le32(dst + 4 * i, castfs_f32_bits(v[i]));
}

static void le_init(void)
{
	le_store(le_nf4, castfs_q4_table(CASTFS_Q_NF4), 16);
	le_store(le_fp4, castfs_q4_table(CASTFS_Q_FP4), 16);
	le_store(le_dynmap, castfs_q_dynmap(), 256);
}

/* Constant map @le (@n float32 values, one of the above) as tensor
 * @suffix of @t. */
static int bnb_add_map(struct castfs_pb *pb, const struct castfs_tensor *t,
		       const char *suffix, const uint8_t *le, uint64_t n)
{
	struct castfs_producer p = { .op = CASTFS_OP_MEM,
				     .mem = le,
				     .mem_kept = true };

	pthread_once(&le_once, le_init);
	return bnb_add(pb, t, t->name_len, suffix, CASTFS_DTYPE_F32, 1, &n, &p);
}

/*
 * The dtype quant_state names: the dequantised weight comes back in it.
 * bnb only quantises 16/32-bit floats: a float64 source is quantised from
 * its float32 rounding and says float32; fp8 sources say bfloat16, which
 * holds every fp8 value exactly.
 */
static const char *bnb_state_dtype(enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F64)
		return "float32";
	if (dt == CASTFS_DTYPE_F8_E4M3 || dt == CASTFS_DTYPE_F8_E5M2)
		return "bfloat16";
	return castfs_dtype_torch(dt);
}

/*
 * The quant_state JSON of @qt, kept by the builder, into *@p; a nested
 * state gets its offset field recorded in @qt (before @qt is added).
 */
static int bnb_state(struct castfs_pb *pb, struct castfs_qtensor *qt,
		     struct castfs_producer *p, uint64_t *len)
{
	const struct castfs_q4_state st = {
		.qtype = (enum castfs_qtype)qt->qtype,
		.blocksize = qt->blocksize,
		.dtype = bnb_state_dtype((enum castfs_dtype)qt->src_dtype),
		.rows = qt->rows,
		.cols = qt->cols,
		.nested = qt->nested,
	};
	char json[CASTFS_Q4_STATE_MAX];
	size_t num_off;
	int n = castfs_q4_state_json(json, sizeof(json), &st, &num_off);

	if (n < 0)
		return n;
	*len = (uint64_t)n;
	*p = (struct castfs_producer){ .op = CASTFS_OP_MEM, .mem_kept = true };
	p->mem = bnb_keep(pb, json, (size_t)n);
	if (!p->mem)
		return -ENOMEM;
	if (qt->nested) {
		p->op = CASTFS_OP_Q4_STATE;
		qt->state_off = (uint32_t)num_off;
		qt->state_width = CASTFS_Q4_OFFSET_WIDTH;
	}
	return 0;
}

/* The absmax tensors: float32, or 8-bit codes + nested absmax + map. */
static int bnb_add_absmax(struct castfs_pb *pb, const struct castfs_tensor *t,
			  const struct castfs_qtensor *qt, uint32_t idx)
{
	uint64_t nb =
		qt->nelems / qt->blocksize + (qt->nelems % qt->blocksize != 0);
	uint64_t ng = (nb + CASTFS_Q_NESTED_BLOCK - 1) / CASTFS_Q_NESTED_BLOCK;
	struct castfs_producer p = { .op = CASTFS_OP_Q4_ABSMAX,
				     .unit = 4,
				     .qt = idx };
	int rc;

	if (!qt->nested)
		return bnb_add(pb, t, t->name_len, ".absmax", CASTFS_DTYPE_F32,
			       1, &nb, &p);
	p.op = CASTFS_OP_Q4_QABSMAX;
	p.unit = 1;
	rc = bnb_add(pb, t, t->name_len, ".absmax", CASTFS_DTYPE_U8, 1, &nb,
		     &p);
	if (rc)
		return rc;
	p.op = CASTFS_OP_Q4_NESTED_ABSMAX;
	p.unit = 4;
	rc = bnb_add(pb, t, t->name_len, ".nested_absmax", CASTFS_DTYPE_F32, 1,
		     &ng, &p);
	if (rc)
		return rc;
	return bnb_add_map(pb, t, ".nested_quant_map", le_dynmap, 256);
}

/*
 * A 4-bit weight: Linear4bit's state dict under the weight's name:
 * weight, weight.absmax, weight.quant_map, [weight.nested_absmax,
 * weight.nested_quant_map], weight.quant_state.bitsandbytes__<type>.
 */
static int bnb_add_q4(struct castfs_pb *pb, const struct castfs_view *v,
		      const struct castfs_header *h,
		      const struct castfs_tensor *t,
		      const struct castfs_deqsrc *deq)
{
	struct castfs_qtensor qt = {
		.src_off = h->data_start + t->begin,
		.nelems = t->nelems,
		.rows = t->shape[0],
		.cols = t->shape[1],
		.blocksize = v->blocksize,
		.src_dtype = (uint8_t)t->dtype,
		.qtype = v->qtype,
		.nested = v->nested,
	};
	uint64_t shape[2] = { t->nelems / 2 + t->nelems % 2, 1 };
	struct castfs_producer p = { .op = CASTFS_OP_Q4_CODES,
				     .unit = v->blocksize / 2 };
	struct castfs_producer state;
	uint64_t state_len;
	int rc;

	if (v->blocksize < 2 || v->blocksize % 2 ||
	    v->blocksize / 2 > CASTFS_BOUNCE_LEN)
		return -EINVAL;
	castfs_view_deq_apply(&qt, deq);
	rc = bnb_state(pb, &qt, &state, &state_len);
	if (!rc)
		rc = castfs_pb_add_qtensor(pb, &qt, &p.qt);
	state.qt = p.qt;
	if (!rc)
		rc = bnb_add(pb, t, t->name_len,
			     qt.qtype == CASTFS_Q_FP4 ?
				     ".quant_state.bitsandbytes__fp4" :
				     ".quant_state.bitsandbytes__nf4",
			     CASTFS_DTYPE_U8, 1, &state_len, &state);
	if (!rc)
		rc = bnb_add(pb, t, t->name_len, "", CASTFS_DTYPE_U8, 2, shape,
			     &p);
	if (!rc)
		rc = bnb_add_absmax(pb, t, &qt, p.qt);
	if (!rc)
		rc = bnb_add_map(pb, t, ".quant_map",
				 v->qtype == CASTFS_Q_FP4 ? le_fp4 : le_nf4,
				 16);
	return rc;
}

/*
 * The length of @t's module prefix: the name up to and including the dot
 * before a final "weight" ("a.b.weight" -> "a.b.", "weight" -> ""), or the
 * whole name when it has no such suffix.
 */
static size_t bnb_module_len(const struct castfs_tensor *t)
{
	static const char suffix[] = "weight";
	const size_t slen = sizeof(suffix) - 1;
	size_t mod = t->name_len - slen;

	if (t->name_len < slen || memcmp(t->name + mod, suffix, slen) != 0 ||
	    (mod > 0 && t->name[mod - 1] != '.'))
		return t->name_len;
	return mod;
}

/*
 * An int8 weight: Linear8bitLt's weight (I8), and the module's SCB and
 * weight_format (a name without a final "weight" is taken as the module).
 */
static int bnb_add_i8(struct castfs_pb *pb, const struct castfs_header *h,
		      const struct castfs_tensor *t,
		      const struct castfs_deqsrc *deq)
{
	static const uint8_t row_format = 0; /* bnb's "row" layout; static */
	struct castfs_qtensor qt = {
		.src_off = h->data_start + t->begin,
		.nelems = t->nelems,
		.rows = t->shape[0],
		.cols = t->shape[1],
		.src_dtype = (uint8_t)t->dtype,
		.qtype = CASTFS_Q_INT8,
	};
	struct castfs_producer p = { .op = CASTFS_OP_I8_CODES };
	size_t mod = bnb_module_len(t);
	bool dot = mod == t->name_len;
	int rc;

	castfs_view_deq_apply(&qt, deq);
	rc = castfs_pb_add_qtensor(pb, &qt, &p.qt);
	if (!rc)
		rc = bnb_add(pb, t, t->name_len, "", CASTFS_DTYPE_I8, 2,
			     t->shape, &p);
	p.op = CASTFS_OP_I8_SCB;
	p.unit = 4;
	if (!rc)
		rc = bnb_add(pb, t, mod, dot ? ".SCB" : "SCB", CASTFS_DTYPE_F32,
			     1, &qt.rows, &p);
	p = (struct castfs_producer){ .op = CASTFS_OP_MEM, .mem = &row_format };
	if (!rc)
		rc = bnb_add(pb, t, mod,
			     dot ? ".weight_format" : "weight_format",
			     CASTFS_DTYPE_U8, 0, NULL, &p);
	return rc;
}

int castfs_view_bnb_quantise(struct castfs_pb *pb, const struct castfs_view *v,
			     const struct castfs_header *h,
			     const struct castfs_tensor *t,
			     const struct castfs_deqsrc *deq,
			     struct castfs_diag *d)
{
	int rc;

	if (v->kind == CASTFS_VIEW_INT8)
		rc = bnb_add_i8(pb, h, t, deq);
	else
		rc = bnb_add_q4(pb, v, h, t, deq);
	if (rc)
		castfs_diag_set(d, rc,
				"view '%s': tensor '%s': cannot quantise",
				v->name, t->name);
	return rc;
}

int castfs_view_bnb_add(struct castfs_pb *pb, const struct castfs_view *v,
			const struct castfs_header *h,
			const struct castfs_tensor *t, struct castfs_diag *d)
{
	if (!castfs_view_converts(v, t))
		return castfs_view_add_copy(pb, h, t);
	return castfs_view_bnb_quantise(pb, v, h, t, NULL, d);
}

int castfs_view_plan_bnb(const struct castfs_view *v,
			 const struct castfs_header *h,
			 struct castfs_plan **out, struct castfs_diag *d)
{
	return castfs_view_build(v, h, castfs_view_bnb_add, out, d);
}
