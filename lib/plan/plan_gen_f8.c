/* SPDX-License-Identifier: MIT */
/*
 * The generators of the compressed-tensors scaled-fp8 extents: a range of
 * codes or scales is served from tiles of whole scale blocks (rows for a
 * channel scale, 128 x 128 blocks) read through the thread's scratch.
 * Each block's scale is computed from its elements where it is needed;
 * the codes' reads keep the scales they computed for the weight_scale
 * read that follows them in the late run (f8_keep_scales, a best-effort
 * cache: what it lacks is computed again, the same bytes). The one
 * tensor-wide statistic, NVFP4's global scale, is computed once per
 * tensor on first need and kept with the plan (fp4_gscale).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"
#include "quant/quant_ct.h"
#include "quant/quant_round.h"

/* Source elements staged in the scratch: [f32: cap * 4][raw: cap * size]. */
struct f8_stage {
	castfs_convert_fn to_f32; /* NULL for F32 sources */
	enum castfs_dtype dt;
	size_t src_sz;
	uint64_t cap; /* elements per tile */
	float *f32;
	uint8_t *raw;
	float gs; /* NVFP4: the tensor's global scale */
};

/* The most scale blocks one tile holds. */
#define F8_TILE_MAX 1024u

/*
 * Block rows [br, br + nbr) x block columns [bc, bc + nbc): elements rows
 * [r0, r1) x columns [c0, c1), staged row-major, and each block's scale.
 */
struct f8_tile {
	uint64_t br, nbr, bc, nbc;
	uint64_t r0, r1, c0, c1;
	bool raw16; /* elements left as 16-bit at raw (f8_codes16()) */
	const uint8_t *raw; /* st->raw, or a mapping of the source */
	float scale[F8_TILE_MAX];
};

