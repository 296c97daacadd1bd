/* SPDX-License-Identifier: MIT */
/*
 * Model-directory views in the namespace: DIR.<view>/ next to a directory
 * that holds a transformers or diffusers model, in which every shard is
 * converted under its own name, index.json and config.json are rewritten
 * for the view and everything else is the source's; and the variant
 * spelling X.safetensors.index.<view>.json next to a source index.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/escape.h"
#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"

static char empty_sub[1]; /* a view root's sub-path, "" */

/* ---- in source directories ---- */

/* "DIR.<view>" -> the length of DIR and the view, or -ENOENT. */
static int split_dir_view(struct castfs_ns *ns, const char *name,
			  size_t *base_len, const struct castfs_view **v)
{
	const char *dot = strrchr(name, '.');

	if (!dot || dot == name)
		return -ENOENT;
	*v = castfs_views_find(ns->views, dot + 1, strlen(dot + 1));
	if (!*v || (*v)->kind == CASTFS_VIEW_GGUF ||
	    (*v)->kind == CASTFS_VIEW_COMFY_FP8) /* single files only */
		return -ENOENT;
	*base_len = (size_t)(dot - name);
	return 0;
}

static int lookup_root(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child)
{
	const struct castfs_view *v;
	size_t base_len;
	bool model;
	char *path;
	int rc = split_dir_view(ns, name, &base_len, &v);

	if (rc)
		return rc;
	path = ns_path_join(dir->path, name, base_len);
	if (!path)
		return -ENOMEM;
	rc = ns_src_stat(ns, path, &child->st);
	if (!rc && !S_ISDIR(child->st.st_mode))
		rc = -ENOENT;
	if (!rc)
		rc = ns_md_is_model(ns, path, &model);
	if (!rc && !model)
		rc = -ENOENT;
	if (!rc && !castfs_view_dequantizes(v) && ns_md_casts_only(ns, path))
		rc = -ENOENT; /* not offered for a quantized model */
	if (!rc && ns_md_view_refused(ns, path, v))
		rc = -ENOENT; /* /.castfs/refused says why */
	if (rc) {
		free(path);
		return rc;
	}
	child->kind = NS_MDIR;
	child->view = v;
	child->path = path;
	child->sub = strdup("");
	return child->sub ? 0 : -ENOMEM;
}

/* The fingerprint of source directory @path (what an index depends on). */
static int dir_fp(struct castfs_ns *ns, const char *path, uint64_t *fp)
{
	struct ns_md_dir s;
	int rc = ns_md_dir_scan(ns, path, &s);

	*fp = s.fp;
	ns_md_dir_fini(&s);
	return rc;
}

/*
 * Whether source directory @path holds a quantized model: then it has no
 * variant spellings, since a loader reads the source's config.json, and
 * its quantization_config, through them.
 */
static bool md_quantized(struct castfs_ns *ns, const char *path)
{
	struct castfs_md_quant q;

	return ns_ckpt_dir_quant(ns, path, &q) != 0 || q.quantized;
}

/*
 * The longest view name whose variant spelling of an index is listed, for
 * an index whose longest shard name has @longest bytes: that spelling
 * names each shard's view "X.<view>.safetensors", which must fit NAME_MAX
 * (a bug hunt: index.fp8_e5m2.json of 250-byte shards was listed and named
 * shard views of 259 bytes, which no listing shows and no lookup finds).
 */
static size_t vindex_room(size_t longest)
{
	return longest + 1 < NAME_MAX ? NAME_MAX - longest - 1 : 0;
}

