/* SPDX-License-Identifier: MIT */
/*
 * The shards of DIR.<q>.gguf of a sharded causal-LM folder (level 5):
 * which files DIR/model.safetensors.index.json names (in the order
 * convert_hf_to_gguf.py reads them), their identities (a pack standing in
 * for a missing shard counts as it, as everywhere), and the checkpoint
 * entries that hold their headers. The node's dep covers every identity,
 * so a changed shard is a new node, never a mix of two versions. The
 * index is parsed once per identity (ns_mdtext.c): every getattr and open
 * of such a name needs its shard names, and an index can be megabytes.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_kind_internal.h"

/* The shard names of one identity of an index, shared by the cache and
 * the lookups using them; freed with the last reference. */
struct ns_shard_names {
	_Atomic size_t refs;
	char **names;
	size_t n;
};

/* The cache's result: the names, or why the index is refused. */
struct shard_ix {
	struct ns_shard_names *sn; /* NULL when refused or not read */
	struct castfs_diag d;
};

static void sn_put(struct ns_shard_names *sn)
{
	if (!sn || atomic_fetch_sub(&sn->refs, 1) != 1)
		return;
	castfs_md_gguf_shards_free(sn->names, sn->n);
	free(sn);
}

static void ix_hold(void *result)
{
	struct shard_ix *r = result;

	if (r->sn)
		atomic_fetch_add(&r->sn->refs, 1);
}

static void ix_release(void *result)
{
	sn_put(((struct shard_ix *)result)->sn);
}

/* ns_mdtext_parse_fn: the shard names of index text @text. */
static int ix_parse(const char *text, size_t len, void *out)
{
	struct shard_ix *r = out;
	struct ns_shard_names *sn = calloc(1, sizeof(*sn));
	int rc;

	if (!sn)
		return -ENOMEM;
	rc = castfs_md_gguf_shards(text, len, &sn->names, &sn->n, &r->d);
	if (!rc && sn->n > CASTFS_PART_MAX)
		rc = castfs_diag_set(&r->d, -EINVAL,
				     "GGUF: the index names %zu shards, more "
				     "than the %u castfs reads",
				     sn->n, CASTFS_PART_MAX);
	if (rc) {
		castfs_md_gguf_shards_free(sn->names, sn->n);
		free(sn);
		return rc;
	}
	atomic_init(&sn->refs, 1); /* the cache entry's */
	r->sn = sn;
	return 0;
}

int ns_gguf_shards_init(struct castfs_ns *ns)
{
	return ns_mdtext_new_owned(sizeof(struct shard_ix), ix_parse, ix_hold,
				   ix_release, &ns->shard_ix);
}

void ns_gguf_shards_cache_fini(struct castfs_ns *ns)
{
	ns_mdtext_free(ns->shard_ix);
	ns->shard_ix = NULL;
}

void ns_gguf_shards_forget(struct castfs_ns *ns, const char *path)
{
	if (ns->shard_ix)
		ns_mdtext_forget(ns->shard_ix, path);
}

/* The identity of shard @path into @st: the file, or the pack that stands
 * in for it (ns_ckpt_valid() reads the same one). */
static int shard_stat(struct castfs_ns *ns, const char *path, struct stat *st)
{
	char *packed = NULL;
	int rc = ns_src_stat_in(ns, path, st);

	if (rc == -ENOENT) {
		rc = ns_packed_find(ns, path, &packed, st);
		free(packed);
	}
	if (!rc && !S_ISREG(st->st_mode))
		rc = -ENOENT;
	return rc;
}

/* The paths and identities of the shards named in @s. */
static int shards_stat(struct castfs_ns *ns, const char *folder,
		       struct ns_gguf_shards *s, struct castfs_diag *d)
{
	int rc = 0;