static uint64_t f8_ceil(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

static uint64_t f8_nbcols(const struct castfs_qtensor *q)
{
	return f8_ceil(q->cols, q->blk_cols);
}

uint64_t castfs_f8_scale_elem(const struct castfs_qtensor *q, uint64_t i)
{
	uint64_t nbc = f8_nbcols(q);

	return i / nbc * q->blk_rows * q->cols + i % nbc * q->blk_cols;
}

/*
 * The absmax of a dequantized source weight @q (deq_op set: its deq_op on
 * record deq_qt, q->nelems elements): of its values rounded to BF16, as
 * the bf16 view has them.
 */
static int deq_absmax(const struct castfs_read_env *env,
		      const struct castfs_qtensor *q, float *out)
{
	uint64_t cap = env->s->len / 6; /* fp32 values, then 2 n of work */
	float *f32 = (float *)(void *)env->s->buf;
	float m = 0.0f;
	int rc = 0;

	cap -= cap % 64;
	for (uint64_t i = 0; !rc && i < q->nelems; i += cap) {
		size_t k = (size_t)CASTFS_MIN(cap, q->nelems - i);

		if (castfs_scratch_cancelled(env->s))
			return -EINTR; /* see fp4_absmax() */
		rc = castfs_deq_load_bf16(env->plan, env->src, q, i, k, f32,
					  env->s->buf + cap * 4,
					  (size_t)cap * 2);
		if (!rc)
			m = castfs_ct_absmax_merge(m, castfs_ct_absmax(f32, k));
	}
	*out = m;
	return rc;
}

/* The absmax of @n elements of @q's dtype at @off, chunk by chunk. */
static int fp4_absmax(const struct castfs_read_env *env,
		      const struct castfs_qtensor *q, uint64_t off, uint64_t n,
		      float *out)
{
	enum castfs_dtype dt = (enum castfs_dtype)q->src_dtype;
	size_t sz = castfs_dtype_bits(dt) / 8;
	uint64_t cap = env->s->len / (4 + sz);
	float *f32 = (float *)(void *)env->s->buf;
	uint8_t *raw = dt == CASTFS_DTYPE_F32 ? env->s->buf :
						env->s->buf + cap * 4;
	castfs_convert_fn to_f32 =
		dt == CASTFS_DTYPE_F32 ?
			NULL :
			castfs_convert_get(dt, CASTFS_DTYPE_F32, 0);
	float m = 0.0f;
	int rc = 0;

	cap -= cap % 16;
	for (uint64_t i = 0; !rc && i < n; i += cap) {
		size_t k = (size_t)CASTFS_MIN(cap, n - i);

		/* A 2 TiB tensor takes minutes: the daemon may be stopping
		 * or the reader gone (docs/RELIABILITY.md); nothing is kept,
		 * the next read starts the pass again. */
		if (castfs_scratch_cancelled(env->s))
			return -EINTR;
		rc = castfs_reader_read(env->src, raw, k * sz, off + i * sz);
		if (rc)
			break;
		/* BF16/F16 stay as they are (castfs_ct_absmax16). */
		if (dt == CASTFS_DTYPE_BF16 || dt == CASTFS_DTYPE_F16) {
			m = castfs_ct_absmax_merge(
				m, castfs_ct_absmax16(raw, k,
						      dt == CASTFS_DTYPE_F16));
			continue;
		}
		if (to_f32)
			to_f32(f32, raw, k);
		m = castfs_ct_absmax_merge(m, castfs_ct_absmax(f32, k));
	}
	*out = m;
	return rc;
}

/*
 * The absmax of member @i of @q's fused group when it is a quantized
 * source weight (q->fuse_op[i]): its values dequantized and rounded to
 * BF16, read as a deq tensor of that dequantizer record would be.
 */
static int fuse_deq_absmax(const struct castfs_read_env *env,
			   const struct castfs_qtensor *q, uint8_t i,
			   float *out)
{
	struct castfs_qtensor m = *q;

	m.deq_op = q->fuse_op[i];
	m.deq_qt = q->fuse_qt[i];
	m.nelems = q->fuse_n[i];
	return deq_absmax(env, &m, out);
}

/*
 * The tensor-wide scale of tensor @idx (NVFP4's global scale, ComfyUI's
 * per-tensor scale): one pass over it and its fused siblings on first
 * need, under the tensor's lock (sizes never wait for it). Uses the
 * scratch: call before staging anything in it.
 */
static int fp4_gscale(const struct castfs_read_env *env, uint32_t idx,
		      float *gs)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[idx];
	struct castfs_qstats *qs = &env->plan->qstats[idx];
	int rc = 0;

	if (!__atomic_load_n(&qs->ready, __ATOMIC_ACQUIRE)) {
		float m = 0.0f;

		pthread_mutex_lock(&qs->lock);
		for (uint8_t i = 0; !qs->ready && !rc && i < q->nfuse; i++) {
			float a = 0.0f;

			rc = q->fuse_op[i] ? fuse_deq_absmax(env, q, i, &a) :
					     fp4_absmax(env, q, q->fuse_off[i],
							q->fuse_n[i], &a);
			m = castfs_ct_absmax_merge(m, a);
		}
		if (!qs->ready && !rc) {
			enum castfs_dtype dt = (enum castfs_dtype)q->src_dtype;

			qs->gscale = q->qtype == CASTFS_Q_COMFY_F8 ?
					     castfs_comfy_f8_scale(m, dt) :
					     castfs_ct_nvfp4_gscale(m, dt);
			__atomic_store_n(&qs->ready, true, __ATOMIC_RELEASE);
		}
		pthread_mutex_unlock(&qs->lock);
	}
	*gs = qs->gscale;
	return rc;
}

static int f8_stage_init(struct f8_stage *st, const struct castfs_read_env *env,
			 uint32_t idx)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[idx];
	int rc;

	st->gs = 1.0f;
	if (q->qtype == CASTFS_Q_NVFP4 || q->qtype == CASTFS_Q_COMFY_F8) {
		rc = fp4_gscale(env, idx, &st->gs);
		if (rc)
			return rc;
	}
	st->dt = (enum castfs_dtype)q->src_dtype;
	st->src_sz = castfs_dtype_bits(st->dt) / 8;
	st->to_f32 = NULL;
	if (st->dt != CASTFS_DTYPE_F32) {
		st->to_f32 = castfs_convert_get(st->dt, CASTFS_DTYPE_F32, 0);
		if (!st->to_f32)
			return -ENOTSUP; /* unreachable: the plan checked it */
	}
	st->cap = env->s->len / (4 + st->src_sz);
	st->cap -= st->cap % 16; /* keeps the raw region aligned */
	st->f32 = (float *)(void *)env->s->buf;
	st->raw = env->s->buf + st->cap * 4;
	/* The view converts no tensor whose block exceeds a tile. */
	return q->blk_rows * q->blk_cols <= st->cap ? 0 : -ENOMEM;
}

