/* SPDX-License-Identifier: MIT */
/*
 * File handles that survive a daemon restart. The kernel keeps the fh of
 * every open file across a restart of the daemon (the supervisor keeps the
 * FUSE connection), so an fh is never a pointer: it is a number looked up
 * here, and a number this daemon never issued is an open of the previous
 * daemon, reopened by node id on first use (adopted).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/hash.h"
#include "fs.h"

#define FH_BUCKETS 4096u

struct fh_ent {
	uint64_t fh;
	void *obj;
	struct fh_ent *next;
};

struct castfs_fh_table {
	pthread_mutex_t lock;
	void *(*hold)(void *obj); /* a share for a caller, under the lock */
	uint64_t prefix; /* this daemon's random high 32 bits */
	uint32_t next;
	struct fh_ent *b[FH_BUCKETS];
};

/* A prefix per daemon, so an fh of a previous daemon is (almost surely,
 * 1 in 2^32 per restart) not one of ours: it gets adopted, not confused. */
static uint64_t random_prefix(void)
{
	uint32_t r = 0;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint32_t)castfs_mix64((uint64_t)getpid() ^
					   (uint64_t)(uintptr_t)&r);
	return (uint64_t)(r | 1u) << 32; /* never 0: 0 is no fh at all */
}

int castfs_fh_table_new(void *(*hold)(void *), struct castfs_fh_table **out)
{
	struct castfs_fh_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->lock, NULL);
	t->hold = hold;
	t->prefix = random_prefix();
	*out = t;
	return 0;
}

void castfs_fh_table_free(struct castfs_fh_table *t, void (*free_obj)(void *))
{
	if (!t)
		return;
	for (size_t i = 0; i < FH_BUCKETS; i++) {
		struct fh_ent *e = t->b[i], *next;

		for (; e; e = next) {
			next = e->next;
			free_obj(e->obj);
			free(e);
		}
	}
	pthread_mutex_destroy(&t->lock);
	free(t);
}

static struct fh_ent **bucket(struct castfs_fh_table *t, uint64_t fh)
{
	return &t->b[castfs_mix64(fh) % FH_BUCKETS];
}

static struct fh_ent *find_locked(struct castfs_fh_table *t, uint64_t fh)
{
	struct fh_ent *e = *bucket(t, fh);

	while (e && e->fh != fh)
		e = e->next;
	return e;
}

static int insert_locked(struct castfs_fh_table *t, uint64_t fh, void *obj)
{
	struct fh_ent *e = malloc(sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->fh = fh;
	e->obj = obj;
	e->next = *bucket(t, fh);
	*bucket(t, fh) = e;
	return 0;
}

uint64_t castfs_fh_add(struct castfs_fh_table *t, void *obj)
{
	uint64_t fh;

	pthread_mutex_lock(&t->lock);
	do /* skip numbers still in use after the counter wrapped */
		fh = t->prefix | ++t->next;
	while (find_locked(t, fh));
	if (insert_locked(t, fh, obj))
		fh = 0;
	pthread_mutex_unlock(&t->lock);
	return fh;
}

void *castfs_fh_get(struct castfs_fh_table *t, uint64_t fh)
{
	struct fh_ent *e;
	void *obj;

	pthread_mutex_lock(&t->lock);
	e = find_locked(t, fh);
	/* The entry is only valid under the lock, and the object only with
	 * a share taken under it: a RELEASE may take it out next. */
	obj = e ? t->hold(e->obj) : NULL;
	pthread_mutex_unlock(&t->lock);
	return obj;
}

void *castfs_fh_adopt(struct castfs_fh_table *t, uint64_t fh, void *obj,
		      bool *took)
{
	struct fh_ent *e;
	void *got = obj;

	*took = false;
	pthread_mutex_lock(&t->lock);
	e = find_locked(t, fh);
	if (e)
		got = t->hold(e->obj); /* another thread adopted it first */
	else if (insert_locked(t, fh, obj))
		got = NULL;
	else
		*took = true;
	if (*took)
		got = t->hold(obj); /* the table's share, and the caller's */
	pthread_mutex_unlock(&t->lock);
	return got;
}

void *castfs_fh_swap(struct castfs_fh_table *t, uint64_t fh, void *old,
		     void *obj, bool *took)
{
	struct fh_ent *e;
	void *got = NULL;

	*took = false;
	pthread_mutex_lock(&t->lock);
	e = find_locked(t, fh);
	if (e && e->obj == old) {
		e->obj = obj;
		*took = true;
	}
	if (e)
		got = t->hold(e->obj);
	pthread_mutex_unlock(&t->lock);
	return got;
}

void *castfs_fh_remove(struct castfs_fh_table *t, uint64_t fh)
{
	struct fh_ent **pp, *e;
	void *obj = NULL;

	pthread_mutex_lock(&t->lock);
	for (pp = bucket(t, fh); (e = *pp); pp = &e->next) {
		if (e->fh == fh) {
			*pp = e->next;
			obj = e->obj;
			free(e);
			break;
		}
	}
	pthread_mutex_unlock(&t->lock);
	return obj;
}
