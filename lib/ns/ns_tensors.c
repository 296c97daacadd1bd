/* SPDX-License-Identifier: MIT */
/*
 * Tensor trees in the namespace: X.safetensors.tensors/ (and the same for
 * every view, X.<view>.safetensors.tensors/) shows each tensor as .info,
 * .npy and .raw files under a directory per dotted name part
 * (docs/TENSOR_TREE.md). Each tree is built once per checkpoint identity
 * and view, and cached in the checkpoint next to the view plans.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_kind_internal.h"
#include "tensors/tensor_files.h"
#include "tensors/tensor_tree.h"

static const char tree_ext[] = ".tensors";
#define TREE_EXT_LEN (sizeof(tree_ext) - 1)
static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)
static const char meta_name[] = "__metadata__.json";

/*
 * The longest path of a node inside a tree (PATH_MAX less its NUL): each
 * node keeps its whole path, so a name of N dotted parts cost O(N^2)
 * bytes and time once walked (20,000 parts: 546 MB; bug hunt). Deeper
 * entries are not listed, and their lookup is ENAMETOOLONG, as no single
 * path to them could be passed to a system call anyway.
 */
#define TREE_SUB_MAX 4095u

/* Whether @name (@len bytes) in tree directory @sub stays within it. */
static bool sub_fits(const char *sub, size_t len)
{
	size_t n = strlen(sub);

	return (n ? n + 1 : 0) + len <= TREE_SUB_MAX;
}

enum tfile_type { TF_INFO, TF_NPY, TF_RAW, TF_META };

static const char *const tf_suffix[] = {
	[TF_INFO] = ".info",
	[TF_NPY] = ".npy",
	[TF_RAW] = ".raw",
};
#define TF_LEAF_COUNT 3

/* The generated files of a tree whose plans are kept: a .info is text,
 * a .npy a header, __metadata__.json the header's metadata. A long shape
 * in the first two (a million dimensions are megabytes of text) is made
 * per read range (CASTFS_OP_INTS): their plans hold the rest. */
enum { GEN_INFO, GEN_NPY, GEN_COUNT };

/* A tensor tree: the tensors of one file (a checkpoint or a view). */
struct ns_tree {
	struct castfs_ttree *tt;
	struct castfs_tfile_ctx c;
	struct castfs_header *owned_h; /* views: parsed from the plan */
	char *file; /* views: "dir/X.<view>.safetensors" */
	/* The plans of the generated files, made on first need and shared by
	 * every stat and open of the identity (charged to the checkpoint
	 * cache): 100 opens of a huge .info cost one copy, not 100. Per
	 * tensor index, each array allocated on first need; under the
	 * checkpoint's lock. */
	struct castfs_plan **gen[GEN_COUNT];
	struct castfs_plan *meta;
	/* Listings of its large directories, shared by every open handle
	 * (under the checkpoint's lock): one of a directory of a million
	 * tensor files costs tens of MB. */
	struct tdir_shared *listings;
};

/* A directory listing of a tree kept for every handle that opens it. */
struct tdir_shared {
	struct tdir_shared *next;
	char *sub;
	struct castfs_dir *dir;
};

/* Listings at least this long are kept; shorter ones cost less to make
 * again than to keep, and so the kept ones stay few. */
#define TDIR_SHARE_MIN 4096u

static void gen_free(struct ns_tree *t)
{
	for (int g = 0; g < GEN_COUNT; g++) {
		for (size_t i = 0; t->gen[g] && i < t->c.h->ntensors; i++)
			castfs_plan_free(t->gen[g][i]);
		free(t->gen[g]);
	}
	castfs_plan_free(t->meta);
}

static void listings_free(struct ns_tree *t)
{
	struct tdir_shared *s, *next;

	for (s = t->listings; s; s = next) {
		next = s->next;
		castfs_dir_free(s->dir);
		free(s->sub);
		free(s);
	}
}