static int lookup_vindex(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, struct ns_node *child)
{
	const struct castfs_view *v;
	size_t stem, vlen, longest = 0;
	const char *vname;
	char base[300];
	int rc;

	if (!castfs_md_split_variant_index(name, &stem, &vname, &vlen))
		return -ENOENT;
	v = castfs_views_find(ns->views, vname, vlen);
	if (!v || v->kind == CASTFS_VIEW_GGUF ||
	    v->kind == CASTFS_VIEW_COMFY_FP8 || stem + 6 > sizeof(base))
		return -ENOENT;
	snprintf(base, sizeof(base), "%.*s.json", (int)stem, name);
	child->path = ns_path_join(dir->path, base, strlen(base));
	if (!child->path)
		return -ENOMEM;
	rc = ns_src_stat_in(ns, child->path, &child->st);
	if (!rc && !S_ISREG(child->st.st_mode))
		rc = -ENOENT;
	if (!rc && md_quantized(ns, dir->path))
		rc = -ENOENT;
	/* An index castfs refuses has no variant spellings (not listed),
	 * nor one that would name shard views past NAME_MAX. */
	if (!rc &&
	    ns_md_index_ok(ns, child->path, &longest, NULL, 0) == -EINVAL)
		rc = -ENOENT;
	if (!rc && vlen > vindex_room(longest))
		rc = -ENOENT;
	if (!rc)
		rc = dir_fp(ns, dir->path, &child->dep);
	child->kind = NS_MFILE;
	child->aux = MF_VINDEX;
	child->view = v;
	return rc;
}

static int modeldir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			   const char *name, struct ns_node *child)
{
	int rc;

	/* The source's lookups free what they made when they fail. */
	*child = (struct ns_node){ 0 };
	rc = lookup_vindex(ns, dir, name, child);
	if (rc != -ENOENT)
		return rc;
	free(child->path);
	*child = (struct ns_node){ 0 };
	return lookup_root(ns, dir, name, child);
}

/* Which views of a source entry get a name "@stem.<view>@ext" (@stem
 * @len bytes of entry @name of source directory @dir), with the id of
 * @node: only casts when @casts_only, only views computed from
 * dequantized values when @deq_only (what lookup_root serves for a
 * quantized model: a listed name must not answer ENOENT), none that
 * @refused (by kind: bitsandbytes, ct), none whose name has more than
 * @vmax bytes (an index's shards would then be named past NAME_MAX). */
struct md_views {
	const struct ns_node *dir;
	const char *name;
	size_t len;
	const char *ext;
	struct ns_node *node;
	bool casts_only, deq_only;
	const bool *refused;
	size_t vmax;
	size_t longest; /* an index's longest shard name (the reason) */
};

static bool md_view_wanted(const struct md_views *w,
			   const struct castfs_view *v)
{
	return v->listed && v->kind != CASTFS_VIEW_GGUF &&
	       v->kind != CASTFS_VIEW_COMFY_FP8 &&
	       (!w->casts_only || v->kind == CASTFS_VIEW_CAST) &&
	       (!w->deq_only || castfs_view_dequantizes(v)) &&
	       (!w->refused || v->kind == CASTFS_VIEW_CAST ||
		!w->refused[castfs_view_is_ct(v)]);
}

/* Add @w's name of view @v to @l, or say in /.castfs/refused why it has
 * none past NAME_MAX. */
static int list_view(struct ns_list *l, const struct md_views *w,
		     const struct castfs_view *v)
{
	char buf[512], why[160];
	size_t vlen = strlen(v->name);
	int n;

	n = snprintf(buf, sizeof(buf), "%.*s.%s%s", (int)w->len, w->name,
		     v->name, w->ext);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return 0;
	/* A source entry of that name is shown, and says nothing. */
	if (vlen > w->vmax &&
	    !(n <= NAME_MAX && ns_list_has(l, buf, (size_t)n))) {
		snprintf(why, sizeof(why),
			 "name too long: its shards' files in this view "
			 "would be up to %zu bytes, past NAME_MAX %d",
			 w->longest + 1 + vlen, NAME_MAX);
		return ns_list_too_long(l, w->dir->path, w->name, v->name, buf,
					(size_t)n, why);
	}
	w->node->view = v;
	return ns_list_derived(l, w->dir->path, w->name, v->name, buf,
			       (size_t)n,
			       w->node->kind == NS_MDIR ? S_IFDIR : S_IFREG,
			       ns_node_id(w->node));
}

