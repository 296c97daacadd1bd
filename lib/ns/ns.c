/* SPDX-License-Identifier: MIT */
/*
 * The namespace facade: the kind table, the mount's lifecycle, and the
 * dispatch of each operation to the kind that implements it.
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
#include "ns/ns_kind_internal.h"

static const struct ns_kind_ops *const kind_ops[NS_KIND_COUNT] = {
	[NS_DIR] = &ns_kind_dir,	 [NS_FILE] = &ns_kind_file,
	[NS_LINK] = &ns_kind_link,	 [NS_VIEW] = &ns_kind_view,
	[NS_CTL_DIR] = &ns_kind_ctl_dir, [NS_CTL_FILE] = &ns_kind_ctl_file,
	[NS_TDIR] = &ns_kind_tdir,	 [NS_TFILE] = &ns_kind_tfile,
	[NS_MDIR] = &ns_kind_mdir,	 [NS_MFILE] = &ns_kind_mfile,
	[NS_PACKED] = &ns_kind_packed,	 [NS_MGGUF] = &ns_kind_mgguf,
};

/* What a source directory shows besides its entries and their views, in
 * lookup order; NULL-terminated. */
static const struct ns_dir_ext *const dir_exts[] = {
	&ns_packed_dir_ext,
	&ns_tensors_dir_ext,
	&ns_modeldir_dir_ext,
	&ns_mdgguf_dir_ext,
	NULL,
};

void castfs_ns_forget(struct castfs_ns *ns, uint64_t id, uint64_t nlookup)
{
	char *idle = ns_node_forget(ns, id, nlookup);

	/* The kernel holds nothing of that source any more: what the
	 * checkpoint cache keeps for it can go (docs/RELIABILITY.md). */
	if (idle)
		ns_ckpt_idle_path(ns, idle);
	free(idle);
}

bool castfs_ns_held(struct castfs_ns *ns, uint64_t id)
{
	return ns_node_held(ns, id);
}

/* ---- setup ---- */

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
	pthread_cond_init(&ns->ck_loaded, NULL);
	pthread_mutex_init(&ns->gguf_gate_lock, NULL);
	pthread_cond_init(&ns->gguf_gate_free, NULL);
	ns->views = o->views;
	ns->stats = o->stats;
	ns->log = o->log;
	ns->log_ctx = o->log_ctx;
	ns->listing_changed = o->listing_changed;
	ns->listing_ctx = o->listing_ctx;
	ns->guard = o->guard;
	ns->ck_budget = o->cache_bytes ? o->cache_bytes :
					 CASTFS_CKPT_CACHE_DEFAULT;
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
	ns->dir_exts = dir_exts;
	ns_tensors_init(ns);
	ns_md_plans_init(ns);
	ns_md_xshard_init(ns);
	ns_mdgguf_init(ns);
	rc = castfs_zcache_new(o->zcache_bytes ? o->zcache_bytes :
						 CASTFS_ZCACHE_DEFAULT,
			       &ns->zcache);
	if (!rc)
		rc = ns_dir_config_init(ns);
	if (!rc)
		rc = ns_gguf_shards_init(ns);
	if (!rc)
		rc = ns_ckpt_cache_init(ns);
	if (!rc)
		rc = ns_node_add_root(ns, d);
	if (!rc && !o->successor)
		rc = ns_name_seen_init(ns);
	if (!rc)
		rc = ns_modeldir_init(ns);
	if (!rc)
		rc = ns_snaps_init(ns);
	if (!rc)
		rc = ns_dirshares_init(ns);
	if (!rc)
		rc = ns_ctlshares_init(ns);
	if (!rc && ns->stats)
		castfs_stats_set_zcache(ns->stats, ns->zcache);
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
	ns_ctlshares_fini(ns); /* charged to the checkpoint cache */
	ns_node_table_fini(ns);
	ns_ckpt_cache_fini(ns);
	ns_modeldir_fini(ns);
	ns_gguf_shards_cache_fini(ns);
	ns_snaps_fini(ns);
	ns_dirshares_fini(ns);
	castfs_zcache_free(ns->zcache); /* after the checkpoints' indexes */
	if (ns->root_fd >= 0)
		close(ns->root_fd);
	pthread_mutex_destroy(&ns->lock);
	pthread_mutex_destroy(&ns->ck_lock);
	pthread_cond_destroy(&ns->ck_loaded);
	pthread_mutex_destroy(&ns->gguf_gate_lock);
	pthread_cond_destroy(&ns->gguf_gate_free);
	free(ns->source);
	free(ns->config_json);
	free(ns);
}

