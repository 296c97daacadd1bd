/* SPDX-License-Identifier: MIT */
/*
 * The hot path: serve any byte range of a plan, statelessly, from a bounded
 * per-thread scratch. Validation happened at plan time; this only indexes.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "plan/plan_internal.h"
#include "quant/quant.h"

int castfs_scratch_init(struct castfs_scratch *s)
{
	s->buf = malloc(CASTFS_SCRATCH_LEN + CASTFS_BOUNCE_LEN);
	if (!s->buf)
		return -ENOMEM;
	s->len = CASTFS_SCRATCH_LEN;
	s->bounce = s->buf + CASTFS_SCRATCH_LEN;
	s->cancelled = NULL;
	s->cancel_ctx = NULL;
	return 0;
}

void castfs_scratch_fini(struct castfs_scratch *s)
{
	free(s->buf);
	s->buf = NULL;
	s->bounce = NULL;
	s->len = 0;
}

static int gen_mem(const struct castfs_read_env *env,
		   const struct castfs_extent *e, uint64_t first,
		   uint64_t count, uint8_t *dst)
{
	(void)env;
	memcpy(dst, e->mem + first, (size_t)count);
	return 0;
}

/* Copied bytes go straight from the source into the caller's buffer. */
static int gen_copy(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t first,
		    uint64_t count, uint8_t *dst)
{
	return castfs_reader_read(env->src, dst, (size_t)count,
				  e->src_off + first);
}

/* A cast fed by a reader's visit op: where its output goes next. */
struct cast_visit {
	const struct castfs_extent *e;
	castfs_convert_planes_fn cvtp; /* bf16 planes */
	castfs_convert_grouped_fn cvtg; /* fp16 or fp32 planes */
	size_t in_sz; /* bytes per source element */
	uint8_t *dst;
};

static int cast_piece(void *arg, const struct castfs_piece *p)
{
	struct cast_visit *v = arg;
	size_t count = p->n / v->in_sz;

	if (p->sm)
		v->cvtp(v->dst, p->sm, p->ex, count);
	else if (p->planes)
		v->cvtg(v->dst, p->planes, count);
	else
		v->e->cvt(v->dst, p->bytes, count);
	v->dst += count * v->e->unit;
	return 0;
}

/*
 * A cast from a reader that hands its bytes over as they lie (a grouped
 * pack: a bf16 frame's planes cast without un-grouping them first, other
 * frames un-grouped a cache-sized piece at a time, no copy of cached
 * frames). -ENOTSUP when the reader has no such path; nothing is written
 * then.
 */
static int gen_cast_visit(const struct castfs_read_env *env,
			  const struct castfs_extent *e, uint64_t first,
			  uint64_t count, uint8_t *dst)
{
	struct cast_visit v = { .e = e, .dst = dst };
	unsigned how;

	v.in_sz = castfs_dtype_bits(e->src_dtype) / 8;
	if (!env->src->visit || (v.in_sz != 2 && v.in_sz != 4))
		return -ENOTSUP;
	how = (unsigned)v.in_sz;
	if (e->src_dtype == CASTFS_DTYPE_BF16) {
		v.cvtp = castfs_convert_planes_get(e->dst_dtype, e->flags);
		how |= v.cvtp ? CASTFS_VISIT_BF16 : 0;
	}
	v.cvtg = castfs_convert_grouped_get(e->src_dtype, e->dst_dtype,
					    e->flags);
	if (v.cvtg)
		how |= e->src_dtype == CASTFS_DTYPE_F32 ? CASTFS_VISIT_F32 :
							  CASTFS_VISIT_F16;
	return env->src->visit(env->src->ctx, e->src_off + first * v.in_sz,
			       (size_t)count * v.in_sz, how, cast_piece, &v);
}

/* A cast from the source's bytes where they lie (a mapped source). */
static int cast_mapped(void *arg, const struct castfs_piece *p)
{
	struct cast_visit *v = arg;

	v->e->cvt(v->dst, p->bytes,
		  p->n / (castfs_dtype_bits(v->e->src_dtype) / 8));
	return 0;
}

static int gen_cast(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t first,
		    uint64_t count, uint8_t *dst)
{
	size_t in_sz = castfs_dtype_bits(e->src_dtype) / 8;
	size_t chunk = env->s->len / in_sz;
	struct cast_visit v = { .e = e, .dst = dst };
	int rc = gen_cast_visit(env, e, first, count, dst);

	if (rc != -ENOTSUP)
		return rc;
	/* Mapped, the source is read once, by the cast itself: no pread
	 * copy into the scratch and no second pass over it. */
	rc = castfs_reader_map(env->src, e->src_off + first * in_sz,
			       (size_t)count * in_sz, cast_mapped, &v);
	if (rc != -ENOTSUP)
		return rc;

	while (count) {
		size_t n = (size_t)CASTFS_MIN(count, chunk);

		rc = castfs_reader_read(env->src, env->s->buf, n * in_sz,
					e->src_off + first * in_sz);
		if (rc)
			return rc;
		e->cvt(dst, env->s->buf, n);
		dst += n * e->unit;
		first += n;
		count -= n;
	}
	return 0;
}