static int list_views(struct castfs_ns *ns, struct ns_list *l,
		      const struct md_views *w)
{
	int rc = 0;

	for (size_t i = 0; !rc && i < ns->views->n; i++) {
		if (md_view_wanted(w, &ns->views->v[i]))
			rc = list_view(l, w, &ns->views->v[i]);
	}
	return rc;
}

static int list_roots(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_list *l)
{
	struct ns_node node = { .kind = NS_MDIR, .sub = empty_sub };
	char *path = ns_path_join(dir->path, name, strlen(name));
	bool model = false;
	int rc = path ? ns_md_is_model(ns, path, &model) : -ENOMEM;

	if (rc == -ESTALE)
		rc = 0; /* its config.json being written: unlisted this time */
	if (!rc && model && ns_src_stat(ns, path, &node.st) == 0) {
		/* once per folder, not per view: bitsandbytes, ct */
		const bool refused[2] = {
			ns_md_quant_refusal(ns, path, false, NULL, 0),
			ns_md_quant_refusal(ns, path, true, NULL, 0)
		};
		const struct md_views w = {
			.dir = dir,
			.name = name,
			.len = strlen(name),
			.ext = "",
			.node = &node,
			.deq_only = ns_md_casts_only(ns, path),
			.refused = refused,
			.vmax = SIZE_MAX,
		};

		rc = list_views(ns, l, &w);
	}
	free(path);
	return rc;
}

/* The variant spellings of index @name: only casts, because a loader
 * reads the source's config.json through them (docs/LOADERS.md §3.4). */
static int list_vindex(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_list *l)
{
	struct ns_node node = { .kind = NS_MFILE, .aux = MF_VINDEX };
	char *path = ns_path_join(dir->path, name, strlen(name));
	int rc = path ? ns_src_stat_in(ns, path, &node.st) : -ENOMEM;
	size_t longest = 0;

	if (!rc && !S_ISREG(node.st.st_mode))
		rc = -ENOENT;
	if (!rc && md_quantized(ns, dir->path))
		rc = -ENOENT;
	if (!rc && ns_md_index_ok(ns, path, &longest, NULL, 0) == -EINVAL)
		rc = -ENOENT;
	if (!rc)
		rc = dir_fp(ns, dir->path, &node.dep);
	if (!rc) {
		const struct md_views w = {
			.dir = dir,
			.name = name,
			.len = strlen(name) - 5,
			.ext = ".json",
			.node = &node,
			.casts_only = true,
			.vmax = vindex_room(longest),
			.longest = longest,
		};

		rc = list_views(ns, l, &w);
	}
	free(path);
	return rc == -ENOMEM ? rc : 0;
}

/* The views of a sub-directory that holds a model, the variant spellings
 * of a "*.safetensors.index.json". */
static int modeldir_list(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, mode_t type, bool ckpt,
			 const struct stat *st, struct ns_list *l)
{
	(void)ckpt;
	(void)st;
	if (type == S_IFDIR)
		return list_roots(ns, dir, name, l);
	if ((type == S_IFREG || type == S_IFLNK) &&
	    castfs_md_is_base_index(name))
		return list_vindex(ns, dir, name, l);
	return 0;
}

/* {"path", "views", "reason"} for the DIR.<view>/ names that @path
 * would have but for a refused index, or for its quantising ones when its
 * architecture is refused them (/.castfs/refused). */
