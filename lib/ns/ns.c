/* SPDX-License-Identifier: MIT */
/*
 * The namespace core: stable node ids, the node table, and the dispatch of
 * each operation to the kind that implements it.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/hash.h"
#include "ns/ns_internal.h"

static const struct ns_kind_ops *const kind_ops[NS_KIND_COUNT] = {
	[NS_DIR] = &ns_dir_ops,		[NS_FILE] = &ns_file_ops,
	[NS_LINK] = &ns_link_ops,	[NS_VIEW] = &ns_view_ops,
	[NS_CTL_DIR] = &ns_ctl_dir_ops, [NS_CTL_FILE] = &ns_ctl_file_ops,
	[NS_TDIR] = &ns_tdir_ops,	[NS_TFILE] = &ns_tfile_ops,
	[NS_MDIR] = &ns_mdir_ops,	[NS_MFILE] = &ns_mfile_ops,
};

/* ---- stable ids ---- */

static uint64_t hash_u64(uint64_t h, uint64_t v)
{
	return castfs_fnv1a(h, &v, sizeof(v));
}

static uint64_t hash_str(uint64_t h, const char *s)
{
	/* The length first, so that ("ab","c") and ("a","bc") differ. */
	size_t len = s ? strlen(s) + 1 : 0;

	h = hash_u64(h, len);
	return s ? castfs_fnv1a(h, s, len) : h;
}

/*
 * A node's id depends only on what it shows: its kind, the identity of
 * the source object behind it (device and inode; size and mtime too for
 * files, so that a rewritten file gets a new id) and its view and
 * sub-path. Never on lookup order, so ids survive a daemon restart, which
 * NFS file handles need.
 */
uint64_t ns_node_id(const struct ns_node *n)
{
	uint64_t h = CASTFS_FNV_SEED;

	if (n->kind == NS_DIR && n->path && n->path[0] == '\0')
		return CASTFS_NS_ROOT_ID;
	h = hash_u64(h, n->kind);
	h = hash_u64(h, n->aux);
	h = hash_u64(h, (uint64_t)n->st.st_dev);
	h = hash_u64(h, (uint64_t)n->st.st_ino);
	if (!S_ISDIR(n->st.st_mode)) {
		h = hash_u64(h, (uint64_t)n->st.st_size);
		h = hash_u64(h, (uint64_t)n->st.st_mtim.tv_sec);
		h = hash_u64(h, (uint64_t)n->st.st_mtim.tv_nsec);
	}
	h = hash_str(h, n->view ? n->view->name : NULL);
	h = hash_str(h, n->sub);
	if (n->dep) /* only model-directory files: other ids unchanged */
		h = hash_u64(h, n->dep);
	h = castfs_mix64(h);
	/* 0 is invalid and 1 is the root in FUSE. */
	return h > CASTFS_NS_ROOT_ID ? h : h + 2;
}

/* ---- the node table ---- */

static struct ns_node **bucket(struct castfs_ns *ns, uint64_t id)
{
	return &ns->nodes[castfs_mix64(id) % NS_HASH_BUCKETS];
}

/* Caller holds ns->lock. */
static struct ns_node *node_find_locked(struct castfs_ns *ns, uint64_t id)
{
	struct ns_node *n;

	for (n = *bucket(ns, id); n; n = n->hnext) {
		if (n->id == id)
			return n;
	}
	return NULL;
}

static void node_free(struct ns_node *n)
{
	if (!n)
		return;
	free(n->path);
	free(n->sub);
	free(n);
}

/*
 * Copy of node @id (strings duplicated) so that the caller can work on it
 * without holding the table lock. Returns 0, -ESTALE or -ENOMEM.
 */
static int node_get(struct castfs_ns *ns, uint64_t id, struct ns_node *out)
{
	struct ns_node *n;
	int rc = 0;

	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, id);
	if (!n) {
		rc = -ESTALE;
		goto out_unlock;
	}
	*out = *n;
	out->hnext = NULL;
	out->path = strdup(n->path);
	out->sub = n->sub ? strdup(n->sub) : NULL;
	if (!out->path || (n->sub && !out->sub)) {
		free(out->path);
		free(out->sub);
		rc = -ENOMEM;
	}
