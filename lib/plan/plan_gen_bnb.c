/* SPDX-License-Identifier: MIT */
/*
 * The generators of the bitsandbytes extents: each reads the source blocks
 * (or rows) a range needs through the thread's scratch and quantises them.
 * The only tensor-wide state, the double-quantisation statistics, is
 * computed once per tensor on first need (q4_stats_get).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "plan/plan_internal.h"
#include "quant/quant.h"

/*
 * Source elements staged as float32 in the scratch:
 * [f32: cap * 4][raw: cap * src size][half: cap * 2][amax: cap / 16 * 4].
 */
struct q_stage {
	castfs_convert_fn to_half; /* int8: source -> F16, NULL if F16 */
	castfs_convert_fn to_f32; /* source (or F16) -> F32; NULL if F32 */
	size_t src_sz;
	bool raw16; /* BF16/F16 4-bit sources: kernels read st->raw as is */
	bool f16;
	size_t cap; /* elements per chunk */
	float *f32;
	uint8_t *raw;
	uint8_t *half;
	float *amax; /* cap / 16 block absmax (blocks of >= 64) */
};

static const struct castfs_qtensor *q_tensor(const struct castfs_read_env *env,
					     const struct castfs_extent *e)
{
	return &env->plan->qtensors[e->qt];
}

/*
 * Prepare the staging of @qt's elements, through float16 when @via_half
 * (LLM.int8 rounds to float16 first). Chunks hold a multiple of @align
 * elements. Returns 0, or -ENOTSUP / -ENOMEM (a scratch too small).
 */
static int q_stage_init(struct q_stage *st, const struct castfs_read_env *env,
			const struct castfs_qtensor *qt, bool via_half,
			size_t align)
{
	enum castfs_dtype src = (enum castfs_dtype)qt->src_dtype;
	enum castfs_dtype mid = via_half ? CASTFS_DTYPE_F16 : src;
	size_t per;

	st->src_sz = castfs_dtype_bits(src) / 8;
	st->raw16 = !via_half &&
		    (src == CASTFS_DTYPE_BF16 || src == CASTFS_DTYPE_F16);
	st->f16 = src == CASTFS_DTYPE_F16;
	st->to_half = NULL;
	if (via_half && src != CASTFS_DTYPE_F16) {
		st->to_half = castfs_convert_get(src, CASTFS_DTYPE_F16, 0);
		if (!st->to_half)
			return -ENOTSUP; /* unreachable: the plan checked it */
	}
	st->to_f32 = NULL;
	if (mid != CASTFS_DTYPE_F32) {
		st->to_f32 = castfs_convert_get(mid, CASTFS_DTYPE_F32, 0);
		if (!st->to_f32)
			return -ENOTSUP;
	}
	/* 4 (f32) + src + 2 (half) + 1 (absmax, 4 bytes per >= 16). */
	per = 4 + st->src_sz + 2 + 1;
	st->cap = env->s->len / per;
	st->cap -= st->cap % 64; /* keeps every region aligned */
	st->cap = st->cap / align * align;
	if (st->cap == 0)
		return -ENOMEM;
	st->f32 = (float *)(void *)env->s->buf;
	st->raw = env->s->buf + st->cap * 4;
	st->half = st->raw + st->cap * st->src_sz;
	st->amax = (float *)(void *)(st->half + st->cap * 2);
	return 0;
}

/*
 * Elements [@first, @first + @n) of @qt into st->f32 (@n <= st->cap), or
 * only into st->raw when st->raw16.
 */
/*
 * The BF16 elements of a dequantized source weight into @raw, as the bf16
 * view has them. The f32, half and amax regions are free while loading:
 * they hold the fp32 values, the codes and the scale rows.
 */
static int q_load_deq(const struct castfs_read_env *env,
		      const struct castfs_qtensor *qt, const struct q_stage *st,
		      uint64_t first, size_t n, uint8_t *raw)
{
	castfs_convert_fn to_bf16 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_BF16, 0);
	int rc;

	if (!to_bf16 || qt->src_dtype != CASTFS_DTYPE_BF16)
		return -ENOTSUP; /* unreachable: the plan made it so */
	/* half and amax are one region of cap * 2 + cap / 4 bytes */
	rc = castfs_deq_load(env->plan, env->src, qt, first, n, st->f32,
			     st->half, st->cap * 2 + st->cap / 4);
	if (!rc)
		to_bf16(raw, st->f32, n);
	return rc;
}