static int modeldir_refusals(struct castfs_ns *ns, const char *path, cJSON *arr)
{
	char why[512], *p = NULL, *r = NULL;
	cJSON *o = NULL, *views;
	bool casts_only, quant = false;
	bool model = false;
	int rc = -ENOMEM;

	if (!path[0])
		return 0;
	if (!ns_md_index_refusal(ns, path, why, sizeof(why))) {
		/* The bitsandbytes reason if those are refused, else the
		 * compressed-tensors one (the checked list is smaller). */
		if (ns_md_is_model(ns, path, &model) || !model ||
		    (!ns_md_quant_refusal(ns, path, false, why, sizeof(why)) &&
		     !ns_md_quant_refusal(ns, path, true, why, sizeof(why))))
			return 0;
		quant = true;
	}
	casts_only = ns_md_casts_only(ns, path);
	p = castfs_escape(path, strlen(path));
	r = castfs_escape_text(why, strlen(why));
	if (!p || !r || !(o = cJSON_CreateObject()) ||
	    !cJSON_AddStringToObject(o, "path", p) ||
	    !(views = cJSON_AddArrayToObject(o, "views")) ||
	    !cJSON_AddStringToObject(o, "reason", r))
		goto out;
	for (size_t i = 0; i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];

		/* The names lookup_root() would have found. */
		if (!v->listed || v->kind == CASTFS_VIEW_GGUF ||
		    v->kind == CASTFS_VIEW_COMFY_FP8 ||
		    (casts_only && !castfs_view_dequantizes(v)) ||
		    (quant && !ns_md_view_refused(ns, path, v)))
			continue;
		if (!cJSON_AddItemToArray(views, cJSON_CreateString(v->name)))
			goto out;
	}
	rc = 0;
	/* A refusal of views none of which is listed (-o views=) says
	 * nothing a listing would have shown. */
	if (quant && !cJSON_GetArraySize(views))
		goto out;
	cJSON_AddItemToArray(arr, o);
	o = NULL;
out:
	cJSON_Delete(o);
	free(p);
	free(r);
	return rc;
}

const struct ns_dir_ext ns_modeldir_dir_ext = {
	.lookup = modeldir_lookup,
	.list = modeldir_list,
	.refusals = modeldir_refusals,
};

/* ---- inside DIR.<view>/ ---- */

/*
 * 1 if @path (identity @st) is a valid checkpoint, its node's dep in view
 * @v for keep set @keep into @dep; 0 if it is none (rejected or gone: the
 * view passes the file through, and the folder's plan refuses the view
 * when the file is one of its weights). Any other failure is the lookup's
 * error: a file being written or changed since the listing passed
 * through would be the source's bytes under a converted name.
 */
static int is_checkpoint(struct castfs_ns *ns, const char *path,
			 const struct stat *st, const struct castfs_view *v,
			 int keep, uint64_t *dep)
{
	struct ns_ckpt *ck;
	struct stat now;
	int rc;

	/* By name: a missing X.safetensors may be its pack X.safetensors.zst. */
	rc = ns_ckpt_valid(ns, path, &now, &ck);
	if (rc)
		return rc == -ENOENT ? 0 : rc;
	rc = ns_same_file(&now, st) ? 1 : -ESTALE;
	*dep = (uint64_t)keep;
	if (rc == 1 && ns_md_xshard_wants(ck, v)) {
		rc = ns_md_xshard_dep(ns, ck, keep, dep);
		/* nvfp4 of a file no index names: the file alone */
		rc = rc == 0 || (rc == -ENOENT && !ck->xshard) ? 1 : rc;
	}
	ns_ckpt_put(ns, ck);
	return rc;
}

/* A file inside the view: converted, rewritten, or the source's. */
static int child_file(struct castfs_ns *ns, const struct castfs_view *v,
		      const char *name, const struct ns_md_dir *s, int keep,
		      struct ns_node *child)
{
	int rc;

	child->kind = NS_FILE;
	switch (castfs_md_name_kind(name)) {
	case CASTFS_MD_WEIGHTS:
		rc = is_checkpoint(ns, child->path, &child->st, v, keep,
				   &child->dep);
		if (rc < 0)
			return rc;
		if (rc) {
			child->kind = NS_MFILE;
			child->aux = MF_SHARD;
		}
		break;
	case CASTFS_MD_INDEX:
		child->kind = NS_MFILE;
		child->aux = MF_INDEX;
		child->dep = s->fp;
		break;
	case CASTFS_MD_CONFIG:
		if (ns_md_dir_weights(s)) {
			child->kind = NS_MFILE;
			child->aux = MF_CONFIG;
			child->dep = s->fp;
		}
		break;
	case CASTFS_MD_PIPELINE:
	case CASTFS_MD_OTHER:
		break;
	}
	return 0;
}

/*
 * The identity of entry @path of a model directory: a link that stays in
 * the root counts as the file it reaches when the view computes from it
 * (weights, indexes, config.json), so that a Hugging Face snapshot of
 * links to blobs converts; any other link stays a link.
 */