static void tree_free(struct ns_tree *t)
{
	if (!t)
		return;
	gen_free(t);
	listings_free(t);
	castfs_ttree_free(t->tt);
	castfs_header_free(t->owned_h);
	free(t->file);
	free(t);
}

/* The trees of @ck: [0] the source's, [1 + view index] the views',
 * allocated and built on first need. */
static struct ns_tree **ck_trees(struct ns_ckpt *ck)
{
	return ck->slot[NS_CKPT_TREES];
}

/* Registered as the checkpoint cache's fini of NS_CKPT_TREES. */
static void trees_fini(struct ns_ckpt *ck)
{
	struct ns_tree **trees = ck_trees(ck);

	for (size_t i = 0; trees && i <= ck->nviews; i++)
		tree_free(trees[i]);
	free(trees);
	ck->slot[NS_CKPT_TREES] = NULL;
}

void ns_tensors_init(struct castfs_ns *ns)
{
	ns->ckpt_fini[NS_CKPT_TREES] = trees_fini;
}

/* "dir/X.safetensors" seen through @view: "dir/X.<view>.safetensors". */
static char *view_file_name(const char *path, const char *view)
{
	size_t len = strlen(path), stem = len - ST_EXT_LEN;
	char *s = malloc(len + strlen(view) + 2);

	if (!s)
		return NULL;
	sprintf(s, "%.*s.%s%s", (int)stem, path, view, st_ext);
	return s;
}

static int tree_build(const struct ns_ckpt *ck, const struct castfs_view *view,
		      const struct castfs_plan *plan, struct ns_tree **out,
		      struct castfs_diag *d)
{
	struct ns_tree *t = calloc(1, sizeof(*t));
	int rc = 0;

	if (!t)
		return -ENOMEM;
	t->c.h = ck->h;
	t->c.file = ck->path;
	if (view) {
		rc = castfs_plan_header(plan, &t->owned_h, d);
		t->file = rc ? NULL : view_file_name(ck->path, view->name);
		if (!rc && !t->file)
			rc = -ENOMEM;
		t->c = (struct castfs_tfile_ctx){
			.h = t->owned_h,
			.file = t->file,
			.view = view->name,
			.plan = plan,
			.src_h = ck->h,
			.src_file = ck->path,
		};
	}
	if (!rc)
		rc = castfs_ttree_build(t->c.h, &t->tt);
	if (rc) {
		tree_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

static void log_failure(struct castfs_ns *ns, const struct ns_ckpt *ck,
			const struct castfs_view *view, int rc,
			const struct castfs_diag *d)
{
	ns_logf(ns, ck->path, "view %s: %s", view ? view->name : "(none)",
		d->msg[0] ? d->msg : strerror(-rc));
}

/* The tree of @ck through @view (NULL: the source), built once. */
static int tree_of(struct castfs_ns *ns, struct ns_ckpt *ck,
		   const struct castfs_view *view, struct ns_tree **out)
{
	const struct castfs_plan *plan = NULL;
	struct castfs_diag d = { { 0 } };
	size_t idx = 0, built = 0;
	int rc = 0;

	if (view) {
		int vi = ns_view_index(ns, view);

		if (vi < 0)
			return -EINVAL;
		idx = (size_t)vi + 1;
		rc = ns_ckpt_plan(ns, ck, view, &plan, &d);
	}
	pthread_mutex_lock(&ck->lock);
	if (!rc && !ck_trees(ck)) {
		ck->slot[NS_CKPT_TREES] =
			calloc(ck->nviews + 1, sizeof(struct ns_tree *));
		rc = ck_trees(ck) ? 0 : -ENOMEM;
	}
	if (!rc && ck_trees(ck)[idx]) {
		castfs_stats_count(ns->stats, CASTFS_SCTR_TREE_CACHE_HITS, 1);
	} else if (!rc) {
		rc = tree_build(ck, view, plan, &ck_trees(ck)[idx], &d);
		if (!rc)
			castfs_stats_count(ns->stats, CASTFS_SCTR_TREES_BUILT,
					   1);
		/* A node per tensor and path part; a view's tree also
		 * holds the header parsed from its plan. */
		if (!rc)
			built = (view ? 2 : 1) * ns_ckpt_header_cost(ck->h);
	}
	if (!rc)
		*out = ck_trees(ck)[idx];
	pthread_mutex_unlock(&ck->lock);
	if (built)
		ns_ckpt_charge(ns, ck, built);
	if (rc && rc != -ENOMEM)
		log_failure(ns, ck, view, rc, &d);
	return rc;
}

/* The checkpoint behind node @n, still the identity @n was made from,
 * and its tree. The caller puts *@ck. */
static int node_tree(struct castfs_ns *ns, const struct ns_node *n,
		     struct ns_ckpt **ck, struct ns_tree **tree)
{
	struct stat st;
	int rc = ns_ckpt_valid(ns, n->path, &st, ck);

	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st)) {
		ns_ckpt_put(ns, *ck);
		return -ESTALE;
	}
	rc = tree_of(ns, *ck, n->view, tree);
	if (rc)
		ns_ckpt_put(ns, *ck);
	return rc;
}