static int q_load(const struct castfs_read_env *env,
		  const struct castfs_qtensor *qt, const struct q_stage *st,
		  uint64_t first, size_t n)
{
	uint8_t *raw = st->to_half || st->to_f32 ? st->raw : (uint8_t *)st->f32;
	int rc = castfs_qtensor_deq(qt) ?
			 q_load_deq(env, qt, st, first, n, raw) :
			 castfs_reader_read(env->src, raw, n * st->src_sz,
					    qt->src_off + first * st->src_sz);

	if (rc)
		return rc;
	if (st->to_half) {
		st->to_half(st->half, raw, n);
		raw = st->half;
	}
	if (st->to_f32 && !st->raw16)
		st->to_f32(st->f32, raw, n);
	return 0;
}

/* The block absmax of blocks [@b, @b + @nb) into st->amax (@nb * bs <= cap). */
static int q4_load_absmax(const struct castfs_read_env *env,
			  const struct castfs_qtensor *qt,
			  const struct q_stage *st, uint64_t b, size_t nb)
{
	uint64_t first = b * qt->blocksize;
	size_t n = (size_t)CASTFS_MIN((uint64_t)nb * qt->blocksize,
				      qt->nelems - first);
	const struct castfs_quant_kernels *k = castfs_quant_kernels_get();
	int rc = q_load(env, qt, st, first, n);

	if (rc)
		return rc;
	if (st->raw16)
		k->absmax16(st->amax, st->raw, n, qt->blocksize, st->f16);
	else
		k->absmax(st->amax, st->f32, n, qt->blocksize);
	return 0;
}

static uint64_t q4_nblocks(const struct castfs_qtensor *qt)
{
	return qt->nelems / qt->blocksize + (qt->nelems % qt->blocksize != 0);
}

/*
 * The double-quantisation statistics of a tensor come from per nested
 * block (256 blocks) summaries: the block absmax's sum (in double, in
 * block order), smallest and largest. The offset is the groups' sums
 * added in group order over the block count, so a summary made by
 * whoever read the whole group, in any order, gives the same float
 * (docs/FORMATS.md, "Double quantisation"). fl32(a - offset) is monotonic
 * in a, so the extremes give the largest |a - offset| of the group.
 */
#define Q4_GROUP ((uint64_t)CASTFS_Q_NESTED_BLOCK)

/* The most groups Q4_CODES reads keep summaries of: 16 MiB, 17 G elements. */
#define Q4_GROUPS_MAX ((uint64_t)1 << 20)

/* The summaries Q4_CODES reads left; bit g of @done: group g is whole. */
struct castfs_q4_groups {
	uint64_t *done;
	double *sum;
	float *lo, *hi;
};

void castfs_q4_groups_free(struct castfs_q4_groups *g)
{
	if (!g)
		return;
	free(g->done);
	free(g->sum);
	free(g->lo);
	free(g->hi);
	free(g);
}

static struct castfs_q4_groups *q4_groups_new(uint64_t ng)
{
	struct castfs_q4_groups *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->done = calloc((size_t)(ng + 63) / 64, sizeof(uint64_t));
	g->sum = calloc((size_t)ng, sizeof(double));
	g->lo = calloc((size_t)ng, sizeof(float));
	g->hi = calloc((size_t)ng, sizeof(float));
	if (!g->done || !g->sum || !g->lo || !g->hi) {
		castfs_q4_groups_free(g);
		return NULL;
	}
	return g;
}

static bool q4_group_done(const struct castfs_q4_groups *g, uint64_t i)
{
	return g && (g->done[i / 64] >> (i % 64) & 1);
}

static uint64_t q4_ngroups(const struct castfs_qtensor *qt)
{
	return (q4_nblocks(qt) + Q4_GROUP - 1) / Q4_GROUP;
}