/* ---- operations ---- */

static const struct ns_kind_ops *ops_of(const struct ns_node *n)
{
	return kind_ops[n->kind];
}

static int node_get_how(struct castfs_ns *ns, uint64_t id, struct ns_node *out,
			bool resolve)
{
	int rc = ns_node_get(ns, id, out);

	if (rc != -ESTALE || !resolve)
		return rc;
	rc = ns_resolve(ns, id);
	return rc ? rc : ns_node_get(ns, id, out);
}

/*
 * Node @id. An unknown id can only come from the kernel's memory of a
 * daemon before this one (a restart under a kept FUSE connection: open
 * files, cached inodes) or from a file handle (NFS) of a node this daemon
 * freed: the kernel then asks LOOKUP(id, ".") (and "..") to reconnect, or
 * sends the operation itself. Either way the tree is searched for the
 * object whose id it is.
 */
static int node_get(struct castfs_ns *ns, uint64_t id, struct ns_node *out)
{
	return node_get_how(ns, id, out, true);
}

static int lookup_dots(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, uint64_t *id, struct stat *st)
{
	uint64_t target = strcmp(name, ".") == 0 ? dir->id : dir->parent;
	struct ns_node n;
	int rc;

	rc = node_get(ns, target, &n);
	if (rc)
		return rc;
	rc = ops_of(&n)->getattr(ns, &n, st);
	ns_node_put_copy(&n);
	if (rc)
		return rc;
	if (!ns_node_ref(ns, target))
		return -ESTALE;
	st->st_ino = target;
	*id = target;
	return 0;
}

int castfs_ns_lookup(struct castfs_ns *ns, uint64_t parent, const char *name,
		     uint64_t *id, struct stat *st)
{
	return ns_lookup_how(ns, parent, name, id, st, NS_LOOKUP_RESOLVE);
}

/* How to look up listed entry @de. */
static unsigned listed_how(const struct castfs_dirent *de)
{
	return de->derived ? NS_LOOKUP_DERIVED : 0;
}

int castfs_ns_lookup_listed(struct castfs_ns *ns, uint64_t parent,
			    const struct castfs_dirent *de, uint64_t *id,
			    struct stat *st)
{
	return ns_lookup_how(ns, parent, de->name, id, st,
			     NS_LOOKUP_RESOLVE | listed_how(de));
}

void castfs_ns_lookup_ahead(struct castfs_ns *ns, uint64_t parent,
			    const struct castfs_dirent *ents, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t id;
		struct stat st;

		if (!strcmp(ents[i].name, ".") || !strcmp(ents[i].name, ".."))
			continue;
		(void)ns_lookup_how(ns, parent, ents[i].name, &id, &st,
				    NS_LOOKUP_AHEAD | listed_how(&ents[i]));
	}
}

/* @kind's lookup, or its lookup of derived names where @how says so. */
static int kind_lookup(const struct ns_kind_ops *kind, struct castfs_ns *ns,
		       const struct ns_node *dir, const char *name,
		       struct ns_node *child, unsigned how)
{
	if ((how & NS_LOOKUP_DERIVED) && kind->lookup_derived)
		return kind->lookup_derived(ns, dir, name, child);
	return kind->lookup(ns, dir, name, child);
}

/* The attributes of @child, which a lookup made just now. */
static int new_attr(struct castfs_ns *ns, const struct ns_node *child,
		    struct stat *st)
{
	const struct ns_kind_ops *kind = ops_of(child);

