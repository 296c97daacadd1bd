// SPDX-License-Identifier: MIT
/*
 * The bottom of the namespace: stable node ids, the node table, listings
 * under construction and the small helpers every kind shares. Calls nothing
 * else in ns/.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/compiler.h"
#include "common/escape.h"
#include "common/hash.h"
#include "ns/ns_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)

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
 * the source object behind it (device and inode; size, mtime and ctime
 * too for files, so that a rewritten file gets a new id, also when the
 * writer put its mtime back: rsync --inplace -t) and its view and
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
		h = hash_u64(h, (uint64_t)n->st.st_ctim.tv_sec);
		h = hash_u64(h, (uint64_t)n->st.st_ctim.tv_nsec);
	}
	h = hash_str(h, n->view ? n->view->name : NULL);
	/* A view a config redefined: by what it converts too (built-in
	 * definitions add nothing, so their ids are what they were). */
	if (n->view && n->view->id_salt)
		h = hash_u64(h, n->view->id_salt);
	h = hash_str(h, n->sub);
	if (n->dep) /* only model-directory files: other ids unchanged */
		h = hash_u64(h, n->dep);
	/* What the path of a link to it hides (ns_src_link_hide()): not
	 * the inode of the target reached directly. Other ids unchanged. */
	if (S_ISREG(n->st.st_mode) && n->st.st_rdev)
		h = hash_u64(h, (uint64_t)n->st.st_rdev);
	/* A tensor tree's nodes also by the path they were reached by: the
	 * .info names it, and two hard links (HF-cache blobs) are one
	 * identity. Other ids unchanged. */
	if (n->kind == NS_TDIR || n->kind == NS_TFILE)
		h = hash_str(h, n->path);
	h = castfs_mix64(h);
	/* 0 is invalid and 1 is the root in FUSE. */
	return h > CASTFS_NS_ROOT_ID ? h : h + 2;
}

/* ---- the node table ---- */

/* A node's bit in its bucket's tags: the top six bits of @h, its id's
 * mixed hash, which the bucket's index (the low bits) does not use. */
static uint64_t tag_of(uint64_t h)
{
	return 1ull << (h >> 58);
}

/* Id @id's bucket, and through *@tag its bit in that bucket's tags. */
static struct ns_bucket *bucket(struct castfs_ns *ns, uint64_t id,
				uint64_t *tag)
{
	uint64_t h = castfs_mix64(id);

	*tag = tag_of(h);
	return &ns->nodes[h & (ns->nbuckets - 1)];
}

static void bucket_push(struct castfs_ns *ns, struct ns_node *n)
{
	uint64_t tag;
	struct ns_bucket *b = bucket(ns, n->id, &tag);

	n->hnext = b->head;
	b->head = n;
	b->tags |= tag;
}

/* The tags of @b's chain again, after nodes left it. */
static void bucket_retag(struct ns_bucket *b)
{
	b->tags = 0;
	for (const struct ns_node *n = b->head; n; n = n->hnext)
		b->tags |= tag_of(castfs_mix64(n->id));
}

/* Caller holds ns->lock. Move every node into @nb buckets; without memory
 * for them the table stays as it is (chains only longer or shorter). */
static void table_resize_locked(struct castfs_ns *ns, size_t nb)
{
	size_t oldn = ns->nbuckets;
	struct ns_bucket *old = ns->nodes;

	ns->nodes = calloc(nb, sizeof(*ns->nodes));
	if (!ns->nodes) {
		ns->nodes = old;
		return;
	}
	ns->nbuckets = nb;
	for (size_t i = 0; i < oldn; i++) {
		struct ns_node *n = old[i].head, *next;

		for (; n; n = next) {
			next = n->hnext;
			bucket_push(ns, n);
		}
	}
	free(old);
}

/* Caller holds ns->lock. Double the buckets once the table holds twice as
 * many nodes. */
static void table_grow_locked(struct castfs_ns *ns)
{
	if (ns->nnodes > 2 * ns->nbuckets)
		table_resize_locked(ns, ns->nbuckets * 2);
}

