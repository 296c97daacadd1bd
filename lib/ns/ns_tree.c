/* SPDX-License-Identifier: MIT */
/*
 * The mirrored source tree (directories, files, symlinks) and the
 * single-file views X.<view>.safetensors next to each checkpoint.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ns/ns_kind_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)

/* ---- source access ---- */

/* ---- directories ---- */

static int lookup_view(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child)
{
	const struct castfs_view *view;
	char *base, *path;
	int rc;

	rc = ns_split_view_name(ns, name, &base, &view);
	if (rc)
		return rc;
	path = ns_path_join(dir->path, base, strlen(base));
	free(base);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_has_view(ns, path, view, &child->st);
	if (rc) {
		free(path);
		return rc;
	}
	child->kind = NS_VIEW;
	child->view = view;
	child->path = path;
	return 0;
}

static int lookup_source(struct castfs_ns *ns, const struct ns_node *dir,
			 const char *name, struct ns_node *child)
{
	char *path = ns_path_join(dir->path, name, strlen(name));
	int rc;

	if (!path)
		return -ENOMEM;
	rc = ns_src_stat(ns, path, &child->st);
	if (rc) {
		free(path);
		return rc;
	}
	switch (child->st.st_mode & S_IFMT) {
	case S_IFDIR:
		child->kind = NS_DIR;
		break;
	case S_IFREG:
		child->kind = NS_FILE;
		break;
	case S_IFLNK:
		child->kind = NS_LINK;
		break;
	default:
		/* FIFOs, sockets and devices are not mirrored. */
		free(path);
		return -ENOENT;
	}
	child->path = path;
	return 0;
}

/* @name in @dir among the names of the directory extensions looked up
 * @before_views or after them. */
static int lookup_exts(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, bool before_views,
		       struct ns_node *child)
{
	int rc = -ENOENT;

	for (size_t i = 0; rc == -ENOENT && ns->dir_exts[i]; i++) {
		if (ns->dir_exts[i]->lookup &&
		    ns->dir_exts[i]->before_views == before_views)
			rc = ns->dir_exts[i]->lookup(ns, dir, name, child);
	}
	return rc;
}

/* @name in @dir among the names castfs derives only. */
static int dir_lookup_derived(struct castfs_ns *ns, const struct ns_node *dir,
			      const char *name, struct ns_node *child)
{
	int rc;

	if (dir->id == CASTFS_NS_ROOT_ID && strcmp(name, ".castfs") == 0) {
		child->kind = NS_CTL_DIR;
		child->st = dir->st;
		child->path = strdup("");
		return child->path ? 0 : -ENOMEM;
	}
	rc = lookup_exts(ns, dir, name, true, child);
	if (rc == -ENOENT)
		rc = lookup_view(ns, dir, name, child);
	return rc == -ENOENT ? lookup_exts(ns, dir, name, false, child) : rc;
}

static int dir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child)
{
	int rc = -ENOENT;

	/* The control directory's name shadows a source entry's. */
	if (dir->id != CASTFS_NS_ROOT_ID || strcmp(name, ".castfs") != 0)
		rc = lookup_source(ns, dir, name, child);
	return rc == -ENOENT ? dir_lookup_derived(ns, dir, name, child) : rc;
}

/* Whether GGUF view @v of checkpoint @ck builds: a GGUF view exists only
 * for the architectures it maps, so a listing shows only those (the plan
 * is built once per checkpoint and view, and cached). */
static bool gguf_maps(struct castfs_ns *ns, struct ns_ckpt *ck,
		      const struct castfs_view *v)
{
	const struct castfs_plan *plan;

	return ns_ckpt_plan(ns, ck, v, &plan, NULL) == 0;
}

/* The views of checkpoint @name of @dir (a valid one, @ck of identity
 * @st), but those known not to build: an entry that cannot be served is
 * not listed, nor one past NAME_MAX (said in /.castfs/refused). */
static int list_views(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, const struct stat *st,
		      struct ns_ckpt *ck, struct ns_list *l)
{
	size_t stem = strlen(name) - ST_EXT_LEN;
	char buf[512];
	int rc = 0;

