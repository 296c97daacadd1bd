/* SPDX-License-Identifier: MIT */
/*
 * The decoded-frame cache (LRU, bounded in decoded bytes) and the pool of
 * decoder contexts: at most one context per thread decoding at a time,
 * reused rather than created per read (creating one costs 10-20 us). A
 * frame being decoded is in the cache already, so that threads needing it
 * (read-ahead sends neighbouring requests at once) wait for it rather than
 * decode it again.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "common/fault.h"
#include "source/zst_internal.h"

#define ZC_BUCKETS 1024u

/* Bytes of frames being decoded into the cache at once (decoded and
 * compressed), beyond the cache's own size (they are charged to it when
 * their decodes end): two of the largest frames. Each decode holds both
 * until it ends, so without a bound the daemon grew by threads x 128 MiB
 * (a bug hunt: 715 MB with 16 threads and zcache_mb=16, from a 50 KB pack
 * of 64 MiB frames). Not scaled with the cache: with zcache_mb=16384 that
 * would let the decodes under way double the daemon's bound. */
#define ZC_INFLIGHT_MAX (256u << 20)

/*
 * Freed entries of at most ZC_SPARE_MAX bytes kept for the next frame
 * cut by a request (ZC_SPARES of them, outside the capacity): a fresh
 * allocation of a frame's size came back from the kernel a zeroed page
 * at a time (glibc gives a thread arena's freed top back), and those
 * faults cost the daemon 3 % of a grouped pack's sequential read, as
 * much as un-grouping the frame into it.
 */
#define ZC_SPARES 4u
#define ZC_SPARE_MAX (1u << 20)

struct zst_frame {
	uint64_t id;
	size_t frame;
	size_t size;
	size_t cap; /* bytes allocated for @data: a spare's are reused */
	size_t lo, hi; /* it handed out bytes [lo, hi) and no others */
	bool scattered; /* it handed out bytes outside one such run */
	unsigned refs; /* readers copying out of it, plus one while cached */
	int state; /* 0 being decoded, 1 ready, or the decode's -errno */
	bool cached; /* in the table and the LRU list */
	struct zst_frame *hnext; /* hash chain */
	struct zst_frame *prev, *next; /* LRU list, most recent first */
	uint8_t data[];
};

struct castfs_zcache {
	pthread_mutex_t lock;
	size_t capacity;
	size_t used; /* bytes of the cached frames that are decoded */
	struct zst_frame *buckets[ZC_BUCKETS];
	struct zst_frame *head, *tail;
	pthread_cond_t decoded; /* a frame left state 0 */
	pthread_cond_t room; /* inflight went down */
	size_t inflight; /* bytes of frame_get() decodes under way */
	struct zst_dctx *pool; /* idle decoder contexts */
	struct zst_frame *spare[ZC_SPARES]; /* freed entries, for reuse */
	unsigned nspare;
	uint64_t next_id;
	_Atomic uint64_t hits, misses, bytes, errors;
};

int castfs_zcache_new(size_t capacity, struct castfs_zcache **out)
{
	struct castfs_zcache *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->decoded, NULL);
	pthread_cond_init(&c->room, NULL);
	c->capacity = capacity;
	*out = c;
	return 0;
}