/* Caller holds ns->lock. Once a sweep leaves the table an eighth full,
 * give its buckets back: a listing of 100,000 tensors grows it to megabytes
 * the kernel's forgetting would otherwise never return (the hysteresis
 * against table_grow_locked keeps one size from flapping). */
static void table_shrink_locked(struct castfs_ns *ns)
{
	size_t nb = ns->nbuckets;

	if (nb <= NS_HASH_BUCKETS || ns->nnodes * 8 >= nb)
		return;
	while (nb > NS_HASH_BUCKETS && ns->nnodes * 2 < nb)
		nb /= 2;
	table_resize_locked(ns, nb);
}

/* Caller holds ns->lock. */
static struct ns_node *node_find_locked(struct castfs_ns *ns, uint64_t id)
{
	uint64_t tag;
	const struct ns_bucket *b = bucket(ns, id, &tag);
	struct ns_node *n;

	if (!(b->tags & tag))
		return NULL;
	for (n = b->head; n; n = n->hnext) {
		if (n->id == id)
			return n;
	}
	return NULL;
}

struct ns_node *ns_node_find_locked(struct castfs_ns *ns, uint64_t id)
{
	return node_find_locked(ns, id);
}

static void node_free(struct ns_node *n)
{
	if (!n)
		return;
	free(n->path);
	free(n->sub);
	free(n);
}

int ns_node_get(struct castfs_ns *ns, uint64_t id, struct ns_node *out)
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

bool ns_node_listed_once(struct castfs_ns *ns, uint64_t id)
{
	struct ns_node *n;
	bool was = false;

	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, id);
	if (n) {
		was = n->listed;
		n->listed = true;
	}
	pthread_mutex_unlock(&ns->lock);
	return was;
}

void ns_node_put_copy(struct ns_node *n)
{
	free(n->path);
	free(n->sub);
}

bool ns_node_path_live(const struct castfs_ns *ns, const char *path, size_t len)
{
	return ns->live && ns_live_has(ns->live, path, len);
}

size_t ns_node_tree_slot(const struct castfs_ns *ns, const struct stat *st)
{
	uint64_t h = hash_u64(CASTFS_FNV_SEED, (uint64_t)st->st_dev);

	(void)ns;
	h = hash_u64(h, (uint64_t)st->st_ino);
	return castfs_mix64(h) % NS_LIVE_SLOTS;
}

static _Atomic uint32_t *tree_slot(const struct castfs_ns *ns,
				   const struct stat *st)
{
	return &ns->tlive[ns_node_tree_slot(ns, st)];
}

bool ns_node_tree_live(const struct castfs_ns *ns, const struct stat *st)
{
	return ns->tlive && atomic_load(&ns->ntlive) != 0 &&
	       atomic_load(tree_slot(ns, st)) != 0;
}

/* Node @n became held by the kernel: count it where ns_node_path_live()
 * and ns_node_tree_live() look. */
static void live_count(struct castfs_ns *ns, const struct ns_node *n)
{
	ns_live_add(ns->live, n->path);
	if (n->kind != NS_TDIR)
		return;
	atomic_fetch_add(tree_slot(ns, &n->st), 1);
	atomic_fetch_add(&ns->ntlive, 1);
	ns_tids_add(ns, ns_node_tree_slot(ns, &n->st), n->id);
}

/* Tree directory @n is no longer held by the kernel. */
static void tree_forget(struct castfs_ns *ns, const struct ns_node *n)
{
	atomic_fetch_sub(tree_slot(ns, &n->st), 1);
	atomic_fetch_sub(&ns->ntlive, 1);
	ns_tids_del(ns, ns_node_tree_slot(ns, &n->st), n->id);
}

int ns_name_seen_init(struct castfs_ns *ns)
{
	/* Pages the lookups never touch are never given memory. */
	ns->seen = calloc(NS_SEEN_BITS / 64, sizeof(*ns->seen));
	return ns->seen ? 0 : -ENOMEM;
}

