/* SPDX-License-Identifier: MIT */
/*
 * DIR.<q>.gguf beside a transformers causal-LM folder DIR/ (level 5): one
 * llama.cpp GGUF file computed from DIR/model.safetensors, config.json,
 * tokenizer.json and tokenizer_config.json (modeldir/modeldir_gguf.c).
 * The node's identity is the weights'; the text files' identities are its
 * dep fingerprint, checked again at every getattr and open, so a changed
 * config never mixes into a file already looked up (ESTALE instead). The
 * plan is built per getattr and open, not cached: the files are few and
 * the size is needed once per lookup.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_kind_internal.h"

/* The text files the GGUF is made of; the first two are required. */
static const char *const texts[] = { "config.json", "tokenizer.json",
				     "tokenizer_config.json" };
#define NTEXTS (sizeof(texts) / sizeof(texts[0]))

/* Larger text files are refused (a tokenizer.json is a few MiB). */
#define TEXT_MAX (256u << 20)

/* The fingerprint of the text files of folder @dir (0 when a required one
 * is missing): their identities, so that an edit makes a new node. */
static int texts_dep(struct castfs_ns *ns, const char *dir, uint64_t *dep)
{
	uint64_t h = CASTFS_FNV_SEED;

	for (size_t i = 0; i < NTEXTS; i++) {
		char *p = ns_path_join(dir, texts[i], strlen(texts[i]));
		struct stat st = { 0 };
		int rc;

		if (!p)
			return -ENOMEM;
		rc = ns_src_stat_in(ns, p, &st);
		free(p);
		if (rc && (i < 2 || rc != -ENOENT))
			return rc;
		if (!rc && !S_ISREG(st.st_mode))
			return -ENOENT;
		h = castfs_fnv1a(h, &st.st_ino, sizeof(st.st_ino));
		h = castfs_fnv1a(h, &st.st_size, sizeof(st.st_size));
		h = castfs_fnv1a(h, &st.st_mtim, sizeof(st.st_mtim));
	}
	*dep = castfs_mix64(h) | 1;
	return 0;
}

static int mdgguf_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, struct ns_node *child)
{
	size_t dlen;
	const struct castfs_view *v =
		ns_split_gguf_name(ns, name, strlen(name), &dlen);
	char *folder;
	struct stat st;
	int rc;

	if (!v)
		return -ENOENT;
	folder = ns_path_join(dir->path, name, dlen);
	if (!folder)
		return -ENOMEM;
	rc = ns_src_stat(ns, folder, &st);
	if (!rc && !S_ISDIR(st.st_mode))
		rc = -ENOENT;
	if (!rc)
		rc = texts_dep(ns, folder, &child->dep);
	if (!rc) {
		child->path = ns_path_join(folder, "model.safetensors", 17);
		rc = child->path ? ns_src_stat_in(ns, child->path, &child->st) :
				   -ENOMEM;
	}
	if (!rc && !S_ISREG(child->st.st_mode))
		rc = -ENOENT;
	free(folder);
	if (rc) {
		free(child->path);
		child->path = NULL;
		return rc == -ENOMEM ? rc : -ENOENT;
	}
	child->kind = NS_MGGUF;
	child->view = v;
	return 0;
}

static int mdgguf_plan(struct castfs_ns *ns, const struct ns_node *n,
		       struct ns_ckpt **ck, struct castfs_plan **plan);

/* Whether the folder of node @n maps (its plan builds): listings show
 * only files that open. Costs a parse of its JSON; only for views chosen
 * with -o views=. */
static bool maps(struct castfs_ns *ns, const struct ns_node *n)
{
	struct castfs_plan *plan;
	struct ns_ckpt *ck;

	if (mdgguf_plan(ns, n, &ck, &plan))
		return false;
	castfs_plan_free(plan);
	ns_ckpt_put(ns, ck);
	return true;
}