	s->paths = calloc(s->n, sizeof(*s->paths));
	s->st = calloc(s->n, sizeof(*s->st));
	s->ck = calloc(s->n, sizeof(*s->ck));
	if (!s->paths || !s->st || !s->ck)
		return -ENOMEM;
	for (size_t k = 0; !rc && k < s->n; k++) {
		s->paths[k] =
			ns_path_join(folder, s->names[k], strlen(s->names[k]));
		rc = s->paths[k] ? shard_stat(ns, s->paths[k], &s->st[k]) :
				   -ENOMEM;
		if (rc == -ENOENT)
			rc = castfs_diag_set(d, -ENOENT,
					     "GGUF: shard %s is missing",
					     s->names[k]);
	}
	return rc;
}

int ns_gguf_shards_read(struct castfs_ns *ns, const char *folder,
			const char *index, const struct stat *ist,
			struct ns_gguf_shards *s, struct castfs_diag *d)
{
	struct shard_ix r = { 0 };
	struct stat now;
	int rc;

	memset(s, 0, sizeof(*s));
	/* The index must still be @ist, as when its text was read each
	 * time: a stat, not a read and parse, per lookup. */
	rc = ns_src_stat_in(ns, index, &now);
	if (rc == -ENOENT || rc == -ELOOP || (!rc && !ns_same_file(&now, ist)))
		rc = -ESTALE;
	if (!rc)
		rc = ns_mdtext_get_at(ns, ns->shard_ix, index, ist, &r);
	if (rc && r.d.msg[0] && d)
		*d = r.d;
	s->sn = r.sn;
	if (!rc) {
		s->names = r.sn->names;
		s->n = r.sn->n;
		s->ist = *ist;
		s->index_path = strdup(index);
		rc = s->index_path ? shards_stat(ns, folder, s, d) : -ENOMEM;
	}
	if (rc)
		ns_gguf_shards_fini(ns, s);
	return rc;
}

int ns_gguf_shards_text(struct castfs_ns *ns, struct ns_gguf_shards *s)
{
	if (s->index)
		return 0;
	return ns_src_read_text(ns, s->index_path, &s->ist, NS_TEXT_MAX,
				&s->index, &s->index_len);
}

uint64_t ns_gguf_shards_dep(const struct ns_gguf_shards *s, uint64_t dep)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, &dep, sizeof(dep));

	for (size_t k = 0; k < s->n; k++) {
		const struct stat *st = &s->st[k];

		h = castfs_fnv1a(h, &st->st_dev, sizeof(st->st_dev));
		h = castfs_fnv1a(h, &st->st_ino, sizeof(st->st_ino));
		h = castfs_fnv1a(h, &st->st_size, sizeof(st->st_size));
		h = castfs_fnv1a(h, &st->st_mtim, sizeof(st->st_mtim));
		h = castfs_fnv1a(h, &st->st_ctim, sizeof(st->st_ctim));
		h = castfs_fnv1a(h, s->names[k], strlen(s->names[k]) + 1);
	}
	return castfs_mix64(h) | 1;
}

int ns_gguf_shards_hold(struct castfs_ns *ns, struct ns_gguf_shards *s)
{
	int rc = 0;

	for (size_t k = 0; !rc && k < s->n; k++) {
		struct stat st;

		rc = ns_ckpt_valid(ns, s->paths[k], &st, &s->ck[k]);
		if (!rc && !ns_same_file(&st, &s->st[k]))
			rc = -ESTALE; /* changed since its identity was taken */
	}
	return rc;
}

void ns_gguf_shards_fini(struct castfs_ns *ns, struct ns_gguf_shards *s)
{
	for (size_t k = 0; s->ck && k < s->n; k++)
		ns_ckpt_put(ns, s->ck[k]);
	for (size_t k = 0; s->paths && k < s->n; k++)
		free(s->paths[k]);
	sn_put(s->sn);
	free(s->paths);
	free(s->st);
	free(s->ck);
	free(s->index);
	free(s->index_path);
	memset(s, 0, sizeof(*s));
}