/* A group being summarised, block by block in block order. */
struct q4_run {
	uint64_t g;
	uint64_t next; /* the block that continues it; UINT64_MAX: none */
	double sum;
	float lo, hi;
};

typedef void (*q4_run_done_fn)(void *arg, const struct q4_run *r);

/*
 * Fold the absmax @a of blocks [@b, @b + @k) of a tensor of @nb blocks
 * into @r; each group that ends here, all of its blocks folded in order,
 * goes to @done. Block absmax are finite and >= +0, so plain compares
 * give what fminf/fmaxf give; those were library calls here, about a
 * third of the statistics pass's instructions (callgrind).
 */
static void q4_run_fold(struct q4_run *r, uint64_t nb, uint64_t b,
			const float *a, size_t k, q4_run_done_fn done,
			void *arg)
{
	for (size_t i = 0, m; i < k; i += m, b += m) {
		uint64_t in = b % Q4_GROUP;
		double s;
		float lo, hi;

		m = (size_t)CASTFS_MIN((uint64_t)(k - i), Q4_GROUP - in);
		if (in == 0)
			*r = (struct q4_run){ .g = b / Q4_GROUP,
					      .lo = a[i],
					      .hi = a[i] };
		else if (r->next != b)
			continue; /* its first blocks were not ours */
		s = r->sum;
		lo = r->lo;
		hi = r->hi;
		for (size_t j = i; j < i + m; j++) {
			s += a[j];
			lo = a[j] < lo ? a[j] : lo;
			hi = a[j] > hi ? a[j] : hi;
		}
		*r = (struct q4_run){
			.g = r->g, .next = b + m, .sum = s, .lo = lo, .hi = hi
		};
		if (in + m == Q4_GROUP || b + m == nb) {
			done(arg, r);
			r->next = UINT64_MAX;
		}
	}
}

/* The statistics pass's view of a finished group. */
struct q4_total {
	float *lo, *hi;
	double sum;
};

static void q4_total_add(void *arg, const struct q4_run *r)
{
	struct q4_total *t = arg;

	t->lo[r->g] = r->lo;
	t->hi[r->g] = r->hi;
	t->sum += r->sum;
}

/* The first block past the run of groups from @g that @gs lacks. */
static uint64_t q4_missing_end(const struct castfs_q4_groups *gs, uint64_t g,
			       uint64_t ng, uint64_t nb)
{
	while (g < ng && !q4_group_done(gs, g))
		g++;
	return CASTFS_MIN(g * Q4_GROUP, nb);
}

/*
 * One pass over the groups of @qt that @gs (may be NULL) does not hold,
 * summing every group in group order into @t.
 */
static int q4_stats_pass(const struct castfs_read_env *env,
			 const struct castfs_qtensor *qt,
			 const struct castfs_q4_groups *gs, struct q4_total *t)
{
	uint64_t nb = q4_nblocks(qt), ng = q4_ngroups(qt), b = 0, end = 0;
	struct q4_run r = { .next = UINT64_MAX };
	struct q_stage st;
	int rc = q_stage_init(&st, env, qt, false, qt->blocksize);

	while (!rc && b < nb) {
		uint64_t g = b / Q4_GROUP;
		size_t k;

		if (q4_group_done(gs, g)) { /* lo, hi already in t */
			t->sum += gs->sum[g];
			b = CASTFS_MIN((g + 1) * Q4_GROUP, nb);
			continue;
		}
		if (b >= end)
			end = q4_missing_end(gs, g, ng, nb);
		k = (size_t)CASTFS_MIN(end - b, st.cap / qt->blocksize);
		/* A 2 TiB tensor takes minutes: its reader may be gone, or
		 * the daemon stopping (docs/RELIABILITY.md). */
		if (castfs_scratch_cancelled(env->s))
			rc = -EINTR;
		else
			rc = q4_load_absmax(env, qt, &st, b, k);
		if (!rc)
			q4_run_fold(&r, nb, b, st.amax, k, q4_total_add, t);
		b += k;
	}
	return rc;
}