/*
 * Elements [@k, @k + @n) of @q (@n <= st->cap) as float32 into @f: read
 * and widened, or, for a dequantized source weight (deq_op set), its values
 * rounded to BF16 as the bf16 view has them (the raw region holds the
 * codes and the scale rows meanwhile).
 */
static int f8_load(const struct castfs_read_env *env,
		   const struct castfs_qtensor *q, const struct f8_stage *st,
		   uint64_t k, size_t n, float *f)
{
	uint8_t *raw = st->to_f32 ? st->raw : (uint8_t *)f;
	size_t half = (size_t)(st->cap * st->src_sz / 2);
	int rc;

	if (castfs_qtensor_deq(q)) {
		rc = castfs_deq_load(env->plan, env->src, q, k, n, f, st->raw,
				     2 * half);
		if (!rc) {
			castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_BF16,
					   0)(st->raw, f, n);
			st->to_f32(f, st->raw, n);
		}
		return rc;
	}
	rc = castfs_reader_read(env->src, raw, n * st->src_sz,
				q->src_off + k * st->src_sz);
	if (!rc && st->to_f32)
		st->to_f32(f, raw, n);
	return rc;
}

/*
 * The tile at block (@br, @bc): @nbr block rows of full width when @nbr > 1
 * and they fit, else one block row of up to @nbc blocks from @bc.
 */
static void f8_tile_pick(const struct castfs_qtensor *q, uint64_t cap,
			 uint64_t br, uint64_t nbr, uint64_t bc, uint64_t nbc,
			 struct f8_tile *t)
{
	uint64_t fit = cap / (q->blk_rows * q->blk_cols);
	uint64_t all = f8_nbcols(q);

	t->br = br;
	t->bc = bc;
	t->nbr = 1;
	t->nbc = CASTFS_MIN(CASTFS_MIN(nbc, fit), (uint64_t)F8_TILE_MAX);
	if (nbr > 1 && bc == 0 && fit >= all && F8_TILE_MAX >= all) {
		t->nbc = all;
		t->nbr = CASTFS_MIN(nbr, CASTFS_MIN(fit, F8_TILE_MAX) / all);
	}
	t->r0 = br * q->blk_rows;
	t->r1 = CASTFS_MIN(q->rows, (br + t->nbr) * q->blk_rows);
	t->c0 = bc * q->blk_cols;
	t->c1 = CASTFS_MIN(q->cols, (bc + t->nbc) * q->blk_cols);
}

/* Read the tile's elements as float32: one read when it spans whole rows. */
static int f8_tile_read(const struct castfs_read_env *env,
			const struct castfs_qtensor *q,
			const struct f8_stage *st, const struct f8_tile *t)
{
	uint64_t w = t->c1 - t->c0, nr = t->r1 - t->r0;
	int rc = 0;

	if (w == q->cols)
		return f8_load(env, q, st, t->r0 * w, (size_t)(nr * w),
			       st->f32);
	for (uint64_t i = 0; !rc && i < nr; i++)
		rc = f8_load(env, q, st, (t->r0 + i) * q->cols + t->c0,
			     (size_t)w, st->f32 + i * w);
	return rc;
}

/*
 * Whether a tile whose scales alone are needed may stay in the source's
 * 16-bit bits (castfs_ct_absmax16): a BF16/F16 weight read as it is.
 */
static bool f8_raw16(const struct castfs_qtensor *q, const struct f8_stage *st)
{
	return !castfs_qtensor_deq(q) && st->src_sz == 2 && st->to_f32;
}

