/* SPDX-License-Identifier: MIT */
/*
 * The nodes the kernel holds (nlookup > 0), chained by the hash of their
 * source path: an exact set, sized with what is held, so that a path no
 * held node has is never taken for held whatever the count (a fixed table
 * of 65,536 counters took ~74 % of released paths for held at 100,000).
 * The nodes are the entries (ns_node.lnext): nothing is allocated per
 * lookup and a held path costs a link and a bucket, not a copy.
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "ns/ns_internal.h"

/* Fewer buckets are never kept, so an idle mount's set is small. */
#define NS_LIVE_MIN_BUCKETS 256u

struct ns_live {
	/* A leaf: taken under ns->lock by the writers, alone by
	 * ns_live_has(), and nothing is taken under it. */
	pthread_mutex_t lock;
	struct ns_node **b;
	size_t nb; /* a power of two */
	size_t n; /* nodes in the set */
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
	free(l->b);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

static size_t live_bucket(const struct ns_live *l, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return (size_t)castfs_mix64(h) & (l->nb - 1);
}

/* Rehash into @nb buckets; without memory the chains just stay longer. */
static void live_resize_locked(struct ns_live *l, size_t nb)
{
	struct ns_node **old = l->b, *n, *next;
	size_t onb = l->nb;

	l->b = calloc(nb, sizeof(*l->b));
	if (!l->b) {
		l->b = old;
		return;
	}
	l->nb = nb;
	for (size_t i = 0; i < onb; i++) {
		for (n = old[i]; n; n = next) {
			size_t b = live_bucket(l, n->path);

			next = n->lnext;
			n->lnext = l->b[b];
			l->b[b] = n;
		}
	}
	free(old);
}

static bool live_has_locked(const struct ns_live *l, const char *path)
{
	const struct ns_node *n = l->b[live_bucket(l, path)];

	while (n && strcmp(n->path, path) != 0)
		n = n->lnext;
	return n != NULL;
}

void ns_live_add(struct ns_live *l, struct ns_node *n)
{
	size_t b;

	pthread_mutex_lock(&l->lock);
	b = live_bucket(l, n->path);
	n->lnext = l->b[b];
	l->b[b] = n;
	if (++l->n > l->nb)
		live_resize_locked(l, l->nb * 2);
	pthread_mutex_unlock(&l->lock);
}

bool ns_live_del(struct ns_live *l, struct ns_node *n)
{
	struct ns_node **pp;
	bool last;

	pthread_mutex_lock(&l->lock);
	pp = &l->b[live_bucket(l, n->path)];
	while (*pp && *pp != n)
		pp = &(*pp)->lnext;
	assert(*pp == n); /* added when its nlookup left 0 */
	if (!*pp) {
		pthread_mutex_unlock(&l->lock);
		return false;
	}
	*pp = n->lnext;
	n->lnext = NULL;
	last = !live_has_locked(l, n->path);
	/* A quarter the size at an eighth full: memory follows what the
	 * kernel holds, and add/del at one size never rehash each time. */
	if (--l->n < l->nb / 8 && l->nb > NS_LIVE_MIN_BUCKETS)
		live_resize_locked(l, l->nb / 4 > NS_LIVE_MIN_BUCKETS ?
					      l->nb / 4 :
					      NS_LIVE_MIN_BUCKETS);
	pthread_mutex_unlock(&l->lock);
	return last;
}

bool ns_live_has(struct ns_live *l, const char *path)
{
	bool held;

	pthread_mutex_lock(&l->lock);
	held = live_has_locked(l, path);
	pthread_mutex_unlock(&l->lock);
	return held;
}
