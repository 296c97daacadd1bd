/* SPDX-License-Identifier: MIT */
/*
 * Model-directory views, the source side: what a directory holds, whether
 * it is a model, and the rewritten config.json and index.json files, built
 * once per identity of their sources and cached.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"
#include "tensors/tensor_files.h"
#include "view/qsrc.h"
#include "view/qsrc_xshard.h"

#define MD_JSON_MAX NS_TEXT_MAX
#define MD_BUCKETS 256u

/* ---- scanning a source directory ---- */

/* One entry's share of the fingerprint: its name and identity. */
static uint64_t md_ident(const char *name, const struct stat *st)
{
	const uint64_t v[7] = {
		(uint64_t)st->st_dev,	       (uint64_t)st->st_ino,
		(uint64_t)st->st_size,	       (uint64_t)st->st_mtim.tv_sec,
		(uint64_t)st->st_mtim.tv_nsec, (uint64_t)st->st_ctim.tv_sec,
		(uint64_t)st->st_ctim.tv_nsec,
	};
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, name, strlen(name) + 1);

	return castfs_mix64(castfs_fnv1a(h, v, sizeof(v)));
}

static int md_push(char ***v, size_t *n, const char *name)
{
	char **nv = realloc(*v, (*n + 1) * sizeof(**v));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	nv[*n] = strdup(name);
	if (!nv[*n])
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* Note regular file @name (identity @st) in @s. */
static int md_dir_add(struct ns_md_dir *s, const char *name,
		      const struct stat *st)
{
	switch (castfs_md_name_kind(name)) {
	case CASTFS_MD_CONFIG:
		s->config = true;
		s->fp += md_ident(name, st); /* the keep rules come from it */
		return 0;
	case CASTFS_MD_PIPELINE:
		s->pipeline = true;
		return 0;
	case CASTFS_MD_WEIGHTS:
		s->fp += md_ident(name, st);
		return md_push(&s->weights, &s->nweights, name);
	case CASTFS_MD_INDEX:
		s->fp += md_ident(name, st);
		return md_push(&s->indexes, &s->nindex, name);
	case CASTFS_MD_OTHER:
		break;
	}
	return 0;
}

static int md_stat_link(struct castfs_ns *ns, const char *dir, const char *name,
			struct stat *st)
{
	char *p = ns_path_join(dir, name, strlen(name));
	int rc = p ? ns_src_stat_in(ns, p, st) : -ENOMEM;

	free(p);
	return rc;
}

int ns_md_dir_scan(struct castfs_ns *ns, const char *path, struct ns_md_dir *s)
{
	int fd = ns_src_open(ns, path, O_RDONLY | O_DIRECTORY);
	struct dirent *de;
	struct stat st;
	DIR *dp;
	int rc = 0;

	*s = (struct ns_md_dir){ .fp = 1 };
	if (fd < 0)
		return fd;
	dp = fdopendir(fd);
	if (!dp) {
		close(fd);
		return -errno;
	}
	while (!rc && (errno = 0, de = readdir(dp))) {
		char buf[NAME_MAX + 1];
		/* A pack counts as the weights file it is shown as. */
		const char *name = ns_packed_shown(dirfd(dp), de->d_name, buf,
						   sizeof(buf));

		if (de->d_type != DT_REG && de->d_type != DT_LNK &&
		    de->d_type != DT_UNKNOWN)
			continue;
		if (castfs_md_name_kind(name) == CASTFS_MD_OTHER)
			continue;
		if (fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue;
		/* A link inside the root counts as the file it reaches. */
		if (S_ISLNK(st.st_mode) &&
		    md_stat_link(ns, path, de->d_name, &st))
			continue;
		if (!S_ISREG(st.st_mode))
			continue;
		rc = md_dir_add(s, name, &st);
	}
	if (!rc && errno)
		rc = -errno;
	closedir(dp);
	s->fp = s->fp ? s->fp : 1; /* 0 means "no dependency" in a node */
	return rc;
}

void ns_md_dir_fini(struct ns_md_dir *s)
{
	for (size_t i = 0; i < s->nweights; i++)
		free(s->weights[i]);
	for (size_t i = 0; i < s->nindex; i++)
		free(s->indexes[i]);
	free(s->weights);
	free(s->indexes);
	*s = (struct ns_md_dir){ 0 };
}

bool ns_md_dir_weights(const struct ns_md_dir *s)
{
	return s->nweights > 0 || s->nindex > 0;
}

/* ---- reading source files ---- */

int ns_md_read(struct castfs_ns *ns, const char *path, const struct stat *ident,
	       char **out, size_t *len)
{
	return ns_src_read_text(ns, path, ident, MD_JSON_MAX, out, len);
}

bool ns_md_casts_only(struct castfs_ns *ns, const char *path)
{
	struct castfs_md_quant q;

	return ns_ckpt_dir_quant(ns, path, &q) == 0 &&
	       castfs_md_quant_dequantized(&q);
}

/* Why config @c gets no quantising views (@ct: compressed-tensors),
 * after @pre (a pipeline's component, or ""). */
static void refusal_why(const struct castfs_md_config *c, bool ct,
			const char *pre, char *why, size_t len)
{
	char what[160];

	if (c->diffusers)
		snprintf(what, sizeof(what), "diffusers class '%s'%s",
			 c->class_name[0] ? c->class_name : "?",
			 c->class_embeds ? " with num_class_embeds" : "");
	else
		snprintf(what, sizeof(what), "architectures %s%s%s",
			 c->narch ? "'" : "(none readable)",
			 c->narch ? c->arch[0] : "", c->narch ? "'" : "");
	snprintf(why, len,
		 "%sconfig.json: %s: no %s views (castfs quantises the models "
		 "it has checked against the loader's own quantisation; "
		 "docs/MODELDIR.md)",
		 pre, what, ct ? "compressed-tensors" : "bitsandbytes");
}

/*
 * Whether pipeline root @path (a model_index.json) has a component, a
 * sub-folder with a config.json, that castfs does not quantise: its
 * quantising views would quantise that one too (the gate holds for the
 * whole DIR.<view>/). The first such component's config into @c, its
 * name into @name.
 */
static bool pipe_refused(struct castfs_ns *ns, const char *path, bool ct,
			 struct castfs_md_config *c, char *name, size_t len)
{
	char *idx = ns_path_join(path, "model_index.json", 16);
	struct stat st;
	struct dirent *de;
	bool refused = false;
	DIR *dp = NULL;
	int fd;

	fd = idx && ns_src_stat_in(ns, idx, &st) == 0 && S_ISREG(st.st_mode) ?
		     ns_src_open(ns, path, O_RDONLY | O_DIRECTORY) :
		     -1;
	free(idx);
	if (fd >= 0 && !(dp = fdopendir(fd)))
		close(fd);
	while (dp && !refused && (de = readdir(dp))) {
		char *sub;

		if (de->d_name[0] == '.' ||
		    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
			continue;
		sub = ns_path_join(path, de->d_name, strlen(de->d_name));
		refused = sub && ns_dir_config(ns, sub, c) == 0 &&
			  !castfs_md_quantisable(c, ct);
		if (refused)
			snprintf(name, len, "%s", de->d_name);
		free(sub);
	}
	if (dp)
		closedir(dp);
	return refused;
}

bool ns_md_quant_refusal(struct castfs_ns *ns, const char *path, bool ct,
			 char *why, size_t len)
{
	struct castfs_md_config c;
	char comp[NAME_MAX + 1], pre[NAME_MAX + 16] = "";

	if (ns_dir_config(ns, path, &c) == 0) {
		if (castfs_md_quantisable(&c, ct))
			return false;
	} else if (pipe_refused(ns, path, ct, &c, comp, sizeof(comp))) {
		snprintf(pre, sizeof(pre), "component %.255s: ", comp);
	} else {
		return false;
	}
	if (why && len)
		refusal_why(&c, ct, pre, why, len);
	return true;
}

bool ns_md_view_refused(struct castfs_ns *ns, const char *path,
			const struct castfs_view *v)
{
	return v->kind != CASTFS_VIEW_CAST &&
	       ns_md_quant_refusal(ns, path, castfs_view_is_ct(v), NULL, 0);
}

int ns_md_keep_of(struct castfs_ns *ns, const char *dir,
		  const struct castfs_view *v)
{
	struct castfs_md_config c;
	int rc;

	if (v->kind == CASTFS_VIEW_CAST)
		return 0;
	/* config.json being written: not "no rules", which would plan the
	 * shards with none (a MoE's experts quantised) while the config the
	 * loader read says they are kept */
	rc = ns_dir_config(ns, dir, &c);
	if (rc)
		return ns_err_transient(rc) ? rc : 0;
	return castfs_md_keep_of(&c);
}

/* 1 if a weights file of scan @s of @dir is a valid checkpoint, else 0;
 * or the transient error of one (being written, its config.json too: a
 * folder is not "without weights" meanwhile). */
static int md_any_valid(struct castfs_ns *ns, const char *dir,
			const struct ns_md_dir *s)
{
	int err = 0;

	for (size_t i = 0; i < s->nweights; i++) {
		char *p =
			ns_path_join(dir, s->weights[i], strlen(s->weights[i]));
		struct ns_ckpt *ck;
		struct stat st;
		int rc = p ? ns_ckpt_valid(ns, p, &st, &ck) : -ENOMEM;

		free(p);
		if (!rc) {
			ns_ckpt_put(ns, ck);
			return 1;
		}
		if (ns_err_transient(rc))
			err = rc;
	}
	return err;
}

/*
 * Whether a weight file of @s is one castfs cannot serve: a quantized
 * layout it does not dequantize, or a file rejected as malformed (a
 * truncated download, say). Then the directory has no views: never a
 * shard shown undequantized, and never a model without one of its files
 * (its index rewrite would fail at open; without an index, transformers
 * would fill the weights it lacks at random, with a warning). "<name>:
 * <reason>" in @why (@len bytes) when @why is not NULL. A transient
 * failure is not one: the next listing tries again.
 */
static bool md_bad_weight(struct castfs_ns *ns, const char *dir,
			  const struct ns_md_dir *s, char *why, size_t len)
{
	char reason[256];
	bool found = false;

	for (size_t i = 0; !found && i < s->nweights; i++) {
		char *p =
			ns_path_join(dir, s->weights[i], strlen(s->weights[i]));

		found = p && ns_ckpt_rejected(ns, p, reason, sizeof(reason));
		if (found && why && len)
			snprintf(why, len, "%s: %s", s->weights[i], reason);
		free(p);
	}
	return found;
}

/* 1 if scan @s of @path is a model with views, its indexes and its
 * weight files' soundness aside, else 0; or a transient error (its
 * config.json being written: the folder is not gone meanwhile). */
static int md_model_of(struct castfs_ns *ns, const char *path,
		       const struct ns_md_dir *s)
{
	struct castfs_md_quant q;
	struct castfs_md_config c;
	int rc;

	if (s->pipeline)
		return 1;
	if (!s->config)
		return 0;
	if (!s->nindex) {
		rc = md_any_valid(ns, path, s);
		if (rc <= 0)
			return rc;
	}
	/* Unreadable or quantised in a layout castfs does not dequantize:
	 * no views, not an error. */
	rc = ns_dir_config(ns, path, &c);
	if (rc)
		return ns_err_transient(rc) ? rc : 0;
	return ns_ckpt_dir_quant(ns, path, &q) == 0 &&
	       (!q.quantized || castfs_md_quant_dequantized(&q));
}

/* Whether a shard of @sh is rejected (cut short, say): "shard X: <why>"
 * in @reason. A transient failure is not: the next call tries again. */
static bool md_shard_rejected(struct castfs_ns *ns,
			      const struct ns_gguf_shards *sh, char *reason,
			      size_t len)
{
	char why[256];

	for (size_t k = 0; k < sh->n; k++) {
		if (ns_ckpt_rejected(ns, sh->paths[k], why, sizeof(why))) {
			snprintf(reason, len, "shard %s: %s", sh->names[k],
				 why);
			return true;
		}
	}
	return false;
}

/*
 * Whether weights index @p (named @name) names a shard castfs cannot
 * serve: one that is not there (nor packed), one it rejects, or more than
 * it reads (CASTFS_PART_MAX); the reason in @reason. Its DIR.<view>/
 * would list an index whose rewrite fails at open, or a model without
 * that shard. Not cached: a shard may come back while the index stays
 * (the shards' headers are the checkpoint cache's).
 */
static bool md_shard_bad(struct castfs_ns *ns, const char *dir,
			 const char *name, const char *p, char *reason,
			 size_t len)
{
	struct castfs_diag d = { { 0 } };
	struct ns_gguf_shards sh;
	struct stat ist;
	const char *msg = d.msg;
	bool bad;
	int rc;

	if (!castfs_md_is_base_index(name) || ns_src_stat_in(ns, p, &ist))
		return false;
	rc = ns_gguf_shards_read(ns, dir, p, &ist, &sh, &d);
	if (!rc) {
		bad = md_shard_rejected(ns, &sh, reason, len);
		ns_gguf_shards_fini(ns, &sh);
		return bad;
	}
	if ((rc != -ENOENT && rc != -EINVAL) || !d.msg[0])
		return false; /* any other trouble: the open says it */
	/* The shard reader speaks for the GGUF views. */
	if (!strncmp(msg, "GGUF: ", 6))
		msg += 6;
	snprintf(reason, len, "%s", msg);
	return true;
}

/*
 * Whether an index of scan @s of @dir is refused: true with "<name>:
 * <reason>" in @why (@len bytes) if @why is not NULL. Any other error
 * (unreadable, gone) is not a refusal: the open says it, as before.
 */
static bool md_index_refused(struct castfs_ns *ns, const char *dir,
			     const struct ns_md_dir *s, char *why, size_t len)
{
	char reason[512];

	for (size_t i = 0; i < s->nindex; i++) {
		const char *name = s->indexes[i];
		char *p = ns_path_join(dir, name, strlen(name));
		int rc = p ? ns_md_index_ok(ns, p, NULL, reason,
					    sizeof(reason)) :
			     -ENOMEM;

		free(p);
		if (rc != -EINVAL)
			continue;
		if (why && len)
			snprintf(why, len, "%s: %s", name, reason);
		return true;
	}
	return false;
}

int ns_md_is_model(struct castfs_ns *ns, const char *path, bool *yes)
{
	struct ns_md_dir s;
	int rc = ns_md_dir_scan(ns, path, &s), model = 0;

	if (!rc)
		model = md_model_of(ns, path, &s);
	*yes = model > 0 && !md_bad_weight(ns, path, &s, NULL, 0) &&
	       !md_index_refused(ns, path, &s, NULL, 0);
	ns_md_dir_fini(&s);
	if (model < 0)
		return model;
	return rc == -ENOMEM ? rc : 0;
}

bool ns_md_index_refusal(struct castfs_ns *ns, const char *path, char *why,
			 size_t len)
{
	struct ns_md_dir s;
	bool refused = ns_md_dir_scan(ns, path, &s) == 0 &&
		       md_model_of(ns, path, &s) > 0 &&
		       (md_bad_weight(ns, path, &s, why, len) ||
			md_index_refused(ns, path, &s, why, len));

	ns_md_dir_fini(&s);
	return refused;
}

/* ---- building the rewritten JSON ---- */

/* The valid checkpoints of a directory, with references held. */
struct ns_md_ckpts {
	size_t n;
	struct ns_ckpt **ck;
	const struct castfs_header **h;
	struct castfs_header **own; /* the h[] this holds (4-bit sources) */
	bool sharded; /* the folder has a weights index */
};

static void md_ckpts_fini(struct castfs_ns *ns, struct ns_md_ckpts *c)
{
	for (size_t i = 0; i < c->n; i++) {
		ns_ckpt_put(ns, c->ck[i]);
		if (c->own)
			castfs_header_free(c->own[i]);
	}
	free(c->ck);
	free(c->h);
	free(c->own);
}

/*
 * The tensors a quantising view sees in checkpoint @ck: those of its
 * bf16 view when it is a quantized source (4-bit sources store packed
 * bytes under other shapes and names, FP8 ones other dtypes: the view
 * quantises the bf16 view's weights, and the config must name those),
 * else its own header (an FP8 block shard whose scales sit in other
 * shards has no bf16 view of its own). *@own is the header to free, or
 * NULL.
 */
static int md_ckpt_header(struct castfs_ns *ns, struct ns_ckpt *ck,
			  const struct castfs_header **h,
			  struct castfs_header **own)
{
	const struct castfs_view *bf16;
	const struct castfs_plan *plan;
	int rc;

	*h = ck->h;
	*own = NULL;
	if (!ck->quant)
		return 0;
	/* The bf16 the quantising views dequantize to (view_deq.c), not
	 * what a config made of the view called "bf16": a redefined one
	 * gave config.json another compute dtype than the weights', and a
	 * reload changed a file open across it (a bug hunt). */
	bf16 = castfs_views_find(ns->views, "bf16", 4);
	if (!bf16 || bf16->id_salt)
		bf16 = castfs_view_builtin("bf16");
	if (!bf16)
		return -ENOENT; /* unreachable: a built-in view */
	if (ck->xshard) {
		/* Its weights whose scales sit in other shards are
		 * dequantized (and so quantised again) only in the
		 * composite: its own header would name them as fp8
		 * weights kept as they are. */
		struct ns_md_xshard x;

		rc = ns_md_xshard_plan(ns, ck, bf16, 0, &x, &plan);
		if (!rc)
			rc = castfs_plan_header(plan, own, NULL);
		ns_md_xshard_fini(ns, &x);
	} else if (bf16 == castfs_view_builtin("bf16")) {
		/* not among the mount's views: its plan is not cached */
		struct castfs_qsrc_opts o;
		struct castfs_plan *p = NULL;

		rc = castfs_view_plan_opts(bf16, ck->h, ns_ckpt_qopts(ck, &o),
					   &p, NULL);
		if (!rc)
			rc = castfs_plan_header(p, own, NULL);
		castfs_plan_free(p);
	} else {
		rc = ns_ckpt_plan(ns, ck, bf16, &plan, NULL);
		if (!rc)
			rc = castfs_plan_header(plan, own, NULL);
	}
	if (!rc)
		*h = *own;
	return rc;
}

/* Whether @name is among the @n @names. */
static bool md_named(char *const *names, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(names[i], name))
			return true;
	return false;
}

/* Drop from @s the weights of @dir that transformers does not load: with
 * an index, the files it does not name; else, beside model.safetensors,
 * every other (a stray Mistral consolidated.safetensors would otherwise
 * add its tensors to the quantization_config). An index that cannot be
 * read keeps all: its view's shards are refused on their own; one being
 * written is -ESTALE. */
static int md_loaded_weights(struct castfs_ns *ns, const char *dir,
			     struct ns_md_dir *s)
{
	char **keep = NULL, *text = NULL, *p = NULL;
	size_t nkeep = 0, len, w = 0;
	struct castfs_diag d = { { 0 } };
	int rc = 0;

	for (size_t i = 0; i < s->nindex && !p; i++)
		if (!strcmp(s->indexes[i], "model.safetensors.index.json"))
			p = ns_path_join(dir, s->indexes[i],
					 strlen(s->indexes[i]));
	if (p) {
		rc = ns_src_read_text(ns, p, NULL, MD_JSON_MAX, &text, &len);
		if (!rc && castfs_md_gguf_shards(text, len, &keep, &nkeep, &d))
			nkeep = 0;
		free(text);
		free(p);
		/* being written: not "unreadable", which keeps every file */
		if (rc)
			return rc == -ENOMEM || rc == -ESTALE ? rc : 0;
	} else if (md_named(s->weights, s->nweights, "model.safetensors")) {
		keep = calloc(1, sizeof(*keep));
		if (!keep || !(keep[0] = strdup("model.safetensors"))) {
			free(keep);
			return -ENOMEM;
		}
		nkeep = 1;
	}
	for (size_t i = 0; nkeep && i < s->nweights; i++) {
		if (md_named(keep, nkeep, s->weights[i]))
			s->weights[w++] = s->weights[i];
		else
			free(s->weights[i]);
	}
	if (nkeep)
		s->nweights = w;
	castfs_md_gguf_shards_free(keep, nkeep);
	return 0;
}

static int md_ckpts_of(struct castfs_ns *ns, const char *dir,
		       struct ns_md_ckpts *c)
{
	struct ns_md_dir s;
	int rc = ns_md_dir_scan(ns, dir, &s);

	if (!rc)
		rc = md_loaded_weights(ns, dir, &s);

	*c = (struct ns_md_ckpts){ 0 };
	c->ck = calloc(s.nweights + 1, sizeof(*c->ck));
	c->h = calloc(s.nweights + 1, sizeof(*c->h));
	c->own = calloc(s.nweights + 1, sizeof(*c->own));
	if (!rc && (!c->ck || !c->h || !c->own))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < s.nweights; i++) {
		char *p = ns_path_join(dir, s.weights[i], strlen(s.weights[i]));
		struct stat st;
		int vrc = p ? ns_ckpt_valid(ns, p, &st, &c->ck[c->n]) : -ENOMEM;

		free(p);
		if (vrc == 0) {
			rc = md_ckpt_header(ns, c->ck[c->n], &c->h[c->n],
					    &c->own[c->n]);
			c->n++;
		} else if (vrc == -ENOMEM) {
			rc = vrc;
		}
	}
	c->sharded = s.nindex > 0;
	ns_md_dir_fini(&s);
	return rc;
}

/* Whether nvfp4 view @v quantises fused groups over every shard of @ck
 * (ns_md_xshard_wants()): its config then sees them all at once. */
static bool md_fuses_all(const struct castfs_view *v,
			 const struct ns_md_ckpts *ck)
{
	if (v->kind != CASTFS_VIEW_CT_NVFP4 || !ck->sharded || ck->n < 2)
		return false;
	for (size_t i = 0; i < ck->n; i++)
		if (!ns_md_xshard_wants(ck->ck[i], v))
			return false;
	return true;
}

/* The compressed-tensors quantization_config of @v over @ck. */
static int md_ct_init(struct castfs_md_ct *ct, const struct castfs_view *v,
		      const struct ns_md_ckpts *ck)
{
	const struct castfs_header *one;
	struct castfs_header *all = NULL;
	int rc;

	if (!md_fuses_all(v, ck))
		return castfs_md_ct_init(ct, v, ck->h, ck->n);
	rc = castfs_qsrc_xshard_all(ck->h, ck->n, &all);
	one = all;
	if (!rc)
		rc = castfs_md_ct_init(ct, v, &one, 1);
	castfs_header_free(all);
	return rc;
}

/* The quantization_config of @v with keep set @keep over @ck, into
 * @q (bitsandbytes views) or @ct (compressed-tensors views). */
static int md_qcfg_of(const struct castfs_view *v, int keep,
		      const struct ns_md_ckpts *ck, bool diffusers,
		      struct castfs_md_bnb *q, struct castfs_md_ct *ct)
{
	struct castfs_md_view mv;
	const struct castfs_view *use = v;
	int rc = 0;

	if (keep)
		rc = castfs_md_view_keep(v, keep, &mv);
	if (rc)
		return rc;
	if (keep)
		use = &mv.v;
	if (castfs_view_is_ct(v))
		rc = md_ct_init(ct, use, ck);
	else
		rc = castfs_md_bnb_init(q, use, ck->h, ck->n, diffusers);
	if (keep)
		castfs_md_view_fini(&mv);
	return rc;
}

/*
 * config.json through view @v: dtype and quantization_config. The
 * weights of every view of an FP8 block model are dequantized (castfs
 * offers no view of other quantized models): its own quantization_config
 * goes first.
 */
static int md_build_config(struct castfs_ns *ns, const struct ns_node *n,
			   const char *text, size_t len, char **out,
			   size_t *out_len)
{
	struct castfs_md_patch p = { 0 };
	struct castfs_md_config c;
	struct castfs_md_bnb q = { 0 };
	struct castfs_md_ct ct = { 0 };
	struct ns_md_ckpts ck = { 0 };
	char *dir = NULL;
	int rc = castfs_md_config_read(text, len, &c, NULL);

	if (rc)
		return rc;
	p.dtype = c.diffusers ? NULL : castfs_md_view_dtype(n->view);
	if (n->view->kind != CASTFS_VIEW_CAST) {
		dir = ns_parent_path(n->path);
		rc = dir ? md_ckpts_of(ns, dir, &ck) : -ENOMEM;
		if (!rc)
			rc = md_qcfg_of(n->view, castfs_md_keep_of(&c), &ck,
					c.diffusers, &q, &ct);
		/* Nothing quantised: no config, as llm-compressor. */
		if (!rc && castfs_view_is_ct(n->view) && ct.nquant)
			p.ct = &ct;
		else if (!rc && castfs_view_is_ct(n->view))
			p.ct = NULL;
		else if (!rc)
			p.bnb = &q;
	}
	if (!rc)
		rc = castfs_md_config_patch(text, len, &p, out, out_len, NULL);
	castfs_md_bnb_fini(&q);
	castfs_md_ct_fini(&ct);
	md_ckpts_fini(ns, &ck);
	free(dir);
	return rc;
}

struct ns_md_shard_ctx {
	struct castfs_ns *ns;
	const char *dir;
	const struct castfs_view *view;
	int keep;
};

/* castfs_md_shard_fn: the header of shard @name through the view. */
static int md_shard(void *ctx, const char *name, struct castfs_header **out)
{
	const struct ns_md_shard_ctx *c = ctx;
	const struct castfs_plan *plan;
	char *path = ns_path_join(c->dir, name, strlen(name));
	struct ns_ckpt *ck;
	struct stat st;
	int rc = path ? ns_ckpt_valid(c->ns, path, &st, &ck) : -ENOMEM;

	free(path);
	if (rc)
		return rc;
	rc = ns_md_shard_plan(c->ns, ck, c->view, c->keep, &plan);
	if (!rc)
		rc = castfs_plan_header(plan, out, NULL);
	ns_ckpt_put(c->ns, ck);
	return rc;
}

static void md_log_refused(struct castfs_ns *ns, const struct ns_node *n,
			   const char *why)
{
	ns_logf(ns, n->path, "view %s: refused: %s", n->view->name, why);
}

static int md_build_index(struct castfs_ns *ns, const struct ns_node *n,
			  const char *text, size_t len, char **out,
			  size_t *out_len)
{
	struct ns_md_shard_ctx c = { ns, NULL, n->view, 0 };
	struct castfs_diag d = { { 0 } };
	char *dir = ns_parent_path(n->path);
	int rc;

	if (!dir)
		return -ENOMEM;
	c.dir = dir;
	/* The variant spelling names the single-file views: no model rules. */
	if (n->aux == MF_INDEX)
		c.keep = ns_md_keep_of(ns, dir, n->view);
	if (c.keep < 0) {
		free(dir);
		return c.keep;
	}
	rc = castfs_md_index_rewrite(text, len,
				     n->aux == MF_VINDEX ? n->view->name : NULL,
				     md_shard, &c, out, out_len, &d);
	/* An index castfs refuses (a shard named by a path, "../x" or
	 * "/x") is said, not only failed. */
	if (rc == -EINVAL && d.msg[0])
		md_log_refused(ns, n, d.msg);
	free(dir);
	return rc;
}

static int md_build_config_of(struct castfs_ns *ns, const struct ns_node *n,
			      const char *text, size_t len, char **out,
			      size_t *out_len)
{
	struct castfs_md_quant mq;
	char *plain;
	size_t plen;
	int rc = castfs_md_quant_read(text, len, &mq, NULL);

	if (rc || !mq.quantized)
		return rc ? rc :
			    md_build_config(ns, n, text, len, out, out_len);
	rc = castfs_md_config_unquant(text, len, &plain, &plen, NULL);
	if (rc)
		return rc;
	rc = md_build_config(ns, n, plain, plen, out, out_len);
	free(plain);
	return rc;
}

static int md_build(struct castfs_ns *ns, const struct ns_node *n, char **out,
		    size_t *out_len)
{
	char *text;
	size_t len;
	int rc = ns_md_read(ns, n->path, &n->st, &text, &len);

	if (rc)
		return rc;
	if (n->aux == MF_CONFIG)
		rc = md_build_config_of(ns, n, text, len, out, out_len);
	else
		rc = md_build_index(ns, n, text, len, out, out_len);
	free(text);
	return rc;
}

/* Whether @n's sources are still those it was looked up with. */
static int md_current(struct castfs_ns *ns, const struct ns_node *n)
{
	char *dir = ns_parent_path(n->path);
	struct ns_md_dir s = { 0 };
	struct stat st;
	int rc = dir ? ns_src_stat_in(ns, n->path, &st) : -ENOMEM;

	if (!rc && !ns_same_file(&st, &n->st))
		rc = -ESTALE;
	if (!rc)
		rc = ns_md_dir_scan(ns, dir, &s);
	if (!rc && s.fp != n->dep)
		rc = -ESTALE;
	ns_md_dir_fini(&s);
	free(dir);
	return rc == -ENOENT ? -ESTALE : rc;
}

/* ---- the cache ---- */

struct ns_md_entry {
	struct ns_md_entry *next;
	char *path;
	const struct castfs_view *view;
	uint32_t aux;
	struct stat ident;
	uint64_t dep;
	char *text;
	size_t len;
};

struct ns_mdcache {
	pthread_mutex_t lock;
	struct ns_md_entry *b[MD_BUCKETS];
	struct ns_mdtext *ixc; /* checked indexes */
	/* The index names of the directory the watcher last asked about
	 * (ns_md_dir_indexes), with that directory's identity. */
	char *ix_path;
	dev_t ix_dev;
	ino_t ix_ino;
	struct ns_md_dir ix;
};

int ns_md_index_ok(struct castfs_ns *ns, const char *path, size_t *longest,
		   char *why, size_t len)
{
	int rc = ns_md_ixc_check(ns, ns->md->ixc, path, longest, why, len);
	const char *slash = strrchr(path, '/');
	char *dir, reason[512];

	if (rc)
		return rc;
	dir = ns_parent_path(path);
	if (!dir)
		return -ENOMEM;
	if (md_shard_bad(ns, dir, slash ? slash + 1 : path, path, reason,
			 sizeof(reason))) {
		rc = -EINVAL;
		if (why && len)
			snprintf(why, len, "%s", reason);
	}
	free(dir);
	return rc;
}

void ns_md_index_forget(struct castfs_ns *ns, const char *path)
{
	ns_mdtext_forget(ns->md->ixc, path);
	ns_gguf_shards_forget(ns, path);
}

static struct ns_md_entry **md_bucket(struct castfs_ns *ns, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return &ns->md->b[castfs_mix64(h) % MD_BUCKETS];
}

static bool md_same_key(const struct ns_md_entry *e, const struct ns_node *n)
{
	return e->view == n->view && e->aux == n->aux &&
	       strcmp(e->path, n->path) == 0;
}

static void md_entry_free(struct ns_md_entry *e)
{
	free(e->path);
	free(e->text);
	free(e);
}

/* Caller holds the lock. The size, or a plan of a copy, of @e. */
static int md_entry_out(const struct ns_md_entry *e, uint64_t *size,
			struct castfs_plan **plan)
{
	if (size)
		*size = e->len;
	return plan ? castfs_plan_new_mem(e->text, e->len, plan) : 0;
}

/* The entry for @n if cached: 0 with the outputs filled, else -ENOENT. */
static int md_cached(struct castfs_ns *ns, const struct ns_node *n,
		     uint64_t *size, struct castfs_plan **plan)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&ns->md->lock);
	for (struct ns_md_entry *e = *md_bucket(ns, n->path); e; e = e->next) {
		if (md_same_key(e, n) && e->dep == n->dep &&
		    ns_same_file(&e->ident, &n->st)) {
			rc = md_entry_out(e, size, plan);
			break;
		}
	}
	pthread_mutex_unlock(&ns->md->lock);
	return rc;
}