/*
 * Whether the codes of a tile may come from its 16-bit bits too
 * (castfs_ct_f8_codes16(): widened in registers): the FP8 views'.
 */
static bool f8_codes16(const struct castfs_qtensor *q,
		       const struct f8_stage *st)
{
	return f8_raw16(q, st) && q->qtype != CASTFS_Q_NVFP4 &&
	       q->qtype != CASTFS_Q_W4;
}

/* Read the tile's elements unconverted into st->raw, row-major as
 * f8_tile_read() stages them (f8_raw16() tensors only). */
static int f8_tile_read16(const struct castfs_read_env *env,
			  const struct castfs_qtensor *q,
			  const struct f8_stage *st, const struct f8_tile *t)
{
	uint64_t w = t->c1 - t->c0, nr = t->r1 - t->r0;
	int rc = 0;

	if (w == q->cols)
		return castfs_reader_read(env->src, st->raw, nr * w * 2,
					  q->src_off + t->r0 * w * 2);
	for (uint64_t i = 0; !rc && i < nr; i++)
		rc = castfs_reader_read(
			env->src, st->raw + i * w * 2, w * 2,
			q->src_off + ((t->r0 + i) * q->cols + t->c0) * 2);
	return rc;
}

/* The absmax of @n staged elements from element @k of tile @t. */
static float f8_stage_absmax(const struct f8_stage *st, const struct f8_tile *t,
			     uint64_t k, size_t n)
{
	if (t->raw16)
		return castfs_ct_absmax16(t->raw + k * 2, n,
					  st->dt == CASTFS_DTYPE_F16);
	return castfs_ct_absmax(st->f32 + k, n);
}

static float f8_block_scale(const struct castfs_qtensor *q,
			    const struct f8_stage *st, float absmax)
{
	if (q->qtype == CASTFS_Q_NVFP4)
		return castfs_ct_nvfp4_scale(absmax, st->gs, st->dt);
	if (q->qtype == CASTFS_Q_W4)
		return castfs_ct_i4_scale(absmax, st->dt);
	return castfs_ct_f8_scale(absmax, st->dt);
}

/* The scale of each block of block row @i of tile @t, from its elements. */
static void f8_band_scales(const struct castfs_qtensor *q,
			   const struct f8_stage *st, struct f8_tile *t,
			   uint64_t i)
{
	uint64_t w = t->c1 - t->c0;
	uint64_t ra = (t->br + i) * q->blk_rows;
	uint64_t rb = CASTFS_MIN(q->rows, ra + q->blk_rows);

	for (uint64_t j = 0; j < t->nbc; j++) {
		uint64_t ca = j * q->blk_cols;
		uint64_t n = CASTFS_MIN(w - ca, q->blk_cols);
		float m = 0.0f;

		for (uint64_t r = ra; r < rb; r++)
			m = castfs_ct_absmax_merge(
				m, f8_stage_absmax(st, t, (r - t->r0) * w + ca,
						   (size_t)n));
		t->scale[i * t->nbc + j] = f8_block_scale(q, st, m);
	}
}

/* A scale's bytes: F8_E4M3 for NVFP4, else the weight's dtype. */
static void ct_scale_store(uint8_t *dst, float v,
			   const struct castfs_qtensor *q, enum castfs_dtype dt)
{
	if (q->qtype == CASTFS_Q_NVFP4)
		*dst = castfs_qr_e4m3(v);
	else
		castfs_ct_store(dst, v, dt);
}

/*
 * Load tile @t and compute the scale of each of its blocks. With
 * @scales_only, or when its codes can use them so (f8_codes16()), a
 * BF16/F16 tile stays unconverted (t->raw16).
 */
static int f8_tile_load_as(const struct castfs_read_env *env,
			   const struct castfs_qtensor *q,
			   const struct f8_stage *st, struct f8_tile *t,
			   bool scales_only)
{
	bool raw16 = scales_only ? f8_raw16(q, st) : f8_codes16(q, st);
	int rc = raw16 ? f8_tile_read16(env, q, st, t) :
			 f8_tile_read(env, q, st, t);

	t->raw16 = raw16;
	t->raw = st->raw;
	for (uint64_t i = 0; !rc && i < t->nbr; i++)
		f8_band_scales(q, st, t, i);
	return rc;
}