/* The two bits of (@parent, @name), in one 64-bit word (a blocked Bloom
 * filter): a test costs one cache miss, not two, in a set larger than the
 * caches; the watcher tests ~77 names per changed checkpoint. */
static void seen_bits(uint64_t parent, const char *name, uint32_t b[2])
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, &parent, sizeof(parent));

	h = castfs_mix64(castfs_fnv1a(h, name, strlen(name)));
	b[0] = (uint32_t)h % NS_SEEN_BITS;
	b[1] = (b[0] & ~63u) | (uint32_t)(h >> 58);
}

static void seen_set(_Atomic uint64_t *seen, uint32_t b)
{
	if (!(atomic_load_explicit(&seen[b / 64], memory_order_relaxed) &
	      (1ull << (b % 64))))
		atomic_fetch_or(&seen[b / 64], 1ull << (b % 64));
}

static bool seen_test(_Atomic uint64_t *seen, uint32_t b)
{
	return (atomic_load(&seen[b / 64]) >> (b % 64)) & 1;
}

void ns_name_seen_add(struct castfs_ns *ns, uint64_t parent, const char *name)
{
	uint32_t b[2];

	if (!ns->seen)
		return;
	seen_bits(parent, name, b);
	seen_set(ns->seen, b[0]);
	seen_set(ns->seen, b[1]);
}

bool ns_name_seen(const struct castfs_ns *ns, uint64_t parent, const char *name)
{
	uint32_t b[2];

	ns_name_seen_hash(ns, parent, name, b);
	return ns_name_seen_bits(ns, b);
}

void ns_name_seen_hash(const struct castfs_ns *ns, uint64_t parent,
		       const char *name, uint32_t b[2])
{
	seen_bits(parent, name, b);
	/* Both bits are in this word: the test that follows waits on one
	 * line, loaded while other names are hashed. */
	if (ns->seen)
		__builtin_prefetch(&ns->seen[b[0] / 64]);
}

bool ns_name_seen_bits(const struct castfs_ns *ns, const uint32_t b[2])
{
	if (!ns->seen)
		return true;
	return seen_test(ns->seen, b[0]) && seen_test(ns->seen, b[1]);
}

/* One more kernel reference to @n; a forgotten node comes back to life.
 * Caller holds ns->lock. */
static void node_ref_locked(struct castfs_ns *ns, struct ns_node *n)
{
	if (n->nlookup++ == 0) {
		ns->nforgotten--;
		live_count(ns, n);
	}
}

/*
 * The identity of node @n was just found at @desc's path: a file renamed
 * over another keeps its identity, hence its id, and the path @n had may
 * be gone, so @n follows the path a lookup resolved last (a hard link's
 * other path serves the same bytes). Caller holds ns->lock.
 */
static void node_move_locked(struct castfs_ns *ns, struct ns_node *n,
			     struct ns_node *desc)
{
	char *old = n->path;

	if (!desc->path || strcmp(old, desc->path) == 0)
		return;
	if (n->nlookup) {
		ns_live_sub(ns->live, old);
		ns_live_add(ns->live, desc->path);
	}
	n->path = desc->path;
	n->parent = desc->parent;
	desc->path = old; /* freed by the caller's ns_node_put_copy() */
}

int ns_node_intern(struct castfs_ns *ns, struct ns_node *desc, uint64_t *id)
{
	struct ns_node *n;

	desc->id = ns_node_id(desc);
	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, desc->id);
	if (n) {
		node_move_locked(ns, n, desc);
		node_ref_locked(ns, n);
		pthread_mutex_unlock(&ns->lock);
		ns_node_put_copy(desc);
		*id = desc->id;
		return 0;
	}
	n = malloc(sizeof(*n));
	if (!n) {
		pthread_mutex_unlock(&ns->lock);
		ns_node_put_copy(desc);
		return -ENOMEM;
	}
	*n = *desc;
	n->nlookup = 1;
	live_count(ns, n);
	bucket_push(ns, n);
	ns->nnodes++;
	table_grow_locked(ns);
	pthread_mutex_unlock(&ns->lock);
	*id = n->id;
	return 0;
}