	return kind->getattr_new ? kind->getattr_new(ns, child, st) :
				   kind->getattr(ns, child, st);
}

int ns_lookup_how(struct castfs_ns *ns, uint64_t parent, const char *name,
		  uint64_t *id, struct stat *st, unsigned how)
{
	bool resolve = how & NS_LOOKUP_RESOLVE;
	struct ns_node dir, child = { 0 };
	int rc;

	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	rc = node_get_how(ns, parent, &dir, resolve);
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
	/* Seen before the source is looked at, not after: a change made
	 * while this lookup runs (a parse can take seconds) is then told to
	 * the kernel, whose invalidation waits for this lookup's reply
	 * under the directory's lock and drops it. Marked after the look,
	 * the watcher skipped the name as one no lookup answered, and the
	 * answer stayed a day beside listings that show the change
	 * (test_seen_race). A failed lookup costs a spare notification. */
	if (!(how & NS_LOOKUP_AHEAD))
		ns_name_seen_add(ns, dir.id, name);
	rc = kind_lookup(ops_of(&dir), ns, &dir, name, &child, how);
	if (rc) {
		ns_node_put_copy(&child);
		goto out;
	}
	child.parent = dir.id;
	child.id = ns_node_id(&child);
	rc = new_attr(ns, &child, st);
	if (rc || (how & NS_LOOKUP_AHEAD)) {
		ns_node_put_copy(&child);
		goto out;
	}
	rc = ns_node_intern(ns, &child, id);
	st->st_ino = *id;
out:
	ns_node_put_copy(&dir);
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
	ns_node_put_copy(&n);
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
	ns_node_put_copy(&n);
	return rc;
}

int castfs_ns_opendir(struct castfs_ns *ns, uint64_t id,
		      struct castfs_dir **out)
{
	return ns_opendir_how(ns, id, out, true);
}

int ns_opendir_how(struct castfs_ns *ns, uint64_t id, struct castfs_dir **out,
		   bool resolve)
{
	struct ns_node n;
	int rc = node_get_how(ns, id, &n, resolve);

	if (rc)
		return rc;
	if (ops_of(&n)->opendir)
		rc = ops_of(&n)->opendir(ns, &n, out);
	else if (ops_of(&n)->list)
		rc = ns_list_dir(ns, &n, ops_of(&n)->list, out);
	else
		rc = -ENOTDIR;
	ns_node_put_copy(&n);
	return rc;
}

/* Open file @id; @again: for a handle a previous daemon opened. */
static int ns_open_how(struct castfs_ns *ns, uint64_t id, bool again,
		       struct castfs_file **out)
{
	struct ns_node n;
	int rc = node_get(ns, id, &n);

	if (rc)
		return rc;
	if (ops_of(&n)->open)
		rc = ops_of(&n)->open(ns, &n, out);
	else
		rc = ops_of(&n)->list ? -EISDIR : -EINVAL;
	if (!rc && again && ops_of(&n) == &ns_kind_ctl_file)
		ns_file_fresh_text(*out);
	ns_node_put_copy(&n);
	return rc;
}

int castfs_ns_open(struct castfs_ns *ns, uint64_t id, struct castfs_file **out)
{
	return ns_open_how(ns, id, false, out);
}

int castfs_ns_reopen(struct castfs_ns *ns, uint64_t id,
		     struct castfs_file **out)
{
	return ns_open_how(ns, id, true, out);
}