	for (size_t i = 0; !rc && i < ns->views->n; i++) {
		const struct castfs_view *v = &ns->views->v[i];
		struct ns_node node = { .kind = NS_VIEW, .view = v, .st = *st };
		int n;

		if (!v->listed || !ns_ckpt_offers(ck, v) ||
		    ns_ckpt_view_fails(ck, (int)i) ||
		    (v->kind == CASTFS_VIEW_GGUF && !gguf_maps(ns, ck, v)))
			continue;
		/* GGUF view names carry their extension ("q8_0.gguf") */
		n = snprintf(buf, sizeof(buf), "%.*s.%s%s", (int)stem, name,
			     v->name,
			     v->kind == CASTFS_VIEW_GGUF ? "" : st_ext);
		if (n < 0 || (size_t)n >= sizeof(buf))
			continue;
		rc = ns_list_derived(l, dir->path, name, v->name, buf,
				     (size_t)n, S_IFREG, ns_node_id(&node));
	}
	return rc;
}

/* Whether source entry @name (@len bytes, of type @type) may be a
 * checkpoint: what a listing parses. */
static bool ckpt_entry(const char *name, size_t len, mode_t type)
{
	return (type == S_IFREG || type == S_IFLNK) && ns_has_st_ext(name, len);
}

/* Whether source entry @name (of type @type) is a valid checkpoint: its
 * entry (a held reference) to *@ck, else NULL, and its identity to @st.
 * Links inside the root count as the files they reach (the Hugging Face
 * cache keeps checkpoints as links to blobs). */
static int entry_ckpt(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, mode_t type, struct stat *st,
		      struct ns_ckpt **ck)
{
	size_t len = strlen(name);
	char *path;
	int rc;

	*ck = NULL;
	if (!ckpt_entry(name, len, type))
		return 0;
	path = ns_path_join(dir->path, name, len);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_valid(ns, path, st, ck);
	free(path);
	if (rc)
		return rc == -ENOMEM ? rc : 0; /* rejected: no views */
	return 0;
}

/* Virtual siblings of source entry @name (of type @type): its views, then
 * what each directory extension derives from it. */
static int list_virtual(struct castfs_ns *ns, const struct ns_node *dir,
			const char *name, mode_t type, struct ns_list *l)
{
	struct stat st = { 0 };
	struct ns_ckpt *ck;
	int rc = entry_ckpt(ns, dir, name, type, &st, &ck);

	if (!rc && ck)
		rc = list_views(ns, dir, name, &st, ck, l);
	for (size_t i = 0; !rc && ns->dir_exts[i]; i++) {
		if (ns->dir_exts[i]->list)
			rc = ns->dir_exts[i]->list(ns, dir, name, type,
						   ck != NULL, &st, l);
	}
	ns_ckpt_put(ns, ck);
	return rc;
}

/*
 * Type and node id of directory entry @de: the id its lookup will give, so
 * that `ls -i` and stat(2) agree. Returns 0 for entries castfs does not
 * mirror (FIFOs, sockets, devices) or that vanished.
 */
static mode_t dirent_node(int dfd, const struct dirent *de, uint64_t *ino,
			  struct ns_snap *snap)
{
	struct ns_node n = { .kind = NS_FILE };