/* ---- the roots, next to the checkpoints ---- */

static bool has_ext(const char *s, size_t len, const char *ext, size_t el)
{
	return len > el && memcmp(s + len - el, ext, el) == 0;
}

/* Checkpoint @base of directory @dir, directly or as a view. */
static int root_target(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *base, struct ns_node *child)
{
	const struct castfs_view *view = NULL;
	char *path = ns_path_join(dir->path, base, strlen(base)), *vbase;
	struct stat st;
	int rc;

	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_has_view(ns, path, NULL, &child->st);
	/* A source entry of that name shadows the view, whatever it is (a
	 * bug hunt: a rejected X.nf4.safetensors showed the hidden nf4
	 * view's tree under its own name). */
	if (rc == -ENOENT && ns_src_stat(ns, path, &st) == -ENOENT &&
	    ns_split_view_name(ns, base, &vbase, &view) == 0) {
		free(path);
		path = ns_path_join(dir->path, vbase, strlen(vbase));
		free(vbase);
		rc = path ? ns_ckpt_has_view(ns, path, view, &child->st) :
			    -ENOMEM;
	}
	if (rc) {
		free(path);
		return rc;
	}
	child->view = view;
	child->path = path;
	return 0;
}

/* "X.safetensors.tensors", "X.<view>.safetensors.tensors" in @dir. */
static int tensors_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			  const char *name, struct ns_node *child)
{
	size_t len = strlen(name);
	char *base;
	int rc;

	if (!has_ext(name, len, tree_ext, TREE_EXT_LEN) ||
	    !has_ext(name, len - TREE_EXT_LEN, st_ext, ST_EXT_LEN))
		return -ENOENT;
	base = strndup(name, len - TREE_EXT_LEN);
	if (!base)
		return -ENOMEM;
	rc = root_target(ns, dir, base, child);
	free(base);
	if (rc)
		return rc;
	child->kind = NS_TDIR;
	child->sub = strdup("");
	return child->sub ? 0 : -ENOMEM;
}

/* The tree root of entry @name when it is a valid checkpoint. */
static int tensors_list(struct castfs_ns *ns, const struct ns_node *dir,
			const char *name, mode_t type, bool ckpt,
			const struct stat *st, struct ns_list *l)
{
	char root_sub[1] = ""; /* as its lookup makes it: hashed like "" */
	struct ns_node root = { .kind = NS_TDIR, .st = *st, .sub = root_sub };
	char buf[512];
	int n, rc;

	(void)ns;
	(void)type;
	if (!ckpt)
		return 0;
	/* Only the source's tree is listed; a view's resolves on lookup. */
	n = snprintf(buf, sizeof(buf), "%s%s", name, tree_ext);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return 0;
	root.path = ns_path_join(dir->path, name, strlen(name));
	if (!root.path)
		return -ENOMEM;
	rc = ns_list_derived(l, dir->path, name, "tensors", buf, (size_t)n,
			     S_IFDIR, ns_node_id(&root));
	free(root.path);
	return rc;
}

