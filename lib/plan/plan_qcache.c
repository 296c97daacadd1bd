// SPDX-License-Identifier: MIT
/*
 * The double-quantised absmax cache of a plan: the one piece of read-path
 * state that outlives a request (see the comment below for why).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan/plan_internal.h"

/*
 * The cache of small bytes made from a weight's blocks. A block's 8-bit
 * absmax code (the Q4_QABSMAX byte) needs the block's absmax, which a
 * Q4_CODES read has just computed for the block's codes; in a sequential
 * read of a view the tensor's .absmax bytes come right after its codes
 * (the writer's name order), or after the codes of every tensor (the late
 * run of docs/FORMATS.md). Q4_CODES reads keep them (castfs_qcache_save)
 * once the tensor's statistics are ready, and the Q4_QABSMAX read takes
 * them (castfs_qcache_take) instead of reading the whole tensor again. The
 * compressed-tensors codes (F8_CODES, I4_PACKED) keep their blocks'
 * weight_scale bytes (CT_SCALE, in the late run) the same way
 * (plan_gen_f8.c): a tensor's cache holds one kind of bytes. A plan's
 * caches hold at most QC_BUDGET bytes, each at most QC_MAX_BYTES; a
 * cache is dropped once all of it was served. When a new one does not
 * fit, holders idle for QC_IDLE_MS (a reader that never came for its
 * .absmax) are evicted, oldest first; recent ones are kept, not the new
 * one: in the late run every tensor's codes come before any .absmax, and
 * evicting the oldest would leave none by then. Any range not all cached
 * is computed as before: the bytes are the same.
 */
#define QC_MAX_BYTES (2u << 20)
#define QC_BUDGET ((uint64_t)16 << 20)
#define QC_IDLE_MS 10000u
/* A tensor refused room asks again after this long, not per chunk. */
#define QC_RETRY_MS 1000u

static uint64_t qc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Free @qs's cache; the caller holds qs->lock. */
static void qc_drop_locked(struct castfs_qstats *qs)
{
	free(qs->qc);
	free(qs->qc_valid);
	qs->qc = NULL;
	qs->qc_valid = NULL;
	qs->qc_served = 0;
	qs->qc_len = 0;
}

/* Forget tensor @idx in @c (if there); the caller holds c->lock. */
static void qcache_remove_locked(struct castfs_qcache *c, uint32_t idx)
{
	uint32_t j = 0;

	for (uint32_t i = 0; i < c->n; i++) {
		if (c->qt[i] != idx)
			c->qt[j++] = c->qt[i];
	}
	c->n = j;
}

/*
 * Forget the plan's holders whose cache was dropped (all served); the
 * bytes the others hold. The caller holds c->lock.
 */
static uint64_t qcache_prune_locked(const struct castfs_plan *p)
{
	struct castfs_qcache *c = p->qcache;
	uint64_t held = 0;
	uint32_t j = 0;

	for (uint32_t i = 0; i < c->n; i++) {
		struct castfs_qstats *qs = &p->qstats[c->qt[i]];

		pthread_mutex_lock(&qs->lock);
		if (qs->qc) {
			held += qs->qc_len;
			c->qt[j++] = c->qt[i];
		}
		pthread_mutex_unlock(&qs->lock);
	}
	c->n = j;
	return held;
}

/* Evict the oldest holder if it has been idle long enough; its bytes, or
 * 0 when it has not. The caller holds c->lock. */
static uint64_t qcache_evict_idle_locked(const struct castfs_plan *p,
					 uint64_t now)
{
	struct castfs_qcache *c = p->qcache;
	struct castfs_qstats *old = &p->qstats[c->qt[0]];
	uint64_t freed = 0;

	pthread_mutex_lock(&old->lock);
	if (old->qc_used_ms + QC_IDLE_MS <= now) {
		freed = old->qc_len;
		qc_drop_locked(old);
	}
	pthread_mutex_unlock(&old->lock);
	if (freed)
		qcache_remove_locked(c, c->qt[0]);
	return freed;
}

/*
 * Give tensor @idx a cache of @nb bytes if it fits the plan's budget,
 * after evicting idle holders. Best effort: without room or memory there
 * is none.
 */