void castfs_zcache_free(struct castfs_zcache *c)
{
	if (!c)
		return;
	for (struct zst_frame *f = c->head, *n; f; f = n) {
		n = f->next;
		free(f);
	}
	for (struct zst_dctx *p = c->pool, *n; p; p = n) {
		n = p->next;
		zst_dctx_free(p);
	}
	for (unsigned i = 0; i < c->nspare; i++)
		free(c->spare[i]);
	pthread_cond_destroy(&c->decoded);
	pthread_cond_destroy(&c->room);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

void castfs_zcache_stats_get(struct castfs_zcache *c,
			     struct castfs_zcache_stats *out)
{
	out->hits = atomic_load(&c->hits);
	out->misses = atomic_load(&c->misses);
	out->bytes_decoded = atomic_load(&c->bytes);
	out->errors = atomic_load(&c->errors);
	pthread_mutex_lock(&c->lock);
	out->cached_bytes = c->used;
	pthread_mutex_unlock(&c->lock);
}

uint64_t zcache_next_id(struct castfs_zcache *c)
{
	uint64_t id;

	pthread_mutex_lock(&c->lock);
	id = ++c->next_id;
	pthread_mutex_unlock(&c->lock);
	return id;
}

static struct zst_frame **zc_slot(struct castfs_zcache *c, uint64_t id,
				  size_t frame)
{
	uint64_t h = (id * 0x9e3779b97f4a7c15ull) ^ (uint64_t)frame;

	return &c->buckets[(h ^ (h >> 29)) % ZC_BUCKETS];
}

static void lru_unlink(struct castfs_zcache *c, struct zst_frame *f)
{
	*(f->prev ? &f->prev->next : &c->head) = f->next;
	*(f->next ? &f->next->prev : &c->tail) = f->prev;
}

static void lru_push(struct castfs_zcache *c, struct zst_frame *f)
{
	f->prev = NULL;
	f->next = c->head;
	*(c->head ? &c->head->prev : &c->tail) = f;
	c->head = f;
}

/* Drop a reference to @f: unreferenced, it is kept as a spare or freed.
 * Under the lock. */
static void zc_unref_locked(struct castfs_zcache *c, struct zst_frame *f)
{
	if (--f->refs)
		return;
	if (f->cap <= ZC_SPARE_MAX && c->nspare < ZC_SPARES)
		c->spare[c->nspare++] = f;
	else
		free(f);
}

/* Drop @f from the cache; it is freed once no reader copies from it. */
static void zc_drop(struct castfs_zcache *c, struct zst_frame *f)
{
	struct zst_frame **pp = zc_slot(c, f->id, f->frame);

	while (*pp != f)
		pp = &(*pp)->hnext;
	*pp = f->hnext;
	lru_unlink(c, f);
	if (f->state == 1)
		c->used -= f->size;
	f->cached = false;
	zc_unref_locked(c, f);
}

/* The cached frame @frame of @id (decoded or being decoded), or NULL;
 * neither referenced nor moved. Under the lock. */
static struct zst_frame *zc_match_locked(struct castfs_zcache *c, uint64_t id,
					 size_t frame)
{
	struct zst_frame *f = *zc_slot(c, id, frame);

	while (f && !(f->id == id && f->frame == frame))
		f = f->hnext;
	return f;
}

/* A referenced cached frame, used last now, or NULL. Under the lock. */
static struct zst_frame *zc_find(struct castfs_zcache *c, uint64_t id,
				 size_t frame)
{
	struct zst_frame *f = zc_match_locked(c, id, frame);

	if (f) {
		lru_unlink(c, f);
		lru_push(c, f);
		f->refs++;
	}
	return f;
}

/* Whether frame @i of @id is in the cache (decoded or being decoded). */
static bool zc_has(struct castfs_zcache *c, uint64_t id, size_t frame)
{
	bool has;

	pthread_mutex_lock(&c->lock);
	has = zc_match_locked(c, id, frame) != NULL;
	pthread_mutex_unlock(&c->lock);
	return has;
}

/* Insert @f (held by the caller, being decoded). Under the lock.
 * Capacity 0 keeps nothing. */
static void zc_insert_locked(struct castfs_zcache *c, struct zst_frame *f)
{
	struct zst_frame **slot = zc_slot(c, f->id, f->frame);

	if (c->capacity == 0)
		return; /* decoded for this read only */
	f->hnext = *slot;
	*slot = f;
	lru_push(c, f);
	f->cached = true;
	f->refs++;
}

/*
 * @f (cached) is decoded now: make room for it among the decoded frames,
 * dropping others least recently used first. Under the lock.
 *
 * A frame is charged to the capacity once decoded, not when its decode
 * starts: frames being decoded are bounded by the in-flight limit
 * instead, and dropping one frees nothing (its decoder holds it) but
 * makes the next request for it decode it again. Making room at the
 * start dropped the frame the requests still in flight needed: at the
 * boundary of two frames larger than the cache (read-ahead sends their
 * requests at once), the next frame's start dropped the previous one; a
 * late request for the previous one's end decoded it again and dropped
 * the next one, being decoded, and the next one's other requests
 * decoded that again: each frame twice (seen in CI).
 *
 * A frame larger than the whole cache is kept alone rather than not at
 * all: each read request that cuts it would decode it again otherwise, 33
 * times the bytes for a sequential read of a pack written with 32 MiB
 * frames (castfs pack --frame-size 32M, or another seekable writer)
 * through 1 MiB requests. The decoded frames then take one frame, at most
 * CASTFS_ZST_MAX_FRAME, over the capacity.
 */
static void zc_charge_locked(struct castfs_zcache *c, struct zst_frame *f)
{
	struct zst_frame *v, *prev;

	/* Used last now: a slow decode must not end at the tail, the first
	 * to go, while read-ahead's later requests for it are on their way. */
	lru_unlink(c, f);
	lru_push(c, f);
	for (v = c->tail; v && c->used + f->size > c->capacity; v = prev) {
		prev = v->prev;
		if (v != f && v->state == 1)
			zc_drop(c, v);
	}
	c->used += f->size;
}

static void zc_release(struct castfs_zcache *c, struct zst_frame *f)
{
	pthread_mutex_lock(&c->lock);
	zc_unref_locked(c, f);
	pthread_mutex_unlock(&c->lock);
}

/* Note that @f handed out bytes [@in, @in + @n): whether it has now
 * handed out each of its bytes once, in one run. Under the lock. */
static bool zc_served_locked(struct zst_frame *f, size_t in, size_t n)
{
	if (f->lo == f->hi) {
		f->lo = in;
		f->hi = in + n;
	} else if (in + n == f->lo) {
		f->lo = in;
	} else if (in == f->hi) {
		f->hi = in + n;
	} else {
		f->scattered = true;
	}
	return !f->scattered && f->lo == 0 && f->hi == f->size;
}

/*
 * zc_release() of @f after it handed out bytes [@in, @in + @n). A cached
 * frame that has handed out each of its bytes once, in one run, is
 * dropped (a spare then): a sequential reader cuts each frame once, the
 * end of one request and the start of the next, so every request left a
 * frame in the cache that no read wanted again, and the cache grew to
 * its bound on each new mount, a fresh page faulted in and zeroed per
 * 4 KiB (6,000 faults, a tenth of the daemon's first read of a grouped
 * pack's fp8 view). The kernel's page cache keeps what was made of those
 * bytes. A frame read any other way (twice, or in pieces that leave a
 * gap) stays, least recently used last.
 */
static void zc_release_served(struct castfs_zcache *c, struct zst_frame *f,
			      size_t in, size_t n)
{
	pthread_mutex_lock(&c->lock);
	if (zc_served_locked(f, in, n) && f->cached && f->state == 1)
		zc_drop(c, f);
	zc_unref_locked(c, f);
	pthread_mutex_unlock(&c->lock);
}

static struct zst_dctx *pool_take(struct castfs_zcache *c)
{
	struct zst_dctx *dc;

	pthread_mutex_lock(&c->lock);
	dc = c->pool;
	if (dc)
		c->pool = dc->next;
	pthread_mutex_unlock(&c->lock);
	return dc ? dc : zst_dctx_new();
}

static void pool_give(struct castfs_zcache *c, struct zst_dctx *dc)
{
	/* An idle context keeps buffers for the usual frames only: those of
	 * a pack with larger ones would otherwise stay with every context
	 * that once read it (tens of MiB each). */
	zst_dctx_trim(dc, ZST_POOL_KEEP);
	pthread_mutex_lock(&c->lock);
	dc->next = c->pool;
	c->pool = dc;
	pthread_mutex_unlock(&c->lock);
}

/* Frame @i's transform: NONE for every frame of a standard pack. */
static enum castfs_zst_transform frame_xform(const struct castfs_zst_index *ix,
					     size_t i)
{
	return ix->xform ? (enum castfs_zst_transform)ix->xform[i] :
			   CASTFS_ZST_NONE;
}

/*
 * Decode grouped frame @i (@csize bytes at @src) into its planes, pointed
 * at by @plane: into @planes (its decoded size), except a raw plane, which
 * is read where it lies in @src (no copy of it). Not verified: see
 * frame_sum_ok().
 */
static int frame_planes_at(const struct castfs_zst_index *ix, size_t i,
			   struct zst_dctx *dc, const void *src, size_t csize,
			   uint8_t *planes, const uint8_t **plane)
{
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);
	enum castfs_zst_transform t = frame_xform(ix, i);

	return zst_xform_tiered(t) ?
		       zst_tier_decode(planes, dsize, src, csize, t, plane) :
		       zst_decode_planes(dc, planes, dsize, src, csize,
					 zst_group_width(t), plane);
}

