/* SPDX-License-Identifier: MIT */
/*
 * Directory snapshots: per source directory, what its last listing (or
 * rescan) found, as (name hash -> identity hash), so that a rescan after
 * lost change events reports only the names that differ.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "ns/ns_src_internal.h"
#include "ns/stats.h"

#define SNAP_BUCKETS 4096u

/* One entry: 16 bytes. An id of 0 marks a name whose hash another name
 * of the directory shares: never trusted (always reported). */
struct snap_ent {
	uint64_t name;
	uint64_t id;
};

struct ns_snap {
	struct ns_snap *next; /* in its bucket */
	uint64_t dirh;
	char *dir;
	int64_t stamp; /* CLOCK_MONOTONIC ns before the directory was read */
	size_t n, cap;
	struct snap_ent *e; /* sorted by name hash once committed */
	char **names; /* a rescan's own: the names, parallel to @e */
	bool broken; /* an entry could not be added: not to be kept */
};

struct ns_snaps {
	pthread_mutex_t lock;
	size_t entries; /* in every kept snapshot */
	struct ns_snap *b[SNAP_BUCKETS];
};

int64_t ns_snap_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t hash_str(const char *s)
{
	return castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, s, strlen(s)));
}

/* What a changed entry changes: for a directory only what it is (its
 * own entries are its own snapshot's business, and its mtime moves with
 * each of them); for the rest also size, mtime and ctime (a rewrite in
 * place that put the mtime back still moves the ctime). */
static uint64_t ident_hash(const struct stat *st)
{
	uint64_t v[8] = { (uint64_t)(st->st_mode & S_IFMT),
			  (uint64_t)st->st_dev, (uint64_t)st->st_ino };
	size_t n = 3;

	if (!S_ISDIR(st->st_mode)) {
		v[3] = (uint64_t)st->st_size;
		v[4] = (uint64_t)st->st_mtim.tv_sec;
		v[5] = (uint64_t)st->st_mtim.tv_nsec;
		v[6] = (uint64_t)st->st_ctim.tv_sec;
		v[7] = (uint64_t)st->st_ctim.tv_nsec;
		n = 8;
	}
	return castfs_mix64(
		       castfs_fnv1a(CASTFS_FNV_SEED, v, n * sizeof(v[0]))) |
	       1;
}

int ns_snaps_init(struct castfs_ns *ns)
{
	ns->snaps = calloc(1, sizeof(*ns->snaps));
	if (!ns->snaps)
		return -ENOMEM;
	pthread_mutex_init(&ns->snaps->lock, NULL);
	return 0;
}

/* Release what @s holds, not @s itself. */
static void snap_clear(struct ns_snap *s)
{
	for (size_t i = 0; s->names && i < s->n; i++)
		free(s->names[i]);
	free(s->names);
	free(s->e);
	free(s->dir);
}

static void snap_free(struct ns_snap *s)
{
	if (!s)
		return;
	snap_clear(s);
	free(s);
}

void ns_snaps_fini(struct castfs_ns *ns)
{
	if (!ns->snaps)
		return;
	for (size_t b = 0; b < SNAP_BUCKETS; b++) {
		while (ns->snaps->b[b]) {
			struct ns_snap *s = ns->snaps->b[b];

			ns->snaps->b[b] = s->next;
			snap_free(s);
		}
	}
	pthread_mutex_destroy(&ns->snaps->lock);
	free(ns->snaps);
	ns->snaps = NULL;
}

struct ns_snap *ns_snap_begin(struct castfs_ns *ns, const char *dir)
{
	struct ns_snap *s;

	if (!ns->snaps)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->dir = strdup(dir);
	if (!s->dir) {
		free(s);
		return NULL;
	}
	s->dirh = hash_str(dir);
	s->stamp = ns_snap_now();
	return s;
}