/* Compute @qs of @qt; the caller holds qs->lock. */
static int q4_stats_compute(const struct castfs_read_env *env,
			    const struct castfs_qtensor *qt,
			    struct castfs_qstats *qs)
{
	size_t ng = (size_t)q4_ngroups(qt);
	struct castfs_q4_groups *gs = qs->groups;
	struct q4_total t = { 0 };
	float offset = 0.0f;
	int rc;

	if (gs) {
		t.lo = gs->lo;
		t.hi = gs->hi;
	} else {
		t.lo = calloc(ng, sizeof(float));
		t.hi = calloc(ng, sizeof(float));
	}
	rc = t.lo && t.hi ? q4_stats_pass(env, qt, gs, &t) : -ENOMEM;
	if (!rc) {
		offset = (float)(t.sum / (double)q4_nblocks(qt));
		for (size_t g = 0; g < ng; g++)
			t.hi[g] = fmaxf(fabsf(t.hi[g] - offset),
					fabsf(t.lo[g] - offset));
	}
	if (!gs) {
		free(t.lo);
		if (rc)
			free(t.hi);
	}
	if (rc)
		return rc; /* the summaries stay for the next try */
	if (gs) /* the nested absmax is made in hi: keep it, drop the rest */
		gs->hi = NULL;
	castfs_q4_groups_free(gs);
	qs->groups = NULL;
	qs->offset = offset;
	qs->nnested = ng;
	qs->nested_absmax = t.hi;
	return 0;
}

/*
 * The statistics of the extent's tensor, computed on first need (one pass
 * over the source, under the tensor's lock). Uses the scratch: call before
 * staging anything in it. Returns them, or NULL with *@rc set.
 */
static const struct castfs_qstats *
q4_stats_get(const struct castfs_read_env *env, const struct castfs_extent *e,
	     int *rc)
{
	struct castfs_qstats *qs = &env->plan->qstats[e->qt];

	*rc = 0;
	if (__atomic_load_n(&qs->ready, __ATOMIC_ACQUIRE))
		return qs;
	pthread_mutex_lock(&qs->lock);
	if (!qs->ready) {
		*rc = q4_stats_compute(env, q_tensor(env, e), qs);
		if (!*rc)
			__atomic_store_n(&qs->ready, true, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&qs->lock);
	return *rc ? NULL : qs;
}

/* The Q4_QABSMAX bytes of blocks [@b, @b + @k) from their absmax @amax. */
static void q4_qabsmax_codes(const struct castfs_qstats *qs, uint64_t b,
			     const float *amax, size_t k, uint8_t *dst)
{
	const struct castfs_quant_kernels *kq = castfs_quant_kernels_get();

	/* One kernel call per nested block (one scale each). */
	for (size_t i = 0, m; i < k; i += m, dst += m) {
		uint64_t g = (b + i) / CASTFS_Q_NESTED_BLOCK;
		uint64_t g_end = (g + 1) * CASTFS_Q_NESTED_BLOCK;

		m = (size_t)CASTFS_MIN((uint64_t)(k - i), g_end - (b + i));
		kq->q8(dst, amax + i, m, qs->offset,
		       castfs_q_scale(qs->nested_absmax[g]));
	}
}

/*
 * A Q4_CODES read computed the absmax @amax of blocks [@b, @b + @k):
 * keep their Q4_QABSMAX bytes (made in @tmp, @k bytes) for the read of
 * the tensor's .absmax that follows (plan_qcache.c).
 */
static void qc_save(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t b,
		    const float *amax, size_t k, uint8_t *tmp)
{
	struct castfs_qstats *qs = &env->plan->qstats[e->qt];

	q4_qabsmax_codes(qs, b, amax, k, tmp);
	castfs_qcache_save(env->plan, e->qt, q4_nblocks(q_tensor(env, e)), b,
			   tmp, k);
}

/* Q4_QABSMAX bytes [@first, @first + @count) from the cache, if all there. */
static bool qc_take(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t first,
		    uint64_t count, uint8_t *dst)
{
	return castfs_qcache_take(env->plan, e->qt,
				  q4_nblocks(q_tensor(env, e)), first, count,
				  dst);
}

/* Whether Q4_CODES reads of @e should keep Q4_QABSMAX bytes. */
static bool qc_wanted(const struct castfs_read_env *env,
		      const struct castfs_extent *e, const struct q_stage *st)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);

	return st->raw16 && qt->nested &&
	       __atomic_load_n(&env->plan->qstats[e->qt].ready,
			       __ATOMIC_ACQUIRE) &&
	       castfs_qcache_wants(env->plan, e->qt, q4_nblocks(qt));
}