const struct ns_dir_ext ns_tensors_dir_ext = {
	.lookup = tensors_lookup,
	.list = tensors_list,
};

/* ---- directories inside a tree ---- */

static int tfile_type_of(const char *suffix)
{
	for (int i = 0; i < TF_LEAF_COUNT; i++) {
		if (strcmp(suffix, tf_suffix[i]) == 0)
			return i;
	}
	return -1;
}

/* What @name in tree directory @sub is: its kind and aux, or -ENOENT. */
static int tdir_resolve(const struct ns_tree *tree, const char *sub,
			const char *name, struct ns_node *child)
{
	const char *dot = strchr(name, '.');
	char *path;
	bool found;
	int type;

	if (!sub[0] && strcmp(name, meta_name) == 0) {
		child->kind = NS_TFILE;
		child->aux = TF_META;
		return 0;
	}
	if (dot && (type = tfile_type_of(dot)) < 0)
		return -ENOENT;
	path = ns_path_join(sub, name,
			    dot ? (size_t)(dot - name) : strlen(name));
	if (!path)
		return -ENOMEM;
	if (dot)
		found = castfs_ttree_find(tree->tt, path, strlen(path)) != NULL;
	else
		found = castfs_ttree_is_dir(tree->tt, path, strlen(path));
	free(path);
	if (!found)
		return -ENOENT;
	child->kind = dot ? NS_TFILE : NS_TDIR;
	child->aux = dot ? (uint32_t)type : 0;
	return 0;
}

static int tdir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child)
{
	struct ns_tree *tree;
	struct ns_ckpt *ck;
	int rc = node_tree(ns, dir, &ck, &tree);

	if (rc)
		return rc;
	rc = sub_fits(dir->sub, strlen(name)) ?
		     tdir_resolve(tree, dir->sub, name, child) :
		     -ENAMETOOLONG;
	ns_ckpt_put(ns, ck);
	if (rc)
		return rc;
	child->view = dir->view;
	child->st = dir->st;
	child->path = strdup(dir->path);
	child->sub = ns_path_join(dir->sub, name, strlen(name));
	return child->path && child->sub ? 0 : -ENOMEM;
}

struct list_ctx {
	const struct ns_node *dir;
	struct ns_list *l;
};

/* Add @name (@len bytes) + @suffix with the id its lookup gives. */
static int list_one(struct list_ctx *c, const char *name, size_t len,
		    const char *suffix, enum ns_kind kind, uint32_t aux)
{
	struct ns_node n = { .kind = (uint8_t)kind,
			     .aux = aux,
			     .view = c->dir->view,
			     .path = c->dir->path,
			     .st = c->dir->st };
	size_t sl = strlen(suffix);
	char *leaf;
	int rc = -ENOMEM;

	if (!sub_fits(c->dir->sub, len + sl))
		return 0; /* its lookup is ENAMETOOLONG */
	leaf = malloc(len + sl + 1);
	if (!leaf)
		return rc;
	memcpy(leaf, name, len);
	memcpy(leaf + len, suffix, sl + 1);
	n.sub = ns_path_join(c->dir->sub, leaf, len + sl);
	if (n.sub)
		rc = ns_list_add(c->l, leaf, len + sl,
				 kind == NS_TDIR ? S_IFDIR : S_IFREG,
				 ns_node_id(&n));
	free(n.sub);
	free(leaf);
	return rc;
}

static int list_child(void *ctx, const char *name, size_t len,
		      const struct castfs_ttree_entry *leaf)
{
	int rc = 0;

	if (!leaf)
		return list_one(ctx, name, len, "", NS_TDIR, 0);
	for (uint32_t i = 0; !rc && i < TF_LEAF_COUNT; i++)
		rc = list_one(ctx, name, len, tf_suffix[i], NS_TFILE, i);
	return rc;
}