out_unlock:
	pthread_mutex_unlock(&ns->lock);
	return rc;
}

static void node_put_copy(struct ns_node *n)
{
	free(n->path);
	free(n->sub);
}

/* One more kernel reference to @n; a forgotten node comes back to life.
 * Caller holds ns->lock. */
static void node_ref_locked(struct castfs_ns *ns, struct ns_node *n)
{
	if (n->nlookup++ == 0)
		ns->nforgotten--;
}

/* Intern @desc (taking its strings) with one more lookup; its id to *@id. */
static int node_intern(struct castfs_ns *ns, struct ns_node *desc, uint64_t *id)
{
	struct ns_node *n;

	desc->id = ns_node_id(desc);
	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, desc->id);
	if (n) {
		node_ref_locked(ns, n);
		pthread_mutex_unlock(&ns->lock);
		node_put_copy(desc);
		*id = desc->id;
		return 0;
	}
	n = malloc(sizeof(*n));
	if (!n) {
		pthread_mutex_unlock(&ns->lock);
		node_put_copy(desc);
		return -ENOMEM;
	}
	*n = *desc;
	n->nlookup = 1;
	n->hnext = *bucket(ns, n->id);
	*bucket(ns, n->id) = n;
	pthread_mutex_unlock(&ns->lock);
	*id = n->id;
	return 0;
}

/* Free every forgotten node. Caller holds ns->lock. */
static void sweep_forgotten_locked(struct castfs_ns *ns)
{
	for (size_t i = 0; i < NS_HASH_BUCKETS; i++) {
		struct ns_node **pp = &ns->nodes[i], *n;

		while ((n = *pp)) {
			if (n->nlookup == 0 && n->id != CASTFS_NS_ROOT_ID) {
				*pp = n->hnext;
				node_free(n);
				continue;
			}
			pp = &n->hnext;
		}
	}
	ns->nforgotten = 0;
}

/*
 * A node the kernel forgot stays known for a while: an NFS server may
 * still hold a file handle of it, and the kernel then asks for it again
 * by id (LOOKUP(id, ".")) rather than by name. Past NS_FORGOTTEN_MAX they
 * are all freed; a handle of one of those is found again by ns_resolve().
 */
void castfs_ns_forget(struct castfs_ns *ns, uint64_t id, uint64_t nlookup)
{
	struct ns_node *n;

	if (id == CASTFS_NS_ROOT_ID)
		return;
	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, id);
	if (n && n->nlookup) {
		n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
		if (n->nlookup == 0 && ++ns->nforgotten > NS_FORGOTTEN_MAX)
			sweep_forgotten_locked(ns);
	}
	pthread_mutex_unlock(&ns->lock);
}

/* ---- setup ---- */

static int ns_add_root(struct castfs_ns *ns, struct castfs_diag *d)
{
	struct ns_node *root = calloc(1, sizeof(*root));

	if (!root)
		return -ENOMEM;
	root->kind = NS_DIR;
	root->path = strdup("");
	if (!root->path) {
		free(root);
		return -ENOMEM;
	}
	if (fstat(ns->root_fd, &root->st) < 0) {
		int rc = -errno;

		node_free(root);
		return castfs_diag_set(d, rc, "%s: %s", ns->source,
				       strerror(-rc));
	}
	root->id = CASTFS_NS_ROOT_ID;
	root->parent = CASTFS_NS_ROOT_ID;
	root->nlookup = 1; /* never forgotten */
	*bucket(ns, root->id) = root;
	return 0;
}

int castfs_ns_new(const struct castfs_ns_opts *o, struct castfs_ns **out,
		  struct castfs_diag *d)
{
	struct castfs_ns *ns = calloc(1, sizeof(*ns));
	int rc = -ENOMEM;