/* Free every forgotten node. Caller holds ns->lock. */
static void sweep_forgotten_locked(struct castfs_ns *ns)
{
	for (size_t i = 0; i < ns->nbuckets; i++) {
		struct ns_node **pp = &ns->nodes[i].head, *n;

		while ((n = *pp)) {
			if (n->nlookup == 0 && n->id != CASTFS_NS_ROOT_ID) {
				*pp = n->hnext;
				node_free(n);
				ns->nnodes--;
				continue;
			}
			pp = &n->hnext;
		}
		bucket_retag(&ns->nodes[i]);
	}
	ns->nforgotten = 0;
	table_shrink_locked(ns);
}

/* One more kernel reference to node @id if it is in the table. */
bool ns_node_ref(struct castfs_ns *ns, uint64_t id)
{
	struct ns_node *t;

	pthread_mutex_lock(&ns->lock);
	t = node_find_locked(ns, id);
	if (t)
		node_ref_locked(ns, t);
	pthread_mutex_unlock(&ns->lock);
	return t != NULL;
}

/*
 * A node the kernel forgot stays known for a while: an NFS server may
 * still hold a file handle of it, and the kernel then asks for it again
 * by id (LOOKUP(id, ".")) rather than by name. Past NS_FORGOTTEN_MAX they
 * are all freed; a handle of one of those is found again by ns_resolve()
 * (the facade).
 */
char *ns_node_forget(struct castfs_ns *ns, uint64_t id, uint64_t nlookup)
{
	struct ns_node *n;
	char *idle = NULL;

	if (id == CASTFS_NS_ROOT_ID)
		return NULL;
	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, id);
	if (n && n->nlookup) {
		n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
		if (n->nlookup == 0 && n->kind == NS_TDIR)
			tree_forget(ns, n);
		if (n->nlookup == 0 && ns_live_sub(ns->live, n->path))
			idle = strdup(n->path);
		if (n->nlookup == 0 && ++ns->nforgotten > NS_FORGOTTEN_MAX)
			sweep_forgotten_locked(ns);
	}
	pthread_mutex_unlock(&ns->lock);
	return idle;
}

bool ns_node_held(struct castfs_ns *ns, uint64_t id)
{
	const struct ns_node *n;
	bool held;

	pthread_mutex_lock(&ns->lock);
	n = node_find_locked(ns, id);
	held = n && n->nlookup;
	pthread_mutex_unlock(&ns->lock);
	return held;
}

void ns_node_count(struct castfs_ns *ns, size_t *n, size_t *forgotten)
{
	pthread_mutex_lock(&ns->lock);
	*n = ns->nnodes;
	*forgotten = ns->nforgotten;
	pthread_mutex_unlock(&ns->lock);
}

static int places_add(struct ns_place **v, size_t *n, size_t *cap,
		      const struct ns_node *node)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct ns_place *nv = realloc(*v, nc * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = nc;
	}
	(*v)[*n].parent = node->parent;
	(*v)[*n].path = strdup(node->path);
	if (!(*v)[*n].path)
		return -ENOMEM;
	(*n)++;
	return 0;
}

bool ns_err_transient(int err)
{
	switch (err) {
	case -ESTALE:
	case -ENOMEM:
	case -EAGAIN:
	case -EINTR:
	case -EMFILE:
	case -ENFILE:
		return true;
	default:
		return false;
	}
}

int ns_err_unlisted(int err)
{
	if (!err || err == -EIO || ns_err_transient(err))
		return err;
	return -ENOENT;
}

