// SPDX-License-Identifier: MIT
/*
 * Model-directory views: the parsed config.json of each source directory,
 * read and parsed once per identity of the file (a 50 MB config.json was
 * read and parsed again by every listing of its parent and every stat of
 * a bitsandbytes shard).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"

#define CONF_BUCKETS 256u
/* Entries kept at most; past it the cache starts again empty, so that
 * memory stays bounded whatever the tree holds. */
#define CONF_MAX 4096u

struct conf_entry {
	struct conf_entry *next;
	char *path; /* of the config.json */
	struct stat ident;
	int err; /* of the read or parse: kept only if not transient */
	struct castfs_md_config c;
};

struct ns_mdconf {
	pthread_mutex_t lock;
	size_t n;
	struct conf_entry *b[CONF_BUCKETS];
};

static struct conf_entry **conf_bucket(struct ns_mdconf *c, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return &c->b[castfs_mix64(h) % CONF_BUCKETS];
}

static void conf_clear_locked(struct ns_mdconf *c)
{
	for (size_t i = 0; i < CONF_BUCKETS; i++) {
		while (c->b[i]) {
			struct conf_entry *e = c->b[i];

			c->b[i] = e->next;
			free(e->path);
			free(e);
		}
	}
	c->n = 0;
}

int ns_md_conf_new(struct ns_mdconf **out)
{
	struct ns_mdconf *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

void ns_md_conf_free(struct ns_mdconf *c)
{
	if (!c)
		return;
	conf_clear_locked(c);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Caller holds the lock. The entry of @path if it is still @st. */
static struct conf_entry *
conf_find_locked(struct ns_mdconf *c, const char *path, const struct stat *st)
{
	for (struct conf_entry *e = *conf_bucket(c, path); e; e = e->next) {
		if (strcmp(e->path, path) == 0 && ns_same_file(&e->ident, st))
			return e;
	}
	return NULL;
}

/* Caller holds the lock. Keep @e (taken), replacing older identities. */
static void conf_insert_locked(struct ns_mdconf *c, struct conf_entry *e)
{
	struct conf_entry **pp = conf_bucket(c, e->path), *o;

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
	if (c->n >= CONF_MAX)
		conf_clear_locked(c);
	pp = conf_bucket(c, e->path);
	e->next = *pp;
	*pp = e;
	c->n++;
}

/* Read and parse @path (identity @st) into a new entry; NULL on ENOMEM. */
static struct conf_entry *conf_load(struct castfs_ns *ns, const char *path,
				    const struct stat *st)
{
	struct conf_entry *e = calloc(1, sizeof(*e));
	char *text = NULL;
	size_t len;

	if (!e || !(e->path = strdup(path))) {
		free(e);
		return NULL;
	}
	e->ident = *st;
	e->err = ns_md_read(ns, path, st, &text, &len);
	if (!e->err)
		e->err = castfs_md_config_read(text, len, &e->c, NULL);
	free(text);
	return e;
}

int ns_md_config_get(struct castfs_ns *ns, struct ns_mdconf *c, const char *dir,
		     struct castfs_md_config *out)
{
	char *path = ns_path_join(dir, "config.json", 11);
	struct conf_entry *e;
	struct stat st;
	int rc = path ? ns_src_stat_in(ns, path, &st) : -ENOMEM;

	if (rc)
		goto out_free;
	pthread_mutex_lock(&c->lock);
	e = conf_find_locked(c, path, &st);
	rc = e ? e->err : 0;
	if (e && !rc)
		*out = e->c;
	pthread_mutex_unlock(&c->lock);
	if (e)
		goto out_free;
	/* Read outside the lock: other directories need not wait. */
	e = conf_load(ns, path, &st);
	if (!e) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = e->err;
	if (!rc)
		*out = e->c;
	pthread_mutex_lock(&c->lock);
	if (ns_err_transient(rc)) {
		free(e->path);
		free(e);
	} else {
		conf_insert_locked(c, e);
	}
	pthread_mutex_unlock(&c->lock);
out_free:
	free(path);
	return rc;
}

void ns_md_conf_forget(struct ns_mdconf *c, const char *dir)
{
	char *path = ns_path_join(dir, "config.json", 11);
	struct conf_entry **pp, *e;

	if (!path)
		return;
	pthread_mutex_lock(&c->lock);
	pp = conf_bucket(c, path);
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
	free(path);
}