/* Bytes of one stored scale (ct_scale_store()). */
static unsigned f8_scale_unit(const struct castfs_qtensor *q,
			      const struct f8_stage *st)
{
	return q->qtype == CASTFS_Q_NVFP4 ? 1u : castfs_dtype_bits(st->dt) / 8;
}

/* Bytes of all of @q's stored scales, @unit each. */
static uint64_t f8_scale_bytes(const struct castfs_qtensor *q, unsigned unit)
{
	return f8_ceil(q->rows, q->blk_rows) * f8_nbcols(q) * unit;
}

/* Scales kept at most per save, on the stack. */
#define F8_KEEP_CHUNK 256u

/* Keep the bytes of the @n scales at @sc, scales [@b, @b + @n) of @q
 * (@total bytes of them). */
static void f8_keep_run(const struct castfs_read_env *env,
			const struct castfs_qtensor *q,
			const struct f8_stage *st, const float *sc, uint64_t b,
			uint64_t n, uint64_t total)
{
	uint32_t idx = (uint32_t)(q - env->plan->qtensors);
	unsigned unit = f8_scale_unit(q, st);
	uint8_t buf[F8_KEEP_CHUNK * 4];

	for (uint64_t j = 0; j < n; j += F8_KEEP_CHUNK) {
		uint64_t k = CASTFS_MIN(n - j, (uint64_t)F8_KEEP_CHUNK);

		for (uint64_t m = 0; m < k; m++)
			ct_scale_store(buf + m * unit, sc[j + m], q, st->dt);
		castfs_qcache_save(env->plan, idx, total, (b + j) * unit, buf,
				   (size_t)(k * unit));
	}
}

/*
 * A codes read computed the scales of tile @t: keep their bytes for the
 * read of the weight's _scale tensor, which lies after every weight's
 * codes (the late run), so that read need not go over the weight again
 * (plan_qcache.c; best effort, bounded by the plan's budget).
 */
static void f8_keep_scales(const struct castfs_read_env *env,
			   const struct castfs_qtensor *q,
			   const struct f8_stage *st, const struct f8_tile *t)
{
	uint64_t total = f8_scale_bytes(q, f8_scale_unit(q, st));
	uint64_t all = f8_nbcols(q);

	if (!castfs_qcache_wants(env->plan, (uint32_t)(q - env->plan->qtensors),
				 total))
		return;
	if (t->nbc == all) { /* whole block rows: one run */
		f8_keep_run(env, q, st, t->scale, t->br * all, t->nbr * all,
			    total);
		return;
	}
	for (uint64_t i = 0; i < t->nbr; i++)
		f8_keep_run(env, q, st, t->scale + i * t->nbc,
			    (t->br + i) * all + t->bc, t->nbc, total);
}

static int f8_tile_load(const struct castfs_read_env *env,
			const struct castfs_qtensor *q,
			const struct f8_stage *st, struct f8_tile *t)
{
	return f8_tile_load_as(env, q, st, t, false);
}

/* Elements per chunk of packed int4 codes (stack buffer). */
#define I4_CHUNK 256u

/*
 * Packed int4 codes of @n elements (@n even) into @dst: element 2k in the
 * low nibble of byte k, as value + 8 (compressed-tensors pack_to_int32:
 * element i at bit 4i of little-endian int32 words).
 */
static void i4_pack(uint8_t *dst, const float *x, size_t n, float scale,
		    enum castfs_dtype dt)
{
	int8_t v[I4_CHUNK];

	for (size_t i = 0; i < n; i += I4_CHUNK) {
		size_t m = CASTFS_MIN(n - i, (size_t)I4_CHUNK);

		castfs_ct_i4_codes(v, x + i, m, scale, dt);
		for (size_t j = 0; j + 1 < m; j += 2)
			dst[(i + j) / 2] =
				(uint8_t)((v[j] + 8) | (v[j + 1] + 8) << 4);
	}
}

