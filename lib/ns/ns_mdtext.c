// SPDX-License-Identifier: MIT
/*
 * A small source text (config.json, an index) read and parsed once per
 * identity of the file, its result kept by path and identity. A listing
 * asks for every model directory it shows, and every checkpoint parse for
 * its directory's quantization_config, so without it a 50 MB config.json
 * was read and parsed by every listing of its parent and every shard. The
 * checkpoint cache's quantization_config cache (ns_ckpt.c) and those of
 * ns_mdconfig.c, ns_mdindex.c and ns_mdgguf_shards.c are instances.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "ns/ns_src_internal.h"

#define TEXT_BUCKETS 256u
/* Entries kept at most; past it the cache starts again empty, so that
 * memory stays bounded whatever the tree holds. */
#define TEXT_MAX 4096u

struct text_entry {
	struct text_entry *next;
	char *path;
	struct stat ident;
	int err; /* of the read or parse: kept only if not transient */
	max_align_t result[]; /* the parse's output, c->size bytes */
};

struct ns_mdtext {
	pthread_mutex_t lock;
	size_t n;
	size_t size;
	ns_mdtext_parse_fn parse;
	ns_mdtext_ref_fn hold, release; /* NULL: results own nothing */
	struct text_entry *b[TEXT_BUCKETS];
};

static struct text_entry **text_bucket(struct ns_mdtext *c, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return &c->b[castfs_mix64(h) % TEXT_BUCKETS];
}

static void entry_free(struct ns_mdtext *c, struct text_entry *e)
{
	if (c->release)
		c->release(e->result);
	free(e->path);
	free(e);
}

static void text_clear_locked(struct ns_mdtext *c)
{
	for (size_t i = 0; i < TEXT_BUCKETS; i++) {
		while (c->b[i]) {
			struct text_entry *e = c->b[i];

			c->b[i] = e->next;
			entry_free(c, e);
		}
	}
	c->n = 0;
}

int ns_mdtext_new(size_t size, ns_mdtext_parse_fn parse, struct ns_mdtext **out)
{
	return ns_mdtext_new_owned(size, parse, NULL, NULL, out);
}

int ns_mdtext_new_owned(size_t size, ns_mdtext_parse_fn parse,
			ns_mdtext_ref_fn hold, ns_mdtext_ref_fn release,
			struct ns_mdtext **out)
{
	struct ns_mdtext *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	c->size = size;
	c->parse = parse;
	c->hold = hold;
	c->release = release;
	*out = c;
	return 0;
}

void ns_mdtext_free(struct ns_mdtext *c)
{
	if (!c)
		return;
	text_clear_locked(c);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Caller holds the lock. The entry of @path if it is still @st. */
static struct text_entry *
text_find_locked(struct ns_mdtext *c, const char *path, const struct stat *st)
{
	for (struct text_entry *e = *text_bucket(c, path); e; e = e->next) {
		if (strcmp(e->path, path) == 0 && ns_same_file(&e->ident, st))
			return e;
	}
	return NULL;
}

/* Caller holds the lock. Drop every entry of @path. */
static void text_drop_locked(struct ns_mdtext *c, const char *path)
{
	struct text_entry **pp = text_bucket(c, path), *o;

	while ((o = *pp)) {
		if (strcmp(o->path, path) == 0) {
			*pp = o->next;
			entry_free(c, o);
			c->n--;
			continue;
		}
		pp = &o->next;
	}
}

/* Caller holds the lock. Keep @e (taken), replacing older identities. */
static void text_insert_locked(struct ns_mdtext *c, struct text_entry *e)
{
	struct text_entry **pp;

	text_drop_locked(c, e->path);
	if (c->n >= TEXT_MAX)
		text_clear_locked(c);
	pp = text_bucket(c, e->path);
	e->next = *pp;
	*pp = e;
	c->n++;
}

/* Read and parse @path (identity @st) into a new entry; NULL on ENOMEM. */
static struct text_entry *text_load(struct castfs_ns *ns, struct ns_mdtext *c,
				    const char *path, const struct stat *st)
{
	struct text_entry *e = calloc(1, sizeof(*e) + c->size);
	char *text = NULL;
	size_t len;

	if (!e || !(e->path = strdup(path))) {
		free(e);
		return NULL;
	}
	e->ident = *st;
	e->err = ns_src_read_text(ns, path, st, NS_TEXT_MAX, &text, &len);
	if (!e->err)
		e->err = c->parse(text, len, e->result);
	free(text);
	return e;
}

/* Caller holds the lock. Copy @e's result to @out, for the caller. */
static int text_copy_locked(struct ns_mdtext *c, struct text_entry *e,
			    void *out)
{
	memcpy(out, e->result, c->size);
	if (c->hold)
		c->hold(out);
	return e->err;
}

int ns_mdtext_get(struct castfs_ns *ns, struct ns_mdtext *c, const char *path,
		  void *out)
{
	struct stat st;
	int rc = ns_src_stat_in(ns, path, &st);

	return rc ? rc : ns_mdtext_get_at(ns, c, path, &st, out);
}

int ns_mdtext_get_at(struct castfs_ns *ns, struct ns_mdtext *c,
		     const char *path, const struct stat *st, void *out)
{
	struct text_entry *e;
	int rc = 0;

	pthread_mutex_lock(&c->lock);
	e = text_find_locked(c, path, st);
	if (e)
		rc = text_copy_locked(c, e, out);
	pthread_mutex_unlock(&c->lock);
	if (e)
		return rc;
	/* Read outside the lock: other directories need not wait. */
	e = text_load(ns, c, path, st);
	if (!e)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	rc = text_copy_locked(c, e, out);
	if (ns_err_transient(rc))
		entry_free(c, e);
	else
		text_insert_locked(c, e);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

void ns_mdtext_forget(struct ns_mdtext *c, const char *path)
{
	pthread_mutex_lock(&c->lock);
	text_drop_locked(c, path);
	pthread_mutex_unlock(&c->lock);
}