/* The one map from an extent's op to the generator of its bytes. */
static const castfs_gen_fn gen_table[CASTFS_OP_COUNT] = {
	[CASTFS_OP_MEM] = gen_mem,
	[CASTFS_OP_COPY] = gen_copy,
	[CASTFS_OP_CAST] = gen_cast,
	[CASTFS_OP_Q4_CODES] = castfs_gen_q4_codes,
	[CASTFS_OP_Q4_ABSMAX] = castfs_gen_q4_absmax,
	[CASTFS_OP_Q4_QABSMAX] = castfs_gen_q4_qabsmax,
	[CASTFS_OP_Q4_NESTED_ABSMAX] = castfs_gen_q4_nested_absmax,
	[CASTFS_OP_Q4_STATE] = castfs_gen_q4_state,
	[CASTFS_OP_I8_CODES] = castfs_gen_i8_codes,
	[CASTFS_OP_I8_SCB] = castfs_gen_i8_scb,
	[CASTFS_OP_DEQ_FP8] = castfs_gen_deq_fp8,
	[CASTFS_OP_F8_CODES] = castfs_gen_f8_codes,
	[CASTFS_OP_I4_PACKED] = castfs_gen_i4_packed,
	[CASTFS_OP_CT_SCALE] = castfs_gen_ct_scale,
	[CASTFS_OP_CT_GSCALE] = castfs_gen_ct_gscale,
	[CASTFS_OP_GGUF_BLOCKS] = castfs_gen_gguf_blocks,
	[CASTFS_OP_DEQ_MXFP4] = castfs_gen_deq_mxfp4,
	[CASTFS_OP_DEQ_Q4] = castfs_gen_deq_packed,
	[CASTFS_OP_DEQ_W4] = castfs_gen_deq_packed,
	[CASTFS_OP_DEQ_BF16] = castfs_gen_deq_bf16,
	[CASTFS_OP_INTS] = castfs_gen_ints,
};

/* One unit cut by the range: produce it whole, copy out the part asked. */
static int read_partial_unit(const struct castfs_read_env *env,
			     const struct castfs_extent *e, castfs_gen_fn gen,
			     uint64_t rel, size_t n, uint8_t *dst)
{
	uint64_t unit = rel / e->unit;
	int rc = gen(env, e, unit, 1, env->s->bounce);

	if (rc)
		return rc;
	memcpy(dst, env->s->bounce + (rel - unit * e->unit), n);
	return 0;
}

/* Bytes [@rel, @rel + @n) of extent @e into @dst. */
static int read_extent(const struct castfs_read_env *env,
		       const struct castfs_extent *e, uint64_t rel, size_t n,
		       uint8_t *dst)
{
	castfs_gen_fn gen = gen_table[e->op];
	size_t head, whole;
	int rc;

	assert(e->op < CASTFS_OP_COUNT && gen);
	if (e->unit == 1)
		return gen(env, e, rel, n, dst);
	head = (size_t)((e->unit - rel % e->unit) % e->unit);
	if (head) {
		head = CASTFS_MIN(head, n);
		rc = read_partial_unit(env, e, gen, rel, head, dst);
		if (rc)
			return rc;
		rel += head;
		dst += head;
		n -= head;
	}
	whole = n / e->unit;
	if (whole) {
		rc = gen(env, e, rel / e->unit, whole, dst);
		if (rc)
			return rc;
		rel += whole * e->unit;
		dst += whole * e->unit;
		n -= whole * e->unit;
	}
	if (n)
		return read_partial_unit(env, e, gen, rel, n, dst);
	return 0;
}