	if (!ns)
		return -ENOMEM;
	ns->root_fd = -1;
	pthread_mutex_init(&ns->lock, NULL);
	pthread_mutex_init(&ns->ck_lock, NULL);
	ns->views = o->views;
	ns->stats = o->stats;
	ns->log = o->log;
	ns->log_ctx = o->log_ctx;
	ns->guard = o->guard;
	ns->source = strdup(o->source);
	ns->config_json = strdup(o->config_json ? o->config_json : "{}");
	if (!ns->source || !ns->config_json)
		goto out_free;
	ns->root_fd = open(o->source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (ns->root_fd < 0) {
		rc = castfs_diag_set(d, -errno, "%s: %s", o->source,
				     strerror(errno));
		goto out_free;
	}
	rc = ns_add_root(ns, d);
	if (!rc)
		rc = ns_modeldir_init(ns);
	if (rc)
		goto out_free;
	*out = ns;
	return 0;

out_free:
	castfs_ns_free(ns);
	return rc;
}

void castfs_ns_free(struct castfs_ns *ns)
{
	if (!ns)
		return;
	for (size_t i = 0; i < NS_HASH_BUCKETS; i++) {
		struct ns_node *n = ns->nodes[i];

		while (n) {
			struct ns_node *next = n->hnext;

			node_free(n);
			n = next;
		}
	}
	for (size_t i = 0; i < NS_HASH_BUCKETS; i++) {
		while (ns->ckpts[i]) {
			struct ns_ckpt *ck = ns->ckpts[i];

			ns->ckpts[i] = ck->hnext;
			ns_ckpt_put(ns, ck);
		}
	}
	ns_modeldir_fini(ns);
	if (ns->root_fd >= 0)
		close(ns->root_fd);
	pthread_mutex_destroy(&ns->lock);
	pthread_mutex_destroy(&ns->ck_lock);
	free(ns->source);
	free(ns->config_json);
	free(ns);
}

/* ---- operations ---- */

static const struct ns_kind_ops *ops_of(const struct ns_node *n)
{
	return kind_ops[n->kind];
}

static int lookup_dots(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, uint64_t *id, struct stat *st)
{
	uint64_t target = strcmp(name, ".") == 0 ? dir->id : dir->parent;
	struct ns_node n, *t;
	int rc;

	rc = node_get(ns, target, &n);
	if (rc)
		return rc;
	rc = ops_of(&n)->getattr(ns, &n, st);
	node_put_copy(&n);
	if (rc)
		return rc;
	pthread_mutex_lock(&ns->lock);
	t = node_find_locked(ns, target);
	if (t)
		node_ref_locked(ns, t);
	pthread_mutex_unlock(&ns->lock);
	if (!t)
		return -ESTALE;
	st->st_ino = target;
	*id = target;
	return 0;
}

static bool is_dots(const char *name)
{
	return strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
}

/*
 * Node @id for a lookup in it. An unknown id can only come from a file
 * handle (NFS) of a node this daemon freed or never knew (a restart): the
 * kernel then asks LOOKUP(id, ".") (and "..") to reconnect, and the tree
 * is searched for the object whose id it is.
 */
static int node_get_for_lookup(struct castfs_ns *ns, uint64_t id,
			       const char *name, struct ns_node *out)
{
	int rc = node_get(ns, id, out);

	if (rc != -ESTALE || !is_dots(name))
		return rc;
	rc = ns_resolve(ns, id);
	return rc ? rc : node_get(ns, id, out);
}

int castfs_ns_lookup(struct castfs_ns *ns, uint64_t parent, const char *name,
		     uint64_t *id, struct stat *st)
{
	struct ns_node dir, child = { 0 };
	int rc;

	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	rc = node_get_for_lookup(ns, parent, name, &dir);
	if (rc)
		return rc;
	/* "." of any node: the kernel asks it for files too (NFS handles). */
	if (strcmp(name, ".") == 0 ||
	    (strcmp(name, "..") == 0 && ops_of(&dir)->lookup)) {
		rc = lookup_dots(ns, &dir, name, id, st);
		goto out;
	}
	if (!ops_of(&dir)->lookup) {
		rc = -ENOTDIR;
		goto out;
	}
	rc = ops_of(&dir)->lookup(ns, &dir, name, &child);
	if (rc) {
		node_put_copy(&child);
		goto out;
	}
	child.parent = dir.id;
	child.id = ns_node_id(&child);
	rc = ops_of(&child)->getattr(ns, &child, st);
	if (rc) {
		node_put_copy(&child);
		goto out;
	}
	rc = node_intern(ns, &child, id);
	st->st_ino = *id;
out:
	node_put_copy(&dir);
	return rc;
}

int castfs_ns_getattr(struct castfs_ns *ns, uint64_t id, struct stat *st)
{
	struct ns_node n;
	int rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	rc = ops_of(&n)->getattr(ns, &n, st);
	st->st_ino = id;
	node_put_copy(&n);
	return rc;
}

int castfs_ns_readlink(struct castfs_ns *ns, uint64_t id, char *buf, size_t len)
{
	struct ns_node n;
	ssize_t got;
	int fd, rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	if (n.kind != NS_LINK) {
		rc = -EINVAL;
		goto out;
	}
	fd = ns_src_open(ns, n.path, O_PATH | O_NOFOLLOW);
	if (fd < 0) {
		rc = fd;
		goto out;
	}
	got = readlinkat(fd, "", buf, len);
	rc = got < 0 ? -errno : 0;
	close(fd);
	if (!rc && (size_t)got >= len)
		rc = -ENAMETOOLONG;
	else if (!rc)
		buf[got] = '\0';
out:
	node_put_copy(&n);
	return rc;
}

int ns_list_add(struct ns_list *l, const char *name, size_t len, mode_t type,
		uint64_t ino)
{
	struct castfs_dir *d = l->dir;
	char *copy;

	if (d->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 32;
		struct castfs_dirent *n = realloc(d->ents, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		d->ents = n;
		l->cap = cap;
	}
	copy = malloc(len + 1);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, name, len);
	copy[len] = '\0';
	/* readdir(3) hides entries whose inode number is 0. */
	if (!ino)
		ino = castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, name, len)) |
		      2;
	d->ents[d->n++] = (struct castfs_dirent){ copy, type, ino };
	return 0;
}