ssize_t ns_node_places(struct castfs_ns *ns, struct ns_place **out)
{
	struct ns_place *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	pthread_mutex_lock(&ns->lock);
	for (size_t b = 0; b < ns->nbuckets && !rc; b++) {
		for (struct ns_node *node = ns->nodes[b].head; node && !rc;
		     node = node->hnext) {
			if (node->parent && !node->sub)
				rc = places_add(&v, &n, &cap, node);
		}
	}
	pthread_mutex_unlock(&ns->lock);
	if (rc) {
		for (size_t i = 0; i < n; i++)
			free(v[i].path);
		free(v);
		return rc;
	}
	*out = v;
	return (ssize_t)n;
}

int ns_node_add_root(struct castfs_ns *ns, struct castfs_diag *d)
{
	struct ns_node *root;

	ns->nodes = calloc(NS_HASH_BUCKETS, sizeof(*ns->nodes));
	ns->live = ns_live_new();
	ns->tlive = calloc(NS_LIVE_SLOTS, sizeof(*ns->tlive));
	if (!ns->nodes || !ns->live || !ns->tlive)
		return -ENOMEM;
	ns->nbuckets = NS_HASH_BUCKETS;
	root = calloc(1, sizeof(*root));
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
	bucket_push(ns, root);
	ns->nnodes = 1;
	return 0;
}

void ns_node_table_fini(struct castfs_ns *ns)
{
	for (size_t i = 0; ns->nodes && i < ns->nbuckets; i++) {
		struct ns_node *n = ns->nodes[i].head;

		while (n) {
			struct ns_node *next = n->hnext;

			node_free(n);
			n = next;
		}
	}
	free(ns->nodes);
	ns->nodes = NULL;
	ns_live_free(ns->live);
	ns->live = NULL;
	free(ns->tlive);
	ns->tlive = NULL;
	ns_tids_fini(ns);
	free(ns->seen);
	ns->seen = NULL;
	ns->nbuckets = 0;
	ns->nnodes = 0;
}

/* ---- listings, attributes, names ---- */

static uint64_t list_hash(const char *name, size_t len)
{
	return castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, name, len));
}

/*
 * The set holds, per name, the high 32 bits of its hash (its tag) above
 * its entry's index + 1. A name's first slot is its tag's top bits, so
 * the set grows without reading a name again, and a probe reads a name,
 * a cache miss with a million entries, only where the tags agree.
 */
static uint32_t list_tag(uint64_t h)
{
	return (uint32_t)(h >> 32);
}

static size_t list_home(size_t nset, uint32_t tag)
{
	return (size_t)(((uint64_t)tag * nset) >> 32); /* nset <= 2^32 */
}

/* The slot of @name (of tag @tag) in the set: where it is, or the empty
 * one where it would go. The set is never full, so the probe ends. */
static uint64_t *list_slot(const struct ns_list *l, const char *name,
			   size_t len, uint32_t tag)
{
	size_t mask = l->nset - 1, i = list_home(l->nset, tag);

	for (;; i = (i + 1) & mask) {
		uint64_t e = l->set[i];
		const char *en;

		if (!e)
			return &l->set[i];
		if ((uint32_t)(e >> 32) != tag)
			continue;
		en = l->dir->ents[(uint32_t)e - 1].name;
		if (strlen(en) == len && memcmp(en, name, len) == 0)
			return &l->set[i];
	}
}

/* Keep the set at most half full: rebuild it at twice the size. */
static int list_set_grow(struct ns_list *l)
{
	size_t nset = l->nset ? l->nset * 2 : 64;
	uint64_t *old = l->set;

	if (l->dir->n + 1 <= l->nset / 2)
		return 0;
	if (nset > ((size_t)1 << 32))
		return -ENOMEM; /* past what an index in a slot can say */
	l->set = calloc(nset, sizeof(*l->set));
	if (!l->set) {
		l->set = old;
		return -ENOMEM;
	}
	for (size_t i = 0; i < l->nset; i++) {
		size_t k = list_home(nset, (uint32_t)(old[i] >> 32));

		if (!old[i])
			continue;
		while (l->set[k])
			k = (k + 1) & (nset - 1);
		l->set[k] = old[i];
	}
	free(old);
	l->nset = nset;
	return 0;
}