/*
 * Hand elements [@elem, @end) of @qt to @fn where they lie in a mapping of
 * the source (no pread copy): only stored BF16/F16, which the kernels read
 * as they are. -ENOTSUP, nothing called, when not (read them then).
 */
static int q_map(const struct castfs_read_env *env,
		 const struct castfs_qtensor *qt, const struct q_stage *st,
		 uint64_t elem, uint64_t end, castfs_visit_fn fn, void *arg)
{
	if (!st->raw16 || castfs_qtensor_deq(qt))
		return -ENOTSUP;
	return castfs_reader_map(env->src, qt->src_off + elem * st->src_sz,
				 (size_t)(end - elem) * st->src_sz, fn, arg);
}

/* The 4-bit codes of elements [elem, end) of a tensor, chunk by chunk. */
struct q4_codes {
	const struct castfs_read_env *env;
	const struct castfs_extent *e;
	const struct castfs_qtensor *qt;
	struct q_stage *st;
	bool keep; /* the .absmax bytes go to the qcache on the way */
	bool collect; /* summaries of whole groups go to the qstats */
	struct q4_run run;
	uint64_t elem, end;
	uint8_t *dst;
};

/*
 * Whether Q4_CODES reads of @e should summarise the groups they read
 * whole: until the statistics are made, for tensors whose summaries stay
 * small (bigger ones are left to the statistics pass).
 */
static bool q4_collect_wanted(const struct castfs_read_env *env,
			      const struct castfs_extent *e,
			      const struct q_stage *st)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);

	return st->raw16 && qt->nested && q4_ngroups(qt) <= Q4_GROUPS_MAX &&
	       !__atomic_load_n(&env->plan->qstats[e->qt].ready,
				__ATOMIC_ACQUIRE);
}

/*
 * Hand the summary of a whole group a Q4_CODES read made to the tensor's
 * statistics. Never waits: a statistics pass holding the lock reads the
 * group itself.
 */
static void q4_publish(void *arg, const struct q4_run *r)
{
	struct q4_codes *c = arg;
	struct castfs_qstats *qs = &c->env->plan->qstats[c->e->qt];
	struct castfs_q4_groups *gs;

	if (pthread_mutex_trylock(&qs->lock))
		return;
	if (!qs->ready && !qs->groups)
		qs->groups = q4_groups_new(q4_ngroups(c->qt));
	gs = qs->ready ? NULL : qs->groups;
	if (gs) {
		gs->sum[r->g] = r->sum;
		gs->lo[r->g] = r->lo;
		gs->hi[r->g] = r->hi;
		gs->done[r->g / 64] |= (uint64_t)1 << (r->g % 64);
	}
	pthread_mutex_unlock(&qs->lock);
}

/* One chunk of @n elements whose source is at @raw (BF16/F16 as stored,
 * or st->f32) into c->dst. */
static void q4_codes_chunk(struct q4_codes *c, const uint8_t *raw, size_t n)
{
	const struct castfs_quant_kernels *k = castfs_quant_kernels_get();
	const struct castfs_qtensor *qt = c->qt;
	size_t nb = (n + qt->blocksize - 1) / qt->blocksize;

	if (c->st->raw16)
		k->q4_16(c->dst, c->keep || c->collect ? c->st->amax : NULL,
			 raw, n, qt->blocksize, (enum castfs_qtype)qt->qtype,
			 c->st->f16);
	if (c->collect)
		q4_run_fold(&c->run, q4_nblocks(qt), c->elem / qt->blocksize,
			    c->st->amax, nb, q4_publish, c);
	if (c->keep) /* st.half is free in 4-bit reads */
		qc_save(c->env, c->e, c->elem / qt->blocksize, c->st->amax, nb,
			c->st->half);
	if (!c->st->raw16)
		k->q4(c->dst, c->st->f32, n, qt->blocksize,
		      (enum castfs_qtype)qt->qtype);
	c->dst += (n + 1) / 2;
	c->elem += n;
}