static int md_stat(struct castfs_ns *ns, const char *path,
		   enum castfs_md_name kind, struct stat *st)
{
	if (kind == CASTFS_MD_OTHER || kind == CASTFS_MD_PIPELINE)
		return ns_src_stat(ns, path, st);
	return ns_src_stat_in(ns, path, st);
}

static int md_stat_entry(struct castfs_ns *ns, const char *dir,
			 const char *name, struct stat *st)
{
	char *path = ns_path_join(dir, name, strlen(name));
	int rc = path ? md_stat(ns, path, castfs_md_name_kind(name), st) :
			-ENOMEM;

	free(path);
	return rc;
}

/*
 * Entry @name of view directory @dir, source identity @st already in
 * @child, into @child: kind, aux, view, sub, dep, path. @s is the scan of
 * the source directory, @keep its keep set. Pass-through files and links
 * are the source's nodes (no view, no sub), so they have the source's ids.
 */
static int view_child(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, const struct ns_md_dir *s, int keep,
		      struct ns_node *child)
{
	child->path = ns_path_join(dir->path, name, strlen(name));
	if (!child->path)
		return -ENOMEM;
	switch (child->st.st_mode & S_IFMT) {
	case S_IFDIR:
		child->kind = NS_MDIR;
		break;
	case S_IFLNK:
		child->kind = NS_LINK;
		return 0;
	case S_IFREG: {
		int rc = child_file(ns, dir->view, name, s, keep, child);

		if (rc || child->kind == NS_FILE)
			return rc;
		break;
	}
	default:
		return -ENOENT; /* FIFOs, sockets, devices: not mirrored */
	}
	child->view = dir->view;
	child->sub = ns_path_join(dir->sub, name, strlen(name));
	return child->sub ? 0 : -ENOMEM;
}

static int mdir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child)
{
	enum castfs_md_name kind = castfs_md_name_kind(name);
	struct ns_md_dir s = { 0 };
	int keep = 0;
	char *path = ns_path_join(dir->path, name, strlen(name));
	int rc = path ? md_stat(ns, path, kind, &child->st) : -ENOMEM;

	if (rc == -ENOENT && kind == CASTFS_MD_WEIGHTS)
		rc = ns_ckpt_packed_stat(ns, path, &child->st);
	free(path);
	/* Only the rewritten JSON depends on the rest of the directory. */
	if (!rc && (kind == CASTFS_MD_INDEX || kind == CASTFS_MD_CONFIG))
		rc = ns_md_dir_scan(ns, dir->path, &s);
	if (!rc && kind == CASTFS_MD_WEIGHTS)
		keep = ns_md_keep_of(ns, dir->path, dir->view);
	if (keep < 0)
		rc = keep;
	if (!rc)
		rc = view_child(ns, dir, name, &s, keep, child);
	ns_md_dir_fini(&s);
	return rc;
}

/*
 * The name entry @name (identity @st) is listed under: a usable pack's
 * shown name (written to @buf, NAME_MAX + 1 bytes), else @name, so that
 * the listing agrees with what mdir_lookup() finds.
 */
static const char *mdir_shown(struct castfs_ns *ns, const struct ns_node *dir,
			      int dfd, const char *name, const struct stat *st,
			      char *buf)
{
	const char *shown = ns_packed_shown(dfd, name, buf, NAME_MAX + 1);
	struct stat pst;
	char *path;
	bool ok;

	if (shown == name)
		return name;
	path = ns_path_join(dir->path, shown, strlen(shown));
	ok = path && ns_ckpt_packed_stat(ns, path, &pst) == 0 &&
	     ns_same_file(&pst, st);
	free(path);
	return ok ? shown : name;
}

/* List @dp's entries with the ids their lookups give. */
static int mdir_list_entries(struct castfs_ns *ns, const struct ns_node *dir,
			     DIR *dp, const struct ns_md_dir *s,
			     struct ns_list *l)
{
	int keep = ns_md_keep_of(ns, dir->path, dir->view);
	int rc = keep < 0 ? keep : 0;
	struct dirent *de;