int ns_list_add(struct ns_list *l, const char *name, size_t len, mode_t type,
		uint64_t ino)
{
	struct castfs_dir *d = l->dir;
	uint64_t *slot, h;
	uint32_t tag;
	char *copy;

	if (list_set_grow(l))
		return -ENOMEM;
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
	h = list_hash(name, len);
	/* readdir(3) hides entries whose inode number is 0. */
	if (!ino)
		ino = h | 2;
	/* A duplicate name stays out of the set: the first one listed is
	 * the one lookups find. */
	tag = list_tag(h);
	slot = list_slot(l, name, len, tag);
	if (!*slot)
		*slot = (uint64_t)tag << 32 | (d->n + 1);
	d->ents[d->n++] = (struct castfs_dirent){ .name = copy,
						  .type = type,
						  .ino = ino };
	return 0;
}

void ns_list_shorten(struct ns_list *l, size_t i, size_t len)
{
	struct castfs_dirent *e = &l->dir->ents[i];
	uint32_t tag = list_tag(list_hash(e->name, len));
	uint64_t *slot = list_slot(l, e->name, len, tag);

	/* The old name's slot now names an entry of another name: probes
	 * pass it by, as they pass any other name of that tag. */
	e->name[len] = '\0';
	if (!*slot)
		*slot = (uint64_t)tag << 32 | (i + 1);
}

bool ns_list_has(const struct ns_list *l, const char *name, size_t len)
{
	return l->nset &&
	       *list_slot(l, name, len, list_tag(list_hash(name, len))) != 0;
}

void ns_list_fini(struct ns_list *l)
{
	free(l->set);
	l->set = NULL;
	l->nset = 0;
}

int ns_list_dir(struct castfs_ns *ns, const struct ns_node *n,
		int (*list)(struct castfs_ns *ns, const struct ns_node *dir,
			    struct ns_list *l),
		struct castfs_dir **out)
{
	struct ns_list l = { 0 };
	int rc;

	l.dir = calloc(1, sizeof(*l.dir));
	rc = l.dir ? 0 : -ENOMEM;
	if (!rc)
		rc = ns_list_add(&l, ".", 1, S_IFDIR, n->id);
	if (!rc)
		rc = ns_list_add(&l, "..", 2, S_IFDIR, n->parent);
	if (!rc)
		rc = list(ns, n, &l);
	ns_list_fini(&l);
	castfs_stats_count(ns->stats, CASTFS_SCTR_LISTINGS_MADE, 1);
	if (rc)
		castfs_dir_free(l.dir);
	else
		*out = l.dir;
	return rc;
}

struct castfs_dir *castfs_dir_hold(struct castfs_dir *dir)
{
	/* The caller's share keeps refs above zero meanwhile. */
	atomic_fetch_add(&dir->refs, 1);
	return dir;
}

/* Offsets: 32 bits of the name's hash above 31 of position (from 1). */
#define DIR_OFF_POS_BITS 31
#define DIR_OFF_POS_MAX ((1ull << DIR_OFF_POS_BITS) - 1)

/* The name's tag in a listing's name set (list_tag()), 32 bits. */
static uint64_t dir_name_hash(const char *name)
{
	return list_tag(list_hash(name, strlen(name)));
}

uint64_t castfs_dir_off(const struct castfs_dir *dir, size_t i)
{
	uint64_t pos = CASTFS_MIN((uint64_t)i + 1, DIR_OFF_POS_MAX);

	return dir_name_hash(dir->ents[i].name) << DIR_OFF_POS_BITS | pos;
}

/* The entry of @dir with name hash @h nearest to index @near, or n. */
static size_t dir_find_hash(const struct castfs_dir *dir, uint64_t h,
			    size_t near)
{
	for (size_t d = 0; d < near || near + d < dir->n; d++) {
		if (near + d < dir->n &&
		    dir_name_hash(dir->ents[near + d].name) == h)
			return near + d;
		if (d < near &&
		    dir_name_hash(dir->ents[near - d - 1].name) == h)
			return near - d - 1;
	}
	return dir->n;
}

