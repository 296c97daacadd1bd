// SPDX-License-Identifier: MIT
/*
 * The double-quantised absmax cache of a plan: the one piece of read-path
 * state that outlives a request (see the comment below for why).
 */
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

/*
 * The double-quantised absmax cache. A block's 8-bit absmax code (the
 * Q4_QABSMAX byte) needs the block's absmax, which a Q4_CODES read has
 * just computed for the block's codes; in a sequential read of a view the
 * tensor's .absmax bytes come right after its codes (the writer's name
 * order). Q4_CODES reads keep them (castfs_qcache_save) once the tensor's statistics
 * are ready, and the Q4_QABSMAX read takes them (castfs_qcache_take) instead of
 * reading the whole tensor again. At most CASTFS_QCACHE_TENSORS tensors
 * per plan hold one (oldest evicted), each of at most QC_MAX_BLOCKS
 * bytes; a cache is dropped once all of it was served. Any range not all
 * cached is computed as before: the bytes are the same.
 */
#define QC_MAX_BLOCKS (2u << 20)

/* Free @qs's cache; the caller holds qs->lock. */
static void qc_drop_locked(struct castfs_qstats *qs)
{
	free(qs->qc);
	free(qs->qc_valid);
	qs->qc = NULL;
	qs->qc_valid = NULL;
	qs->qc_served = 0;
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
 * Give tensor @idx a cache of @nb bytes, evicting the oldest holder when
 * the plan's are all taken. Best effort: without memory there is none.
 */
static void qc_acquire(const struct castfs_plan *p, uint32_t idx, uint64_t nb)
{
	struct castfs_qcache *c = p->qcache;
	struct castfs_qstats *qs = &p->qstats[idx];
	uint8_t *qc = malloc((size_t)nb);
	uint64_t *valid = calloc((size_t)(nb + 63) / 64, sizeof(*valid));

	pthread_mutex_lock(&c->lock);
	qcache_remove_locked(c, idx);
	if (qc && valid && c->n == CASTFS_QCACHE_TENSORS) {
		struct castfs_qstats *old = &p->qstats[c->qt[0]];

		pthread_mutex_lock(&old->lock);
		qc_drop_locked(old);
		pthread_mutex_unlock(&old->lock);
		qcache_remove_locked(c, c->qt[0]);
	}
	pthread_mutex_lock(&qs->lock);
	if (qc && valid && !qs->qc) {
		qs->qc = qc;
		qs->qc_valid = valid;
		qc = NULL;
		valid = NULL;
	}
	if (qs->qc)
		c->qt[c->n++] = idx;
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

bool castfs_qcache_fits(uint64_t nblocks)
{
	return nblocks <= QC_MAX_BLOCKS;
}

void castfs_qcache_save(const struct castfs_plan *p, uint32_t idx,
			uint64_t nblocks, uint64_t b, const uint8_t *codes,
			size_t k)
{
	struct castfs_qstats *qs = &p->qstats[idx];

	pthread_mutex_lock(&qs->lock);
	if (!qs->qc) {
		pthread_mutex_unlock(&qs->lock);
		qc_acquire(p, idx, nblocks);
		pthread_mutex_lock(&qs->lock);
	}
	if (qs->qc) {
		memcpy(qs->qc + b, codes, k);
		qc_bits(qs->qc_valid, b, k, true);
	}
	pthread_mutex_unlock(&qs->lock);
}

bool castfs_qcache_take(const struct castfs_plan *p, uint32_t idx,
			uint64_t nblocks, uint64_t first, uint64_t count,
			uint8_t *dst)
{
	struct castfs_qstats *qs = &p->qstats[idx];
	bool hit;

	pthread_mutex_lock(&qs->lock);
	hit = qs->qc && qc_bits(qs->qc_valid, first, count, false);
	if (hit) {
		memcpy(dst, qs->qc + first, (size_t)count);
		qs->qc_served += count;
		if (qs->qc_served >= nblocks)
			qc_drop_locked(qs); /* stays listed: harmless */
	}
	pthread_mutex_unlock(&qs->lock);
	return hit;
}