/* Room for one more entry (and its name, for a rescan's). */
static bool snap_grow(struct ns_snap *s, bool names)
{
	size_t cap = s->cap * 2 + 64;
	struct snap_ent *e;

	if (s->n < s->cap)
		return true;
	if (s->n >= NS_SNAP_MAX_ENTRIES)
		return false;
	e = realloc(s->e, cap * sizeof(*e));
	if (!e)
		return false;
	s->e = e;
	if (names) {
		char **nm = realloc(s->names, cap * sizeof(*nm));

		if (!nm)
			return false;
		s->names = nm;
	}
	s->cap = cap;
	return true;
}

/*
 * Add an entry with identity @id under name hash @h (the hash of the
 * entry's name, or for a pack of the name it is shown as); with @name (a
 * rescan's snapshot, which keeps names to report) a copy of @name too.
 * Returns 0, or -ENOMEM (no memory, or past NS_SNAP_MAX_ENTRIES) and @s
 * is then broken: not to be kept.
 */
static int snap_put(struct ns_snap *s, uint64_t h, const char *name,
		    uint64_t id)
{
	if (s->broken || !snap_grow(s, name != NULL) ||
	    (name && !(s->names[s->n] = strdup(name)))) {
		s->broken = true;
		return -ENOMEM;
	}
	s->e[s->n].name = h;
	s->e[s->n].id = id;
	s->n++;
	return 0;
}

void ns_snap_add(struct ns_snap *s, int dfd, const char *name,
		 const struct stat *st)
{
	char shown[NAME_MAX + 1];
	uint64_t id;

	if (!s)
		return;
	id = ident_hash(st);
	/* A listing's snapshot keeps no names; one that failed is broken,
	 * which is all the listing needs to know. */
	(void)snap_put(s, hash_str(name), NULL, id);
	/* Lookups hold a pack under the name it is shown as: its identity
	 * vouches for that name too. */
	if (ns_packed_stands_in(dfd, name, shown, sizeof(shown)))
		(void)snap_put(s, hash_str(shown), NULL, id);
}

static int ent_cmp(const void *a, const void *b)
{
	const struct snap_ent *x = a, *y = b;

	return x->name < y->name ? -1 : x->name > y->name;
}

/* Sort by name hash; names sharing a hash lose their identity (0). */
static void snap_sort(struct ns_snap *s)
{
	if (s->n == 0)
		return; /* s->e may be NULL: not for qsort() */
	qsort(s->e, s->n, sizeof(*s->e), ent_cmp);
	for (size_t i = 1; i < s->n; i++) {
		if (s->e[i].name == s->e[i - 1].name)
			s->e[i].id = s->e[i - 1].id = 0;
	}
}

static struct ns_snap **slot_of(struct ns_snaps *ss, uint64_t dirh,
				const char *dir)
{
	struct ns_snap **p = &ss->b[dirh % SNAP_BUCKETS];

	while (*p && ((*p)->dirh != dirh || strcmp((*p)->dir, dir)))
		p = &(*p)->next;
	return p;
}

/* Put @s (sorted, no names) in place of @s->dir's snapshot, or drop that
 * one when @s does not fit; the old one is returned (caller frees). */
static struct ns_snap *snap_swap(struct castfs_ns *ns, struct ns_snap *s)
{
	struct ns_snaps *ss = ns->snaps;
	struct ns_snap **p, *old;

	pthread_mutex_lock(&ss->lock);
	p = slot_of(ss, s->dirh, s->dir);
	old = *p;
	if (old) {
		*p = old->next;
		old->next = NULL;
		ss->entries -= old->n;
	}
	if (!s->broken && ss->entries + s->n <= NS_SNAP_MAX_ENTRIES) {
		s->next = ss->b[s->dirh % SNAP_BUCKETS];
		ss->b[s->dirh % SNAP_BUCKETS] = s;
		ss->entries += s->n;
		s = NULL;
	}
	pthread_mutex_unlock(&ss->lock);
	snap_free(s);
	return old;
}

