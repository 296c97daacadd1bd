/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint cache's memory budget: valid entries in a list, most
 * recently used first, with what each is estimated to hold. Past the
 * budget, entries nothing uses (no open file, no request, no node the
 * kernel holds) are evicted from the cold end, and entries only the
 * kernel's nodes hold give back their plans (built again on need); when
 * the kernel forgets the last node of a source path, its entries are
 * evicted at once, or at the put of the last reference that still held
 * them (a file's release comes after its forget as often as not). Evicted
 * memory goes back to the system (malloc_trim), so a forgotten mount
 * shrinks.
 */
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_ckpt_internal.h"
#include "plan/plan.h"

/* Below this much freed, malloc_trim is not worth its walk of the heap. */
#define TRIM_MIN_BYTES (1u << 20)
/* Entries one trim looks at: it costs a put at most this much. */
#define TRIM_SCAN 64u
/* After a pass that found nothing to evict, the cache grows by this
 * fraction of its budget (1/16) before the next pass. */
#define TRIM_SLACK 16u
/* Measured RSS over the parsed header's own sizes (see header_cost). */
#define HEADER_SLACK 3u

size_t ns_ckpt_header_cost(const struct castfs_header *h)
{
	/* The JSON text bounds the names, shapes and metadata the parse
	 * keeps; each tensor adds its record and its by-name pointer. The
	 * allocator's share and the shapes' own blocks about triple it: a
	 * 100,000-tensor, 8 MB header grows the daemon by 40-77 MB. */
	return HEADER_SLACK *
	       (sizeof(*h) + (size_t)h->header_len +
		h->ntensors * (sizeof(struct castfs_tensor) + sizeof(void *)) +
		h->nmeta * sizeof(struct castfs_meta_kv));
}

size_t ns_ckpt_plan_cost(const struct castfs_plan *p)
{
	/* The arena holds the rest: the header text, kept bytes,
	 * quantiser records and their statistics' slots. */
	return sizeof(*p) + p->arena_bytes +
	       p->nextents * sizeof(struct castfs_extent);
}

void ns_ckpt_usage(struct castfs_ns *ns, size_t *entries, size_t *bytes)
{
	pthread_mutex_lock(&ns->ck_lock);
	*entries = ns->ck_entries;
	*bytes = atomic_load(&ns->ck_bytes);
	pthread_mutex_unlock(&ns->ck_lock);
}

static bool past_budget(const struct castfs_ns *ns)
{
	return atomic_load(&ns->ck_bytes) > ns->ck_budget;
}

bool ns_ckpt_over_budget(const struct castfs_ns *ns)
{
	size_t bytes = atomic_load(&ns->ck_bytes);

	return bytes > ns->ck_budget &&
	       bytes > atomic_load_explicit(&ns->ck_trim_floor,
					    memory_order_relaxed);
}

void ns_ckpt_lru_del_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	if (!ck->in_lru)
		return;
	if (ck->lru_prev)
		ck->lru_prev->lru_next = ck->lru_next;
	else
		ns->ck_lru = ck->lru_next;
	if (ck->lru_next)
		ck->lru_next->lru_prev = ck->lru_prev;
	else
		ns->ck_lru_tail = ck->lru_prev;
	ck->lru_prev = ck->lru_next = NULL;
	ck->in_lru = false;
	ns->ck_entries--;
	atomic_fetch_sub(&ns->ck_bytes, ck->bytes);
}

/* Caller holds ck_lock; @ck is not in the list. */
static void lru_push_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	ck->lru_prev = NULL;
	ck->lru_next = ns->ck_lru;
	if (ns->ck_lru)
		ns->ck_lru->lru_prev = ck;
	else
		ns->ck_lru_tail = ck;
	ns->ck_lru = ck;
	ck->in_lru = true;
	ns->ck_entries++;
	atomic_fetch_add(&ns->ck_bytes, ck->bytes);
}

void ns_ckpt_lru_add_locked(struct castfs_ns *ns, struct ns_ckpt *ck,
			    size_t bytes)
{
	ck->bytes += bytes;
	ck->base_bytes = bytes;
	lru_push_locked(ns, ck);
}