ssize_t castfs_ns_getxattr(struct castfs_ns *ns, uint64_t id, const char *name,
			   char *buf, size_t len)
{
	struct ns_node n;
	ssize_t rc;

	/*
	 * castfs has a handler for the user. namespace only. -EOPNOTSUPP for
	 * the others is what the VFS answers for a prefix no handler claims,
	 * and ls -l caches it per device (coreutils errno_unsupported), so its
	 * security.selinux and ACL probes stop after the first entry; -ENODATA
	 * cost one round trip per entry and probe.
	 */
	if (strncmp(name, "user.", 5) != 0)
		return -EOPNOTSUPP;
	rc = node_get(ns, id, &n);
	if (rc)
		return rc;
	rc = ops_of(&n)->getxattr ?
		     ops_of(&n)->getxattr(ns, &n, name, buf, len) :
		     -ENODATA;
	ns_node_put_copy(&n);
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
	ns_node_put_copy(&n);
	return rc;
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

/* @buf = @a (@alen bytes) "." @b @c, or NULL when that does not fit.
 * Not snprintf: this runs for every view of every changed file (a
 * quarter of the watcher's CPU went to formatting). */
static const char *name_cat(char *buf, size_t cap, const char *a, size_t alen,
			    const char *b, const char *c)
{
	size_t bl = strlen(b), cl = strlen(c);

	if (alen + 1 + bl + cl >= cap)
		return NULL;
	memcpy(buf, a, alen);
	buf[alen] = '.';
	memcpy(buf + alen + 1, b, bl);
	memcpy(buf + alen + 1 + bl, c, cl + 1);
	return buf;
}

/* Report @name through @cb unless it is NULL (too long to be a name). */
static void report(void (*cb)(void *, uint64_t, const char *), void *ctx,
		   uint64_t parent, const char *name)
{
	if (name)
		cb(ctx, parent, name);
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
	report(cb, ctx, parent,
	       name_cat(buf, sizeof(buf), name, len, "tensors", ""));
	stem = len > 12 && strcmp(name + len - 12, ".safetensors") == 0 ?
		       len - 12 :
		       0;
	for (size_t i = 0; i < ns->views->n; i++) {
		const char *v = ns->views->v[i].name;

		/* model-directory views */
		report(cb, ctx, parent,
		       name_cat(buf, sizeof(buf), name, len, v, ""));
		if (!stem)
			continue;
		report(cb, ctx, parent,
		       name_cat(buf, sizeof(buf), name, stem, v,
				ns->views->v[i].kind == CASTFS_VIEW_GGUF ?
					"" :
					".safetensors"));
		report(cb, ctx, parent,
		       name_cat(buf, sizeof(buf), name, stem, v,
				".safetensors.tensors"));
	}
}

/* Names a batch of the seen filter holds: a changed checkpoint's ~77
 * candidates fit, so their tests wait on memory together. */
#define SEEN_BATCH 128
#define SEEN_BATCH_BYTES 8192

/* The caller's callback, behind the set of names lookups answered. */
struct seen_filter {
	struct castfs_ns *ns;
	void (*cb)(void *ctx, uint64_t parent, const char *name);
	void *ctx;
	uint64_t last_parent; /* whose listing was last reported changed */
	size_t n, used; /* names batched; bytes of @names used */
	uint64_t parent[SEEN_BATCH];
	uint32_t bits[SEEN_BATCH][2];
	uint16_t off[SEEN_BATCH];
	char names[SEEN_BATCH_BYTES];
};

/* Test every batched name, in order, and pass on the ones a lookup may
 * have answered. A name no lookup answered has no dentry in the kernel:
 * telling it would cost a round trip into the kernel for nothing (most
 * candidates, which a listing never shows, and every name of a
 * checkpoint nobody looked up). */
static void seen_filter_flush(struct seen_filter *f)
{
	for (size_t i = 0; i < f->n; i++) {
		if (!ns_name_seen_bits(f->ns, f->bits[i])) {
			castfs_stats_count(f->ns->stats,
					   CASTFS_SCTR_INVAL_SKIPPED, 1);
			continue;
		}
		castfs_stats_count(f->ns->stats, CASTFS_SCTR_INVAL_SENT, 1);
		f->cb(f->ctx, f->parent[i], f->names + f->off[i]);
	}
	f->n = 0;
	f->used = 0;
}

static void seen_filter_cb(void *ctx, uint64_t parent, const char *name)
{
	struct seen_filter *f = ctx;
	size_t len = strlen(name) + 1;

	/* Every name reported is in @parent's listing, which changes even
	 * when the kernel holds no dentry of the name (a new file). */
	if (parent != f->last_parent) {
		f->last_parent = parent;
		ns_listing_changed(f->ns, parent);
	}
	if (f->n == SEEN_BATCH || f->used + len > sizeof(f->names))
		seen_filter_flush(f);
	if (len > sizeof(f->names)) {
		if (ns_name_seen(f->ns, parent, name))
			f->cb(f->ctx, parent, name);
		return;
	}
	ns_name_seen_hash(f->ns, parent, name, f->bits[f->n]);
	memcpy(f->names + f->used, name, len);
	f->parent[f->n] = parent;
	f->off[f->n++] = (uint16_t)f->used;
	f->used += len;
}

/* Forget source path @rel; report the names that depend on it to @cb. */
static void invalidate_path(struct castfs_ns *ns, const char *rel,
			    void (*cb)(void *ctx, uint64_t parent,
				       const char *name),
			    void *ctx)
{
	const char *slash = strrchr(rel, '/');
	char *dir = strndup(rel, slash ? (size_t)(slash - rel) : 0);
	uint64_t parent;
	struct stat st;

	ns_ckpt_drop_path(ns, rel);
	/* Its tensor trees list its header, which may have changed with the
	 * size and mtime their ids hash kept (a rewrite in place). */
	if (ns_src_stat_in(ns, rel, &st) == 0)
		ns_tree_listings_changed(ns, &st);
	if (!dir)
		return;
	if (strcmp(slash ? slash + 1 : rel, "config.json") == 0)
		ns_ckpt_drop_dir(ns, dir); /* whether they are quantized */
	if (dir_id(ns, dir, &parent) == 0)
		invalidate_names(ns, parent, slash ? slash + 1 : rel, cb, ctx);
	ns_modeldir_invalidate(ns, rel, cb, ctx);
	free(dir);
	/* A pack is shown, with its views, as the file it holds. */
	if (ns_packed_name(rel)) {
		char *shown =
			strndup(rel, strlen(rel) - ns_packed_ext_len(rel));

		if (shown)
			invalidate_path(ns, shown, cb, ctx);
		free(shown);
	}
}

void castfs_ns_invalidate(struct castfs_ns *ns, const char *rel,
			  void (*cb)(void *ctx, uint64_t parent,
				     const char *name),
			  void *ctx)
{
	struct seen_filter f = { .ns = ns, .cb = cb, .ctx = ctx };

	ns_ctl_src_changed(ns);
	invalidate_path(ns, rel, seen_filter_cb, &f);
	seen_filter_flush(&f);
}

/* Places by parent, then path (qsort). */
static int place_cmp(const void *a, const void *b)
{
	const struct ns_place *x = a, *y = b;

	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	return strcmp(x->path, y->path);
}

void castfs_ns_invalidate_held(
	struct castfs_ns *ns, bool (*keep)(void *kctx, const char *path),
	void *kctx, void (*cb)(void *ctx, uint64_t parent, const char *name),
	void *ctx)
{
	struct seen_filter f = { .ns = ns, .cb = cb, .ctx = ctx };
	struct ns_place *v;
	ssize_t n = ns_node_places(ns, &v);

	ns_ctl_src_changed(ns);
	if (n < 0)
		return;
	qsort(v, (size_t)n, sizeof(*v), place_cmp);
	for (ssize_t i = 0; i < n; i++) {
		const char *slash = strrchr(v[i].path, '/');

		if ((i && place_cmp(&v[i - 1], &v[i]) == 0) || !v[i].path[0] ||
		    keep(kctx, v[i].path))
			continue;
		ns_ckpt_drop_path(ns, v[i].path);
		invalidate_names(ns, v[i].parent, slash ? slash + 1 : v[i].path,
				 seen_filter_cb, &f);
	}
	seen_filter_flush(&f); /* the last batch of names */
	for (ssize_t i = 0; i < n; i++)
		free(v[i].path);
	free(v);
}

int castfs_ns_statfs(struct castfs_ns *ns, struct statvfs *sv)
{
	if (fstatvfs(ns->root_fd, sv) < 0)
		return -errno;
	sv->f_flag |= ST_RDONLY;
	return 0;
}