/*
 * The whole range from a mapping of the source (castfs_reader.map): the
 * kernels read the stored BF16/F16 where it lies, no pread copy. Runs
 * under the reader's fault guard: nothing here may hold a lock while it
 * touches the piece (qc_save's lock is taken between touches).
 */
static int q4_codes_mapped(void *arg, const struct castfs_piece *p)
{
	struct q4_codes *c = arg;
	const uint8_t *raw = p->bytes;

	while (c->elem < c->end) {
		size_t n = (size_t)CASTFS_MIN(c->end - c->elem,
					      (uint64_t)c->st->cap);

		q4_codes_chunk(c, raw, n);
		raw += n * c->st->src_sz;
	}
	return 0;
}

/* Q4_CODES: a unit is one block's blocksize / 2 bytes. */
int castfs_gen_q4_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	struct q_stage st;
	struct q4_codes c = { .env = env,
			      .e = e,
			      .qt = qt,
			      .st = &st,
			      .elem = first * qt->blocksize,
			      .dst = dst };
	int rc = q_stage_init(&st, env, qt, false, qt->blocksize);

	if (rc)
		return rc;
	c.end = CASTFS_MIN(qt->nelems, (first + count) * qt->blocksize);
	c.keep = qc_wanted(env, e, &st);
	c.collect = !c.keep && q4_collect_wanted(env, e, &st);
	c.run.next = UINT64_MAX;
	rc = q_map(env, qt, &st, c.elem, c.end, q4_codes_mapped, &c);
	if (rc != -ENOTSUP)
		return rc;
	while (c.elem < c.end) {
		size_t n = (size_t)CASTFS_MIN(c.end - c.elem, (uint64_t)st.cap);

		rc = q_load(env, qt, &st, c.elem, n);
		if (rc)
			return rc;
		q4_codes_chunk(&c, st.raw, n);
	}
	return 0;
}

/* Q4_ABSMAX: a unit is one block's float32 absmax. */
int castfs_gen_q4_absmax(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	struct q_stage st;
	int rc = q_stage_init(&st, env, qt, false, qt->blocksize);

	while (!rc && count) {
		size_t k = (size_t)CASTFS_MIN(count, st.cap / qt->blocksize);

		rc = q4_load_absmax(env, qt, &st, first, k);
		for (size_t i = 0; !rc && i < k; i++, dst += 4)
			castfs_store_le32(dst, castfs_f32_bits(st.amax[i]));
		first += k;
		count -= k;
	}
	return rc;
}

/* The 8-bit absmax codes of blocks [first, first + count), chunk by chunk. */
struct q4_qabs {
	const struct castfs_read_env *env;
	const struct castfs_extent *e;
	const struct castfs_qtensor *qt;
	const struct castfs_qstats *qs;
	struct q_stage *st;
	uint64_t first, count;
	uint8_t *dst;
};

/*
 * Each chunk from the cache when all there: a reader's read-ahead can ask
 * for a tensor's .absmax while the last codes request is still running on
 * another thread, and then only that request's blocks are missing, not
 * the whole tensor's. Else from @raw, the 16-bit source of block @first
 * where it lies, or (NULL) read.
 */
static int q4_qabs_run(struct q4_qabs *c, const uint8_t *raw)
{
	const struct castfs_quant_kernels *kq = castfs_quant_kernels_get();
	const struct castfs_qtensor *qt = c->qt;
	int rc = 0;

	while (!rc && c->count) {
		size_t k = (size_t)CASTFS_MIN(c->count,
					      c->st->cap / qt->blocksize);
		uint64_t elem = c->first * qt->blocksize;
		size_t n = (size_t)CASTFS_MIN((uint64_t)k * qt->blocksize,
					      qt->nelems - elem);
		bool hit = qc_take(c->env, c->e, c->first, k, c->dst);

		if (!hit && raw)
			kq->absmax16(c->st->amax, raw, n, qt->blocksize,
				     c->st->f16);
		else if (!hit)
			rc = q4_load_absmax(c->env, qt, c->st, c->first, k);
		if (!hit && !rc)
			q4_qabsmax_codes(c->qs, c->first, c->st->amax, k,
					 c->dst);
		if (raw)
			raw += n * c->st->src_sz;
		c->dst += k;
		c->first += k;
		c->count -= k;
	}
	return rc;
}