	if (fstatat(dfd, de->d_name, &n.st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	/* what the rescan compares */
	ns_snap_add(snap, dfd, de->d_name, &n.st);
	switch (n.st.st_mode & S_IFMT) {
	case S_IFDIR:
		n.kind = NS_DIR;
		break;
	case S_IFREG:
		break;
	case S_IFLNK:
		n.kind = NS_LINK;
		break;
	default:
		return 0;
	}
	*ino = ns_node_id(&n);
	return n.st.st_mode & S_IFMT;
}

/* Source entries first, so that a real file shadows a virtual name. */
static int list_source(DIR *dp, struct ns_list *l, size_t *nsrc,
		       struct ns_snap *snap)
{
	struct dirent *de;
	int rc = 0;

	while (!rc && (errno = 0, de = readdir(dp))) {
		uint64_t ino = 0;
		mode_t t;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		t = dirent_node(dirfd(dp), de, &ino, snap);
		if (t)
			rc = ns_list_add(l, de->d_name, strlen(de->d_name), t,
					 ino);
	}
	if (!rc && errno)
		rc = -errno;
	*nsrc = l->dir->n;
	return rc;
}

/* How many checkpoints ahead of the parse a listing has their headers
 * read: from a cold disk, reading them one at a time waits for each in
 * turn, while the disk serves many at once. As many bytes as the
 * kernel's own read-ahead brings in for the parse's first 8-byte read
 * (four pages): no more is read than before, only sooner; the rest of a
 * longer header is read by the parse, as before. */
#define LIST_AHEAD 128
#define LIST_AHEAD_BYTES (16 << 10)

/* Have the kernel read the start of checkpoint entry @de of @dir (its
 * header, or most of it) in the background, for its parse to find. */
static void list_prefetch(struct castfs_ns *ns, const struct ns_node *dir,
			  const struct castfs_dirent *de)
{
	size_t len = strlen(de->name);
	char *path;
	int fd;

	if (!ckpt_entry(de->name, len, de->type))
		return;
	path = ns_path_join(dir->path, de->name, len);
	fd = path ? ns_src_open_in(ns, path, O_RDONLY | O_NONBLOCK) : -1;
	free(path);
	if (fd < 0)
		return; /* the parse meets whatever this was */
	(void)posix_fadvise(fd, 0, LIST_AHEAD_BYTES, POSIX_FADV_WILLNEED);
	close(fd);
}

static int dir_list(struct castfs_ns *ns, const struct ns_node *dir,
		    struct ns_list *l)
{
	size_t first = l->dir->n, nsrc;
	struct ns_snap *snap;
	DIR *dp;
	int fd, rc;

	fd = ns_src_open(ns, dir->path, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return fd;
	dp = fdopendir(fd);
	if (!dp) {
		close(fd);
		return -errno;
	}
	/* Before the directory is read; none for /.castfs/refused, whose
	 * listing no kernel holds (a rescan compares with what one does). */
	snap = l->too_long ? NULL : ns_snap_begin(ns, dir->path);
	rc = list_source(dp, l, &nsrc, snap);
	closedir(dp);
	if (rc)
		ns_snap_abort(snap);
	else
		ns_snap_commit(ns, snap);
	/* Every source entry under the name it is shown as (a pack as its
	 * X.safetensors) before any view is added: a shown name is a file,
	 * which wins over a view of that name, whatever the order. */
	for (size_t i = first; !rc && i < nsrc; i++) {
		for (size_t x = 0; !rc && ns->dir_exts[x]; x++) {
			if (ns->dir_exts[x]->show)
				rc = ns->dir_exts[x]->show(ns, dir, l, i);
		}
	}
	for (size_t i = first; !rc && i < nsrc && i < first + LIST_AHEAD; i++)
		list_prefetch(ns, dir, &l->dir->ents[i]);
	for (size_t i = first; !rc && i < nsrc; i++) {
		char *name;

		if (i + LIST_AHEAD < nsrc)
			list_prefetch(ns, dir, &l->dir->ents[i + LIST_AHEAD]);
		/* Copy: adding entries may move the array. */
		name = strdup(l->dir->ents[i].name);
		if (!name)
			return -ENOMEM;
		rc = list_virtual(ns, dir, name, l->dir->ents[i].type, l);
		free(name);
	}
	for (size_t i = nsrc; i < l->dir->n; i++)
		l->dir->ents[i].derived = true;
	if (!rc && dir->id == CASTFS_NS_ROOT_ID &&
	    !ns_list_has(l, ".castfs", 7)) {
		struct ns_node ctl = { .kind = NS_CTL_DIR, .st = dir->st };

		rc = ns_list_add(l, ".castfs", 7, S_IFDIR, ns_node_id(&ctl));
		if (!rc)
			l->dir->ents[l->dir->n - 1].derived = true;
	}
	return rc;
}

int ns_tree_too_long(struct castfs_ns *ns, const char *path, struct cJSON *arr)
{
	struct ns_node dir = { .kind = NS_DIR, .path = strdup(path) };
	struct ns_list l = { .too_long = arr };
	int rc = dir.path ? ns_src_stat(ns, path, &dir.st) : -ENOMEM;

	if (rc)
		goto out_free_path;
	dir.id = path[0] ? ns_node_id(&dir) : CASTFS_NS_ROOT_ID;
	l.dir = calloc(1, sizeof(*l.dir));
	rc = l.dir ? dir_list(ns, &dir, &l) : -ENOMEM;
	ns_list_fini(&l);
	castfs_dir_free(l.dir);
out_free_path:
	free(dir.path);
	return rc;
}

static int dir_getattr(struct castfs_ns *ns, const struct ns_node *n,
		       struct stat *st)
{
	int rc = ns_src_stat(ns, n->path, st);

	if (rc)
		return rc;
	if (st->st_dev != n->st.st_dev || st->st_ino != n->st.st_ino ||
	    !S_ISDIR(st->st_mode))
		return -ESTALE;
	st->st_mode &= ~(mode_t)0222;
	return 0;
}

/* One listing per directory state, shared by its open handles. */
static int dir_opendir(struct castfs_ns *ns, const struct ns_node *dir,
		       struct castfs_dir **out)
{
	struct stat st;

	if (ns_src_stat(ns, dir->path, &st))
		return ns_list_dir(ns, dir, dir_list, out);
	return ns_dirshare_open(ns, dir, &st, dir_list, out);
}

const struct ns_kind_ops ns_kind_dir = {
	.lookup = dir_lookup,
	.lookup_derived = dir_lookup_derived,
	.list = dir_list,
	.opendir = dir_opendir,
	.getattr = dir_getattr,
};

/* ---- files and links ---- */

static int file_getattr(struct castfs_ns *ns, const struct ns_node *n,
			struct stat *st)
{
	/* A file node may sit at a link's path inside a model-directory view
	 * (a snapshot of links to blobs): its identity is the target's. */
	int rc = n->kind == NS_LINK ? ns_src_stat(ns, n->path, st) :
				      ns_src_stat_in(ns, n->path, st);

	if (rc)
		return rc;
	if (!ns_same_file(st, &n->st))
		return -ESTALE;
	st->st_mode &= ~(mode_t)0222;
	st->st_rdev = 0; /* what a link's path cut (ns_src_link_hide()) */
	return 0;
}

static int file_open(struct castfs_ns *ns, const struct ns_node *n,
		     struct castfs_file **out)
{
	return ns_file_new_source(ns, n->path, &n->st, out);
}

const struct ns_kind_ops ns_kind_file = {
	.getattr = file_getattr,
	.open = file_open,
};

const struct ns_kind_ops ns_kind_link = {
	.getattr = file_getattr,
};

/* ---- single-file views ---- */

/* The checkpoint behind view node @n, still the identity @n has; when
 * @n is @fresh from its lookup, the entry that lookup found, if it is
 * still cached, without a stat. */
static int view_ckpt(struct castfs_ns *ns, const struct ns_node *n, bool fresh,
		     struct ns_ckpt **ck)
{
	struct stat st;
	int rc;

	if (fresh && ns_ckpt_loaded(ns, &n->st, ck) == 0)
		return 0;
	rc = ns_ckpt_valid(ns, n->path, &st, ck);
	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st)) {
		ns_ckpt_put(ns, *ck);
		return -ESTALE;
	}
	return 0;
}

static int view_plan(struct castfs_ns *ns, const struct ns_node *n, bool fresh,
		     struct ns_ckpt **ck, const struct castfs_plan **plan)
{
	struct castfs_diag d = { { 0 } };
	bool known;
	int rc = view_ckpt(ns, n, fresh, ck);

