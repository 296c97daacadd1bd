/* SPDX-License-Identifier: MIT */
/*
 * DIR.<view>/ files of a shard whose quantized modules cross shards (FP8
 * block scales, compressed-tensors FP4/int4 companions), and nvfp4 files
 * of a model whose fused groups a shard boundary may cut (level 5): the
 * folder's index names every shard; each is held under
 * the usual identity rules, the shard's composite header
 * (view/qsrc_xshard.h) is planned once per identity of every shard and
 * cached in the shard's checkpoint entry, and an open file reads every
 * shard as a part of one composite source (ns_file_new_parts()). What
 * every shard's nvfp4 plan reads of the whole model (struct ns_md_fuse)
 * is built once per identity of the shards, in the first shard's entry;
 * it borrows nothing from the other shards' entries, which come and go
 * under it (the kernel forgets a shard; it is parsed again, same
 * identity).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_modeldir_internal.h"
#include "view/qsrc.h"
#include "view/qsrc_xshard.h"

/* The index of sharded weights: the one whose shards a view reads. */
static const char index_name[] = "model.safetensors.index.json";

/* Whole-model parts kept per first shard; beyond, built per plan (a
 * folder whose other shards keep changing must not grow it forever). */
#define FUSE_ENTS_MAX 4

static void fuse_free(struct ns_md_fuse *f)
{
	if (!f)
		return;
	castfs_view_deqfuse_free(f->deq);
	castfs_header_free(f->all);
	free(f);
}

/* Registered as the checkpoint cache's fini of NS_CKPT_XFUSE. */
static void fuse_ents_fini(struct ns_ckpt *ck)
{
	struct ns_md_fuse *f;

	while ((f = ck->slot[NS_CKPT_XFUSE])) {
		ck->slot[NS_CKPT_XFUSE] = f->next;
		fuse_free(f);
	}
}

void ns_md_xshard_init(struct castfs_ns *ns)
{
	ns->ckpt_fini[NS_CKPT_XFUSE] = fuse_ents_fini;
}

/* Read the index of @ck's folder into @x->s; @x->self is @ck's shard. */
static int xs_read(struct castfs_ns *ns, const struct ns_ckpt *ck,
		   struct ns_md_xshard *x)
{
	char *folder = ns_parent_path(ck->path);
	char *index = folder ? ns_path_join(folder, index_name,
					    sizeof(index_name) - 1) :
			       NULL;
	struct stat ist;
	int rc = index ? ns_src_stat_in(ns, index, &ist) : -ENOMEM;

	if (!rc)
		rc = ns_gguf_shards_read(ns, folder, index, &ist, &x->s, NULL);
	free(index);
	free(folder);
	if (rc)
		return rc;
	for (x->self = 0; x->self < x->s.n; x->self++) {
		const struct stat *st = &x->s.st[x->self];

		if (st->st_dev == ck->dev && st->st_ino == ck->ino)
			return 0;
	}
	/* Named, but another file is there now: a shard being replaced.
	 * Not "a file no index names" (its view alone, without the other
	 * shards' fused siblings), which a bug hunt saw a lookup take in
	 * the middle of a swap and serve for good after it (nvfp4). */
	for (size_t k = 0; k < x->s.n; k++) {
		if (strcmp(x->s.paths[k], ck->path) == 0)
			return -ESTALE;
	}
	return -ENOENT; /* the index does not name this shard */
}

/* The composite of the shards' headers in @x: of shard @x->self, or of
 * them all (@all). Returns 0, -ENOENT (a shard rejected), -ENOMEM or the
 * composite's error. */
static int xs_compose(const struct ns_md_xshard *x, bool all,
		      struct castfs_header **out)
{
	const struct castfs_header **hs = calloc(x->s.n, sizeof(*hs));
	int rc = hs ? 0 : -ENOMEM;

	for (size_t j = 0; !rc && j < x->s.n; j++) {
		hs[j] = x->s.ck[j]->h;
		if (!hs[j])
			rc = -ENOENT;
	}
	if (!rc)
		rc = all ? castfs_qsrc_xshard_all(hs, x->s.n, out) :
			   castfs_qsrc_xshard(hs, x->s.n, x->self, out, NULL);
	free(hs);
	return rc;
}

/* The entry of @dep in @ck (under ck->lock) and the number of entries. */
static struct ns_md_fuse *fuse_find(struct ns_ckpt *ck, uint64_t dep, size_t *n)
{
	struct ns_md_fuse *f;

	*n = 0;
	for (f = ck->slot[NS_CKPT_XFUSE]; f; f = f->next, (*n)++)
		if (f->dep == dep)
			return f;
	return NULL;
}

/* Build the whole-model parts of the shards in @x for nvfp4 view @v. */
static int fuse_build(struct castfs_ns *ns, const struct ns_md_xshard *x,
		      const struct castfs_view *v, uint64_t dep,
		      struct ns_md_fuse **out)
{
	struct ns_md_fuse *f = calloc(1, sizeof(*f));
	struct castfs_qsrc_opts o;
	struct castfs_view fv = *v;
	int rc = f ? xs_compose(x, true, &f->all) : -ENOMEM;

	if (!rc) {
		fv.fuse_h = f->all;
		fv.deqfuse = NULL;
		rc = castfs_view_deqfuse_new(&fv, ns_ckpt_qopts(x->s.ck[0], &o),
					     &f->deq, NULL);
	}
	if (rc) {
		fuse_free(f);
		return rc;
	}
	f->dep = dep;
	castfs_stats_count(ns->stats, CASTFS_SCTR_XFUSE_BUILT, 1);
	*out = f;
	return 0;
}

