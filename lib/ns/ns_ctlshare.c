/* SPDX-License-Identifier: MIT */
/*
 * The control files that walk the source tree (/.castfs/rejected,
 * /.castfs/refused), made once per state and shared by every open until
 * what they show may have changed (issue 17): twenty opens of a listing of
 * thousands of rejected files are one walk and one copy, not twenty.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ns/ns_kind_internal.h"

/* A source directory a walk read, as it was then. */
struct ns_ctldir {
	char *path;
	dev_t dev;
	ino_t ino;
	struct timespec ctim, mtim;
};

/* The text kept for one control file, and what it was made from. */
struct ns_ctlkept {
	pthread_mutex_t lock; /* held across a check and a make */
	struct ns_memshare *m; /* NULL: none kept */
	struct ns_ctlstamp stamp;
};

struct ns_ctlshares {
	struct ns_ctlkept slot[NS_CTLSHARE_SLOTS];
};

static void stamp_fini(struct ns_ctlstamp *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->dirs[i].path);
	free(s->dirs);
	memset(s, 0, sizeof(*s));
}

void ns_ctlstamp_dir(struct ns_ctlstamp *s, const char *path,
		     const struct stat *st)
{
	struct ns_ctldir *d;

	if (s->n == s->cap) {
		size_t cap = s->cap * 2 + 16;

		d = realloc(s->dirs, cap * sizeof(*d));
		if (!d) {
			s->broken = true;
			return;
		}
		s->dirs = d;
		s->cap = cap;
	}
	d = &s->dirs[s->n];
	d->path = strdup(path);
	if (!d->path) {
		s->broken = true;
		return;
	}
	d->dev = st->st_dev;
	d->ino = st->st_ino;
	d->ctim = st->st_ctim;
	d->mtim = st->st_mtim;
	s->n++;
}

void ns_ctlstamp_cache(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	s->ck_gen = atomic_load(&ns->ctl_ck_gen);
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Whether directory @d is still as the walk read it: a name added,
 * removed or renamed there moves its times even before the watcher's
 * event for it arrives (or when the watcher has no watch on it). */
static bool dir_current(struct castfs_ns *ns, const struct ns_ctldir *d)
{
	struct stat st;

	return ns_src_stat(ns, d->path, &st) == 0 && st.st_dev == d->dev &&
	       st.st_ino == d->ino && same_time(&st.st_ctim, &d->ctim) &&
	       same_time(&st.st_mtim, &d->mtim);
}

/* Whether a text made at @s would be made the same now. */
static bool stamp_current(struct castfs_ns *ns, const struct ns_ctlstamp *s)
{
	if (s->broken || s->src_gen != atomic_load(&ns->ctl_src_gen) ||
	    s->ck_gen != atomic_load(&ns->ctl_ck_gen))
		return false;
	for (size_t i = 0; i < s->n; i++) {
		if (!dir_current(ns, &s->dirs[i]))
			return false;
	}
	return true;
}

/* @text (freed) as shared bytes with one trailing newline, so that `cat`
 * leaves the prompt alone. */
static int text_share(struct castfs_ns *ns, char *text,
		      struct ns_memshare **out)
{
	size_t len;
	char *buf;
	int rc;

	if (!text)
		return -ENOMEM;
	len = strlen(text);
	buf = realloc(text, len + 2);
	if (!buf) {
		free(text);
		return -ENOMEM;
	}
	if (!len || buf[len - 1] != '\n')
		buf[len++] = '\n';
	rc = ns_memshare_new(ns, buf, len, out);
	free(buf);
	return rc;
}

/* Walks made again when the source changed during one. */
#define CTL_REMAKE_TRIES 3

/* Make @k's text now; kept for the next opens if the source's reported
 * changes allow it. Caller holds k->lock. */
static int remake(struct castfs_ns *ns, struct ns_ctlkept *k,
		  ns_ctl_make_fn make)
{
	struct ns_ctlstamp s = { 0 };
	struct ns_memshare *m;
	int rc;

	for (int tries = 0;; tries++) {
		/* Before the walk: a change reported during it may have
		 * been missed by it. The cache's count is the maker's to
		 * stamp, after its walk (ns_ctlstamp_cache()): the walk
		 * itself teaches the cache what it finds. */
		s.src_gen = atomic_load(&ns->ctl_src_gen);
		rc = text_share(ns, make(ns, &s), &m);
		if (rc) {
			stamp_fini(&s);
			return rc;
		}
		/* A change reported meanwhile drops the cache entries of
		 * its files (the count moves first), so an entry the walk
		 * had just made may be missing from the text: walk again,
		 * a few times at most while the source keeps changing. */
		if (s.src_gen == atomic_load(&ns->ctl_src_gen) ||
		    tries == CTL_REMAKE_TRIES)
			break;
		ns_memshare_put(ns, m);
		stamp_fini(&s);
	}
	ns_memshare_put(ns, k->m); /* the handles holding it keep it */
	stamp_fini(&k->stamp);
	k->m = m;
	k->stamp = s;
	return 0;
}

int ns_ctlshare_open(struct castfs_ns *ns, int slot, ns_ctl_make_fn make,
		     struct castfs_file **out)
{
	struct ns_ctlshares *t = ns->ctlshares;
	struct ns_ctlkept *k;
	int rc = 0;

	/* Without the watcher's word no text can be known current. */
	if (slot < 0 || slot >= NS_CTLSHARE_SLOTS || !t ||
	    !ns->listing_changed) {
		struct ns_ctlstamp s = { 0 };
		struct ns_memshare *m;

		rc = text_share(ns, make(ns, &s), &m);
		stamp_fini(&s);
		if (!rc)
			rc = ns_file_new_shared(ns, m, out);
		ns_memshare_put(ns, m);
		return rc;
	}
	k = &t->slot[slot];
	pthread_mutex_lock(&k->lock);
	if (!k->m || !stamp_current(ns, &k->stamp))
		rc = remake(ns, k, make);
	if (!rc)
		rc = ns_file_new_shared(ns, k->m, out);
	pthread_mutex_unlock(&k->lock);
	return rc;
}

int ns_ctlshares_init(struct castfs_ns *ns)
{
	struct ns_ctlshares *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < NS_CTLSHARE_SLOTS; i++)
		pthread_mutex_init(&t->slot[i].lock, NULL);
	ns->ctlshares = t;
	return 0;
}

void ns_ctlshares_fini(struct castfs_ns *ns)
{
	struct ns_ctlshares *t = ns->ctlshares;

	if (!t)
		return;
	for (size_t i = 0; i < NS_CTLSHARE_SLOTS; i++) {
		ns_memshare_put(ns, t->slot[i].m);
		stamp_fini(&t->slot[i].stamp);
		pthread_mutex_destroy(&t->slot[i].lock);
	}
	free(t);
	ns->ctlshares = NULL;
}