static int tdir_list(struct castfs_ns *ns, const struct ns_node *dir,
		     struct ns_list *l)
{
	struct list_ctx c = { dir, l };
	struct ns_tree *tree;
	struct ns_ckpt *ck;
	int rc = node_tree(ns, dir, &ck, &tree);

	if (rc)
		return rc;
	if (!dir->sub[0])
		rc = list_one(&c, meta_name, strlen(meta_name), "", NS_TFILE,
			      TF_META);
	if (!rc)
		rc = castfs_ttree_children(tree->tt, dir->sub, strlen(dir->sub),
					   list_child, &c);
	ns_ckpt_put(ns, ck);
	return rc;
}

static int tdir_getattr(struct castfs_ns *ns, const struct ns_node *n,
			struct stat *st)
{
	struct ns_tree *tree;
	struct ns_ckpt *ck;
	int rc = node_tree(ns, n, &ck, &tree);

	if (rc)
		return rc;
	ns_dir_stat(&n->st, n->id, st);
	ns_ckpt_put(ns, ck);
	return 0;
}

/* The kept listing of @sub in @t, with one more owner; NULL if none.
 * Caller holds the checkpoint's lock. */
static struct castfs_dir *shared_find_locked(const struct ns_tree *t,
					     const char *sub)
{
	for (struct tdir_shared *s = t->listings; s; s = s->next) {
		if (strcmp(s->sub, sub) == 0) {
			atomic_fetch_add(&s->dir->refs, 1);
			return s->dir;
		}
	}
	return NULL;
}

/* Keep @dir as the listing of @sub in @t, or if one was kept meanwhile,
 * drop @dir for it. Returns the listing to hand out (one more owner) and
 * the bytes newly kept in *@cost. Caller holds the checkpoint's lock. */
static struct castfs_dir *shared_keep_locked(struct ns_tree *t, const char *sub,
					     struct castfs_dir *dir,
					     size_t *cost)
{
	struct castfs_dir *have = shared_find_locked(t, sub);
	struct tdir_shared *s;

	*cost = 0;
	if (have) {
		castfs_dir_free(dir);
		return have;
	}
	s = calloc(1, sizeof(*s));
	if (s)
		s->sub = strdup(sub);
	if (!s || !s->sub) { /* unshared: this handle's alone */
		free(s);
		return dir;
	}
	s->dir = dir;
	atomic_fetch_add(&dir->refs, 1);
	s->next = t->listings;
	t->listings = s;
	for (size_t i = 0; i < dir->n; i++)
		*cost += sizeof(dir->ents[i]) + strlen(dir->ents[i].name) + 1;
	return dir;
}

/* A handle's listing: a large one is made once per identity and shared. */
static int tdir_opendir(struct castfs_ns *ns, const struct ns_node *dir,
			struct castfs_dir **out)
{
	struct castfs_dir *d;
	struct ns_tree *tree;
	struct ns_ckpt *ck;
	size_t cost = 0;
	bool share;
	int rc = node_tree(ns, dir, &ck, &tree);

	if (rc)
		return rc;
	/* The ids listed hash the path: shared by the tree's own path's
	 * handles, made per handle for another hard link's. */
	share = strcmp(dir->path, ck->path) == 0;
	pthread_mutex_lock(&ck->lock);
	d = share ? shared_find_locked(tree, dir->sub) : NULL;
	pthread_mutex_unlock(&ck->lock);
	if (!d) {
		rc = ns_list_dir(ns, dir, tdir_list, &d);
		if (!rc && share && d->n >= TDIR_SHARE_MIN) {
			pthread_mutex_lock(&ck->lock);
			d = shared_keep_locked(tree, dir->sub, d, &cost);
			pthread_mutex_unlock(&ck->lock);
		}
	}
	if (cost)
		ns_ckpt_charge(ns, ck, cost);
	ns_ckpt_put(ns, ck);
	if (!rc)
		*out = d;
	return rc;
}

const struct ns_kind_ops ns_kind_tdir = {
	.lookup = tdir_lookup,
	.list = tdir_list,
	.opendir = tdir_opendir,
	.getattr = tdir_getattr,
};