void ns_ckpt_lru_touch_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	if (!ck->in_lru || ns->ck_lru == ck)
		return;
	ns_ckpt_lru_del_locked(ns, ck);
	lru_push_locked(ns, ck);
}

/* The length of the name @ck's source is shown as: a pack's path
 * without its ".zst" / ".zstg", which the kernel's nodes carry. */
static size_t shown_len(const struct ns_ckpt *ck)
{
	return strlen(ck->path) - ns_packed_ext_len(ck->path);
}

/* Whether a node the kernel holds shows @ck's source. */
static bool ck_live(const struct castfs_ns *ns, const struct ns_ckpt *ck)
{
	return ns_node_path_live(ns, ck->path, shown_len(ck));
}

/* Caller holds ck_lock. Whether @ck may go: valid, parsed, held by the
 * table alone (a reference is taken from no holder only under ck_lock, so
 * none can appear while it is held) and by no node the kernel holds (the
 * next request would parse it again at once). */
static bool evictable_locked(const struct castfs_ns *ns,
			     const struct ns_ckpt *ck)
{
	return ck->in_lru && !ck->loading && atomic_load(&ck->refs) == 1 &&
	       !ck_live(ns, ck);
}

/* Caller holds ck_lock. Whether @ck may give back its plans and what
 * the levels above keep with them, keeping its parsed header: as
 * evictable_locked() but for a node the kernel holds, which keeps the
 * entry (`ls -l` of a folder of big checkpoints holds every one for the
 * kernel's entry timeout: their plans, one per view, grew the daemon
 * without bound). Only plans worth a trim's walk, a TRIM_SLACK-th of the
 * budget: small ones would be built again by every request that meets
 * them, each build's charge starting another walk of held entries
 * (test_ns_bounds, "held cache not walked per request"). */
static bool plans_droppable_locked(const struct castfs_ns *ns,
				   const struct ns_ckpt *ck)
{
	return ck->in_lru && !ck->loading && atomic_load(&ck->refs) == 1 &&
	       ck->bytes > ck->base_bytes &&
	       ck->bytes - ck->base_bytes >= ns->ck_budget / TRIM_SLACK;
}

/*
 * Caller holds ck_lock and plans_droppable_locked(@ck). Free its plans
 * and its slots' contents (they borrow the plans), as ck_free() does,
 * and charge it its header alone. No one else holds them: a reference is
 * only taken under ck_lock, and without one nothing reads the plans or
 * holds ck->lock (the trylock is a guard). Returns the bytes given back.
 */
static size_t drop_plans_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	size_t freed;

	if (pthread_mutex_trylock(&ck->lock))
		return 0;
	ns_ckpt_free_plans(ck, ck->nviews);
	pthread_mutex_unlock(&ck->lock);
	freed = ck->bytes - ck->base_bytes;
	ck->bytes = ck->base_bytes;
	atomic_fetch_sub(&ns->ck_bytes, freed);
	return freed;
}

/* What an evicted entry knew about its views that cannot be built. */
struct ns_ckfail {
	struct ns_ckfail *next;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime;
	int plan_err[]; /* nviews */
};

static size_t fail_bucket(dev_t dev, ino_t ino)
{
	uint64_t h = (uint64_t)ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)dev;

	return (size_t)(h >> 20) % NS_HASH_BUCKETS;
}

static bool has_fails(const struct ns_ckpt *ck)
{
	for (size_t i = 0; i < ck->nviews; i++) {
		if (ck->plan_err[i])
			return true;
	}
	return false;
}

void ns_ckpt_fails_fini(struct castfs_ns *ns)
{
	for (size_t i = 0; i < NS_HASH_BUCKETS; i++) {
		while (ns->ckfails[i]) {
			struct ns_ckfail *f = ns->ckfails[i];

			ns->ckfails[i] = f->next;
			free(f);
		}
	}
	ns->nckfails = 0;
}

/* Caller holds ck_lock. Remember @ck's failed views (best effort: on
 * -ENOMEM they are found again by the next build). Identities that
 * changed are never asked for again, hence the bound. */