size_t castfs_dir_seek(const struct castfs_dir *dir, uint64_t off)
{
	uint64_t h = off >> DIR_OFF_POS_BITS, pos = off & DIR_OFF_POS_MAX;
	size_t near = (size_t)CASTFS_MIN(pos, (uint64_t)dir->n), i;

	if (off == 0)
		return 0;
	/* The listing that handed it out: its entry is where it says. */
	if (pos && pos < DIR_OFF_POS_MAX && pos <= dir->n &&
	    dir_name_hash(dir->ents[pos - 1].name) == h)
		return (size_t)pos;
	/* An offset with no hash (a daemon before stop 46): a position. */
	if (!h)
		return near;
	/* Another listing (once, then the handle keeps this one): the entry
	 * of that name, searched from where it was outwards (entries added
	 * or gone before it moved it a little; of two names with one hash,
	 * the nearer). That entry gone, what followed it moved up one:
	 * going on one earlier repeats an entry where the position would
	 * skip one. */
	i = dir_find_hash(dir, h, near ? near - 1 : 0);
	return i < dir->n ? i + 1 : (near ? near - 1 : 0);
}

void castfs_dir_free(struct castfs_dir *dir)
{
	/* refs counts the other owners: the last one frees. */
	if (!dir)
		return;
	if (dir->share ? !ns_dirshare_release(dir) :
			 atomic_fetch_sub(&dir->refs, 1) != 0)
		return;
	for (size_t i = 0; i < dir->n; i++)
		free(dir->ents[i].name);
	free(dir->ents);
	free(dir);
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

void ns_logf(struct castfs_ns *ns, const char *path, const char *fmt, ...)
{
	char msg[1024];
	size_t n;
	va_list ap;

	if (!ns->log)
		return;
	n = castfs_escape_buf(msg, sizeof(msg) - 256, path, strlen(path));
	n += (size_t)snprintf(msg + n, sizeof(msg) - n, ": ");
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - n, fmt, ap);
	va_end(ap);
	ns->log(ns->log_ctx, msg);
}

int ns_view_index(const struct castfs_ns *ns, const struct castfs_view *v)
{
	if (!v || v < ns->views->v || v >= ns->views->v + ns->views->n)
		return CASTFS_STATS_OTHER;
	return (int)(v - ns->views->v);
}

char *ns_path_join(const char *dir, const char *name, size_t name_len)
{
	size_t dl = strlen(dir);
	char *p = malloc(dl + 1 + name_len + 1);

	if (!p)
		return NULL;
	if (dl) {
		memcpy(p, dir, dl);
		p[dl++] = '/';
	}
	memcpy(p + dl, name, name_len);
	p[dl + name_len] = '\0';
	return p;
}

void ns_view_stat(const struct stat *src, uint64_t size, uint64_t ino,
		  struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	/* Read bits of the source only: a view is never writable or run. */
	st->st_mode = S_IFREG | (src->st_mode & 0444);
	/* The source's link count: a view's inode number comes from the
	 * source's identity, so the views of two hard links of one file are
	 * one inode with two names (rsync -H, tar, du count it once). */
	st->st_nlink = src->st_nlink ? src->st_nlink : 1;
	st->st_uid = src->st_uid;
	st->st_gid = src->st_gid;
	st->st_size = (off_t)size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	st->st_atim = src->st_atim;
	st->st_mtim = src->st_mtim;
	st->st_ctim = src->st_ctim;
}

void ns_dir_stat(const struct stat *src, uint64_t ino, struct stat *st)
{
	mode_t r = src->st_mode & 0444;

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	/* Searchable wherever readable, like the source file it shows. */
	st->st_mode = S_IFDIR | r | (r >> 2);
	st->st_nlink = 2;
	st->st_uid = src->st_uid;
	st->st_gid = src->st_gid;
	st->st_size = 4096;
	st->st_blksize = 4096;
	st->st_atim = src->st_atim;
	st->st_mtim = src->st_mtim;
	st->st_ctim = src->st_ctim;
}