static void qc_acquire(const struct castfs_plan *p, uint32_t idx, uint64_t nb)
{
	struct castfs_qcache *c = p->qcache;
	struct castfs_qstats *qs = &p->qstats[idx];
	uint64_t now = qc_now_ms(), held, freed = 1;
	uint8_t *qc = NULL;
	uint64_t *valid = NULL;

	pthread_mutex_lock(&c->lock);
	qcache_remove_locked(c, idx);
	held = qcache_prune_locked(p);
	while (held + nb > QC_BUDGET && c->n && freed) {
		freed = qcache_evict_idle_locked(p, now);
		held -= freed;
	}
	if (held + nb <= QC_BUDGET) {
		qc = malloc((size_t)nb);
		valid = calloc((size_t)(nb + 63) / 64, sizeof(*valid));
	}
	pthread_mutex_lock(&qs->lock);
	if (qc && valid && !qs->qc) {
		qs->qc = qc;
		qs->qc_valid = valid;
		qs->qc_len = nb;
		qs->qc_used_ms = now;
		qc = NULL;
		valid = NULL;
	}
	if (qs->qc)
		c->qt[c->n++] = idx;
	else
		qs->qc_refused_ms = now;
	pthread_mutex_unlock(&qs->lock);
	pthread_mutex_unlock(&c->lock);
	free(qc);
	free(valid);
}

/* Bits [@b, @b + @n) of @v: set them, or test that all are set. */
static bool qc_bits(uint64_t *v, uint64_t b, uint64_t n, bool set)
{
	for (uint64_t i = b; i < b + n; i++) {
		uint64_t bit = UINT64_C(1) << (i % 64);

		if (i % 64 == 0 && i + 64 <= b + n) {
			if (!set && v[i / 64] != UINT64_MAX)
				return false;
			if (set)
				v[i / 64] = UINT64_MAX;
			i += 63;
		} else if (set) {
			v[i / 64] |= bit;
		} else if (!(v[i / 64] & bit)) {
			return false;
		}
	}
	return true;
}

/* Whether @qs holds no cache and was refused room too recently to ask
 * again. Under its lock. */
static bool qc_refused_locked(const struct castfs_qstats *qs)
{
	return !qs->qc && qs->qc_refused_ms &&
	       qc_now_ms() - qs->qc_refused_ms < QC_RETRY_MS;
}

bool castfs_qcache_wants(const struct castfs_plan *p, uint32_t idx,
			 uint64_t len)
{
	struct castfs_qstats *qs = &p->qstats[idx];
	bool refused;

	if (!p->qcache || len > QC_MAX_BYTES)
		return false;
	pthread_mutex_lock(&qs->lock);
	refused = qc_refused_locked(qs);
	pthread_mutex_unlock(&qs->lock);
	return !refused;
}

void castfs_qcache_save(const struct castfs_plan *p, uint32_t idx, uint64_t len,
			uint64_t b, const uint8_t *bytes, size_t k)
{
	struct castfs_qstats *qs = &p->qstats[idx];

	pthread_mutex_lock(&qs->lock);
	if (qc_refused_locked(qs)) {
		pthread_mutex_unlock(&qs->lock);
		return;
	}
	if (!qs->qc) {
		pthread_mutex_unlock(&qs->lock);
		qc_acquire(p, idx, len);
		pthread_mutex_lock(&qs->lock);
	}
	if (qs->qc && b <= qs->qc_len && k <= qs->qc_len - b) {
		memcpy(qs->qc + b, bytes, k);
		qc_bits(qs->qc_valid, b, k, true);
		qs->qc_used_ms = qc_now_ms();
	}
	pthread_mutex_unlock(&qs->lock);
}

bool castfs_qcache_take(const struct castfs_plan *p, uint32_t idx, uint64_t len,
			uint64_t first, uint64_t count, uint8_t *dst)
{
	struct castfs_qstats *qs = &p->qstats[idx];
	bool hit;

	pthread_mutex_lock(&qs->lock);
	hit = qs->qc && qc_bits(qs->qc_valid, first, count, false);
	if (hit) {
		memcpy(dst, qs->qc + first, (size_t)count);
		qs->qc_used_ms = qc_now_ms();
		qs->qc_served += count;
		if (qs->qc_served >= len)
			qc_drop_locked(qs); /* stays listed: harmless */
	}
	pthread_mutex_unlock(&qs->lock);
	return hit;
}
