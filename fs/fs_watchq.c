// SPDX-License-Identifier: MIT
/* The watcher's queue of changed paths: arrival order, one entry per path
 * (a hash of the waiting paths), masks or'ed together. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_watchq.h"

static uint64_t path_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* Free every path and forget them all. */
void castfs_watchq_clear(struct castfs_watchq *q)
{
	for (size_t i = 0; i < q->n; i++)
		free(q->items[i].rel);
	q->n = 0;
	q->head = 0;
	if (q->slots)
		memset(q->slots, 0, q->nslots * sizeof(*q->slots));
}

void castfs_watchq_fini(struct castfs_watchq *q)
{
	castfs_watchq_clear(q);
	free(q->items);
	free(q->slots);
	*q = (struct castfs_watchq){ 0 };
}

/* The slot that holds waiting path @rel, or the empty one it would take.
 * Popped paths in slots are passed over: a new change queues them anew. */
static size_t slot_of(const struct castfs_watchq *q, const char *rel,
		      uint64_t h)
{
	size_t mask = q->nslots - 1, i = (size_t)h & mask;

	for (; q->slots[i]; i = (i + 1) & mask) {
		const struct castfs_watchq_item *it =
			&q->items[q->slots[i] - 1];

		if (q->slots[i] - 1 >= q->head && it->hash == h &&
		    strcmp(it->rel, rel) == 0)
			return i;
	}
	return i;
}

/* Re-hash the waiting items into @ns fresh slots. */
static int rehash(struct castfs_watchq *q, size_t ns)
{
	uint32_t *s = calloc(ns, sizeof(*s));

	if (!s)
		return -ENOMEM;
	free(q->slots);
	q->slots = s;
	q->nslots = ns;
	for (size_t i = q->head; i < q->n; i++)
		q->slots[slot_of(q, q->items[i].rel, q->items[i].hash)] =
			(uint32_t)i + 1;
	return 0;
}

/* Free the popped items once they are most of the array, so that a
 * queue that never runs empty stays bounded by what waits. */
static int compact(struct castfs_watchq *q)
{
	if (q->head < 4096 || q->head * 2 < q->n)
		return 0;
	for (size_t i = 0; i < q->head; i++)
		free(q->items[i].rel);
	memmove(q->items, q->items + q->head,
		(q->n - q->head) * sizeof(*q->items));
	q->n -= q->head;
	q->head = 0;
	return rehash(q, q->nslots);
}

/* Room for one more item and a hash at most half full. */
static int reserve(struct castfs_watchq *q)
{
	int rc = compact(q);

	if (rc)
		return rc;
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 1024;
		void *p = realloc(q->items, cap * sizeof(*q->items));

		if (!p)
			return -ENOMEM;
		q->items = p;
		q->cap = cap;
	}
	if ((q->n + 1) * 2 > q->nslots)
		return rehash(q, q->nslots ? q->nslots * 2 : 2048);
	return 0;
}

int castfs_watchq_add(struct castfs_watchq *q, const char *dir,
		      const char *name, uint32_t mask)
{
	char *rel;
	uint64_t h;
	size_t s;
	int rc;

	if (q->head == q->n)
		castfs_watchq_clear(q); /* all handled: start over */
	if (q->n - q->head >= CASTFS_WATCHQ_MAX)
		return -ENOSPC;
	if (asprintf(&rel, "%s%s%s", dir, dir[0] ? "/" : "", name) < 0)
		return -ENOMEM;
	rc = reserve(q);
	if (rc) {
		free(rel);
		return rc;
	}
	h = path_hash(rel);
	s = slot_of(q, rel, h);
	if (q->slots[s]) {
		q->items[q->slots[s] - 1].mask |= mask;
		free(rel);
		return 0;
	}
	q->items[q->n] = (struct castfs_watchq_item){ rel, h, mask };
	q->slots[s] = (uint32_t)++q->n;
	return 0;
}

const struct castfs_watchq_item *castfs_watchq_pop(struct castfs_watchq *q)
{
	return q->head < q->n ? &q->items[q->head++] : NULL;
}