/* ---- the files of a tensor ---- */

/* A tensor file resolved: its tree, checkpoint and tensor. */
struct tfile {
	struct ns_ckpt *ck;
	struct ns_tree *tree;
	const struct castfs_tensor *t; /* NULL for __metadata__.json */
};

static int tfile_get(struct castfs_ns *ns, const struct ns_node *n,
		     struct tfile *f)
{
	const struct castfs_ttree_entry *e;
	const char *dot = strrchr(n->sub, '.');
	int rc = node_tree(ns, n, &f->ck, &f->tree);

	if (rc)
		return rc;
	f->t = NULL;
	if (n->aux == TF_META)
		return 0;
	/* Components hold no dots: the last one starts the suffix. */
	e = dot ? castfs_ttree_find(f->tree->tt, n->sub,
				    (size_t)(dot - n->sub)) :
		  NULL;
	if (!e) {
		ns_ckpt_put(ns, f->ck);
		return -ESTALE;
	}
	f->t = e->t;
	return 0;
}

/* The plan of a .info, made per read range where its shapes are long.
 * It names the path node @n was reached by, not the tree's (the first
 * path parsed). */
static int tinfo_plan(const struct ns_node *n, const struct tfile *f,
		      struct castfs_plan **plan)
{
	struct castfs_tfile_ctx c = f->tree->c;
	char *file = NULL;
	int rc;

	c.file = n->path;
	if (c.view) {
		file = view_file_name(n->path, c.view);
		if (!file)
			return -ENOMEM;
		c.file = file;
		c.src_file = n->path;
	}
	rc = castfs_tinfo_plan(&c, f->t, plan);
	free(file);
	return rc;
}

/* The plan of a tensor file; its byte offsets are in the tree's file.
 * Shapes are borrowed from the tree's headers, which outlive the plans
 * (the tree's and each open's: an open holds the checkpoint). */
static int tfile_plan(const struct ns_node *n, const struct tfile *f,
		      struct castfs_plan **plan)
{
	uint64_t off = f->t ? f->tree->c.h->data_start + f->t->begin : 0;
	size_t len;
	char *text;
	int rc;

	switch ((enum tfile_type)n->aux) {
	case TF_RAW:
		return castfs_plan_new_range(off, f->t->end - f->t->begin,
					     plan);
	case TF_NPY:
		return castfs_npy_plan(f->t, off, plan);
	case TF_INFO:
		return tinfo_plan(n, f, plan);
	case TF_META:
		text = castfs_meta_json(f->tree->c.h, &len);
		if (!text)
			return -ENOMEM;
		rc = castfs_plan_new_mem(text, len, plan);
		free(text);
		return rc;
	}
	return -EINVAL;
}

/* Where the shared plan of generated file @n of @f is kept; NULL for a
 * .raw (its plan is one extent, made per open) or without memory.
 * Caller holds f->ck->lock. */
static struct castfs_plan **gen_slot_locked(const struct ns_node *n,
					    const struct tfile *f)
{
	int g = n->aux == TF_INFO ? GEN_INFO : GEN_NPY;
	size_t nt = f->tree->c.h->ntensors;

	if (n->aux == TF_META)
		return &f->tree->meta;
	if (n->aux == TF_RAW)
		return NULL;
	/* Kept for the tree's own path; another hard link's .info names
	 * its own and is made per use. */
	if (n->aux == TF_INFO && strcmp(n->path, f->ck->path) != 0)
		return NULL;
	if (!f->tree->gen[g])
		f->tree->gen[g] = calloc(nt, sizeof(struct castfs_plan *));
	if (!f->tree->gen[g])
		return NULL;
	return &f->tree->gen[g][f->t - f->tree->c.h->tensors];
}

/*
 * The plan of tensor file @n: a generated file's is made once per
 * identity and kept in its tree (*@owned NULL); a .raw's is made for the
 * caller (*@owned is it, the caller frees it). Made outside the lock, so
 * that a huge .info stalls no other request of the checkpoint; of two
 * made at once, one is kept.
 */