bool ns_list_has(const struct ns_list *l, const char *name, size_t len)
{
	for (size_t i = 0; i < l->dir->n; i++) {
		const char *e = l->dir->ents[i].name;

		if (strlen(e) == len && memcmp(e, name, len) == 0)
			return true;
	}
	return false;
}

void castfs_dir_free(struct castfs_dir *dir)
{
	if (!dir)
		return;
	for (size_t i = 0; i < dir->n; i++)
		free(dir->ents[i].name);
	free(dir->ents);
	free(dir);
}

int castfs_ns_opendir(struct castfs_ns *ns, uint64_t id,
		      struct castfs_dir **out)
{
	struct ns_list l = { 0 };
	struct ns_node n;
	int rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	if (!ops_of(&n)->list) {
		rc = -ENOTDIR;
		goto out;
	}
	l.dir = calloc(1, sizeof(*l.dir));
	rc = l.dir ? 0 : -ENOMEM;
	if (!rc)
		rc = ns_list_add(&l, ".", 1, S_IFDIR, n.id);
	if (!rc)
		rc = ns_list_add(&l, "..", 2, S_IFDIR, n.parent);
	if (!rc)
		rc = ops_of(&n)->list(ns, &n, &l);
	if (rc)
		castfs_dir_free(l.dir);
	else
		*out = l.dir;
out:
	node_put_copy(&n);
	return rc;
}

int castfs_ns_open(struct castfs_ns *ns, uint64_t id, struct castfs_file **out)
{
	struct ns_node n;
	int rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	if (ops_of(&n)->open)
		rc = ops_of(&n)->open(ns, &n, out);
	else
		rc = ops_of(&n)->list ? -EISDIR : -EINVAL;
	node_put_copy(&n);
	return rc;
}