/* The bytes @f holds: the records of every shard's tensors, the copies
 * of their names and shapes (bounded by the shards' header text) and the
 * bf16 plan. */
static size_t fuse_cost(const struct ns_md_xshard *x,
			const struct ns_md_fuse *f)
{
	size_t cost = f->all->ntensors *
		      (sizeof(*f->all->tensors) + sizeof(*f->all->by_name));

	for (size_t j = 0; j < x->s.n; j++)
		cost += (size_t)x->s.ck[j]->h->header_len;
	if (f->deq)
		cost += ns_ckpt_plan_cost(castfs_view_deqfuse_plan(f->deq));
	return cost;
}

/*
 * The whole-model parts of the shards in @x (held) for nvfp4 view @v, kept
 * in the first shard's entry, built on first need. *@owned is set when
 * they could not be kept (the caller frees it with fuse_free()). Thread-
 * safe: concurrent first builds may both run, and one result is kept.
 */
static int fuse_get(struct castfs_ns *ns, const struct ns_md_xshard *x,
		    const struct castfs_view *v, const struct ns_md_fuse **out,
		    struct ns_md_fuse **owned)
{
	struct ns_ckpt *ck0 = x->s.ck[0];
	uint64_t dep = ns_gguf_shards_dep(&x->s, 0);
	struct ns_md_fuse *f, *mine;
	size_t n, cost = 0;
	int rc;

	*owned = NULL;
	pthread_mutex_lock(&ck0->lock);
	f = fuse_find(ck0, dep, &n);
	pthread_mutex_unlock(&ck0->lock);
	if (f) {
		*out = f; /* never freed before ck0, which @x holds */
		return 0;
	}
	rc = fuse_build(ns, x, v, dep, &mine);
	if (rc)
		return rc;
	pthread_mutex_lock(&ck0->lock);
	f = fuse_find(ck0, dep, &n);
	if (!f && n < FUSE_ENTS_MAX) {
		mine->next = ck0->slot[NS_CKPT_XFUSE];
		ck0->slot[NS_CKPT_XFUSE] = f = mine;
		cost = fuse_cost(x, mine);
	} else if (!f) {
		*owned = f = mine;
	}
	pthread_mutex_unlock(&ck0->lock);
	if (f != mine)
		fuse_free(mine); /* another build won */
	if (cost)
		ns_ckpt_charge(ns, ck0, cost);
	*out = f;
	return 0;
}

/* The composite header of shard @x->self, checked like a whole file. */
static int xs_header(struct ns_ckpt *ck, const struct ns_md_xshard *x,
		     struct castfs_header **out)
{
	struct castfs_qsrc_opts o = { .flags = CASTFS_QSRC_STRICT |
					       ck->qw4flags,
				      .brows = ck->qbrows,
				      .bcols = ck->qbcols,
				      .declared = ck->qdeclared,
				      .ct_strategies = ck->qct_strategies };
	struct castfs_qsrc q;
	int rc = xs_compose(x, false, out);

	if (rc)
		return rc;
	/* Every weight must now have its scale and every scale its
	 * weight: what is still alone is refused, never served raw. */
	rc = castfs_qsrc_scan_opts(*out, &o, &q, NULL);
	if (rc) {
		castfs_header_free(*out);
		return rc;
	}
	castfs_qsrc_fini(&q);
	return 0;
}

int ns_md_xshard_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		      const struct castfs_view *v, int keep,
		      struct ns_md_xshard *x, const struct castfs_plan **out)
{
	const struct ns_md_fuse *fuse = NULL;
	struct ns_md_fuse *owned = NULL;
	struct castfs_header *h;
	uint64_t dep;
	int rc;

	memset(x, 0, sizeof(*x));
	rc = xs_read(ns, ck, x);
	if (!rc)
		rc = ns_gguf_shards_hold(ns, &x->s);
	if (rc)
		return rc;
	dep = ns_gguf_shards_dep(&x->s, (uint64_t)keep);
	x->dep = dep;
	rc = ns_md_plan_of(ns, ck, NULL, NULL, dep, v, keep, out);
	if (rc != -ENOENT)
		return rc;
	rc = xs_header(ck, x, &h);
	if (rc)
		return rc;
	/* nvfp4: the fused siblings in every shard (of a quantized model:
	 * in the bf16 view of every shard, view_deq.c) */
	if (v->kind == CASTFS_VIEW_CT_NVFP4)
		rc = fuse_get(ns, x, v, &fuse, &owned);
	if (!rc)
		rc = ns_md_plan_of(ns, ck, h, fuse, dep, v, keep, out);
	fuse_free(owned);
	castfs_header_free(h);
	return rc;
}

bool ns_md_xshard_wants(const struct ns_ckpt *ck, const struct castfs_view *v)
{
	return ck->xshard || v->kind == CASTFS_VIEW_CT_NVFP4;
}

int ns_md_xshard_dep(struct castfs_ns *ns, const struct ns_ckpt *ck, int keep,
		     uint64_t *dep)
{
	struct ns_md_xshard x = { 0 };
	int rc = xs_read(ns, ck, &x);

	if (!rc)
		*dep = ns_gguf_shards_dep(&x.s, (uint64_t)keep);
	ns_md_xshard_fini(ns, &x);
	return rc;
}

void ns_md_xshard_fini(struct castfs_ns *ns, struct ns_md_xshard *x)
{
	ns_gguf_shards_fini(ns, &x->s);
}