/*
 * The codes of the elements of tile @t inside [@lo, @hi), written at
 * @dst + (element - @base) (fp8), or packed two per byte at
 * @dst + (element - @base) / 2 (int4; @lo, @hi and @base even).
 */
static void f8_tile_codes(const struct castfs_qtensor *q,
			  const struct f8_stage *st, const struct f8_tile *t,
			  uint64_t lo, uint64_t hi, uint64_t base, uint8_t *dst)
{
	uint64_t w = t->c1 - t->c0;
	uint64_t ra = CASTFS_MAX(t->r0, lo / q->cols);
	uint64_t rb = CASTFS_MIN(t->r1, (hi - 1) / q->cols + 1);

	for (uint64_t r = ra; r < rb; r++) {
		uint64_t e0 = CASTFS_MAX(lo, r * q->cols + t->c0);
		uint64_t e1 = CASTFS_MIN(hi, r * q->cols + t->c1);

		while (e0 < e1) {
			uint64_t c = e0 - r * q->cols;
			uint64_t b = c / q->blk_cols;
			uint64_t s1 = CASTFS_MIN(
				e1, r * q->cols + (b + 1) * q->blk_cols);
			float scale =
				t->scale[(r / q->blk_rows - t->br) * t->nbc +
					 (b - t->bc)];

			uint64_t k = (r - t->r0) * w + (c - t->c0);
			const float *x = st->f32 + k;

			if (t->raw16)
				castfs_ct_f8_codes16(dst + (e0 - base),
						     t->raw + k * 2,
						     (size_t)(s1 - e0), scale,
						     st->dt);
			else if (q->qtype == CASTFS_Q_NVFP4)
				castfs_ct_fp4_pack(dst + (e0 - base) / 2, x,
						   (size_t)(s1 - e0), scale,
						   st->gs);
			else if (q->qtype == CASTFS_Q_W4)
				i4_pack(dst + (e0 - base) / 2, x,
					(size_t)(s1 - e0), scale, st->dt);
			else
				castfs_ct_f8_codes(dst + (e0 - base), x,
						   (size_t)(s1 - e0), scale,
						   st->dt);
			e0 = s1;
		}
	}
}

/* Codes of [@lo, @hi) inside one block row, tile by tile of columns. */
static int f8_codes_partial(const struct castfs_read_env *env,
			    const struct castfs_qtensor *q,
			    const struct f8_stage *st, struct f8_tile *t,
			    uint64_t lo, uint64_t hi, uint64_t base,
			    uint8_t *dst)
{
	uint64_t br = lo / q->cols / q->blk_rows;
	uint64_t ca = 0, cb = q->cols;
	int rc = 0;

	if (lo / q->cols == (hi - 1) / q->cols) {
		ca = lo % q->cols;
		cb = (hi - 1) % q->cols + 1;
	}
	for (uint64_t bc = ca / q->blk_cols; !rc && bc * q->blk_cols < cb;
	     bc += t->nbc) {
		f8_tile_pick(q, st->cap, br, 1, bc,
			     f8_ceil(cb, q->blk_cols) - bc, t);
		rc = f8_tile_load(env, q, st, t);
		if (!rc) {
			f8_tile_codes(q, st, t, lo, hi, base, dst);
			f8_keep_scales(env, q, st, t);
		}
	}
	return rc;
}

/* ComfyUI scaled fp8: codes of [@first, @first + @count), chunk by chunk
 * (one scale for the tensor: any element range reads only itself). */
static int comfy_codes(const struct castfs_read_env *env, uint32_t idx,
		       uint64_t first, uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[idx];
	struct f8_stage st;
	int rc = f8_stage_init(&st, env, idx);

	while (!rc && count) {
		size_t k = (size_t)CASTFS_MIN(count, st.cap);

		rc = f8_load(env, q, &st, first, k, st.f32);
		if (rc)
			break;
		castfs_comfy_f8_codes(dst, st.f32, k, st.gs, st.dt);
		dst += k;
		first += k;
		count -= k;
	}
	return rc;
}

/* Codes of element range [lo, hi) of a tensor, written from dst at base. */
struct f8_out {
	uint64_t lo, hi, base;
	uint8_t *dst;
};