static int tfile_shared_plan(struct castfs_ns *ns, const struct ns_node *n,
			     const struct tfile *f,
			     const struct castfs_plan **plan,
			     struct castfs_plan **owned)
{
	struct castfs_plan **slot, *p, *made = NULL;
	size_t cost = 0;
	int rc;

	*owned = NULL;
	pthread_mutex_lock(&f->ck->lock);
	slot = gen_slot_locked(n, f);
	p = slot ? *slot : NULL;
	pthread_mutex_unlock(&f->ck->lock);
	if (p) {
		*plan = p;
		return 0;
	}
	rc = tfile_plan(n, f, &made);
	if (rc)
		return rc;
	if (!slot) { /* a .raw, or no memory for the slots: this open's */
		*plan = *owned = made;
		return 0;
	}
	pthread_mutex_lock(&f->ck->lock);
	if (!*slot) {
		*slot = made;
		cost = ns_ckpt_plan_cost(made);
		made = NULL;
	}
	*plan = *slot;
	pthread_mutex_unlock(&f->ck->lock);
	castfs_plan_free(made);
	if (cost)
		ns_ckpt_charge(ns, f->ck, cost);
	return 0;
}

static int tfile_getattr(struct castfs_ns *ns, const struct ns_node *n,
			 struct stat *st)
{
	const struct castfs_plan *plan;
	struct castfs_plan *owned;
	struct tfile f;
	int rc = tfile_get(ns, n, &f);

	if (rc)
		return rc;
	if (n->aux == TF_RAW) {
		ns_view_stat(&n->st, f.t->end - f.t->begin, n->id, st);
		ns_ckpt_put(ns, f.ck);
		return 0;
	}
	rc = tfile_shared_plan(ns, n, &f, &plan, &owned);
	if (!rc)
		ns_view_stat(&n->st, plan->size, n->id, st);
	castfs_plan_free(owned);
	ns_ckpt_put(ns, f.ck);
	return rc;
}

static int tfile_open(struct castfs_ns *ns, const struct ns_node *n,
		      struct castfs_file **out)
{
	const struct castfs_plan *plan;
	struct castfs_plan *owned;
	struct tfile f;
	int rc = tfile_get(ns, n, &f);

	if (rc)
		return rc;
	rc = tfile_shared_plan(ns, n, &f, &plan, &owned);
	if (rc)
		goto out_put;
	if (n->aux == TF_INFO || n->aux == TF_META)
		rc = ns_file_new_plan(ns, NULL, NULL, f.ck, plan, owned,
				      CASTFS_STATS_TENSORS, out);
	else if (f.tree->c.plan)
		rc = ns_file_new_layered(ns, n->path, &n->st, f.ck,
					 f.tree->c.plan, plan, owned,
					 CASTFS_STATS_TENSORS, out);
	else
		rc = ns_file_new_plan(ns, n->path, &n->st, f.ck, plan, owned,
				      CASTFS_STATS_TENSORS, out);
out_put:
	ns_ckpt_put(ns, f.ck);
	return rc;
}

/* ---- extended attributes of the tensor files ---- */

enum txattr {
	TX_NAME,
	TX_DTYPE,
	TX_SHAPE,
	TX_OFFSETS,
	TX_VIEW, /* views only from here on */
	TX_SOURCE,
	TX_CONVERSION,
	TX_COUNT,
};

static const char *const tx_names[TX_COUNT] = {
	[TX_NAME] = "user.castfs.name",
	[TX_DTYPE] = "user.castfs.dtype",
	[TX_SHAPE] = "user.castfs.shape",
	[TX_OFFSETS] = "user.castfs.data_offsets",
	[TX_VIEW] = "user.castfs.view",
	[TX_SOURCE] = "user.castfs.source_tensor",
	[TX_CONVERSION] = "user.castfs.conversion",
};