	while (!rc && (errno = 0, de = readdir(dp))) {
		struct ns_node c = { 0 };
		char buf[NAME_MAX + 1];
		const char *name;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(dirfd(dp), de->d_name, &c.st, AT_SYMLINK_NOFOLLOW))
			continue;
		if (S_ISLNK(c.st.st_mode) &&
		    md_stat_entry(ns, dir->path, de->d_name, &c.st))
			continue;
		name = mdir_shown(ns, dir, dirfd(dp), de->d_name, &c.st, buf);
		rc = view_child(ns, dir, name, s, keep, &c);
		if (!rc)
			rc = ns_list_add(l, name, strlen(name),
					 c.st.st_mode & S_IFMT, ns_node_id(&c));
		else if (rc == -ENOENT || rc == -ESTALE)
			rc = 0; /* gone, or being written: its lookup says */
		free(c.path);
		free(c.sub);
	}
	if (!rc && errno)
		rc = -errno;
	return rc;
}

static int mdir_list(struct castfs_ns *ns, const struct ns_node *dir,
		     struct ns_list *l)
{
	struct ns_md_dir s;
	DIR *dp;
	int fd, rc = ns_md_dir_scan(ns, dir->path, &s);

	fd = rc ? rc : ns_src_open(ns, dir->path, O_RDONLY | O_DIRECTORY);
	if (fd < 0) {
		rc = fd;
		goto out_fini;
	}
	dp = fdopendir(fd);
	if (!dp) {
		rc = -errno;
		close(fd);
		goto out_fini;
	}
	rc = mdir_list_entries(ns, dir, dp, &s, l);
	closedir(dp);
out_fini:
	ns_md_dir_fini(&s);
	return rc;
}

static int mdir_getattr(struct castfs_ns *ns, const struct ns_node *n,
			struct stat *st)
{
	struct stat now;
	int rc = ns_src_stat(ns, n->path, &now);

	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!S_ISDIR(now.st_mode) || now.st_dev != n->st.st_dev ||
	    now.st_ino != n->st.st_ino)
		return -ESTALE;
	ns_dir_stat(&now, n->id, st);
	return 0;
}

/*
 * One listing per directory state, shared by its open handles, as for a
 * source directory (ns_dirshare.c, keyed by node id): the listing is a
 * function of the source directory's entries and of what the files there
 * hold, and the watcher reports a change of either against this node's id
 * (ns_modeldir_invalidate()).
 */
static int mdir_opendir(struct castfs_ns *ns, const struct ns_node *dir,
			struct castfs_dir **out)
{
	struct stat st;

	if (ns_src_stat(ns, dir->path, &st))
		return ns_list_dir(ns, dir, mdir_list, out);
	return ns_dirshare_open(ns, dir, &st, mdir_list, out);
}

const struct ns_kind_ops ns_kind_mdir = {
	.lookup = mdir_lookup,
	.list = mdir_list,
	.opendir = mdir_opendir,
	.getattr = mdir_getattr,
};

/* ---- the files a view computes ---- */

/* The keep set of shard @n's model now. */
static int shard_keep(struct castfs_ns *ns, const struct ns_node *n)
{
	char *dir = ns_parent_path(n->path);
	int keep = dir ? ns_md_keep_of(ns, dir, n->view) : -ENOMEM;

	free(dir);
	return keep;
}

/* The composite plan of shard @n (ck->xshard) with the shards in @x,
 * if its dep still names every shard as they are. */
static int xshard_plan(struct castfs_ns *ns, const struct ns_node *n,
		       struct ns_ckpt *ck, int keep, struct ns_md_xshard *x,
		       const struct castfs_plan **plan)
{
	int rc = ns_md_xshard_plan(ns, ck, n->view, keep, x, plan);

	if (!rc && x->dep != n->dep)
		rc = -ESTALE; /* a shard changed since the lookup */
	return rc;
}

/*
 * The composite plan of shard @n (checkpoint @ck) when it reads other
 * shards (FP8 block scales there, nvfp4's fused groups): the shards are
 * held in @x when it is not NULL (ns_md_xshard_fini() on success), left
 * zeroed otherwise. Returns 1 when @n reads no other shard.
 */