void ns_snap_commit(struct castfs_ns *ns, struct ns_snap *s)
{
	if (!s)
		return;
	snap_sort(s);
	snap_free(snap_swap(ns, s));
}

void ns_snap_abort(struct ns_snap *s)
{
	snap_free(s);
}

static const struct snap_ent *snap_find(const struct ns_snap *s, uint64_t h)
{
	struct snap_ent key = { .name = h };

	if (s->n == 0)
		return NULL; /* s->e may be NULL: not for bsearch() */
	return bsearch(&key, s->e, s->n, sizeof(*s->e), ent_cmp);
}

bool ns_snap_has(struct castfs_ns *ns, const char *dir, const char *name)
{
	const struct snap_ent *e = NULL;
	struct ns_snap *s;
	bool has;

	if (!ns->snaps)
		return false;
	pthread_mutex_lock(&ns->snaps->lock);
	s = *slot_of(ns->snaps, hash_str(dir), dir);
	if (s)
		e = snap_find(s, hash_str(name));
	/* Under the lock: a listing may replace and free @s at once. */
	has = e && e->id;
	pthread_mutex_unlock(&ns->snaps->lock);
	return has;
}

/* Entry @name of directory @dfd, and the name a pack is shown as, which
 * keeps the pack's name (to report) under the shown name's hash. */
static int snap_read_ent(struct ns_snap *s, int dfd, const char *name,
			 const struct stat *st)
{
	char shown[NAME_MAX + 1];
	uint64_t id = ident_hash(st);
	int rc = snap_put(s, hash_str(name), name, id);

	if (!rc && ns_packed_stands_in(dfd, name, shown, sizeof(shown)))
		rc = snap_put(s, hash_str(shown), name, id);
	return rc;
}

/* Read directory @s->dir afresh into @s, names kept; its node id into
 * *@id. Returns 0 or -errno (gone, unreadable, no memory). */
static int snap_read(struct castfs_ns *ns, struct ns_snap *s, uint64_t *id)
{
	struct ns_node dn = { .kind = NS_DIR };
	int fd = ns_src_open(ns, s->dir, O_RDONLY | O_DIRECTORY);
	struct dirent *de;
	DIR *dp;
	int rc = 0;

	if (fd < 0)
		return fd;
	if (fstat(fd, &dn.st) < 0 || !(dp = fdopendir(fd))) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*id = s->dir[0] ? ns_node_id(&dn) : CASTFS_NS_ROOT_ID;
	while (!rc && (errno = 0, de = readdir(dp))) {
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
			continue; /* vanished meanwhile: not in the listing */
		rc = snap_read_ent(s, dirfd(dp), de->d_name, &st);
	}
	if (!rc && errno)
		rc = -errno;
	closedir(dp);
	return rc;
}

/* Sort @s's entries and their names together (by name hash). */
static void snap_sort_named(struct ns_snap *s)
{
	size_t *ix;
	struct snap_ent *e;
	char **nm;

	if (s->n == 0)
		return; /* nothing to sort; s->e may be NULL */
	ix = malloc(s->n * sizeof(*ix));
	e = malloc(s->n * sizeof(*e));
	nm = malloc(s->n * sizeof(*nm));
	if (!ix || !e || !nm) {
		/* Unsorted: no lookup finds anything, so every name is
		 * reported and the snapshot is not kept. */
		s->broken = true;
		goto out;
	}
	for (size_t i = 0; i < s->n; i++)
		e[i] = (struct snap_ent){ .name = s->e[i].name, .id = i };
	qsort(e, s->n, sizeof(*e), ent_cmp);
	for (size_t i = 0; i < s->n; i++) {
		ix[i] = (size_t)e[i].id;
		nm[i] = s->names[ix[i]];
		e[i].id = s->e[ix[i]].id;
	}
	memcpy(s->e, e, s->n * sizeof(*e));
	memcpy(s->names, nm, s->n * sizeof(*nm));
	snap_sort(s);
out:
	free(ix);
	free(e);
	free(nm);
}