/* The value of attribute @which of tensor @t into @buf (see getxattr). */
static ssize_t tx_value(const struct tfile *f, enum txattr which, char *buf,
			size_t len)
{
	const struct castfs_tensor *t = f->t;
	struct castfs_torigin o;
	char tmp[128], *s;
	const char *cs;
	ssize_t rc;

	castfs_torigin_find(&f->tree->c, t, &o);
	switch (which) {
	case TX_NAME:
		return ns_xattr_put(t->name, t->name_len, buf, len);
	case TX_DTYPE:
		cs = castfs_dtype_name(t->dtype);
		return ns_xattr_put(cs, strlen(cs), buf, len);
	case TX_SHAPE:
		s = castfs_tinfo_shape_str(t->ndim, t->shape);
		if (!s)
			return -ENOMEM;
		rc = ns_xattr_put(s, strlen(s), buf, len);
		free(s);
		return rc;
	case TX_OFFSETS:
		snprintf(tmp, sizeof(tmp), "[%" PRIu64 ", %" PRIu64 "]",
			 t->begin, t->end);
		return ns_xattr_put(tmp, strlen(tmp), buf, len);
	case TX_VIEW:
		return ns_xattr_put(f->tree->c.view, strlen(f->tree->c.view),
				    buf, len);
	case TX_SOURCE:
		if (!o.src)
			return -ENODATA;
		return ns_xattr_put(o.src->name, o.src->name_len, buf, len);
	case TX_CONVERSION:
		castfs_torigin_str(&o, tmp, sizeof(tmp));
		return ns_xattr_put(tmp, strlen(tmp), buf, len);
	case TX_COUNT:
		break;
	}
	return -ENODATA;
}

/*
 * Whether tensor file @f has attribute @which: the view's ones only in a
 * view, and no source_tensor for a generated tensor (quant_map, ...), so
 * that listxattr names only what getxattr answers (cp --preserve=xattr
 * fails on a listed name it cannot get).
 */
static bool tx_has(const struct tfile *f, enum txattr which)
{
	struct castfs_torigin o;

	if (!f->t)
		return false;
	if (which < TX_VIEW)
		return true;
	if (!f->tree->c.view)
		return false;
	if (which != TX_SOURCE)
		return true;
	castfs_torigin_find(&f->tree->c, f->t, &o);
	return o.src != NULL;
}

static ssize_t tfile_getxattr(struct castfs_ns *ns, const struct ns_node *n,
			      const char *name, char *buf, size_t len)
{
	struct tfile f;
	ssize_t rc = tfile_get(ns, n, &f);

	if (rc)
		return rc;
	rc = -ENODATA;
	for (int i = 0; i < TX_COUNT; i++) {
		if (strcmp(name, tx_names[i]) == 0) {
			if (tx_has(&f, (enum txattr)i))
				rc = tx_value(&f, (enum txattr)i, buf, len);
			break;
		}
	}
	ns_ckpt_put(ns, f.ck);
	return rc;
}

static ssize_t tfile_listxattr(struct castfs_ns *ns, const struct ns_node *n,
			       char *buf, size_t len)
{
	struct tfile f;
	size_t need = 0, off = 0;
	bool has[TX_COUNT];
	int rc = tfile_get(ns, n, &f);

	if (rc)
		return rc;
	for (int i = 0; i < TX_COUNT; i++) {
		has[i] = tx_has(&f, (enum txattr)i);
		if (has[i])
			need += strlen(tx_names[i]) + 1;
	}
	ns_ckpt_put(ns, f.ck);
	if (len == 0)
		return (ssize_t)need;
	if (len < need)
		return -ERANGE;
	for (int i = 0; i < TX_COUNT; i++) {
		if (!has[i])
			continue;
		memcpy(buf + off, tx_names[i], strlen(tx_names[i]) + 1);
		off += strlen(tx_names[i]) + 1;
	}
	return (ssize_t)need;
}

const struct ns_kind_ops ns_kind_tfile = {
	.getattr = tfile_getattr,
	.open = tfile_open,
	.getxattr = tfile_getxattr,
	.listxattr = tfile_listxattr,
};