/* Insert built @e, replacing older identities of the same file. */
static int md_insert(struct castfs_ns *ns, struct ns_md_entry *e,
		     uint64_t *size, struct castfs_plan **plan)
{
	const struct ns_node key = { .path = e->path,
				     .view = e->view,
				     .aux = e->aux };
	struct ns_md_entry **pp, *o;
	int rc;

	pthread_mutex_lock(&ns->md->lock);
	for (pp = md_bucket(ns, e->path); (o = *pp);) {
		if (md_same_key(o, &key)) {
			*pp = o->next;
			md_entry_free(o);
			continue;
		}
		pp = &o->next;
	}
	e->next = *md_bucket(ns, e->path);
	*md_bucket(ns, e->path) = e;
	rc = md_entry_out(e, size, plan);
	pthread_mutex_unlock(&ns->md->lock);
	return rc;
}

static int md_json_get(struct castfs_ns *ns, const struct ns_node *n,
		       uint64_t *size, struct castfs_plan **plan)
{
	struct ns_md_entry *e;
	int rc = md_current(ns, n);

	if (rc)
		return rc;
	rc = md_cached(ns, n, size, plan);
	if (rc != -ENOENT)
		return rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	*e = (struct ns_md_entry){
		.view = n->view, .aux = n->aux, .ident = n->st, .dep = n->dep
	};
	e->path = strdup(n->path);
	rc = e->path ? md_build(ns, n, &e->text, &e->len) : -ENOMEM;
	/* Built from sources that changed meanwhile: not this node's. */
	if (!rc)
		rc = md_current(ns, n);
	if (rc) {
		md_entry_free(e);
		return rc;
	}
	return md_insert(ns, e, size, plan);
}