/* frame_planes_at() into @dc's second buffer: valid until the next use
 * of @dc. */
static int frame_planes_raw(const struct castfs_zst_index *ix, size_t i,
			    struct zst_dctx *dc, const void *src, size_t csize,
			    const uint8_t **plane)
{
	void *planes =
		zst_dctx_ubuf(dc, (size_t)(ix->doff[i + 1] - ix->doff[i]));

	return planes ? frame_planes_at(ix, i, dc, src, csize, planes, plane) :
			-ENOMEM;
}

/* Whether grouped frame @i, decoded from @src into @plane, matches its
 * checksum in the seek table (true without one). */
static bool frame_sum_ok(const struct castfs_zst_index *ix, size_t i,
			 const void *src, size_t csize,
			 const uint8_t *const *plane)
{
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);

	return !ix->sum || zst_frame_sum(frame_xform(ix, i), src, csize, plane,
					 dsize) == ix->sum[i];
}

/* frame_planes_raw(), verified. */
static int frame_planes_dc(const struct castfs_zst_index *ix, size_t i,
			   struct zst_dctx *dc, const void *src, size_t csize,
			   const uint8_t **plane)
{
	int rc = frame_planes_raw(ix, i, dc, src, csize, plane);

	if (!rc && !frame_sum_ok(ix, i, src, csize, plane))
		rc = -EIO;
	return rc;
}

/* Decode and verify grouped frame @i and un-group it into @dst. */
static int frame_ungroup_dc(const struct castfs_zst_index *ix, size_t i,
			    struct zst_dctx *dc, const void *src, size_t csize,
			    void *dst)
{
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);
	const uint8_t *plane[ZST_MAX_PLANES];
	int rc = frame_planes_dc(ix, i, dc, src, csize, plane);

	if (!rc)
		zst_ungroup_planes(dst, plane, dsize, frame_xform(ix, i));
	return rc;
}

/*
 * Decode and verify grouped frame @i into @dst as a cache entry holds it:
 * its planes one after another, plane p at p x its size. Kept grouped, a
 * frame cut by a request is not un-grouped into memory to be read again
 * (6.5 % of a grouped fp16 pack's sequential fp8 view): a visitor that
 * takes planes casts from them as from a whole frame, and a copy
 * un-groups only the bytes it wants (entry_copy()). The raw planes the
 * decode left in @src are copied in.
 */
static int frame_store_dc(const struct castfs_zst_index *ix, size_t i,
			  struct zst_dctx *dc, const void *src, size_t csize,
			  uint8_t *dst)
{
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);
	unsigned w = zst_group_width(frame_xform(ix, i));
	const uint8_t *plane[ZST_MAX_PLANES];
	int rc = frame_planes_at(ix, i, dc, src, csize, dst, plane);

	if (!rc && !frame_sum_ok(ix, i, src, csize, plane))
		rc = -EIO;
	for (unsigned p = 0; !rc && p < w; p++)
		if (plane[p] != dst + p * (dsize / w))
			memcpy(dst + p * (dsize / w), plane[p], dsize / w);
	return rc;
}

/* Read frame @i's compressed bytes into @dc's input buffer, at *@src. */
static int frame_read_dc(const struct castfs_zst_index *ix,
			 const struct castfs_reader *raw, size_t i,
			 struct zst_dctx *dc, void **src)
{
	size_t csize = (size_t)(ix->coff[i + 1] - ix->coff[i]);

	*src = zst_dctx_buf(dc, csize);
	if (!*src)
		return -ENOMEM;
	return castfs_reader_read(raw, *src, csize, ix->coff[i]);
}

/*
 * Read, decode and verify frame @i of @ix into @dst (its decoded size): a
 * grouped one un-grouped, or, with @store, as a cache entry holds it
 * (frame_store_dc()).
 */
static int frame_decode_dc(const struct castfs_zst_index *ix,
			   const struct castfs_reader *raw, size_t i,
			   struct zst_dctx *dc, void *dst, bool store)
{
	size_t csize = (size_t)(ix->coff[i + 1] - ix->coff[i]);
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);
	void *src;
	int rc = frame_read_dc(ix, raw, i, dc, &src);

	if (rc)
		return rc;
	if (frame_xform(ix, i) != CASTFS_ZST_NONE && store)
		return frame_store_dc(ix, i, dc, src, csize, dst);
	if (frame_xform(ix, i) != CASTFS_ZST_NONE)
		return frame_ungroup_dc(ix, i, dc, src, csize, dst);
	rc = zst_decode_frame(dc, dst, dsize, src, csize);
	if (!rc && ix->sum && zst_checksum(dst, dsize) != ix->sum[i])
		rc = -EIO;
	return rc;
}

/* Count a decode of frame @i that returned @rc in the cache's stats. */
static void count_decode(const struct castfs_zst_index *ix, size_t i, int rc)
{
	struct castfs_zcache *c = ix->cache;

	atomic_fetch_add(&c->misses, 1);
	if (rc)
		atomic_fetch_add(&c->errors, 1);
	else
		atomic_fetch_add(&c->bytes,
				 (size_t)(ix->doff[i + 1] - ix->doff[i]));
}

/* frame_decode_dc() with a pooled context, counted in the cache's stats. */
static int frame_decode(const struct castfs_zst_index *ix,
			const struct castfs_reader *raw, size_t i, void *dst,
			bool store)
{
	struct castfs_zcache *c = ix->cache;
	struct zst_dctx *dc = pool_take(c);
	int rc = -ENOMEM;

	if (dc) {
		rc = frame_decode_dc(ix, raw, i, dc, dst, store);
		pool_give(c, dc);
	}
	count_decode(ix, i, rc);
	return rc;
}

/*
 * A grouped frame's compressed bytes at hand where they lie in a mapping
 * (run_piece()), and the context to decode them with: no read.
 */
struct zst_mapped {
	const void *src;
	struct zst_dctx *dc;
};

struct store_call {
	const struct castfs_zst_index *ix;
	size_t i;
	const struct zst_mapped *m;
	uint8_t *dst;
};

static int store_call_run(void *arg)
{
	const struct store_call *s = arg;
	size_t csize = (size_t)(s->ix->coff[s->i + 1] - s->ix->coff[s->i]);

	return frame_store_dc(s->ix, s->i, s->m->dc, s->m->src, csize, s->dst);
}