static void fails_keep_locked(struct castfs_ns *ns, const struct ns_ckpt *ck)
{
	size_t b = fail_bucket(ck->dev, ck->ino);
	struct ns_ckfail *f;

	if (!has_fails(ck))
		return;
	if (ns->nckfails >= NS_CKFAIL_MAX)
		ns_ckpt_fails_fini(ns);
	f = malloc(sizeof(*f) + ck->nviews * sizeof(int));
	if (!f)
		return;
	f->dev = ck->dev;
	f->ino = ck->ino;
	f->size = ck->size;
	f->mtime = ck->mtime;
	f->ctime = ck->ctime;
	memcpy(f->plan_err, ck->plan_err, ck->nviews * sizeof(int));
	f->next = ns->ckfails[b];
	ns->ckfails[b] = f;
	ns->nckfails++;
}

void ns_ckpt_fails_restore_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct ns_ckfail **pp = &ns->ckfails[fail_bucket(ck->dev, ck->ino)];
	struct ns_ckfail *f;

	for (; (f = *pp); pp = &f->next) {
		if (f->dev == ck->dev && f->ino == ck->ino &&
		    f->size == ck->size &&
		    f->mtime.tv_sec == ck->mtime.tv_sec &&
		    f->mtime.tv_nsec == ck->mtime.tv_nsec &&
		    f->ctime.tv_sec == ck->ctime.tv_sec &&
		    f->ctime.tv_nsec == ck->ctime.tv_nsec) {
			memcpy(ck->plan_err, f->plan_err,
			       ck->nviews * sizeof(int));
			*pp = f->next;
			ns->nckfails--;
			free(f);
			return;
		}
	}
}

/* Caller holds ck_lock. Take @ck out of the table onto @dead (chained
 * through hnext, which no longer means anything for it). */
static void evict_locked(struct castfs_ns *ns, struct ns_ckpt *ck,
			 struct ns_ckpt **dead, size_t *freed)
{
	*freed += ck->bytes;
	fails_keep_locked(ns, ck);
	ns_ckpt_unlink_locked(ns, ck);
	ck->hnext = *dead;
	*dead = ck;
}

/* Free what was evicted, outside the lock (a big header's free takes a
 * while), and hand the pages back: glibc keeps freed heap otherwise. */
static void free_dead(struct castfs_ns *ns, struct ns_ckpt *dead, size_t freed)
{
	while (dead) {
		struct ns_ckpt *next = dead->hnext;

		ns_ckpt_unref(dead); /* the table's reference: the last */
		dead = next;
	}
	(void)ns;
	if (freed >= TRIM_MIN_BYTES)
		malloc_trim(0);
}

/* Caller holds ck_lock. After a pass of @seen entries: one that looked
 * at its whole bound and still left the cache over its budget found the
 * cold end held (nodes the kernel keeps, open files), and the next put
 * would find the same; trims wait until the cache grows by TRIM_SLACK
 * more of its budget, so a listing of 100,000 held checkpoints does not
 * walk 64 entries per request. */
static void trim_backoff_locked(struct castfs_ns *ns, size_t seen)
{
	size_t floor = 0;

	if (seen > TRIM_SCAN && past_budget(ns))
		floor = atomic_load(&ns->ck_bytes) + ns->ck_budget / TRIM_SLACK;
	atomic_store_explicit(&ns->ck_trim_floor, floor, memory_order_relaxed);
}

void ns_ckpt_trim(struct castfs_ns *ns)
{
	struct ns_ckpt *dead = NULL, *ck;
	size_t freed = 0, seen = 0;

	pthread_mutex_lock(&ns->ck_lock);
	/* The most recently used entry stays whatever its size: a file whose
	 * header alone passes the budget is kept until the next one comes or
	 * the kernel forgets it, not parsed again by every listing. An entry
	 * in use goes to the hot end, so that the next trim finds the unused
	 * ones first; a pass is bounded (TRIM_SCAN) because a cache whose
	 * entries are all in use may stay over its budget, and one that
	 * finds no room holds the next ones off (trim_backoff_locked). */
	while ((ck = ns->ck_lru_tail) && ck != ns->ck_lru && past_budget(ns) &&
	       seen++ < TRIM_SCAN) {
		if (evictable_locked(ns, ck)) {
			evict_locked(ns, ck, &dead, &freed);
			continue;
		}
		if (plans_droppable_locked(ns, ck))
			freed += drop_plans_locked(ns, ck);
		ns_ckpt_lru_touch_locked(ns, ck);
	}
	castfs_stats_count(ns->stats, CASTFS_SCTR_CACHE_TRIM_SCANNED,
			   seen > TRIM_SCAN ? TRIM_SCAN : seen);
	trim_backoff_locked(ns, seen);
	pthread_mutex_unlock(&ns->ck_lock);
	free_dead(ns, dead, freed);
}