/* The whole range from a mapping of the source: no pread copy. */
static int q4_qabs_mapped(void *arg, const struct castfs_piece *p)
{
	return q4_qabs_run(arg, p->bytes);
}

/* Q4_QABSMAX: a unit is one block's 8-bit code of (absmax - offset). */
int castfs_gen_q4_qabsmax(const struct castfs_read_env *env,
			  const struct castfs_extent *e, uint64_t first,
			  uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	struct q_stage st;
	struct q4_qabs c = { .env = env,
			     .e = e,
			     .qt = qt,
			     .st = &st,
			     .first = first,
			     .count = count,
			     .dst = dst };
	int rc;

	c.qs = q4_stats_get(env, e, &rc);
	if (!rc && qc_take(env, e, first, count, dst))
		return 0;
	if (!rc)
		rc = q_stage_init(&st, env, qt, false, qt->blocksize);
	if (rc)
		return rc;
	rc = q_map(env, qt, &st, first * qt->blocksize,
		   CASTFS_MIN(qt->nelems, (first + count) * qt->blocksize),
		   q4_qabs_mapped, &c);
	return rc != -ENOTSUP ? rc : q4_qabs_run(&c, NULL);
}

/* Q4_NESTED_ABSMAX: a unit is one nested block's float32 absmax. */
int castfs_gen_q4_nested_absmax(const struct castfs_read_env *env,
				const struct castfs_extent *e, uint64_t first,
				uint64_t count, uint8_t *dst)
{
	const struct castfs_qstats *qs;
	int rc;

	qs = q4_stats_get(env, e, &rc);
	for (uint64_t i = 0; !rc && i < count; i++, dst += 4) {
		float a = qs->nested_absmax[first + i];

		castfs_store_le32(dst, castfs_f32_bits(a));
	}
	return rc;
}

/* Q4_STATE: the plan's JSON with nested_offset written into its field. */
int castfs_gen_q4_state(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	uint64_t lo = CASTFS_MAX(first, (uint64_t)qt->state_off);
	uint64_t hi = CASTFS_MIN(first + count,
				 (uint64_t)qt->state_off + qt->state_width);
	char field[CASTFS_Q4_OFFSET_WIDTH];
	const struct castfs_qstats *qs;
	int rc;

	memcpy(dst, e->mem + first, (size_t)count);
	if (lo >= hi)
		return 0;
	qs = q4_stats_get(env, e, &rc);
	if (rc)
		return rc;
	castfs_q4_state_offset(field, qs->offset);
	memcpy(dst + (lo - first), field + (lo - qt->state_off),
	       (size_t)(hi - lo));
	return 0;
}

/*
 * castfs_q_absmax of @n (> 0) staged values by the ISA's absmax kernel
 * (one block of @n): the same float, without the scalar loop that was
 * ~70 % of an int8 read's instructions (callgrind).
 */
static float i8_absmax(const float *x, size_t n)
{
	float m = 0.0f;

	castfs_quant_kernels_get()->absmax(&m, x, n, n);
	return m;
}

/* The absmax of row @r (staged in chunks when it exceeds one). */
static int i8_row_absmax(const struct castfs_read_env *env,
			 const struct castfs_qtensor *qt,
			 const struct q_stage *st, uint64_t r, float *absmax)
{
	uint64_t c = 0;
	float m = 0.0f;

	while (c < qt->cols) {
		size_t n = (size_t)CASTFS_MIN(qt->cols - c, (uint64_t)st->cap);
		int rc = q_load(env, qt, st, r * qt->cols + c, n);

		if (rc)
			return rc;
		m = fmaxf(m, i8_absmax(st->f32, n));
		c += n;
	}
	*absmax = m;
	return 0;
}