/*
 * frame_store_dc() of grouped frame @i from @m into @dst, counted in the
 * cache's stats, as frame_decode() reads and decodes. The decode has a
 * fault guard of its own: a page of the mapping that cannot be read
 * fails it with -EIO here, so that frame_get() drops the entry as after
 * any failed decode; the guard of the whole mapping would jump past that
 * and leave the entry "being decoded" for every other reader to wait on.
 */
static int frame_store_mapped(const struct castfs_zst_index *ix, size_t i,
			      const struct zst_mapped *m, uint8_t *dst)
{
	size_t csize = (size_t)(ix->coff[i + 1] - ix->coff[i]);
	struct store_call s = { .ix = ix, .i = i, .m = m, .dst = dst };
	int rc = castfs_fault_call(m->src, csize, store_call_run, &s);

	count_decode(ix, i, rc);
	return rc;
}

/*
 * The decoded size frame @i's own header gives, in *@size: the zstd
 * frame's content size, count x width for a tiered frame, 0 for another
 * skippable frame; -ENODATA when a zstd frame does not say, -EBADMSG when
 * its header is no frame header, or the read's error.
 */
static int frame_head_size(const struct castfs_zst_index *ix,
			   const struct castfs_reader *raw, size_t i,
			   uint64_t *size)
{
	size_t n = (size_t)CASTFS_MIN(ix->coff[i + 1] - ix->coff[i],
				      (uint64_t)ZST_FRAME_HEAD);
	enum castfs_zst_transform t = frame_xform(ix, i);
	uint8_t h[ZST_FRAME_HEAD];
	uint32_t magic;
	int rc = castfs_reader_read(raw, h, n, ix->coff[i]);

	if (rc)
		return rc;
	magic = castfs_load_le32(h); /* the table holds no frame under 8 */
	if (magic == ZST_TIER_MAGIC && zst_xform_tiered(t) && n >= 12) {
		*size = (uint64_t)castfs_load_le32(h + 8) * zst_group_width(t);
		return 0;
	}
	if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {
		*size = 0;
		return 0;
	}
	return zst_frame_content_size(h, n, size);
}

/*
 * A frame's place, once learnt, never changes: readers look it up without
 * the lock (an acquire load), so that the frames already placed are not
 * held up by a jump that walks the headers of many others under it.
 */
static uint8_t get_placed(const struct zst_prefix *p, size_t i)
{
	return __atomic_load_n(&p->placed[i], __ATOMIC_ACQUIRE);
}

/* Under @p->lock: frame @i's place, unless it is known already. */
static void set_placed(struct zst_prefix *p, size_t i, uint8_t place)
{
	if (!p->placed[i])
		__atomic_store_n(&p->placed[i], place, __ATOMIC_RELEASE);
}

/* Where frame @p->k lies by the true sizes before it. */
static uint8_t place_of(const struct castfs_zst_index *ix,
			const struct zst_prefix *p)
{
	return !p->lost && p->sum == ix->doff[p->k] ? ZST_PLACED :
						      ZST_MISPLACED;
}

/*
 * Learn frame @p->k's place and true size (its header's; a zstd frame
 * whose header does not say is decoded). A frame whose size stays unknown
 * (a corrupt header, a decode that fails) leaves the place of every frame
 * after it unknown: they fail too, since a lie in its table size would
 * shift them. Under @p->lock. Returns 0, or a read's error (then tried
 * again next time).
 */
static int prefix_step(const struct castfs_zst_index *ix,
		       const struct castfs_reader *raw, struct zst_prefix *p)
{
	size_t k = p->k;
	uint64_t want = ix->doff[k + 1] - ix->doff[k], got = want;
	int rc = frame_head_size(ix, raw, k, &got);
	void *tmp;

	if (rc == -ENODATA) {
		tmp = malloc(want ? (size_t)want : 1);
		rc = tmp ? frame_decode(ix, raw, k, tmp, false) : -ENOMEM;
		free(tmp);
		if (rc == -EIO)
			rc = -EBADMSG;
	}
	if (rc == -EBADMSG) {
		p->lost = true;
		rc = 0;
		got = want;
	}
	if (rc)
		return rc;
	set_placed(p, k, place_of(ix, p));
	p->sum += got;
	__atomic_store_n(&p->k, k + 1, __ATOMIC_RELAXED);
	return 0;
}

/*
 * Before frame @i is decoded: whether it lies where the table says, by
 * the true sizes of the frames before it. Each frame's decode checks its
 * own size, but a table whose sizes lie and still add up (one frame's too
 * big, a later one's too small) places every frame between the two at
 * the wrong offset, behind its own good checksum. Learnt once per pack in
 * file order: a sequential reader's decodes do it for nothing, a jump
 * reads the headers of the frames it skipped. Returns 0, or -EIO for a
 * frame out of place.
 */
static int prefix_check(const struct castfs_zst_index *ix,
			const struct castfs_reader *raw, size_t i)
{
	struct zst_prefix *p = ix->prefix;
	uint8_t placed = get_placed(p, i);
	int rc = 0;

	if (placed)
		return placed == ZST_PLACED ? 0 : -EIO;
	pthread_mutex_lock(&p->lock);
	while (!rc && p->k < i)
		rc = prefix_step(ix, raw, p);
	if (!rc && p->k == i)
		set_placed(p, i, place_of(ix, p));
	placed = p->placed[i];
	pthread_mutex_unlock(&p->lock);
	if (rc)
		return rc;
	return placed == ZST_PLACED ? 0 : -EIO;
}