/* Caller holds ck_lock. Evict @ck, an entry of a source path the kernel
 * just forgot, if nothing uses it; else, when only references keep it (no
 * node shows the path again), leave its eviction to the last of them. A
 * file's RELEASE is sent in the background after its node lets go, and
 * FORGETs are read before other requests: the forget often comes first. */
static void idle_one_locked(struct castfs_ns *ns, struct ns_ckpt *ck,
			    struct ns_ckpt **dead, size_t *freed)
{
	if (evictable_locked(ns, ck))
		evict_locked(ns, ck, dead, freed);
	else if (ck->in_lru && !ck_live(ns, ck))
		ck->idle_wanted = true;
}

void ns_ckpt_put_last(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct ns_ckpt *dead = NULL;
	size_t freed = 0;
	bool sole;

	pthread_mutex_lock(&ns->ck_lock);
	/* Alone, out of the table: no one can take a reference (they are
	 * taken from no holder only under this lock), so it is freed after
	 * the unlock. Else the drop is made here, where the forget marks,
	 * and checked after it: puts lock-free never leave fewer than two,
	 * so whoever leaves the table's alone sees the mark. */
	sole = atomic_load(&ck->refs) == 1;
	if (!sole)
		atomic_fetch_sub(&ck->refs, 1);
	if (!sole && ck->idle_wanted) {
		if (evictable_locked(ns, ck))
			evict_locked(ns, ck, &dead, &freed);
		else if (!ck->in_lru || ck_live(ns, ck))
			ck->idle_wanted = false; /* shown again, or gone */
	}
	pthread_mutex_unlock(&ns->ck_lock);
	if (sole)
		ns_ckpt_unref(ck);
	free_dead(ns, dead, freed);
}

/* Caller holds ck_lock. The entries of the packs shown as @path
 * (X.safetensors.zst, .zstg: ns_pack_src.c), whose own paths the kernel's
 * nodes never carry (a bug hunt: their seek tables were never given back). */
static void idle_packs_locked(struct castfs_ns *ns, const char *path,
			      struct ns_ckpt **dead, size_t *freed)
{
	for (size_t i = 0; i < NS_PACK_EXTS; i++) {
		struct ns_ckpt *ck, *next;
		char *p;

		if (ns_packed_path(path, i, &p))
			return; /* not a checkpoint's name, or -ENOMEM */
		for (ck = ns->ckpaths[ns_ckpt_path_bucket(ns, p)]; ck;
		     ck = next) {
			next = ck->pnext;
			if (strcmp(ck->path, p) == 0)
				idle_one_locked(ns, ck, dead, freed);
		}
		free(p);
	}
}

void ns_ckpt_idle_path(struct castfs_ns *ns, const char *path)
{
	struct ns_ckpt *dead = NULL, *ck, *next;
	size_t freed = 0;

	pthread_mutex_lock(&ns->ck_lock);
	/* The path chain is short; a lookup may have made the path live
	 * again since the forget, and then the entry stays. */
	for (ck = ns->ckpaths[ns_ckpt_path_bucket(ns, path)]; ck; ck = next) {
		next = ck->pnext;
		if (strcmp(ck->path, path) == 0)
			idle_one_locked(ns, ck, &dead, &freed);
	}
	idle_packs_locked(ns, path, &dead, &freed);
	pthread_mutex_unlock(&ns->ck_lock);
	free_dead(ns, dead, freed);
}

void ns_ckpt_charge(struct castfs_ns *ns, struct ns_ckpt *ck, size_t bytes)
{
	pthread_mutex_lock(&ns->ck_lock);
	ck->bytes += bytes;
	if (ck->in_lru)
		atomic_fetch_add(&ns->ck_bytes, bytes);
	pthread_mutex_unlock(&ns->ck_lock);
	if (ns_ckpt_over_budget(ns))
		ns_ckpt_trim(ns);
}