int ns_md_json_size(struct castfs_ns *ns, const struct ns_node *n,
		    uint64_t *size)
{
	return md_json_get(ns, n, size, NULL);
}

int ns_md_json_plan(struct castfs_ns *ns, const struct ns_node *n,
		    struct castfs_plan **out)
{
	return md_json_get(ns, n, NULL, out);
}

void ns_md_json_forget(struct castfs_ns *ns, const char *dir)
{
	size_t dl = strlen(dir);

	pthread_mutex_lock(&ns->md->lock);
	for (size_t i = 0; i < MD_BUCKETS; i++) {
		struct ns_md_entry **pp = &ns->md->b[i], *e;

		while ((e = *pp)) {
			const char *slash = strrchr(e->path, '/');
			size_t pl = slash ? (size_t)(slash - e->path) : 0;

			if (pl == dl && memcmp(e->path, dir, dl) == 0) {
				*pp = e->next;
				md_entry_free(e);
				continue;
			}
			pp = &e->next;
		}
	}
	pthread_mutex_unlock(&ns->md->lock);
	ns_dir_config_forget(ns, dir);
}

int ns_modeldir_init(struct castfs_ns *ns)
{
	ns->md = calloc(1, sizeof(*ns->md));
	if (!ns->md)
		return -ENOMEM;
	if (ns_md_ixc_new(&ns->md->ixc)) {
		free(ns->md);
		ns->md = NULL;
		return -ENOMEM;
	}
	pthread_mutex_init(&ns->md->lock, NULL);
	return 0;
}