/* Elements of source a mapped tile may span (16 MiB of BF16/F16). */
#define F8_MAP_ELEMS (8u << 20)

struct f8_mapped {
	const struct castfs_read_env *env;
	const struct castfs_qtensor *q;
	const struct f8_stage *st;
	struct f8_tile *t;
	const struct f8_out *o;
};

/* Bytes of the next block row asked into the cache ahead of its absmax. */
#define F8_PREFETCH (64u << 10)

/*
 * Ask for the first F8_PREFETCH bytes of the @nr rows of @w bytes at @at
 * in the mapping @p while this block row's codes are computed: the
 * absmax reads the mapping from memory a 4 KiB page at a time, which the
 * hardware's streams do not cross.
 */
static void f8_prefetch(const struct castfs_piece *p, uint64_t at, uint64_t nr,
			uint64_t w)
{
	uint64_t end = CASTFS_MIN(p->n, at + CASTFS_MIN(nr * w, F8_PREFETCH));

	for (uint64_t b = at; b < end; b += 64)
		__builtin_prefetch(p->bytes + b, 0, 3);
}

/*
 * Scales, then codes, one block row of the mapped tile at a time: the
 * codes read the elements while the absmax has just brought them into
 * the cache, so the source is read from memory once, and no pread copy.
 */
static int f8_codes_mapped(void *arg, const struct castfs_piece *p)
{
	const struct f8_mapped *m = arg;
	const struct castfs_qtensor *q = m->q;
	struct f8_tile *t = m->t;

	t->raw = p->bytes;
	for (uint64_t i = 0; i < t->nbr; i++) {
		uint64_t ra = (t->br + i) * q->blk_rows;
		uint64_t rb = CASTFS_MIN(q->rows, ra + q->blk_rows);
		uint64_t e0 = CASTFS_MAX(m->o->lo, ra * q->cols);
		uint64_t e1 = CASTFS_MIN(m->o->hi, rb * q->cols);

		f8_band_scales(q, m->st, t, i);
		f8_prefetch(p, (rb - t->r0) * q->cols * 2,
			    CASTFS_MIN(q->rows, rb + q->blk_rows) - rb,
			    q->cols * 2);
		if (e0 < e1)
			f8_tile_codes(q, m->st, t, e0, e1, m->o->base,
				      m->o->dst);
	}
	f8_keep_scales(m->env, q, m->st, t);
	return 0;
}

/*
 * The codes of [o->lo, o->hi), the start of @whole block rows from block
 * row @br, through a mapping of the source: a tile of whole rows of a
 * BF16/F16 weight, up to F8_MAP_ELEMS. Sets o->lo past the codes written;
 * -ENOTSUP, nothing done, where the tile or the reader does not allow it.
 */
static int f8_codes_map(const struct castfs_read_env *env,
			const struct castfs_qtensor *q,
			const struct f8_stage *st, struct f8_tile *t,
			uint64_t br, uint64_t whole, struct f8_out *o)
{
	struct f8_mapped m = { .env = env, .q = q, .st = st, .t = t, .o = o };
	int rc;

	if (!f8_codes16(q, st))
		return -ENOTSUP;
	f8_tile_pick(q, F8_MAP_ELEMS, br, whole, 0, f8_nbcols(q), t);
	if (t->c1 - t->c0 != q->cols)
		return -ENOTSUP;
	t->raw16 = true;
	rc = castfs_reader_map(env->src, q->src_off + t->r0 * q->cols * 2,
			       (size_t)((t->r1 - t->r0) * q->cols * 2),
			       f8_codes_mapped, &m);
	if (rc != -ENOTSUP)
		o->lo = CASTFS_MIN(o->hi, t->r1 * q->cols);
	return rc;
}

/* The codes of [o->lo, o->hi) from @whole (> 0) block rows at block row
 * @br, o->lo its first element, tile by tile; sets o->lo past them. */