/* List DIR.<q>.gguf for the listed GGUF views of a model folder. */
static int mdgguf_list(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, mode_t type, bool ckpt,
		       const struct stat *st, struct ns_list *l)
{
	char buf[300];

	(void)ckpt;
	(void)st;
	if (type != S_IFDIR)
		return 0;
	for (size_t i = 0; i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];
		struct ns_node n = { 0 };
		int k, rc;

		if (!v->listed || v->kind != CASTFS_VIEW_GGUF)
			continue;
		k = snprintf(buf, sizeof(buf), "%s.%s", name, v->name);
		if (k < 0 || k > 255 || ns_list_has(l, buf, (size_t)k))
			continue;
		rc = mdgguf_lookup(ns, dir, buf, &n);
		if (rc == -ENOMEM)
			return rc;
		if (rc)
			return 0; /* not a model folder */
		n.id = ns_node_id(&n);
		rc = maps(ns, &n) ?
			     ns_list_add(l, buf, (size_t)k, S_IFREG, n.id) :
			     0;
		free(n.path);
		if (rc)
			return rc;
	}
	return 0;
}

const struct ns_dir_ext ns_mdgguf_dir_ext = {
	.lookup = mdgguf_lookup,
	.list = mdgguf_list,
};

static int build_plan(struct castfs_ns *ns, const struct ns_node *n,
		      struct ns_ckpt *ck, struct castfs_plan **plan)
{
	struct castfs_diag d = { { 0 } };
	char *text[NTEXTS] = { 0 }, *folder = ns_parent_path(n->path);
	size_t len[NTEXTS] = { 0 };
	int rc = folder ? 0 : -ENOMEM;

	for (size_t i = 0; !rc && i < NTEXTS; i++) {
		char *p = ns_path_join(folder, texts[i], strlen(texts[i]));

		rc = p ? ns_src_read_text(ns, p, NULL, TEXT_MAX, &text[i],
					  &len[i]) :
			 -ENOMEM;
		/* a missing file reads as -ESTALE */
		if (rc == -ESTALE && i >= 2)
			rc = 0; /* tokenizer_config.json is optional */
		free(p);
	}
	if (!rc)
		rc = castfs_md_gguf_plan(n->view, text[0], len[0], text[1],
					 len[1], text[2], len[2], ck->h, plan,
					 &d);
	if (rc && rc != -ENOMEM)
		ns_logf(ns, "%s: view %s: %s", folder ? folder : n->path,
			n->view->name, d.msg[0] ? d.msg : strerror(-rc));
	for (size_t i = 0; i < NTEXTS; i++)
		free(text[i]);
	free(folder);
	return rc == -ENOMEM ? rc : rc ? -EIO : 0;
}

/* The checkpoint and a fresh plan of @n, if nothing it is made of moved. */
static int mdgguf_plan(struct castfs_ns *ns, const struct ns_node *n,
		       struct ns_ckpt **ck, struct castfs_plan **plan)
{
	char *folder = ns_parent_path(n->path);
	uint64_t dep = 0;
	struct stat st;
	int rc = folder ? texts_dep(ns, folder, &dep) : -ENOMEM;

	free(folder);
	if (!rc && dep != n->dep)
		rc = -ESTALE;
	if (rc)
		return rc == -ENOMEM ? rc : -ESTALE;
	rc = ns_ckpt_valid(ns, n->path, &st, ck);
	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st))
		rc = -ESTALE;
	if (!rc)
		rc = build_plan(ns, n, *ck, plan);
	if (rc)
		ns_ckpt_put(ns, *ck);
	return rc;
}

static int mdgguf_getattr(struct castfs_ns *ns, const struct ns_node *n,
			  struct stat *st)
{
	struct castfs_plan *plan;
	struct ns_ckpt *ck;
	int rc = mdgguf_plan(ns, n, &ck, &plan);

	if (rc)
		return rc;
	ns_view_stat(&n->st, plan->size, n->id, st);
	castfs_plan_free(plan);
	ns_ckpt_put(ns, ck);
	return 0;
}

static int mdgguf_open(struct castfs_ns *ns, const struct ns_node *n,
		       struct castfs_file **out)
{
	struct castfs_plan *plan;
	struct ns_ckpt *ck;
	int rc = mdgguf_plan(ns, n, &ck, &plan);

	if (rc)
		return rc;
	/* the file owns the plan, on failure too */
	rc = ns_file_new_plan(ns, n->path, &n->st, ck, plan, plan,
			      ns_view_index(ns, n->view), out);
	ns_ckpt_put(ns, ck);
	return rc;
}

const struct ns_kind_ops ns_kind_mgguf = {
	.getattr = mdgguf_getattr,
	.open = mdgguf_open,
	.getxattr = ns_view_getxattr,
	.listxattr = ns_view_listxattr,
};