static int shard_plan_parts(struct castfs_ns *ns, const struct ns_node *n,
			    struct ns_ckpt *ck, int keep,
			    const struct castfs_plan **plan,
			    struct ns_md_xshard *x)
{
	struct ns_md_xshard tmp;
	int rc;

	if (!ns_md_xshard_wants(ck, n->view))
		return 1;
	rc = xshard_plan(ns, n, ck, keep, x ? x : &tmp, plan);
	if (rc || !x)
		ns_md_xshard_fini(ns, x ? x : &tmp);
	if (rc && x)
		memset(x, 0, sizeof(*x));
	/* nvfp4 of a file that no index names: the file alone */
	if (rc == -ENOENT && !ck->xshard)
		return 1;
	return rc;
}

/*
 * The plan of converted shard @n, from the checkpoint cache. When it
 * reads other shards (shard_plan_parts()) and @x is not NULL, the shards
 * it reads are held in @x (ns_md_xshard_fini() on success).
 */
static int shard_plan(struct castfs_ns *ns, const struct ns_node *n,
		      struct ns_ckpt **ck, const struct castfs_plan **plan,
		      struct ns_md_xshard *x)
{
	int rc, keep = shard_keep(ns, n);
	struct stat st;

	if (keep < 0)
		return keep;
	rc = ns_ckpt_valid(ns, n->path, &st, ck);
	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st))
		rc = -ESTALE;
	else
		rc = shard_plan_parts(ns, n, *ck, keep, plan, x);
	if (rc == 1 && (uint64_t)keep != n->dep)
		rc = -ESTALE; /* config.json now names another model */
	else if (rc == 1)
		rc = ns_md_shard_plan(ns, *ck, n->view, keep, plan);
	if (rc)
		ns_ckpt_put(ns, *ck);
	return rc;
}

static int mfile_getattr(struct castfs_ns *ns, const struct ns_node *n,
			 struct stat *st)
{
	const struct castfs_plan *plan;
	struct ns_ckpt *ck;
	uint64_t size;
	int rc;

	if (n->aux == MF_SHARD) {
		rc = shard_plan(ns, n, &ck, &plan, NULL);
		if (rc)
			return rc;
		size = plan->size;
		ns_ckpt_put(ns, ck);
	} else {
		rc = ns_md_json_size(ns, n, &size);
		if (rc)
			return rc;
	}
	ns_view_stat(&n->st, size, n->id, st);
	return 0;
}

static int mfile_open(struct castfs_ns *ns, const struct ns_node *n,
		      struct castfs_file **out)
{
	int view = ns_view_index(ns, n->view);
	const struct castfs_plan *plan;
	struct castfs_plan *owned;
	struct ns_md_xshard x = { 0 };
	struct ns_ckpt *ck;
	int rc;

	if (n->aux != MF_SHARD) {
		rc = ns_md_json_plan(ns, n, &owned);
		if (rc)
			return rc;
		return ns_file_new_plan(ns, NULL, NULL, NULL, owned, owned,
					view, out);
	}
	rc = shard_plan(ns, n, &ck, &plan, &x);
	if (rc)
		return rc;
	/* The plan lives in @ck, which the file holds only as one of its
	 * parts: a part that is another entry (the shard replaced between
	 * the two looks) would leave the plan to be freed under the file's
	 * reads (a bug hunt's swaps crashed the daemon so). */
	if (x.s.n && x.s.ck[x.self] != ck)
		rc = -ESTALE;
	/* Scales or fused siblings in other shards: every shard is a part
	 * of the source. */
	else if (x.s.n)
		rc = ns_file_new_parts(ns, x.s.n, x.s.paths, x.s.st, x.s.ck,
				       plan, NULL, view, out);
	else
		rc = ns_file_new_plan(ns, n->path, &n->st, ck, plan, NULL, view,
				      out);
	ns_md_xshard_fini(ns, &x);
	ns_ckpt_put(ns, ck);
	return rc;
}

