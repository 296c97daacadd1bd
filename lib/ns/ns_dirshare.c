/* SPDX-License-Identifier: MIT */
/*
 * Directory listings (source directories, model-directory views), made
 * once per directory state and shared by every handle open on it, keyed
 * by node id (issue 17): twenty handles reading a directory of thousands
 * of checkpoints hold one listing, not twenty.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ns/ns.h"
#include "ns/ns_internal.h"

/* The listing @dir of directory @id, freed with the last handle holding
 * it. Unlinked (@linked false) once the directory may list something
 * else: the handles holding it keep it, so that their offsets stay valid,
 * and the next open lists again. */
struct ns_dirshare {
	struct ns_dirshare *next;
	struct ns_dirshares *tab;
	struct castfs_dir *dir;
	uint64_t id;
	/* The directory's change and modification times when listed: a
	 * change the watcher has not reported yet (or never will, a watch
	 * it could not add) still shows, as it does to the kernel, which
	 * checks the mtime at the start of each listing. */
	struct timespec ctim, mtim;
	size_t cost;
	bool linked;
};

/* Listings held by open handles: few (one per directory open now), so a
 * list. */
struct ns_dirshares {
	struct castfs_ns *ns;
	pthread_mutex_t lock; /* the list, and every kept listing's refs */
	struct ns_dirshare *head;
	/* Bumped by every drop: a listing made across one is not kept, as it
	 * may predate the change the drop was for. */
	uint64_t gen;
};

int ns_dirshares_init(struct castfs_ns *ns)
{
	struct ns_dirshares *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->ns = ns;
	pthread_mutex_init(&t->lock, NULL);
	ns->dirshares = t;
	return 0;
}

void ns_dirshares_fini(struct castfs_ns *ns)
{
	struct ns_dirshares *t = ns->dirshares;

	if (!t)
		return;
	/* Handles are closed before the namespace is freed. */
	assert(!t->head);
	pthread_mutex_destroy(&t->lock);
	free(t);
	ns->dirshares = NULL;
}

static struct ns_dirshare **find_locked(struct ns_dirshares *t, uint64_t id)
{
	struct ns_dirshare **p = &t->head;

	while (*p && (*p)->id != id)
		p = &(*p)->next;
	return p;
}

static size_t dir_cost(const struct castfs_dir *dir)
{
	size_t cost = sizeof(*dir) + sizeof(struct ns_dirshare);

	for (size_t i = 0; i < dir->n; i++)
		cost += sizeof(dir->ents[i]) + strlen(dir->ents[i].name) + 1;
	return cost;
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Whether @s was listed at the directory times of @st. */
static bool same_state(const struct ns_dirshare *s, const struct stat *st)
{
	return same_time(&s->ctim, &st->st_ctim) &&
	       same_time(&s->mtim, &st->st_mtim);
}

/* Unlink @s; caller holds the table's lock. */
static void unlink_locked(struct ns_dirshares *t, struct ns_dirshare *s)
{
	struct ns_dirshare **p = &t->head;

	while (*p != s)
		p = &(*p)->next;
	*p = s->next;
	s->linked = false;
}

/* The kept listing of @id with one more owner, or NULL (none, or one
 * from before the directory's times @st moved); *@gen the table's
 * generation, to pass to keep(). */
static struct castfs_dir *find(struct ns_dirshares *t, uint64_t id,
			       const struct stat *st, uint64_t *gen)
{
	struct castfs_dir *dir = NULL;
	struct ns_dirshare *s;

	pthread_mutex_lock(&t->lock);
	s = *find_locked(t, id);
	if (s && !same_state(s, st)) {
		unlink_locked(t, s);
		t->gen++;
		s = NULL;
	}
	if (s) {
		s->dir->refs++;
		dir = s->dir;
	}
	*gen = t->gen;
	pthread_mutex_unlock(&t->lock);
	return dir;
}

/* Keep @dir, made while the table was at @gen and the directory's times
 * at @st, for the next opens of @id, or drop it for the one kept
 * meanwhile of the same state. Returns the listing to hand out;
 * @dir unkept (no memory, or a drop since @gen) is the caller's alone. */
static struct castfs_dir *keep(struct ns_dirshares *t, uint64_t id,
			       const struct stat *st, uint64_t gen,
			       struct castfs_dir *dir)
{
	struct ns_dirshare *s = calloc(1, sizeof(*s)), **p;
	struct castfs_dir *have = NULL;
	size_t cost = dir_cost(dir);

	if (!s)
		return dir;
	s->tab = t;
	s->dir = dir;
	s->id = id;
	s->ctim = st->st_ctim;
	s->mtim = st->st_mtim;
	s->cost = cost;
	s->linked = true;
	pthread_mutex_lock(&t->lock);
	p = find_locked(t, id);
	/* One kept meanwhile of another directory state: neither is
	 * given the other's opens. */
	if (*p && same_state(*p, st)) {
		have = (*p)->dir;
		have->refs++;
	} else if (!*p && t->gen == gen) {
		dir->share = s;
		*p = s;
		s = NULL;
	}
	pthread_mutex_unlock(&t->lock);
	if (have) {
		free(s);
		castfs_dir_free(dir);
		return have;
	}
	if (s) {
		free(s);
		return dir;
	}
	/* Counted as the checkpoint cache's: past its budget, the cache's
	 * next trim (at its next charge) evicts checkpoints nothing uses to
	 * make room for it. */
	atomic_fetch_add(&t->ns->ck_bytes, cost);
	return dir;
}

int ns_dirshare_open(struct castfs_ns *ns, const struct ns_node *n,
		     const struct stat *st,
		     int (*list)(struct castfs_ns *ns,
				 const struct ns_node *dir, struct ns_list *l),
		     struct castfs_dir **out)
{
	struct ns_dirshares *t = ns->dirshares;
	struct castfs_dir *dir;
	uint64_t gen;
	int rc;

	/* Without the watcher's word no listing can be known current. */
	if (!t || !ns->listing_changed)
		return ns_list_dir(ns, n, list, out);
	dir = find(t, n->id, st, &gen);
	if (dir) {
		*out = dir;
		return 0;
	}
	rc = ns_list_dir(ns, n, list, &dir);
	if (!rc)
		*out = keep(t, n->id, st, gen, dir);
	return rc;
}

void ns_dirshare_drop(struct castfs_ns *ns, uint64_t id, bool all)
{
	struct ns_dirshares *t = ns->dirshares;
	struct ns_dirshare *s;

	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->gen++;
	while ((s = all ? t->head : *find_locked(t, id)))
		unlink_locked(t, s);
	pthread_mutex_unlock(&t->lock);
}

bool ns_dirshare_release(struct castfs_dir *dir)
{
	struct ns_dirshare *s = dir->share;
	struct ns_dirshares *t = s->tab;
	bool last;

	pthread_mutex_lock(&t->lock);
	last = dir->refs-- == 0;
	if (last && s->linked)
		unlink_locked(t, s);
	pthread_mutex_unlock(&t->lock);
	if (!last)
		return false;
	atomic_fetch_sub(&t->ns->ck_bytes, s->cost);
	free(s);
	return true;
}
