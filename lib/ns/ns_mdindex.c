// SPDX-License-Identifier: MIT
/*
 * Model-directory views: whether each *.safetensors.index*.json has a
 * shape castfs rewrites, checked once per identity of the file. A listing
 * asks for every model directory it shows, so that an index castfs would
 * refuse at open (a shard named by a path, "../x" or "/x") makes no
 * DIR.<view>/ name instead of a name that then fails.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"

#define IXC_BUCKETS 256u
/* Entries kept at most; past it the cache starts again empty, so that
 * memory stays bounded whatever the tree holds. */
#define IXC_MAX 4096u

struct ixc_entry {
	struct ixc_entry *next;
	char *path; /* of the index */
	struct stat ident;
	int err; /* of the read or check: kept only if not transient */
	struct castfs_diag why; /* of a refusal */
};

struct ns_mdixc {
	pthread_mutex_t lock;
	size_t n;
	struct ixc_entry *b[IXC_BUCKETS];
};

static struct ixc_entry **ixc_bucket(struct ns_mdixc *c, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return &c->b[castfs_mix64(h) % IXC_BUCKETS];
}

static void ixc_clear_locked(struct ns_mdixc *c)
{
	for (size_t i = 0; i < IXC_BUCKETS; i++) {
		while (c->b[i]) {
			struct ixc_entry *e = c->b[i];

			c->b[i] = e->next;
			free(e->path);
			free(e);
		}
	}
	c->n = 0;
}

int ns_md_ixc_new(struct ns_mdixc **out)
{
	struct ns_mdixc *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

void ns_md_ixc_free(struct ns_mdixc *c)
{
	if (!c)
		return;
	ixc_clear_locked(c);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Caller holds the lock. The entry of @path if it is still @st. */
static struct ixc_entry *ixc_find_locked(struct ns_mdixc *c, const char *path,
					 const struct stat *st)
{
	for (struct ixc_entry *e = *ixc_bucket(c, path); e; e = e->next) {
		if (strcmp(e->path, path) == 0 && ns_same_file(&e->ident, st))
			return e;
	}
	return NULL;
}

/* Caller holds the lock. Keep @e (taken), replacing older identities. */
static void ixc_insert_locked(struct ns_mdixc *c, struct ixc_entry *e)
{
	struct ixc_entry **pp = ixc_bucket(c, e->path), *o;

	while ((o = *pp)) {
		if (strcmp(o->path, e->path) == 0) {
			*pp = o->next;
			free(o->path);
			free(o);
			c->n--;
			continue;
		}
		pp = &o->next;
	}
	if (c->n >= IXC_MAX)
		ixc_clear_locked(c);
	pp = ixc_bucket(c, e->path);
	e->next = *pp;
	*pp = e;
	c->n++;
}

/* Read and check @path (identity @st) into a new entry; NULL on ENOMEM. */
static struct ixc_entry *ixc_load(struct castfs_ns *ns, const char *path,
				  const struct stat *st)
{
	struct ixc_entry *e = calloc(1, sizeof(*e));
	char *text = NULL;
	size_t len;

	if (!e || !(e->path = strdup(path))) {
		free(e);
		return NULL;
	}
	e->ident = *st;
	e->err = ns_md_read(ns, path, st, &text, &len);
	if (!e->err)
		e->err = castfs_md_index_check(text, len, &e->why);
	free(text);
	return e;
}

/* The result of entry @e into the caller's @why (@len bytes). */
static int ixc_result(const struct ixc_entry *e, char *why, size_t len)
{
	if (e->err && why && len)
		snprintf(why, len, "%s", e->why.msg);
	return e->err;
}

void ns_md_ixc_forget(struct ns_mdixc *c, const char *path)
{
	struct ixc_entry **pp, *e;

	pthread_mutex_lock(&c->lock);
	pp = ixc_bucket(c, path);
	while ((e = *pp)) {
		if (strcmp(e->path, path) == 0) {
			*pp = e->next;
			free(e->path);
			free(e);
			c->n--;
			continue;
		}
		pp = &e->next;
	}
	pthread_mutex_unlock(&c->lock);
}

int ns_md_ixc_check(struct castfs_ns *ns, struct ns_mdixc *c, const char *path,
		    char *why, size_t len)
{
	struct ixc_entry *e;
	struct stat st;
	int rc = ns_src_stat_in(ns, path, &st);

	if (rc)
		return rc;
	pthread_mutex_lock(&c->lock);
	e = ixc_find_locked(c, path, &st);
	if (e)
		rc = ixc_result(e, why, len);
	pthread_mutex_unlock(&c->lock);
	if (e)
		return rc;
	/* Read outside the lock: other directories need not wait. */
	e = ixc_load(ns, path, &st);
	if (!e)
		return -ENOMEM;
	rc = ixc_result(e, why, len);
	pthread_mutex_lock(&c->lock);
	if (ns_err_transient(rc)) {
		free(e->path);
		free(e);
	} else {
		ixc_insert_locked(c, e);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}