/* Frame @i decoded to the table's size: its true size, learnt. */
static void prefix_decoded(const struct castfs_zst_index *ix, size_t i)
{
	struct zst_prefix *p = ix->prefix;

	/* k only grows, and is at least @i once @i was checked: past it,
	 * there is nothing to learn and no lock to take. */
	if (__atomic_load_n(&p->k, __ATOMIC_RELAXED) != i)
		return;
	pthread_mutex_lock(&p->lock);
	if (p->k == i) {
		p->sum += ix->doff[i + 1] - ix->doff[i];
		__atomic_store_n(&p->k, i + 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&p->lock);
}

/* frame_decode() of frame @i once it is known to lie in its place, or,
 * given @m, frame_store_mapped(). */
static int frame_decode_checked(const struct castfs_zst_index *ix,
				const struct castfs_reader *raw, size_t i,
				const struct zst_mapped *m, void *dst,
				bool store)
{
	int rc = prefix_check(ix, raw, i);

	if (rc)
		count_decode(ix, i, rc);
	else
		rc = m ? frame_store_mapped(ix, i, m, dst) :
			 frame_decode(ix, raw, i, dst, store);
	if (!rc)
		prefix_decoded(ix, i);
	return rc;
}

/*
 * Bytes [@in, @in + @n) of a grouped frame of transform @t whose planes
 * are @plane, un-grouped into @dst; an element the range cuts at either
 * end is un-grouped whole on the stack first.
 */
static void planes_copy(uint8_t *dst, const uint8_t *const *plane,
			enum castfs_zst_transform t, size_t in, size_t n)
{
	unsigned w = zst_group_width(t);
	size_t e = in / w, skip = in % w;

	while (n) {
		const uint8_t *pl[ZST_MAX_PLANES];
		uint8_t word[ZST_MAX_PLANES];
		size_t whole = skip ? 0 : n / w, m;

		for (unsigned k = 0; k < w; k++)
			pl[k] = plane[k] + e;
		if (whole) {
			zst_ungroup_planes(dst, pl, whole * w, t);
			m = whole * w;
			e += whole;
		} else {
			zst_ungroup_planes(word, pl, w, t);
			m = CASTFS_MIN(w - skip, n);
			memcpy(dst, word + skip, m);
			e++;
			skip = 0;
		}
		dst += m;
		n -= m;
	}
}

/*
 * Bytes [@in, @in + @n) of a grouped frame (transform @t, planes @plane)
 * handed to @fn un-grouped ZST_VISIT_CHUNK bytes at a time into @chunk:
 * the visitor reads each piece from the first-level cache instead of the
 * whole frame un-grouped into memory first.
 */
static int planes_visit_chunks(const uint8_t *const *plane,
			       enum castfs_zst_transform t, size_t in, size_t n,
			       uint8_t *chunk, castfs_visit_fn fn, void *arg)
{
	int rc = 0;

	for (size_t at = 0; at < n && !rc; at += ZST_VISIT_CHUNK) {
		size_t k = (size_t)CASTFS_MIN(n - at, ZST_VISIT_CHUNK);

		planes_copy(chunk, plane, t, in + at, k);
		rc = fn(arg, &(struct castfs_piece){ .bytes = chunk, .n = k });
	}
	return rc;
}

/* Whether a visitor taking @how takes the planes of frames of @t (bf16
 * ones as struct castfs_piece's @sm and @ex, others as its @planes). */
static bool visit_takes_planes(enum castfs_zst_transform t, unsigned how)
{
	if (zst_xform_bf16(t))
		return how & CASTFS_VISIT_BF16;
	if (zst_xform_f32(t))
		return how & CASTFS_VISIT_F32;
	return (t == CASTFS_ZST_PLANES2 || t == CASTFS_ZST_PLANES2_TIERED) &&
	       (how & CASTFS_VISIT_F16);
}

/* Whether bytes [@in, @in + @n) of a grouped frame of @t go to a visitor
 * taking @how as planes: the kind it takes, whole elements. */
static bool hand_as_planes(enum castfs_zst_transform t, unsigned how, size_t in,
			   size_t n)
{
	return visit_takes_planes(t, how) && (in | n) % zst_group_width(t) == 0;
}

/*
 * Hand bytes [@in, @in + @n) of a grouped frame of @t, whose planes are
 * @plane, to @fn: as planes (from element @in / width) where
 * hand_as_planes() (the un-grouping left to the visitor, a fused cast),
 * else un-grouped a piece at a time through @chunk (unused then).
 */
static int planes_hand(enum castfs_zst_transform t, const uint8_t *const *plane,
		       size_t in, size_t n, uint8_t *chunk, unsigned how,
		       castfs_visit_fn fn, void *arg)
{
	unsigned w = zst_group_width(t);
	const uint8_t *pl[ZST_MAX_PLANES];
	struct castfs_piece p = { .n = n };

	if (!hand_as_planes(t, how, in, n))
		return planes_visit_chunks(plane, t, in, n, chunk, fn, arg);
	for (unsigned k = 0; k < w; k++)
		pl[k] = plane[k] + in / w;
	if (zst_xform_bf16(t)) {
		p.sm = pl[0];
		p.ex = pl[1];
	} else {
		p.planes = pl;
	}
	return fn(arg, &p);
}

/* Hand decoded grouped frame @i of @ix (@plane, in @dc) whole to @fn. */
static int frame_hand(const struct castfs_zst_index *ix, size_t i,
		      const uint8_t *const *plane, struct zst_dctx *dc,
		      unsigned how, castfs_visit_fn fn, void *arg)
{
	return planes_hand(frame_xform(ix, i), plane, 0,
			   (size_t)(ix->doff[i + 1] - ix->doff[i]), dc->chunk,
			   how, fn, arg);
}

/*
 * Read, decode and verify grouped frame @i of @ix and hand it to @fn
 * (frame_hand()). The context, whose buffers the planes are, is held
 * until @fn returns.
 */
static int frame_visit_planes(const struct castfs_zst_index *ix,
			      const struct castfs_reader *raw, size_t i,
			      unsigned how, castfs_visit_fn fn, void *arg)
{
	size_t csize = (size_t)(ix->coff[i + 1] - ix->coff[i]);
	struct zst_dctx *dc = pool_take(ix->cache);
	const uint8_t *plane[ZST_MAX_PLANES];
	void *src = NULL;
	int rc = dc ? prefix_check(ix, raw, i) : -ENOMEM;

	if (!rc)
		rc = frame_read_dc(ix, raw, i, dc, &src);
	if (!rc)
		rc = frame_planes_dc(ix, i, dc, src, csize, plane);
	count_decode(ix, i, rc);
	if (!rc)
		prefix_decoded(ix, i);
	if (!rc)
		rc = frame_hand(ix, i, plane, dc, how, fn, arg);
	if (dc)
		pool_give(ix->cache, dc);
	return rc;
}

/* Frame @i of @id if cached and decoded (referenced, a hit), else NULL. */
static struct zst_frame *zc_lookup(struct castfs_zcache *c, uint64_t id,
				   size_t frame)
{
	struct zst_frame *f;

	pthread_mutex_lock(&c->lock);
	f = zc_find(c, id, frame);
	if (f && f->state != 1) {
		f->refs--; /* still being decoded: not worth waiting for */
		f = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (f)
		atomic_fetch_add(&c->hits, 1);
	return f;
}

/* Wait until @f (referenced) is decoded. Under the lock. */
static int zc_wait_locked(struct castfs_zcache *c, struct zst_frame *f)
{
	while (f->state == 0)
		pthread_cond_wait(&c->decoded, &c->lock);
	return f->state < 0 ? f->state : 0;
}

/* An entry for @size bytes: a spare large enough, else a new one.
 * Under the lock. */
static struct zst_frame *zc_alloc_locked(struct castfs_zcache *c, size_t size)
{
	struct zst_frame *f;

	for (unsigned k = 0; k < c->nspare; k++) {
		if (c->spare[k]->cap >= size) {
			f = c->spare[k];
			c->spare[k] = c->spare[--c->nspare];
			return f;
		}
	}
	f = malloc(sizeof(*f) + size);
	if (f)
		f->cap = size;
	return f;
}

/* A new frame @i of @ix in state "being decoded", held by the caller and
 * cached if it fits; NULL on -ENOMEM. Under the lock. */
static struct zst_frame *zc_pending_locked(const struct castfs_zst_index *ix,
					   size_t i)
{
	size_t dsize = (size_t)(ix->doff[i + 1] - ix->doff[i]);
	struct zst_frame *f = zc_alloc_locked(ix->cache, dsize);
	size_t cap;

	if (!f)
		return NULL;
	cap = f->cap;
	*f = (struct zst_frame){
		.id = ix->id, .frame = i, .size = dsize, .cap = cap, .refs = 1
	};
	zc_insert_locked(ix->cache, f);
	return f;
}

/* Frame @i of @ix, referenced: cached, being decoded by another thread
 * (then waited for), or decoded now: read, or from @m where given. */
static int frame_get(const struct castfs_zst_index *ix,
		     const struct castfs_reader *raw, size_t i,
		     const struct zst_mapped *m, struct zst_frame **out)
{
	struct castfs_zcache *c = ix->cache;
	size_t cost = (size_t)(ix->doff[i + 1] - ix->doff[i] + ix->coff[i + 1] -
			       ix->coff[i]);
	size_t cap = ZC_INFLIGHT_MAX;
	struct zst_frame *f;
	int rc;

	pthread_mutex_lock(&c->lock);
	/* Wait for room among the decodes under way (one always has it),
	 * or for another thread to start this frame meanwhile. */
	while (!(f = zc_find(c, ix->id, i)) && c->inflight &&
	       c->inflight + cost > cap)
		pthread_cond_wait(&c->room, &c->lock);
	if (f) {
		rc = zc_wait_locked(c, f);
		pthread_mutex_unlock(&c->lock);
		if (!rc)
			atomic_fetch_add(&c->hits, 1);
		goto out;
	}
	f = zc_pending_locked(ix, i);
	if (f)
		c->inflight += cost;
	pthread_mutex_unlock(&c->lock);
	if (!f)
		return -ENOMEM;
	rc = frame_decode_checked(ix, raw, i, m, f->data, true);
	pthread_mutex_lock(&c->lock);
	c->inflight -= cost;
	pthread_cond_broadcast(&c->room);
	f->state = rc ? rc : 1;
	if (rc && f->cached)
		zc_drop(c, f); /* the next read tries again */
	else if (f->cached)
		zc_charge_locked(c, f);
	pthread_cond_broadcast(&c->decoded);
	pthread_mutex_unlock(&c->lock);
out:
	if (rc) {
		zc_release(c, f);
		return rc;
	}
	*out = f;
	return 0;
}

/* The frame holding decoded offset @off (< the total size): bisection. */
static size_t frame_of(const struct castfs_zst_index *ix, uint64_t off)
{
	size_t lo = 0, hi = ix->nframes; /* doff[lo] <= off < doff[hi] */

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (ix->doff[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The planes of grouped frame @i held by cache entry @f (frame_store_dc()). */
static void entry_planes(const struct castfs_zst_index *ix, size_t i,
			 const struct zst_frame *f, const uint8_t **plane)
{
	unsigned w = zst_group_width(frame_xform(ix, i));

	for (unsigned p = 0; p < w; p++)
		plane[p] = f->data + p * (f->size / w);
}

/* Copy bytes [@in, @in + @n) of frame @i, cached in @f, to @dst. */
static void entry_copy(const struct castfs_zst_index *ix, size_t i,
		       const struct zst_frame *f, void *dst, size_t in,
		       size_t n)
{
	const uint8_t *plane[ZST_MAX_PLANES];

	if (frame_xform(ix, i) == CASTFS_ZST_NONE) {
		memcpy(dst, f->data + in, n);
		return;
	}
	entry_planes(ix, i, f, plane);
	planes_copy(dst, plane, frame_xform(ix, i), in, n);
}

/* Copy @n bytes at @in of frame @i to @dst, decoding whole frames direct. */
static int frame_copy(const struct castfs_zst_index *ix,
		      const struct castfs_reader *raw, size_t i, void *dst,
		      size_t in, size_t n)
{
	struct zst_frame *f;
	int rc;

	/* A whole frame not cached decodes straight into @dst: sequential
	 * readers do not churn the cache. */
	if (in == 0 && n == ix->doff[i + 1] - ix->doff[i]) {
		f = zc_lookup(ix->cache, ix->id, i);
		if (!f)
			return frame_decode_checked(ix, raw, i, NULL, dst,
						    false);
	} else {
		rc = frame_get(ix, raw, i, NULL, &f);
		if (rc)
			return rc;
	}
	entry_copy(ix, i, f, dst, in, n);
	zc_release_served(ix->cache, f, in, n);
	return 0;
}

/*
 * Hand bytes [@in, @in + @n) of frame @i, cached in @f, to @fn: a plain
 * frame's where they lie, a grouped one's planes as planes_hand() does
 * (through a pooled context's chunk when they are un-grouped).
 */
static int entry_visit(const struct castfs_zst_index *ix, size_t i,
		       const struct zst_frame *f, size_t in, size_t n,
		       unsigned how, castfs_visit_fn fn, void *arg)
{
	enum castfs_zst_transform t = frame_xform(ix, i);
	const uint8_t *plane[ZST_MAX_PLANES];
	struct zst_dctx *dc;
	int rc;

	if (t == CASTFS_ZST_NONE)
		return fn(arg, &(struct castfs_piece){ .bytes = f->data + in,
						       .n = n });
	entry_planes(ix, i, f, plane);
	if (hand_as_planes(t, how, in, n))
		return planes_hand(t, plane, in, n, NULL, how, fn, arg);
	dc = pool_take(ix->cache);
	if (!dc)
		return -ENOMEM;
	rc = planes_hand(t, plane, in, n, dc->chunk, how, fn, arg);
	pool_give(ix->cache, dc);
	return rc;
}

/*
 * Hand bytes [@in, @in + @n) of frame @i to @fn from the cache: from @f
 * (referenced) where given, else from frame_get() (decoding from @m where
 * given); the bytes then count as served (zc_release_served()).
 */
static int frame_visit_cached(const struct castfs_zst_index *ix,
			      const struct castfs_reader *raw, size_t i,
			      const struct zst_mapped *m, struct zst_frame *f,
			      size_t in, size_t n, unsigned how,
			      castfs_visit_fn fn, void *arg)
{
	int rc;

	if (!f) {
		rc = frame_get(ix, raw, i, m, &f);
		if (rc)
			return rc;
	}
	rc = entry_visit(ix, i, f, in, n, how, fn, arg);
	zc_release_served(ix->cache, f, in, n);
	return rc;
}

/*
 * Hand bytes [@in, @in + @n) of frame @i to @fn: a whole grouped frame
 * not cached by frame_visit_planes(), anything else from the cache (a cut
 * frame is decoded into it, as for pread), without a copy.
 */
static int frame_visit(const struct castfs_zst_index *ix,
		       const struct castfs_reader *raw, size_t i, size_t in,
		       size_t n, unsigned how, castfs_visit_fn fn, void *arg)
{
	struct zst_frame *f = zc_lookup(ix->cache, ix->id, i);

	if (!f && frame_xform(ix, i) != CASTFS_ZST_NONE && in == 0 &&
	    n == ix->doff[i + 1] - ix->doff[i])
		return frame_visit_planes(ix, raw, i, how, fn, arg);
	return frame_visit_cached(ix, raw, i, NULL, f, in, n, how, fn, arg);
}

/* A range's tiered frames from @a visited from one mapping of their
 * compressed bytes (frames_visit_mapped()). */
struct zst_run {
	const struct castfs_zst_index *ix;
	const struct castfs_reader *raw;
	size_t a; /* the first frame mapped: cut at @in when @in > 0 */
	size_t in;
	size_t w, b; /* the whole frames [@w, @b) */
	uint64_t end; /* the range's end: inside frame @b when @cut */
	bool cut; /* frame @b, cut by @end, is mapped too */
	size_t done; /* whole frames handed over and verified */
	unsigned how;
	castfs_visit_fn fn;
	void *arg;
	struct zst_dctx *dc;
	bool entered; /* the mapping was made: frames may have been handed */
	bool in_whole; /* failed among the whole frames (else in a cut one) */
	bool fn_failed; /* @fn's error, not the frame's */
};

/*
 * Bytes [@in, @in + @n) of frame @i, one that the run's range cuts:
 * decoded from the mapping into the cache and handed over from there, as
 * frame_visit() does after a read (which was a copy of the frame's
 * compressed bytes, 3 % of a grouped fp16 pack's sequential fp8 view).
 * The next request of a sequential reader starts in the frame a range's
 * end cuts; the kernel's read-ahead often has it under way on another
 * thread before this one reaches it, so that request cuts it at its
 * start.
 */
static int run_piece(struct zst_run *r, const struct castfs_piece *m, size_t i,
		     size_t in, size_t n)
{
	const struct castfs_zst_index *ix = r->ix;
	struct zst_mapped at = {
		.src = m->bytes + (ix->coff[i] - ix->coff[r->a]), .dc = r->dc
	};

	return frame_visit_cached(ix, r->raw, i, &at, NULL, in, n, r->how,
				  r->fn, r->arg);
}

/*
 * Under castfs_fault_call(), with the compressed bytes of the run's frames
 * at @m->bytes: the frame the range starts inside, if mapped, and the
 * one its end cuts, if mapped, through the cache (run_piece()); between
 * them each whole frame decoded where it lies, handed over, and only
 * then verified. Its raw planes (most of a frame: the mantissa bytes) are
 * read once, by the visitor's cast, from the page cache as it computes,
 * as an uncompressed source's words are; verified first, they were read
 * by a copy (pread) or by the checksum's pass, neither overlapping any
 * work, which cost a grouped fp16 pack a quarter of the daemon. The
 * checksum then finds them in cache. A frame that fails it fails the
 * read: what @fn wrote from it is never served.
 */
static int run_visit(void *arg, const struct castfs_piece *m)
{
	struct zst_run *r = arg;
	const struct castfs_zst_index *ix = r->ix;
	int rc = 0;

	r->entered = true;
	if (r->in)
		rc = run_piece(r, m, r->a, r->in,
			       (size_t)(ix->doff[r->w] - ix->doff[r->a]) -
				       r->in);
	if (rc)
		return rc;
	r->in_whole = true;
	for (size_t i = r->w; i < r->b; i++) {
		const uint8_t *src = m->bytes + (ix->coff[i] - ix->coff[r->a]);
		size_t csize = (size_t)(ix->coff[i + 1] - ix->coff[i]);
		const uint8_t *plane[ZST_MAX_PLANES];

		rc = frame_planes_raw(ix, i, r->dc, src, csize, plane);
		if (!rc) {
			rc = frame_hand(ix, i, plane, r->dc, r->how, r->fn,
					r->arg);
			r->fn_failed = rc != 0;
		}
		if (!rc && !frame_sum_ok(ix, i, src, csize, plane))
			rc = -EIO;
		if (rc)
			return rc;
		r->done++;
	}
	r->in_whole = false;
	return r->cut ? run_piece(r, m, r->b, 0,
				  (size_t)(r->end - ix->doff[r->b])) :
			0;
}

/* Whether frame @j may be decoded from a run's mapping: grouped, of
 * tiered planes, not cached, in its place. */
static bool run_takes(const struct castfs_zst_index *ix,
		      const struct castfs_reader *raw, size_t j)
{
	return zst_xform_tiered(frame_xform(ix, j)) &&
	       !zc_has(ix->cache, ix->id, j) && prefix_check(ix, raw, j) == 0;
}

/*
 * The end of the run of frames from @i that frames_visit_mapped() takes:
 * whole frames run_takes(), not empty, lying in [@i's start, @end).
 */
static size_t run_end(const struct castfs_zst_index *ix,
		      const struct castfs_reader *raw, size_t i, uint64_t end)
{
	size_t j = i;

	while (j < ix->nframes && ix->doff[j + 1] <= end &&
	       ix->doff[j + 1] > ix->doff[j] && run_takes(ix, raw, j))
		j++;
	return j;
}

/* Whether frame @j, after a run, is cut by @end and run_takes() it. */
static bool run_cuts(const struct castfs_zst_index *ix,
		     const struct castfs_reader *raw, size_t j, uint64_t end)
{
	return j < ix->nframes && ix->doff[j] < end && end < ix->doff[j + 1] &&
	       run_takes(ix, raw, j);
}

/*
 * The range left, from byte @in of frame @i to @end, handed to @fn from
 * one mapping of the compressed bytes of its frames: the whole ones, and
 * those it cuts at either end (run_piece()) where they are not cached
 * already; *@rc their error (the caller stops there). Returns how many
 * frames were handed over and verified, or 0 where the run is not worth
 * a mapping or the raw reader declines it: the caller visits frame @i its
 * own way then, and after a refusal (*@try_map cleared) the rest of its
 * range too, rather than ask again frame by frame.
 */
static size_t frames_visit_mapped(const struct castfs_zst_index *ix,
				  const struct castfs_reader *raw, size_t i,
				  size_t in, uint64_t end, unsigned how,
				  castfs_visit_fn fn, void *arg, bool *try_map,
				  int *rc)
{
	struct zst_run r = { .ix = ix,
			     .raw = raw,
			     .a = i,
			     .in = in,
			     .w = i + (in > 0),
			     .end = end,
			     .how = how,
			     .fn = fn,
			     .arg = arg };

	*rc = 0;
	if (in && (ix->doff[i + 1] > end || !run_takes(ix, raw, i)))
		return 0; /* inside one frame, or cached: not from here */
	r.b = run_end(ix, raw, r.w, end);
	r.cut = run_cuts(ix, raw, r.b, end);
	if (r.b + r.cut - r.a < 2)
		return 0; /* a frame alone: not worth a mapping */
	r.dc = pool_take(ix->cache);
	if (!r.dc)
		return 0;
	*rc = castfs_reader_map(raw, ix->coff[r.a],
				(size_t)(ix->coff[r.b + r.cut] - ix->coff[r.a]),
				run_visit, &r);
	pool_give(ix->cache, r.dc);
	if (!r.entered) { /* declined: nothing handed over */
		*try_map = false;
		*rc = 0;
		return 0;
	}
	for (size_t k = r.w; k < r.w + r.done; k++) {
		count_decode(ix, k, 0);
		prefix_decoded(ix, k);
	}
	if (*rc && r.in_whole) /* a cut frame's decode counted itself */
		count_decode(ix, r.w + r.done, r.fn_failed ? 0 : *rc);
	return *rc ? 0 : r.b + r.cut - r.a;
}

/*
 * Whether @n and every frame boundary in [@off, @off + @n) lie a multiple
 * of @esize (2 or 4) bytes from @off: each piece is then whole elements,
 * and a frame's planes start at an element. Packs castfs writes always
 * do for the elements of their tensors.
 */
static bool visit_whole(const struct castfs_zst_index *ix, uint64_t off,
			size_t n, unsigned esize)
{
	if ((esize != 2 && esize != 4) || n % esize)
		return false;
	for (size_t i = frame_of(ix, off); i < ix->nframes; i++) {
		if (ix->doff[i] >= off + n)
			break;
		if ((ix->doff[i] - off) & (esize - 1))
			return false;
	}
	return true;
}

static int zr_visit(void *ctx, uint64_t off, size_t n, unsigned how,
		    castfs_visit_fn fn, void *arg)
{
	const struct castfs_zst_reader *zr = ctx;
	const struct castfs_zst_index *ix = zr->ix;
	uint64_t total = castfs_zst_index_size(ix);
	bool try_map = zr->raw->map != NULL;

	if (off > total || n > total - off ||
	    !visit_whole(ix, off, n, how & CASTFS_VISIT_SIZE))
		return -ENOTSUP;
	for (size_t i = frame_of(ix, off), done = 0; done < n; i++) {
		uint64_t at = off + done;
		size_t in = (size_t)(at - ix->doff[i]);
		size_t take =
			(size_t)CASTFS_MIN(ix->doff[i + 1] - at, n - done);
		size_t k = 0;
		int rc = 0;

		if (take == 0)
			continue; /* an empty (skippable) frame */
		if (try_map)
			k = frames_visit_mapped(ix, zr->raw, i, in, off + n,
						how, fn, arg, &try_map, &rc);
		if (rc)
			return rc;
		if (k) {
			done += (size_t)(CASTFS_MIN(ix->doff[i + k], off + n) -
					 at);
			i += k - 1;
			continue;
		}
		rc = frame_visit(ix, zr->raw, i, in, take, how, fn, arg);
		if (rc)
			return rc;
		done += take;
	}
	return 0;
}

static ssize_t zr_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct castfs_zst_reader *zr = ctx;
	const struct castfs_zst_index *ix = zr->ix;
	uint64_t total = castfs_zst_index_size(ix);
	size_t done = 0;

	if (off >= total)
		return 0;
	if (n > total - off)
		n = (size_t)(total - off);
	for (size_t i = frame_of(ix, off); done < n; i++) {
		uint64_t at = off + done;
		size_t in = (size_t)(at - ix->doff[i]);
		size_t take = (size_t)(ix->doff[i + 1] - at);
		int rc;

		if (take == 0)
			continue; /* an empty (skippable) frame */
		if (take > n - done)
			take = n - done;
		rc = frame_copy(ix, zr->raw, i, (char *)buf + done, in, take);
		if (rc)
			return rc;
		done += take;
	}
	return (ssize_t)done;
}

uint64_t castfs_zst_raw_off(const struct castfs_zst_index *ix, uint64_t off)
{
	if (off >= castfs_zst_index_size(ix))
		return ix->coff[ix->nframes];
	return ix->coff[frame_of(ix, off)];
}

void castfs_zst_reader_init(struct castfs_zst_reader *zr,
			    const struct castfs_zst_index *ix,
			    const struct castfs_reader *raw)
{
	zr->r.pread = zr_pread;
	zr->r.ctx = zr;
	zr->r.visit = ix->xform ? zr_visit : NULL;
	zr->r.map = NULL;
	zr->ix = ix;
	zr->raw = raw;
}
