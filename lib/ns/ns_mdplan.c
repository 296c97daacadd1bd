/* SPDX-License-Identifier: MIT */
/*
 * Shard plans of model-directory views for models whose loader keeps some
 * Linear layers in full precision (T5's "wo", ...): the view with the
 * model's keep rules, built once per checkpoint identity and cached in
 * the checkpoint next to the plain view plans, so that open files keep
 * them alive through their checkpoint reference.
 */
#include <errno.h>
#include <stdlib.h>

#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"
#include "view/qsrc.h"

struct ns_mdplan {
	struct ns_mdplan *next;
	const struct castfs_view *view;
	int keep;
	uint64_t dep; /* 0, or the identities of the shards it reads */
	struct castfs_plan *plan;
};

/* Registered as the checkpoint cache's fini of NS_CKPT_MDPLANS. */
static void mdplans_fini(struct ns_ckpt *ck)
{
	struct ns_mdplan *p;

	while ((p = ck->slot[NS_CKPT_MDPLANS])) {
		ck->slot[NS_CKPT_MDPLANS] = p->next;
		castfs_plan_free(p->plan);
		free(p);
	}
}

void ns_md_plans_init(struct castfs_ns *ns)
{
	ns->ckpt_fini[NS_CKPT_MDPLANS] = mdplans_fini;
}

/* Caller holds ck->lock. The plan of header @h (@ck's, or the composite
 * of its shards, @dep) in view @v with keep set @keep; @fuse: where
 * nvfp4 finds fused siblings (struct castfs_view), or NULL. */
static int mdplan_build(struct ns_ckpt *ck, const struct castfs_header *h,
			const struct ns_md_fuse *fuse, uint64_t dep,
			const struct castfs_view *v, int keep,
			const struct castfs_plan **out)
{
	struct ns_mdplan *p = calloc(1, sizeof(*p));
	struct castfs_md_view mv = { 0 };
	struct castfs_qsrc_opts o;
	struct castfs_view fv;
	int rc = p ? 0 : -ENOMEM;

	if (!rc && keep) /* keep 0: the view as it is */
		rc = castfs_md_view_keep(v, keep, &mv);
	if (rc) {
		free(p);
		return rc;
	}
	fv = keep ? mv.v : *v;
	fv.fuse_h = fuse ? fuse->all : NULL;
	fv.deqfuse = fuse ? fuse->deq : NULL;
	rc = castfs_view_plan_opts(&fv, h, ns_ckpt_qopts(ck, &o), &p->plan,
				   NULL);
	if (keep)
		castfs_md_view_fini(&mv);
	if (rc) {
		free(p);
		return rc;
	}
	p->view = v;
	p->keep = keep;
	p->dep = dep;
	p->next = ck->slot[NS_CKPT_MDPLANS];
	ck->slot[NS_CKPT_MDPLANS] = p;
	*out = p->plan;
	return 0;
}

int ns_md_plan_of(struct castfs_ns *ns, struct ns_ckpt *ck,
		  const struct castfs_header *h, const struct ns_md_fuse *fuse,
		  uint64_t dep, const struct castfs_view *v, int keep,
		  const struct castfs_plan **out)
{
	struct ns_mdplan *p;
	size_t built = 0;
	int rc = 0;

	pthread_mutex_lock(&ck->lock);
	for (p = ck->slot[NS_CKPT_MDPLANS]; p; p = p->next) {
		if (p->view == v && p->keep == keep && p->dep == dep)
			break;
	}
	if (p) {
		*out = p->plan;
		castfs_stats_count(ns->stats, CASTFS_SCTR_PLAN_CACHE_HITS, 1);
	} else if (!h) {
		rc = -ENOENT; /* not built, and no header to build it from */
	} else {
		rc = mdplan_build(ck, h, fuse, dep, v, keep, out);
		if (!rc)
			castfs_stats_count(ns->stats, CASTFS_SCTR_PLANS_BUILT,
					   1);
		if (!rc)
			built = ns_ckpt_plan_cost(*out);
	}
	pthread_mutex_unlock(&ck->lock);
	if (built)
		ns_ckpt_charge(ns, ck, built);
	return rc;
}

int ns_md_shard_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		     const struct castfs_view *v, int keep,
		     const struct castfs_plan **out)
{
	struct ns_md_xshard x;
	int rc;

	if (!ck->h)
		return -EINVAL;
	if (ns_md_xshard_wants(ck, v)) {
		/* The plan stays cached in @ck, which the caller holds. */
		rc = ns_md_xshard_plan(ns, ck, v, keep, &x, out);
		ns_md_xshard_fini(ns, &x);
		/* nvfp4 of a file that no index names: the file alone */
		if (rc != -ENOENT || ck->xshard)
			return rc;
	}
	if (!keep)
		return ns_ckpt_plan(ns, ck, v, out, NULL);
	return ns_md_plan_of(ns, ck, ck->h, NULL, 0, v, keep, out);
}