/*
 * Codes of elements [@first, @first + @n) of row @r (@first within the
 * row) into @dst. Rows that fit in a chunk are read once.
 */
static int i8_row_codes(const struct castfs_read_env *env,
			const struct castfs_qtensor *qt,
			const struct q_stage *st, uint64_t r, uint64_t first,
			uint64_t n, int8_t *dst)
{
	const struct castfs_quant_kernels *k = castfs_quant_kernels_get();
	float absmax, scale;
	int rc;

	if (qt->cols <= st->cap) {
		rc = q_load(env, qt, st, r * qt->cols, (size_t)qt->cols);
		if (rc)
			return rc;
		scale = castfs_i8_scale(i8_absmax(st->f32, qt->cols));
		k->i8(dst, st->f32 + first, (size_t)n, scale);
		return 0;
	}
	rc = i8_row_absmax(env, qt, st, r, &absmax);
	scale = castfs_i8_scale(absmax);
	while (!rc && n) {
		size_t m = (size_t)CASTFS_MIN(n, (uint64_t)st->cap);

		rc = q_load(env, qt, st, r * qt->cols + first, m);
		if (!rc)
			k->i8(dst, st->f32, m, scale);
		dst += m;
		first += m;
		n -= m;
	}
	return rc;
}

/*
 * Whole rows [@r, @r + @nr) (@nr * cols <= st->cap), read at once: their
 * codes into @codes when not NULL, their absmax into @scb when not NULL.
 */
static int i8_whole_rows(const struct castfs_read_env *env,
			 const struct castfs_qtensor *qt,
			 const struct q_stage *st, uint64_t r, size_t nr,
			 int8_t *codes, uint8_t *scb)
{
	const struct castfs_quant_kernels *k = castfs_quant_kernels_get();
	size_t cols = (size_t)qt->cols;
	int rc = q_load(env, qt, st, r * qt->cols, nr * cols);

	for (size_t i = 0; !rc && i < nr; i++) {
		const float *x = st->f32 + i * cols;
		float absmax = i8_absmax(x, cols);

		if (codes)
			k->i8(codes + i * cols, x, cols,
			      castfs_i8_scale(absmax));
		if (scb)
			castfs_store_le32(scb + i * 4, castfs_f32_bits(absmax));
	}
	return rc;
}

/* I8_CODES: unit 1 (one element); each row's absmax is recomputed. */
int castfs_gen_i8_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	struct q_stage st;
	int rc = q_stage_init(&st, env, qt, true, 1);

	while (!rc && count) {
		uint64_t r = first / qt->cols, c = first % qt->cols;
		uint64_t n = CASTFS_MIN(count, qt->cols - c);
		uint64_t nr = CASTFS_MIN(count / qt->cols, st.cap / qt->cols);

		if (c == 0 && nr > 1) {
			n = nr * qt->cols;
			rc = i8_whole_rows(env, qt, &st, r, (size_t)nr,
					   (int8_t *)dst, NULL);
		} else {
			rc = i8_row_codes(env, qt, &st, r, c, n, (int8_t *)dst);
		}
		dst += n;
		first += n;
		count -= n;
	}
	return rc;
}

/* I8_SCB: a unit is one row's float32 absmax (of its float16 values). */
int castfs_gen_i8_scb(const struct castfs_read_env *env,
		      const struct castfs_extent *e, uint64_t first,
		      uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *qt = q_tensor(env, e);
	uint64_t per = 0;
	struct q_stage st;
	float absmax;
	int rc = q_stage_init(&st, env, qt, true, 1);

	if (!rc)
		per = st.cap / qt->cols; /* 0: rows longer than a chunk */
	while (!rc && count) {
		uint64_t nr = CASTFS_MIN(count, CASTFS_MAX(per, 1));

		if (per) {
			rc = i8_whole_rows(env, qt, &st, first, (size_t)nr,
					   NULL, dst);
		} else {
			rc = i8_row_absmax(env, qt, &st, first, &absmax);
			if (!rc)
				castfs_store_le32(dst, castfs_f32_bits(absmax));
		}
		dst += nr * 4;
		first += nr;
		count -= nr;
	}
	return rc;
}
