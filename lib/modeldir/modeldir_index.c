/* SPDX-License-Identifier: MIT */
/*
 * The *.safetensors.index.json of a model-directory view: the weight_map
 * of the converted shards' tensors (bitsandbytes parts included) and the
 * exact metadata.total_size, written as transformers writes an index.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckd.h"
#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)

/* A weight_map entry of the new index. */
struct ix_entry {
	const char *name; /* into a shard header */
	size_t len;
	size_t shard;
};

struct ix {
	const char *js; /* the source index */
	size_t len;
	char **shards; /* source shard names, sorted, unique */
	char **names; /* as the new weight_map writes them */
	struct castfs_header **h;
	size_t nshards;
	struct ix_entry *e;
	size_t ne;
	uint64_t total;
	const struct castfs_md_member
		*meta; /* "metadata" of the source, or NULL */
};

static void ix_fini(struct ix *x)
{
	for (size_t i = 0; i < x->nshards; i++) {
		free(x->shards[i]);
		free(x->names ? x->names[i] : NULL);
		castfs_header_free(x->h ? x->h[i] : NULL);
	}
	free(x->shards);
	free(x->names);
	free(x->h);
	free(x->e);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A plain "*.safetensors" file name next to the index. */
static bool shard_name_ok(const char *s)
{
	size_t n = strlen(s);

	return n > ST_EXT_LEN && n <= 255 && !strchr(s, '/') &&
	       memcmp(s + n - ST_EXT_LEN, st_ext, ST_EXT_LEN) == 0;
}

/* The distinct values of "weight_map", sorted, into x->shards. */
static int ix_collect(struct ix *x, const cJSON *wm, struct castfs_diag *d)
{
	const cJSON *it;
	size_t n = 0, w = 0;

	cJSON_ArrayForEach(it, wm)
		n++;
	x->shards = calloc(n ? n : 1, sizeof(*x->shards));
	if (!x->shards)
		return -ENOMEM;
	cJSON_ArrayForEach(it, wm) {
		if (!cJSON_IsString(it) || !shard_name_ok(it->valuestring))
			return castfs_diag_set(d, -EINVAL,
					       "index: bad shard name for '%s'",
					       it->string);
		x->shards[x->nshards] = strdup(it->valuestring);
		if (!x->shards[x->nshards])
			return -ENOMEM;
		x->nshards++;
	}
	if (n)
		qsort(x->shards, n, sizeof(*x->shards), cmp_str);
	for (size_t i = 0; i < n; i++) {
		if (w && strcmp(x->shards[w - 1], x->shards[i]) == 0)
			free(x->shards[i]);
		else
			x->shards[w++] = x->shards[i];
	}
	x->nshards = w;
	return 0;
}

/* "X.safetensors" as the new index names it. */
static char *ix_out_name(const char *shard, const char *variant)
{
	size_t n = strlen(shard), stem = n - ST_EXT_LEN;
	char *s;

	if (!variant)
		return strdup(shard);
	s = malloc(n + strlen(variant) + 2);
	if (!s)
		return NULL;
	memcpy(s, shard, stem);
	s[stem] = '.';
	strcpy(s + stem + 1, variant);
	strcat(s, st_ext);
	return s;
}

static int ix_add_shard(struct ix *x, size_t i, size_t *cap)
{
	const struct castfs_header *h = x->h[i];

	for (size_t j = 0; j < h->ntensors; j++) {
		const struct castfs_tensor *t = &h->tensors[j];

		if (castfs_ckd_add(&x->total, x->total, t->end - t->begin))
			return -EOVERFLOW;
		if (x->ne == *cap) {
			size_t ncap = *cap ? *cap * 2 : 256;
			struct ix_entry *ne = realloc(x->e, ncap * sizeof(*ne));

			if (!ne)
				return -ENOMEM;
			x->e = ne;
			*cap = ncap;
		}
		x->e[x->ne++] = (struct ix_entry){ t->name, t->name_len, i };
	}
	return 0;
}

/* Every shard's output header, and the entries of the new weight_map. */
static int ix_load(struct ix *x, const char *variant, castfs_md_shard_fn fn,
		   void *ctx)
{
	size_t cap = 0;
	int rc = 0;

	x->names = calloc(x->nshards ? x->nshards : 1, sizeof(*x->names));
	x->h = calloc(x->nshards ? x->nshards : 1, sizeof(*x->h));
	if (!x->names || !x->h)
		return -ENOMEM;
	for (size_t i = 0; !rc && i < x->nshards; i++) {
		x->names[i] = ix_out_name(x->shards[i], variant);
		rc = x->names[i] ? fn(ctx, x->shards[i], &x->h[i]) : -ENOMEM;
		if (!rc)
			rc = ix_add_shard(x, i, &cap);
	}
	return rc;
}

static int cmp_entry(const void *a, const void *b)
{
	const struct ix_entry *x = a, *y = b;
	int c = memcmp(x->name, y->name, x->len < y->len ? x->len : y->len);

	if (c)
		return c;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return (x->shard > y->shard) - (x->shard < y->shard);
}

/* Sorted by name as sort_keys sorts; a name in two shards keeps the
 * first shard's entry (a JSON object cannot hold it twice). */
static void ix_sort(struct ix *x)
{
	size_t w = 0;

	if (x->ne)
		qsort(x->e, x->ne, sizeof(*x->e), cmp_entry);
	for (size_t i = 0; i < x->ne; i++) {
		if (w && x->e[w - 1].len == x->e[i].len &&
		    memcmp(x->e[w - 1].name, x->e[i].name, x->e[i].len) == 0)
			continue;
		x->e[w++] = x->e[i];
	}
	x->ne = w;
}

/* ---- writing ---- */

/* A member of an object being written: verbatim, or made here. */
struct ix_member {
	const char *key; /* the body between the quotes */
	size_t key_len;
	const char *val; /* verbatim value text, or NULL */
	size_t val_len;
	int made; /* when val is NULL: enum ix_made */
};

enum ix_made { IX_META, IX_WMAP, IX_TOTAL };

static int cmp_member(const void *a, const void *b)
{
	const struct ix_member *x = a, *y = b;
	int c = memcmp(x->key, y->key,
		       x->key_len < y->key_len ? x->key_len : y->key_len);

	return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* The members of @o except those named @drop1 and @drop2, with room for
 * two more. */
static int members_of(const char *js, const struct castfs_md_object *o,
		      const char *drop1, const char *drop2,
		      struct ix_member **out, size_t *n)
{
	struct ix_member *m = calloc(o->n + 2, sizeof(*m));

	if (!m)
		return -ENOMEM;
	*n = 0;
	for (size_t i = 0; i < o->n; i++) {
		const struct castfs_md_member *s = &o->m[i];

		if (castfs_md_key_is(js, s, drop1) ||
		    castfs_md_key_is(js, s, drop2))
			continue;
		m[(*n)++] = (struct ix_member){
			js + s->key + 1,
			s->key_len - 2,
			js + s->val,
			s->val_len,
			0,
		};
	}
	*out = m;
	return 0;
}

static void put_weight_map(struct castfs_strbuf *b, const struct ix *x)
{
	if (!x->ne) {
		castfs_sb_puts(b, "{}");
		return;
	}
	castfs_sb_put(b, "{", 1);
	for (size_t i = 0; i < x->ne; i++) {
		castfs_sb_puts(b, i ? ",\n    " : "\n    ");
		castfs_md_put_str(b, x->e[i].name, x->e[i].len);
		castfs_sb_puts(b, ": ");
		castfs_md_put_str(b, x->names[x->e[i].shard],
				  strlen(x->names[x->e[i].shard]));
	}
	castfs_sb_puts(b, "\n  }");
}

static void put_metadata(struct castfs_strbuf *b, const struct ix *x);

/* @m sorted by key, one per line at @lead, the brace at @close. */
static void put_members(struct castfs_strbuf *b, const struct ix *x,
			struct ix_member *m, size_t n, const char *lead,
			const char *close)
{
	qsort(m, n, sizeof(*m), cmp_member);
	castfs_sb_put(b, "{", 1);
	for (size_t i = 0; i < n; i++) {
		castfs_sb_puts(b, i ? "," : "");
		castfs_sb_puts(b, lead);
		castfs_md_put_str(b, m[i].key, m[i].key_len);
		castfs_sb_puts(b, ": ");
		if (m[i].val)
			castfs_sb_put(b, m[i].val, m[i].val_len);
		else if (m[i].made == IX_TOTAL)
			castfs_md_put_u64(b, x->total);
		else if (m[i].made == IX_WMAP)
			put_weight_map(b, x);
		else
			put_metadata(b, x);
	}
	castfs_sb_puts(b, close);
	castfs_sb_put(b, "}", 1);
}

/* "metadata": the source's members (if it was an object) with
 * total_size replaced. */
static void put_metadata(struct castfs_strbuf *b, const struct ix *x)
{
	struct castfs_md_object o = { 0 };
	struct ix_member *m;
	size_t n;

	if (x->meta && x->js[x->meta->val] == '{' &&
	    castfs_md_scan_object(x->js, x->len, x->meta->val, &o) != 0)
		goto out_oom; /* the text was validated: only ENOMEM */
	if (members_of(x->js, &o, "total_size", "total_size", &m, &n))
		goto out_oom;
	m[n++] = (struct ix_member){ "total_size", 10, NULL, 0, IX_TOTAL };
	put_members(b, x, m, n, "\n    ", "\n  ");
	free(m);
	castfs_md_object_fini(&o);
	return;
out_oom:
	castfs_md_object_fini(&o);
	b->oom = true;
}

static int ix_write(struct ix *x, char **out, size_t *out_len)
{
	struct castfs_strbuf b = { 0 };
	struct castfs_md_object top;
	struct ix_member *m;
	size_t n;
	int rc = castfs_md_top_object(x->js, x->len, &top);

	if (rc)
		return rc;
	for (size_t i = 0; i < top.n; i++) {
		if (castfs_md_key_is(x->js, &top.m[i], "metadata"))
			x->meta = &top.m[i];
	}
	rc = members_of(x->js, &top, "metadata", "weight_map", &m, &n);
	if (!rc) {
		m[n++] = (struct ix_member){ "metadata", 8, NULL, 0, IX_META };
		m[n++] = (struct ix_member){ "weight_map", 10, NULL, 0,
					     IX_WMAP };
		put_members(&b, x, m, n, "\n  ", "\n");
		castfs_sb_put(&b, "\n", 1);
		free(m);
		rc = castfs_sb_take(&b, out, out_len);
	}
	x->meta = NULL;
	castfs_md_object_fini(&top);
	return rc;
}

/* Parse x->js and collect its weight_map into @x (ix_fini() frees it,
 * whatever the return). Returns 0 or -EINVAL / -ENOMEM with @d set. */
static int ix_read(struct ix *x, struct castfs_diag *d)
{
	const cJSON *wm;
	cJSON *root;
	int rc = castfs_md_parse(x->js, x->len, &root, d, "index");

	if (rc)
		return rc;
	wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	if (!cJSON_IsObject(wm))
		rc = castfs_diag_set(d, -EINVAL, "index: no weight_map object");
	if (!rc)
		rc = ix_collect(x, wm, d);
	cJSON_Delete(root);
	return rc;
}

int castfs_md_index_rewrite(const char *json, size_t len, const char *variant,
			    castfs_md_shard_fn shard, void *ctx, char **out,
			    size_t *out_len, struct castfs_diag *d)
{
	struct ix x = { .js = json, .len = len };
	int rc = ix_read(&x, d);

	if (!rc)
		rc = ix_load(&x, variant, shard, ctx);
	if (!rc) {
		ix_sort(&x);
		rc = ix_write(&x, out, out_len);
	}
	ix_fini(&x);
	return rc;
}

int castfs_md_index_check(const char *json, size_t len, size_t *longest,
			  struct castfs_diag *d)
{
	struct ix x = { .js = json, .len = len };
	int rc = ix_read(&x, d);
	size_t most = 0;

	for (size_t i = 0; !rc && i < x.nshards; i++) {
		if (strlen(x.shards[i]) > most)
			most = strlen(x.shards[i]);
	}
	if (!rc && longest)
		*longest = most;
	ix_fini(&x);
	return rc;
}