const struct ns_kind_ops ns_kind_mfile = {
	.getattr = mfile_getattr,
	.open = mfile_open,
	.getxattr = ns_view_getxattr,
	.listxattr = ns_view_listxattr,
};

/* ---- telling the kernel what changed ---- */

typedef void (*inval_fn)(void *ctx, uint64_t parent, const char *name);

/* The id a lookup gives source directory @path. */
static int dir_id(struct castfs_ns *ns, const char *path, uint64_t *id)
{
	struct ns_node n = { .kind = NS_DIR };
	int rc;

	if (!path[0]) {
		*id = CASTFS_NS_ROOT_ID;
		return 0;
	}
	rc = ns_src_stat(ns, path, &n.st);
	if (!rc)
		*id = ns_node_id(&n);
	return rc;
}

/* The variant spellings of the indexes of source directory @d. */
static void inval_vindex(struct castfs_ns *ns, const char *d,
			 const struct ns_md_dir *s, inval_fn cb, void *ctx)
{
	char buf[600];
	uint64_t id;

	if (dir_id(ns, d, &id))
		return;
	for (size_t i = 0; i < s->nindex; i++) {
		size_t stem = strlen(s->indexes[i]) - 5;

		if (!castfs_md_is_base_index(s->indexes[i]))
			continue;
		for (size_t j = 0; j < ns->views->n; j++) {
			snprintf(buf, sizeof(buf), "%.*s.%s.json", (int)stem,
				 s->indexes[i], ns->views->v[j].name);
			cb(ctx, id, buf);
		}
	}
}

/* Inside the views of root @root: entry @base of directory @d and the
 * files there whose content depends on it; and "ROOT.<view>" itself. */
static void inval_root(struct castfs_ns *ns, const char *root, const char *d,
		       const char *base, const struct ns_md_dir *s, inval_fn cb,
		       void *ctx)
{
	size_t rl = strlen(root);
	struct ns_node n = { .kind = NS_MDIR };
	char *parent = ns_parent_path(root), buf[600];
	const char *rname = strrchr(root, '/');
	uint64_t pid;

	rname = rname ? rname + 1 : root;
	n.sub = strdup(d[rl] ? d + rl + 1 : "");
	if (!parent || !n.sub || dir_id(ns, parent, &pid) ||
	    ns_src_stat(ns, d, &n.st))
		goto out_free;
	for (size_t j = 0; j < ns->views->n; j++) {
		n.view = &ns->views->v[j];
		snprintf(buf, sizeof(buf), "%s.%s", rname, n.view->name);
		cb(ctx, pid, buf);
		n.id = ns_node_id(&n);
		cb(ctx, n.id, base);
		cb(ctx, n.id, "config.json");
		for (size_t i = 0; i < s->nindex; i++)
			cb(ctx, n.id, s->indexes[i]);
	}
out_free:
	free(n.sub);
	free(parent);
}

void ns_modeldir_invalidate(struct castfs_ns *ns, const char *rel, inval_fn cb,
			    void *ctx)
{
	const char *base = strrchr(rel, '/');
	char *d = ns_parent_path(rel), *root;
	struct ns_md_dir s = { 0 };

	base = base ? base + 1 : rel;
	if (!d || !rel[0])
		goto out;
	ns_md_json_forget(ns, d);
	/* Cached by identity; also by name, for a rewrite that kept both
	 * size and mtime (coarse timestamps). */
	if (castfs_md_name_kind(base) == CASTFS_MD_INDEX)
		ns_md_index_forget(ns, rel);
	/* What is left of it, if anything. */
	ns_md_dir_indexes(ns, d, castfs_md_name_kind(base) == CASTFS_MD_INDEX,
			  &s);
	inval_vindex(ns, d, &s, cb, ctx);
	/* Every ancestor of @rel may be the root of a view. */
	for (root = strdup(d); root && root[0];) {
		char *up = ns_parent_path(root);

		inval_root(ns, root, d, base, &s, cb, ctx);
		free(root);
		root = up;
	}
	free(root);
out:
	ns_md_dir_fini(&s);
	free(d);
}