bool ns_has_st_ext(const char *name, size_t len)
{
	return len > ST_EXT_LEN &&
	       memcmp(name + len - ST_EXT_LEN, st_ext, ST_EXT_LEN) == 0;
}

const struct castfs_view *ns_split_gguf_name(struct castfs_ns *ns,
					     const char *name, size_t len,
					     size_t *base_len)
{
	static const char ext[] = ".gguf";
	const size_t elen = sizeof(ext) - 1;
	const struct castfs_view *v;
	const char *dot;

	if (len <= elen || memcmp(name + len - elen, ext, elen) != 0)
		return NULL;
	dot = memrchr(name, '.', len - elen);
	if (!dot || dot == name)
		return NULL;
	v = castfs_views_find(ns->views, dot + 1,
			      (size_t)(name + len - dot - 1));
	if (!v || v->kind != CASTFS_VIEW_GGUF)
		return NULL;
	*base_len = (size_t)(dot - name);
	return v;
}

int ns_split_view_name(struct castfs_ns *ns, const char *name, char **base,
		       const struct castfs_view **view)
{
	size_t len = strlen(name), stem_len, base_len;
	const char *dot;

	*view = ns_split_gguf_name(ns, name, len, &base_len);
	if (!*view) {
		if (!ns_has_st_ext(name, len))
			return -ENOENT;
		stem_len = len - ST_EXT_LEN; /* "X.<view>" */
		dot = memrchr(name, '.', stem_len);
		if (!dot || dot == name)
			return -ENOENT;
		*view = castfs_views_find(ns->views, dot + 1,
					  (size_t)(name + stem_len - dot - 1));
		/* "X.q8_0.safetensors" is no name of the GGUF view */
		if (!*view || (*view)->kind == CASTFS_VIEW_GGUF)
			return -ENOENT;
		base_len = (size_t)(dot - name);
	}
	/* "X.q8_0.gguf" of 255 bytes names a source of 257, which cannot
	 * be: no such view (ENAMETOOLONG from the stat of it hid the
	 * DIR.q8_0.gguf of that name, listed; a bug hunt). */
	if (base_len + ST_EXT_LEN > NAME_MAX)
		return -ENOENT;
	*base = malloc(base_len + ST_EXT_LEN + 1);
	if (!*base)
		return -ENOMEM;
	memcpy(*base, name, base_len);
	memcpy(*base + base_len, st_ext, ST_EXT_LEN + 1);
	return 0;
}

ssize_t ns_view_getxattr(struct castfs_ns *ns, const struct ns_node *n,
			 const char *name, char *buf, size_t len)
{
	(void)ns;
	if (strcmp(name, "user.castfs.view") == 0)
		return ns_xattr_put(n->view->name, strlen(n->view->name), buf,
				    len);
	if (strcmp(name, "user.castfs.source") == 0)
		return ns_xattr_put(n->path, strlen(n->path), buf, len);
	return -ENODATA;
}

ssize_t ns_view_listxattr(struct castfs_ns *ns, const struct ns_node *n,
			  char *buf, size_t len)
{
	static const char names[] = "user.castfs.view\0user.castfs.source";

	(void)ns;
	(void)n;
	if (len == 0)
		return sizeof(names);
	if (len < sizeof(names))
		return -ERANGE;
	memcpy(buf, names, sizeof(names));
	return sizeof(names);
}

bool ns_same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
	       a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
	       a->st_ctim.tv_nsec == b->st_ctim.tv_nsec &&
	       (a->st_mode & S_IFMT) == (b->st_mode & S_IFMT);
}

char *ns_parent_path(const char *path)
{
	const char *slash = strrchr(path, '/');

	return strndup(path, slash ? (size_t)(slash - path) : 0);
}