/* Whether entry @h of @now is new or moved since @old. */
static bool ent_moved(const struct ns_snap *old, const struct ns_snap *now,
		      uint64_t h)
{
	const struct snap_ent *o = old && !now->broken ? snap_find(old, h) :
							 NULL;
	const struct snap_ent *e = snap_find(now, h);

	return !o || !o->id || !e || o->id != e->id;
}

/* Entry @i of @now is a pack's shown name (it keeps the pack's name)
 * whose pack entry moved too: reporting the pack reports it. */
static bool shown_of_moved_pack(const struct ns_snap *old,
				const struct ns_snap *now, size_t i)
{
	uint64_t pack;

	if (!ns_packed_name(now->names[i]))
		return false;
	pack = hash_str(now->names[i]);
	return pack != now->e[i].name && ent_moved(old, now, pack);
}

/* Report the entries of @now that @old lacks or has with another
 * identity (all of them when @old is NULL). Returns how many. */
static size_t snap_diff(const struct ns_snap *old, const struct ns_snap *now,
			bool *names_changed,
			void (*changed)(void *, const char *), void *ctx)
{
	size_t found = 0, reported = 0;

	for (size_t i = 0; i < now->n; i++) {
		const struct snap_ent *o =
			old && !now->broken ? snap_find(old, now->e[i].name) :
					      NULL;

		found += o != NULL;
		if ((o && o->id && o->id == now->e[i].id) ||
		    shown_of_moved_pack(old, now, i))
			continue;
		changed(ctx, now->names[i]);
		reported++;
	}
	*names_changed = !old || found != now->n || found != old->n;
	return reported;
}

/* Put the fresh snapshot @now (its names taken out into @mine, with a
 * copy of its entries) in the table; the old one, when it can be trusted
 * for a loss that began at @since, into *@old. */
static int snap_install(struct castfs_ns *ns, struct ns_snap *now,
			struct ns_snap *mine, int64_t since,
			struct ns_snap **old)
{
	mine->n = now->n;
	mine->names = now->names;
	now->names = NULL;
	mine->e = malloc(now->n * sizeof(*mine->e) + 1);
	if (!mine->e) {
		snap_free(now);
		return -ENOMEM;
	}
	if (now->n) /* now->e may be NULL when empty */
		memcpy(mine->e, now->e, now->n * sizeof(*mine->e));
	*old = snap_swap(ns, now);
	if (*old && (*old)->stamp >= since) {
		/* Taken after the lost events began: a change it already
		 * shows may never have reached the kernel. */
		snap_free(*old);
		*old = NULL;
	}
	return 0;
}

int ns_snap_rescan(struct castfs_ns *ns, const char *dir, int64_t since,
		   void (*changed)(void *ctx, const char *name), void *ctx)
{
	struct ns_snap *now = ns_snap_begin(ns, dir), *old = NULL;
	struct ns_snap mine = { 0 };
	bool names_changed;
	uint64_t id = 0;
	size_t reported;
	int rc;

	if (!now)
		return -ENOMEM;
	rc = snap_read(ns, now, &id);
	if (rc) {
		snap_free(now);
		return rc;
	}
	snap_sort_named(now);
	rc = snap_install(ns, now, &mine, since, &old);
	if (rc)
		return rc;
	reported = snap_diff(old, &mine, &names_changed, changed, ctx);
	castfs_stats_count(ns->stats, CASTFS_SCTR_RESCAN_COMPARED,
			   old ? mine.n : 0);
	castfs_stats_count(ns->stats, CASTFS_SCTR_RESCAN_REPORTED, reported);
	if (!old)
		castfs_stats_count(ns->stats, CASTFS_SCTR_RESCAN_WHOLE, 1);
	/* A name gone that no lookup answered is still in the listing the
	 * kernel may keep. */
	if (names_changed)
		ns_listing_changed(ns, id);
	rc = old ? 0 : 1;
	snap_free(old);
	snap_clear(&mine);
	return rc;
}
