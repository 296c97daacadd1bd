/* SPDX-License-Identifier: MIT */
/*
 * The shards of a model folder's GGUF file (docs/FORMATS.md "GGUF of
 * model directories"): which files model.safetensors.index.json names, in
 * the order convert_hf_to_gguf.py reads them, and whether the index maps
 * exactly the tensors the shards hold (the script stops otherwise).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)

/* A plain "*.safetensors" file name beside the index: never a path. */
static bool plain_shard(const char *s)
{
	size_t n = strlen(s);

	return n > ST_EXT_LEN && n <= 255 && !strchr(s, '/') &&
	       !memcmp(s + n - ST_EXT_LEN, st_ext, ST_EXT_LEN);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void castfs_md_gguf_shards_free(char **names, size_t n)
{
	if (!names)
		return;
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* The distinct string values of @wm, sorted, into @v (room for all). */
static int collect(const cJSON *wm, char **v, size_t *n, struct castfs_diag *d)
{
	const cJSON *it;
	size_t k = 0, w = 0;

	cJSON_ArrayForEach(it, wm) {
		if (!cJSON_IsString(it) || !plain_shard(it->valuestring))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: the index maps '%s' to "
					       "something other than a "
					       "*.safetensors file beside it",
					       it->string ? it->string : "");
		v[k] = strdup(it->valuestring);
		if (!v[k++])
			return -ENOMEM;
	}
	qsort(v, k, sizeof(*v), by_name);
	for (size_t i = 0; i < k; i++) {
		if (w && !strcmp(v[w - 1], v[i])) {
			free(v[i]);
			continue;
		}
		v[w++] = v[i];
	}
	*n = w;
	return 0;
}

int castfs_md_gguf_shards(const char *json, size_t len, char ***names,
			  size_t *n, struct castfs_diag *d)
{
	const cJSON *wm;
	cJSON *root;
	char **v = NULL;
	size_t k = 0, all = 0;
	int rc = castfs_md_parse(json, len, &root, d, "index");

	if (rc)
		return rc;
	wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	if (!cJSON_IsObject(wm) || !wm->child)
		rc = castfs_diag_set(d, -EINVAL,
				     "GGUF: the index has no weight_map");
	if (!rc) {
		all = (size_t)cJSON_GetArraySize(wm);
		v = calloc(all, sizeof(*v));
	}
	if (!rc && !v)
		rc = -ENOMEM;
	if (!rc)
		rc = collect(wm, v, &k, d);
	cJSON_Delete(root);
	if (rc) {
		/* collect() fails before it sorts: what it kept is a prefix
		 * of @v, the rest NULL */
		castfs_md_gguf_shards_free(v, all);
		return rc;
	}
	*names = v;
	*n = k;
	return 0;
}

/* Whether tensor @name is mapped to shard @k, and which is its shard. */
static int mapped_to(const cJSON *wm, const struct castfs_md_gguf_src *s,
		     size_t k, const char *name, struct castfs_diag *d)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(wm, name);

	if (!cJSON_IsString(v) || strcmp(v->valuestring, s->shards[k]))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tensor '%s' of %s is not mapped "
				       "to it by the index",
				       name, s->shards[k]);
	return 0;
}

int castfs_md_gguf_check_map(const struct castfs_md_gguf_src *s,
			     struct castfs_diag *d)
{
	const cJSON *wm;
	cJSON *root;
	size_t total = 0;
	int rc = castfs_md_parse(s->index, s->index_len, &root, d, "index");

	if (rc)
		return rc;
	wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	for (size_t k = 0; !rc && k < s->nh; k++) {
		const struct castfs_header *h = s->h[k];

		for (size_t i = 0; !rc && i < h->ntensors; i++)
			rc = mapped_to(wm, s, k, h->by_name[i]->name, d);
		total += h->ntensors;
	}
	/* every tensor maps to its shard; a larger map names one more */
	if (!rc && (size_t)cJSON_GetArraySize(wm) != total)
		rc = castfs_diag_set(d, -EINVAL,
				     "GGUF: the index maps %d tensors, the "
				     "shards hold %zu",
				     cJSON_GetArraySize(wm), total);
	cJSON_Delete(root);
	return rc;
}