	if (rc)
		return rc;
	/* A failure already known was logged when it was found. */
	known = ns_ckpt_view_fails(*ck, ns_view_index(ns, n->view));
	rc = ns_ckpt_plan(ns, *ck, n->view, plan, &d);
	if (rc) {
		if (!known)
			ns_logf(ns, n->path, "view %s: %s", n->view->name,
				d.msg[0] ? d.msg : strerror(-rc));
		ns_ckpt_put(ns, *ck);
	}
	/* A view is listed only where it builds (list_views; GGUF views
	 * where they map, gguf_maps): once its build failed its name
	 * answers like any name a listing does not show, the first time
	 * too (the listing that showed it was dropped when the failure was
	 * learned). The reason is in the log. */
	return ns_err_unlisted(rc);
}

static int view_attr(struct castfs_ns *ns, const struct ns_node *n, bool fresh,
		     struct stat *st)
{
	const struct castfs_plan *plan;
	struct ns_ckpt *ck;
	int rc = view_plan(ns, n, fresh, &ck, &plan);

	if (rc)
		return rc;
	ns_view_stat(&n->st, plan->size, n->id, st);
	ns_ckpt_put(ns, ck);
	return 0;
}

static int view_getattr(struct castfs_ns *ns, const struct ns_node *n,
			struct stat *st)
{
	return view_attr(ns, n, false, st);
}

static int view_getattr_new(struct castfs_ns *ns, const struct ns_node *n,
			    struct stat *st)
{
	return view_attr(ns, n, true, st);
}

static int view_open(struct castfs_ns *ns, const struct ns_node *n,
		     struct castfs_file **out)
{
	const struct castfs_plan *plan;
	struct ns_ckpt *ck;
	int rc = view_plan(ns, n, false, &ck, &plan);

	if (rc)
		return rc;
	rc = ns_file_new_plan(ns, n->path, &n->st, ck, plan, NULL,
			      ns_view_index(ns, n->view), out);
	ns_ckpt_put(ns, ck);
	return rc;
}

const struct ns_kind_ops ns_kind_view = {
	.getattr = view_getattr,
	.getattr_new = view_getattr_new,
	.open = view_open,
	.getxattr = ns_view_getxattr,
	.listxattr = ns_view_listxattr,
};