/* The first source element a quantiser extent's byte @rel is made from. */
static uint64_t quant_elem(const struct castfs_extent *e,
			   const struct castfs_qtensor *q, uint64_t rel)
{
	switch ((enum castfs_op)e->op) {
	case CASTFS_OP_Q4_CODES:
	case CASTFS_OP_Q4_ABSMAX:
	case CASTFS_OP_Q4_QABSMAX: /* a unit per block */
		return rel / e->unit * q->blocksize;
	case CASTFS_OP_Q4_NESTED_ABSMAX:
		return rel / e->unit * CASTFS_Q_NESTED_BLOCK * q->blocksize;
	case CASTFS_OP_I8_CODES:
		return rel;
	case CASTFS_OP_I8_SCB: /* a unit per row */
		return rel / e->unit * q->cols;
	case CASTFS_OP_F8_CODES:
		return rel;
	case CASTFS_OP_I4_PACKED:
		return rel * 2;
	case CASTFS_OP_CT_SCALE: /* the first element of its block */
		return castfs_f8_scale_elem(q, rel / e->unit);
	case CASTFS_OP_CT_GSCALE: /* the whole tensor: its first element */
		return 0;
	case CASTFS_OP_GGUF_BLOCKS: /* a unit per block of 32 */
		return rel / e->unit * q->blocksize;
	case CASTFS_OP_MEM:
	case CASTFS_OP_COPY:
	case CASTFS_OP_CAST:
	case CASTFS_OP_Q4_STATE:
	case CASTFS_OP_DEQ_FP8:
	case CASTFS_OP_DEQ_MXFP4:
	case CASTFS_OP_DEQ_Q4:
	case CASTFS_OP_DEQ_W4:
	case CASTFS_OP_DEQ_BF16:
	case CASTFS_OP_INTS:
	case CASTFS_OP_COUNT:
		break;
	}
	return 0;
}

uint64_t castfs_plan_src_off(const struct castfs_plan *p, uint64_t off)
{
	const struct castfs_extent *e = &p->extents[castfs_plan_find(p, off)];
	uint64_t rel = off - e->out_off;
	const struct castfs_qtensor *q;

	switch ((enum castfs_op)e->op) {
	case CASTFS_OP_MEM:
	case CASTFS_OP_Q4_STATE:
	case CASTFS_OP_INTS:
	case CASTFS_OP_COUNT:
		return UINT64_MAX;
	case CASTFS_OP_COPY:
		return e->src_off + rel;
	case CASTFS_OP_CAST:
		return e->src_off +
		       rel / e->unit * (castfs_dtype_bits(e->src_dtype) / 8);
	case CASTFS_OP_DEQ_FP8: /* one F8 byte per element, or half one */
		q = &p->qtensors[e->qt];
		if (q->code_dtype == CASTFS_DTYPE_U8)
			return e->src_off + rel / e->unit / 2;
		return e->src_off + rel / e->unit;
	case CASTFS_OP_DEQ_MXFP4:
		return castfs_mxfp4_src_off(&p->qtensors[e->qt], rel / e->unit);
	case CASTFS_OP_DEQ_Q4: /* two codes a byte */
		return e->src_off + rel / e->unit / 2;
	case CASTFS_OP_DEQ_W4:
		return castfs_w4_src_off(&p->qtensors[e->qt], rel / e->unit);
	case CASTFS_OP_Q4_CODES:
	case CASTFS_OP_Q4_ABSMAX:
	case CASTFS_OP_Q4_QABSMAX:
	case CASTFS_OP_Q4_NESTED_ABSMAX:
	case CASTFS_OP_I8_CODES:
	case CASTFS_OP_I8_SCB:
	case CASTFS_OP_F8_CODES:
	case CASTFS_OP_I4_PACKED:
	case CASTFS_OP_CT_SCALE:
	case CASTFS_OP_CT_GSCALE:
		break;
	case CASTFS_OP_DEQ_BF16:
	case CASTFS_OP_GGUF_BLOCKS:
		q = &p->qtensors[e->qt];
		if (castfs_qtensor_deq(q))
			return castfs_deq_src_off(
				p, q,
				castfs_gguf_deq_elem(q, e, rel / e->unit));
		return e->src_off +
		       rel / e->unit * q->blocksize *
			       (castfs_dtype_bits(q->src_dtype) / 8);
	}
	q = &p->qtensors[e->qt];
	if (castfs_qtensor_deq(q))
		return castfs_deq_src_off(p, q, quant_elem(e, q, rel));
	return q->src_off + CASTFS_MIN(quant_elem(e, q, rel), q->nelems) *
				    (castfs_dtype_bits(q->src_dtype) / 8);
}

ssize_t castfs_plan_read(const struct castfs_plan *p,
			 const struct castfs_reader *src,
			 struct castfs_scratch *s, void *buf, size_t len,
			 uint64_t off)
{
	const struct castfs_read_env env = { .plan = p, .src = src, .s = s };
	uint8_t *dst = buf;
	uint64_t end;
	size_t i;

	if (off >= p->size || len == 0)
		return 0;
	end = off + CASTFS_MIN((uint64_t)len, p->size - off);
	for (i = castfs_plan_find(p, off); off < end; i++) {
		const struct castfs_extent *e = &p->extents[i];
		uint64_t stop = CASTFS_MIN(end, e->out_off + e->len);
		size_t n = (size_t)(stop - off);
		int rc = read_extent(&env, e, off - e->out_off, n, dst);

		if (rc)
			return rc;
		dst += n;
		off = stop;
	}
	return dst - (uint8_t *)buf;
}