/* Index names of directory @path (open as @fd, consumed), by name only:
 * what the watcher invalidates, where one name too many costs nothing. */
static int md_scan_indexes(int fd, struct ns_md_dir *s)
{
	DIR *dp = fdopendir(fd);
	struct dirent *de;
	int rc = 0;

	if (!dp) {
		close(fd);
		return -errno;
	}
	while (!rc && (errno = 0, de = readdir(dp))) {
		if (castfs_md_name_kind(de->d_name) == CASTFS_MD_INDEX)
			rc = md_push(&s->indexes, &s->nindex, de->d_name);
	}
	if (!rc && errno)
		rc = -errno;
	closedir(dp);
	return rc;
}

/* Caller holds md->lock. Rescan @path into the one-directory cache. */
static int md_ix_fill_locked(struct castfs_ns *ns, const char *path,
			     const struct stat *st)
{
	struct ns_mdcache *c = ns->md;
	int fd, rc;

	ns_md_dir_fini(&c->ix);
	free(c->ix_path);
	c->ix_path = NULL;
	fd = ns_src_open(ns, path, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return fd;
	rc = md_scan_indexes(fd, &c->ix);
	c->ix_path = rc ? NULL : strdup(path);
	if (!c->ix_path) {
		ns_md_dir_fini(&c->ix);
		return rc ? rc : -ENOMEM;
	}
	c->ix_dev = st->st_dev;
	c->ix_ino = st->st_ino;
	return 0;
}

int ns_md_dir_indexes(struct castfs_ns *ns, const char *path, bool rescan,
		      struct ns_md_dir *s)
{
	struct ns_mdcache *c = ns->md;
	struct stat st;
	int rc = ns_src_stat(ns, path, &st);

	*s = (struct ns_md_dir){ .fp = 1 };
	if (rc)
		return rc;
	pthread_mutex_lock(&c->lock);
	if (rescan || !c->ix_path || strcmp(c->ix_path, path) ||
	    c->ix_dev != st.st_dev || c->ix_ino != st.st_ino)
		rc = md_ix_fill_locked(ns, path, &st);
	for (size_t i = 0; !rc && i < c->ix.nindex; i++)
		rc = md_push(&s->indexes, &s->nindex, c->ix.indexes[i]);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

void ns_modeldir_fini(struct castfs_ns *ns)
{
	if (!ns->md)
		return;
	ns_md_dir_fini(&ns->md->ix);
	free(ns->md->ix_path);
	ns_mdtext_free(ns->md->ixc);
	for (size_t i = 0; i < MD_BUCKETS; i++) {
		while (ns->md->b[i]) {
			struct ns_md_entry *e = ns->md->b[i];

			ns->md->b[i] = e->next;
			md_entry_free(e);
		}
	}
	pthread_mutex_destroy(&ns->md->lock);
	free(ns->md);
	ns->md = NULL;
}
