/* SPDX-License-Identifier: MIT */
/*
 * The shards of DIR.<q>.gguf of a sharded causal-LM folder (level 5):
 * which files DIR/model.safetensors.index.json names (in the order
 * convert_hf_to_gguf.py reads them), their identities (a pack standing in
 * for a missing shard counts as it, as everywhere), and the checkpoint
 * entries that hold their headers. The node's dep covers every identity,
 * so a changed shard is a new node, never a mix of two versions.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_kind_internal.h"

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

/* The shard names of the index text in @s, their paths and identities. */
static int shards_stat(struct castfs_ns *ns, const char *folder,
		       struct ns_gguf_shards *s, struct castfs_diag *d)
{
	int rc = castfs_md_gguf_shards(s->index, s->index_len, &s->names, &s->n,
				       d);

	if (rc)
		return rc;
	if (s->n > CASTFS_PART_MAX)
		return castfs_diag_set(d, -EINVAL, "GGUF: %zu shards", s->n);
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
	int rc;

	memset(s, 0, sizeof(*s));
	rc = ns_src_read_text(ns, index, ist, NS_TEXT_MAX, &s->index,
			      &s->index_len);
	if (!rc)
		rc = shards_stat(ns, folder, s, d);
	if (rc)
		ns_gguf_shards_fini(ns, s);
	return rc;
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
	castfs_md_gguf_shards_free(s->names, s->n);
	free(s->paths);
	free(s->st);
	free(s->ck);
	free(s->index);
	memset(s, 0, sizeof(*s));
}