ssize_t castfs_ns_getxattr(struct castfs_ns *ns, uint64_t id, const char *name,
			   char *buf, size_t len)
{
	struct ns_node n;
	ssize_t rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	rc = ops_of(&n)->getxattr ?
		     ops_of(&n)->getxattr(ns, &n, name, buf, len) :
		     -ENODATA;
	node_put_copy(&n);
	return rc;
}

ssize_t castfs_ns_listxattr(struct castfs_ns *ns, uint64_t id, char *buf,
			    size_t len)
{
	struct ns_node n;
	ssize_t rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	rc = ops_of(&n)->listxattr ? ops_of(&n)->listxattr(ns, &n, buf, len) :
				     0;
	node_put_copy(&n);
	return rc;
}

ssize_t ns_xattr_put(const void *val, size_t n, char *buf, size_t len)
{
	if (len == 0)
		return (ssize_t)n;
	if (len < n)
		return -ERANGE;
	memcpy(buf, val, n);
	return (ssize_t)n;
}

void ns_logf(struct castfs_ns *ns, const char *fmt, ...)
{
	char msg[768];
	va_list ap;

	if (!ns->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ns->log(ns->log_ctx, msg);
}

int ns_view_index(const struct castfs_ns *ns, const struct castfs_view *v)
{
	if (!v || v < ns->views->v || v >= ns->views->v + ns->views->n)
		return CASTFS_STATS_OTHER;
	return (int)(v - ns->views->v);
}

/* The id of source directory @path as its lookup would make it. */
static int dir_id(struct castfs_ns *ns, const char *path, uint64_t *id)
{
	struct ns_node n = { .kind = NS_DIR };
	int rc;

	if (path[0] == '\0') {
		*id = CASTFS_NS_ROOT_ID;
		return 0;
	}
	rc = ns_src_stat(ns, path, &n.st);
	if (rc)
		return rc;
	*id = ns_node_id(&n);
	return 0;
}

/* Every name under which the kernel may have cached something derived
 * from source entry @name of a directory. */
static void invalidate_names(struct castfs_ns *ns, uint64_t parent,
			     const char *name,
			     void (*cb)(void *, uint64_t, const char *),
			     void *ctx)
{
	size_t len = strlen(name), stem;
	char buf[600];

	cb(ctx, parent, name);
	snprintf(buf, sizeof(buf), "%s.tensors", name);
	cb(ctx, parent, buf);
	stem = len > 12 && strcmp(name + len - 12, ".safetensors") == 0 ?
		       len - 12 :
		       0;
	for (size_t i = 0; i < ns->views->n; i++) {
		const char *v = ns->views->v[i].name;

		snprintf(buf, sizeof(buf), "%s.%s", name, v);
		cb(ctx, parent, buf); /* model-directory views */
		if (!stem)
			continue;
		snprintf(buf, sizeof(buf), "%.*s.%s.safetensors", (int)stem,
			 name, v);
		cb(ctx, parent, buf);
		snprintf(buf, sizeof(buf), "%.*s.%s.safetensors.tensors",
			 (int)stem, name, v);
		cb(ctx, parent, buf);
	}
}

void castfs_ns_invalidate(struct castfs_ns *ns, const char *rel,
			  void (*cb)(void *ctx, uint64_t parent,
				     const char *name),
			  void *ctx)
{
	const char *slash = strrchr(rel, '/');
	char *dir = strndup(rel, slash ? (size_t)(slash - rel) : 0);
	uint64_t parent;

	ns_ckpt_drop_path(ns, rel);
	if (!dir)
		return;
	if (strcmp(slash ? slash + 1 : rel, "config.json") == 0)
		ns_ckpt_drop_dir(ns, dir); /* whether they are quantized */
	if (dir_id(ns, dir, &parent) == 0)
		invalidate_names(ns, parent, slash ? slash + 1 : rel, cb, ctx);
	ns_modeldir_invalidate(ns, rel, cb, ctx);
	free(dir);
}

int castfs_ns_statfs(struct castfs_ns *ns, struct statvfs *sv)
{
	if (fstatvfs(ns->root_fd, sv) < 0)
		return -errno;
	sv->f_flag |= ST_RDONLY;
	return 0;
}