static int f8_codes_whole(const struct castfs_read_env *env,
			  const struct castfs_qtensor *q,
			  const struct f8_stage *st, struct f8_tile *t,
			  uint64_t br, uint64_t whole, struct f8_out *o)
{
	int rc = f8_codes_map(env, q, st, t, br, whole, o);
	uint64_t hi;

	if (rc != -ENOTSUP)
		return rc;
	f8_tile_pick(q, st->cap, br, whole, 0, f8_nbcols(q), t);
	if (t->c1 - t->c0 != q->cols)
		return -ENOTSUP;
	rc = f8_tile_load(env, q, st, t);
	hi = CASTFS_MIN(o->hi, t->r1 * q->cols);
	if (!rc) {
		f8_tile_codes(q, st, t, o->lo, hi, o->base, o->dst);
		f8_keep_scales(env, q, st, t);
	}
	o->lo = hi;
	return rc;
}

/* The codes of elements [@first, @first + @count) of @q into @dst. */
static int ct_codes(const struct castfs_read_env *env, uint32_t idx,
		    uint64_t first, uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[idx];
	struct f8_out o = { first, first + count, first, dst };
	uint64_t band = q->blk_rows * q->cols; /* elements per block row */
	struct f8_stage st;
	struct f8_tile t;
	int rc;

	if (q->qtype == CASTFS_Q_COMFY_F8)
		return comfy_codes(env, idx, first, count, dst);
	rc = f8_stage_init(&st, env, idx);
	while (!rc && o.lo < o.hi) {
		uint64_t br = o.lo / band;
		uint64_t whole = (o.hi - o.lo) / band;
		uint64_t hi = CASTFS_MIN(o.hi, (br + 1) * band);

		if (o.lo % band == 0 && o.hi == q->nelems)
			whole = f8_ceil(o.hi - o.lo, band);
		rc = -ENOTSUP;
		if (o.lo % band == 0 && whole > 0)
			rc = f8_codes_whole(env, q, &st, &t, br, whole, &o);
		if (rc != -ENOTSUP)
			continue;
		rc = f8_codes_partial(env, q, &st, &t, o.lo, hi, o.base, o.dst);
		o.lo = hi;
	}
	return rc;
}

/* F8_CODES: unit 1 (one F8_E4M3 element). */
int castfs_gen_f8_codes(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	return ct_codes(env, e->qt, first, count, dst);
}

/* I4_PACKED: unit 1 (one byte: two int4 or fp4 elements; rows are even). */
int castfs_gen_i4_packed(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst)
{
	return ct_codes(env, e->qt, first * 2, count * 2, dst);
}

/* CT_SCALE: a unit is one block's scale (F8_E4M3 or the weight's dtype). */
int castfs_gen_ct_scale(const struct castfs_read_env *env,
			const struct castfs_extent *e, uint64_t first,
			uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	uint64_t all = f8_nbcols(q);
	struct f8_stage st;
	struct f8_tile t;
	int rc = f8_stage_init(&st, env, e->qt);

	if (!rc && f8_scale_unit(q, &st) == e->unit &&
	    castfs_qcache_take(env->plan, e->qt, f8_scale_bytes(q, e->unit),
			       first * e->unit, count * e->unit, dst))
		return 0;
	while (!rc && count) {
		uint64_t bc = first % all;

		f8_tile_pick(q, st.cap, first / all, bc ? 1 : count / all, bc,
			     CASTFS_MIN(count, all - bc), &t);
		rc = f8_tile_load_as(env, q, &st, &t, true);
		for (uint64_t i = 0; !rc && i < t.nbr * t.nbc; i++) {
			ct_scale_store(dst, t.scale[i], q, st.dt);
			dst += e->unit;
		}
		first += t.nbr * t.nbc;
		count -= t.nbr * t.nbc;
	}
	return rc;
}

/* CT_GSCALE: one unit, the F32 weight_global_scale of an NVFP4 tensor or
 * the weight_scale of a ComfyUI scaled-fp8 one. */
int castfs_gen_ct_gscale(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst)
{
	float gs;
	int rc = fp4_gscale(env, e->qt, &gs);

	(void)first;
	if (!rc && count)
		castfs_ct_store(dst, gs, CASTFS_DTYPE_F32);
	return rc;
}
