/* SPDX-License-Identifier: MIT */
/*
 * The source paths the kernel holds a node of, each with its count: an
 * exact set (chained, sized with what is held), so that an entry nobody
 * holds is never taken for held, whatever the count (a fixed table of
 * 65,536 counters took ~78 % of unheld paths for held at 100,000).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "ns/ns_internal.h"

/* Fewer buckets are never kept, so an idle mount's set is small. */
#define NS_LIVE_MIN_BUCKETS 256u

struct ns_live_ent {
	struct ns_live_ent *next;
	uint64_t h;
	uint64_t n; /* nodes held with this path, > 0 */
	char path[];
};

struct ns_live {
	pthread_mutex_t lock; /* a leaf: nothing else is taken under it */
	struct ns_live_ent **b;
	size_t nb; /* a power of two */
	size_t n; /* entries */
	/* An entry could not be made (no memory): every path is then taken
	 * for held, which keeps entries (the old, safe answer) rather than
	 * evict what the kernel holds. */
	bool broken;
};

struct ns_live *ns_live_new(void)
{
	struct ns_live *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->b = calloc(NS_LIVE_MIN_BUCKETS, sizeof(*l->b));
	if (!l->b) {
		free(l);
		return NULL;
	}
	l->nb = NS_LIVE_MIN_BUCKETS;
	pthread_mutex_init(&l->lock, NULL);
	return l;
}

void ns_live_free(struct ns_live *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->nb; i++) {
		struct ns_live_ent *e = l->b[i], *next;

		for (; e; e = next) {
			next = e->next;
			free(e);
		}
	}
	free(l->b);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

static uint64_t live_hash(const char *path, size_t len)
{
	return castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, path, len));
}

/* The link that points at the entry of @path's first @len bytes (or the
 * chain's end). */
static struct ns_live_ent **
live_find_locked(struct ns_live *l, const char *path, size_t len, uint64_t h)
{
	struct ns_live_ent **pp = &l->b[h & (l->nb - 1)];

	while (*pp && ((*pp)->h != h || strncmp((*pp)->path, path, len) ||
		       (*pp)->path[len]))
		pp = &(*pp)->next;
	return pp;
}

/* Rehash into @nb buckets; without memory the chains just stay longer. */
static void live_resize_locked(struct ns_live *l, size_t nb)
{
	struct ns_live_ent **b = calloc(nb, sizeof(*b));

	if (!b)
		return;
	for (size_t i = 0; i < l->nb; i++) {
		struct ns_live_ent *e = l->b[i], *next;

		for (; e; e = next) {
			next = e->next;
			e->next = b[e->h & (nb - 1)];
			b[e->h & (nb - 1)] = e;
		}
	}
	free(l->b);
	l->b = b;
	l->nb = nb;
}

void ns_live_add(struct ns_live *l, const char *path)
{
	size_t len = strlen(path);
	uint64_t h = live_hash(path, len);
	struct ns_live_ent **pp, *e;

	pthread_mutex_lock(&l->lock);
	pp = live_find_locked(l, path, len, h);
	if (*pp) {
		(*pp)->n++;
		goto out_unlock;
	}
	e = malloc(sizeof(*e) + len + 1);
	if (!e) {
		l->broken = true;
		goto out_unlock;
	}
	e->next = NULL;
	e->h = h;
	e->n = 1;
	memcpy(e->path, path, len + 1);
	*pp = e;
	if (++l->n > l->nb)
		live_resize_locked(l, l->nb * 2);
out_unlock:
	pthread_mutex_unlock(&l->lock);
}

bool ns_live_sub(struct ns_live *l, const char *path)
{
	size_t len = strlen(path);
	uint64_t h = live_hash(path, len);
	struct ns_live_ent **pp, *e;
	bool last = false;

	pthread_mutex_lock(&l->lock);
	pp = live_find_locked(l, path, len, h);
	e = *pp;
	if (e && --e->n == 0) {
		*pp = e->next;
		free(e);
		last = !l->broken;
		/* Shrunk by a quarter at an eighth full: memory follows what
		 * the kernel holds, and add/sub at one size never rehashes. */
		if (--l->n < l->nb / 8 && l->nb > NS_LIVE_MIN_BUCKETS)
			live_resize_locked(l, l->nb / 4 > NS_LIVE_MIN_BUCKETS ?
						      l->nb / 4 :
						      NS_LIVE_MIN_BUCKETS);
	}
	pthread_mutex_unlock(&l->lock);
	return last;
}

bool ns_live_has(struct ns_live *l, const char *path, size_t len)
{
	uint64_t h = live_hash(path, len);
	bool held;

	pthread_mutex_lock(&l->lock);
	held = l->broken || *live_find_locked(l, path, len, h) != NULL;
	pthread_mutex_unlock(&l->lock);
	return held;
}
