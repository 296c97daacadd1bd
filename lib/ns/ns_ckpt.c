/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint cache: each identity (device, inode, size, mtime, ctime) of a
 * *.safetensors file has its header read and validated once, and its plan
 * per view built once. A file that changes gets a new entry; the old one
 * lives on while open files hold it.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/escape.h"
#include "common/hash.h"
#include "format/st_side.h"
#include "modeldir/modeldir.h"
#include "ns/ns_ckpt_internal.h"
#include "view/qsrc.h"

static size_t ck_bucket_in(size_t nb, dev_t dev, ino_t ino)
{
	uint64_t h = (uint64_t)ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)dev;

	return (size_t)castfs_mix64(h) & (nb - 1);
}

static size_t ck_bucket(const struct castfs_ns *ns, dev_t dev, ino_t ino)
{
	return ck_bucket_in(ns->ck_nbuckets, dev, ino);
}

static size_t path_bucket_in(size_t nb, const char *path)
{
	uint64_t h = castfs_fnv1a(CASTFS_FNV_SEED, path, strlen(path));

	return (size_t)castfs_mix64(h) & (nb - 1);
}

size_t ns_ckpt_path_bucket(const struct castfs_ns *ns, const char *path)
{
	return path_bucket_in(ns->ck_nbuckets, path);
}

int ns_ckpt_cache_init(struct castfs_ns *ns)
{
	ns->ckpts = calloc(NS_HASH_BUCKETS, sizeof(*ns->ckpts));
	ns->ckpaths = calloc(NS_HASH_BUCKETS, sizeof(*ns->ckpaths));
	ns->ck_nbuckets = NS_HASH_BUCKETS;
	return ns->ckpts && ns->ckpaths ? 0 : -ENOMEM;
}

/* Caller holds ck_lock. Twice the buckets, both chains rehashed; out of
 * memory, the chains just stay longer. */
static void ck_grow_locked(struct castfs_ns *ns)
{
	size_t nb = ns->ck_nbuckets * 2;
	struct ns_ckpt **ids = calloc(nb, sizeof(*ids));
	struct ns_ckpt **paths = calloc(nb, sizeof(*paths));

	if (!ids || !paths) {
		free(ids);
		free(paths);
		return;
	}
	for (size_t i = 0; i < ns->ck_nbuckets; i++) {
		struct ns_ckpt *ck, *next;

		for (ck = ns->ckpts[i]; ck; ck = next) {
			size_t b = ck_bucket_in(nb, ck->dev, ck->ino);

			next = ck->hnext;
			ck->hnext = ids[b];
			ids[b] = ck;
		}
		for (ck = ns->ckpaths[i]; ck; ck = next) {
			size_t b = path_bucket_in(nb, ck->path);

			next = ck->pnext;
			ck->pnext = paths[b];
			paths[b] = ck;
		}
	}
	free(ns->ckpts);
	free(ns->ckpaths);
	ns->ckpts = ids;
	ns->ckpaths = paths;
	ns->ck_nbuckets = nb;
}

/* Caller holds ck_lock. Take @ck off the chain by path. */
static void ck_unlink_path_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct ns_ckpt **pp = &ns->ckpaths[ns_ckpt_path_bucket(ns, ck->path)];

	for (; *pp; pp = &(*pp)->pnext) {
		if (*pp == ck) {
			*pp = ck->pnext;
			return;
		}
	}
}

static bool ck_matches(const struct ns_ckpt *ck, const struct stat *st)
{
	return ck->dev == st->st_dev && ck->ino == st->st_ino &&
	       ck->size == st->st_size &&
	       ck->mtime.tv_sec == st->st_mtim.tv_sec &&
	       ck->mtime.tv_nsec == st->st_mtim.tv_nsec &&
	       ck->ctime.tv_sec == st->st_ctim.tv_sec &&
	       ck->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

void ns_ckpt_free_plans(struct ns_ckpt *ck, size_t nviews)
{
	/* First: what the levels above keep borrows the plans. */
	for (size_t s = 0; s < NS_CKPT_SLOTS; s++) {
		if (ck->slot[s] && ck->fini[s])
			ck->fini[s](ck);
	}
	for (size_t i = 0; ck->plans && i < nviews; i++) {
		castfs_plan_free(ck->plans[i]);
		ck->plans[i] = NULL;
	}
}

static void ck_free(struct ns_ckpt *ck, size_t nviews)
{
	ns_ckpt_free_plans(ck, nviews);
	free(ck->plans);
	free(ck->plan_err);
	castfs_header_free(ck->h);
	castfs_zst_index_free(ck->zix);
	pthread_mutex_destroy(&ck->lock);
	free(ck->path);
	free(ck);
}

void ns_ckpt_unref(struct ns_ckpt *ck)
{
	if (ck && atomic_fetch_sub(&ck->refs, 1) == 1)
		ck_free(ck, ck->nviews);
}

/* Drop a reference to @ck unless it is one of the last two (ours and,
 * most often, the table's): those are dropped under the cache lock, where
 * a forget that found the entry in use leaves its eviction to them
 * (ns_ckpt_put_last()). Returns whether it was dropped. */
static bool unref_unless_last_two(struct ns_ckpt *ck)
{
	uint64_t r = atomic_load(&ck->refs);

	do {
		if (r <= 2)
			return false;
	} while (!atomic_compare_exchange_weak(&ck->refs, &r, r - 1));
	return true;
}

void ns_ckpt_put(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	if (!ck)
		return;
	if (!unref_unless_last_two(ck))
		ns_ckpt_put_last(ns, ck);
	/* The entry a request used may be the one past the budget. */
	if (ns_ckpt_over_budget(ns))
		ns_ckpt_trim(ns);
}

static void ck_ref(struct ns_ckpt *ck)
{
	atomic_fetch_add(&ck->refs, 1);
}

static void ck_fail(struct ns_ckpt *ck, int err, const char *why)
{
	ck->err = err;
	snprintf(ck->reason, sizeof(ck->reason), "%s", why);
}

/*
 * The data of the few small tensors quantized layouts need (quant_state
 * JSON, weight_shape), read with the header, under the same guard and
 * identity checks (format/st_side.h). On error the header is dropped.
 */
static int ck_read_side(struct ns_ckpt *ck, const struct castfs_reader *r,
			struct castfs_diag *d)
{
	int rc = castfs_header_read_side(ck->h, r, d);

	if (rc) {
		castfs_header_free(ck->h);
		ck->h = NULL;
	}
	return rc;
}

/*
 * Read the seek table of the pack open as @fd (@raw_size bytes) into
 * @ck->zix and the safetensors header it holds into @ck->h. Returns 0 or
 * the error (-EINVAL, -EFBIG: not a usable pack; -EIO: a frame of the
 * header fails) with the reason in @d.
 */
static int ck_parse_packed(struct castfs_ns *ns, struct ns_ckpt *ck, int fd,
			   uint64_t raw_size, struct castfs_diag *d)
{
	struct castfs_fd_reader fr;
	struct castfs_zst_reader zr;
	int rc;

	castfs_fd_reader_init(&fr, fd);
	rc = castfs_zst_index_read(&fr.r, raw_size, ns->zcache, &ck->zix, d);
	if (rc)
		return rc;
	/* zstd -d restores a .zst, never a grouped pack: names must say. */
	if (castfs_zst_index_grouped(ck->zix) !=
	    (ns_packed_ext_len(ck->path) == 5))
		return castfs_diag_set(d, -EINVAL,
				       "a grouped pack must be named "
				       "*.safetensors.zstg, a standard one "
				       "*.safetensors.zst");
	castfs_zst_reader_init(&zr, ck->zix, &fr.r);
	rc = castfs_header_read(&zr.r, castfs_zst_index_size(ck->zix), &ck->h,
				d);
	if (!rc)
		rc = ck_read_side(ck, &zr.r, d);
	if (rc == -EIO)
		castfs_diag_set(d, rc,
				"a frame holding the header fails to decode "
				"or to match its size or checksum");
	return rc;
}

/* Parse the header through @fd; the file must be @st before and after. */
static void ck_parse(struct castfs_ns *ns, struct ns_ckpt *ck, int fd,
		     const struct stat *st)
{
	struct castfs_fd_reader fr;
	struct castfs_diag d = { { 0 } };
	struct stat now;

	if (fstat(fd, &now) < 0 || !ns_same_file(&now, st)) {
		ck_fail(ck, -ESTALE, "changed while being read");
		return;
	}
	castfs_fd_reader_init(&fr, fd);
	if (ns_packed_name(ck->path))
		ck->err =
			ck_parse_packed(ns, ck, fd, (uint64_t)st->st_size, &d);
	else
		ck->err = castfs_header_read(&fr.r, (uint64_t)st->st_size,
					     &ck->h, &d);
	if (!ck->err && !ns_packed_name(ck->path))
		ck->err = ck_read_side(ck, &fr.r, &d);
	if (ck->err)
		snprintf(ck->reason, sizeof(ck->reason), "%s",
			 d.msg[0] ? d.msg : strerror(-ck->err));
	if (fstat(fd, &now) < 0 || !ns_same_file(&now, st)) {
		castfs_header_free(ck->h);
		ck->h = NULL;
		ck_fail(ck, -ESTALE, "changed while being read");
	}
}

/*
 * Whether @dir has the index of sharded weights that lets a shard's FP8
 * scales (compressed-tensors FP4/int4 companions, bitsandbytes 4-bit
 * quant_state and absmax) be looked for in the other shards
 * (ns_mdxshard.c).
 */
static bool ck_dir_sharded(struct castfs_ns *ns, const char *dir)
{
	static const char ix[] = "model.safetensors.index.json";
	char *p = ns_path_join(dir, ix, sizeof(ix) - 1);
	struct stat st;
	bool yes = p && ns_src_stat_in(ns, p, &st) == 0 && S_ISREG(st.st_mode);

	free(p);
	return yes;
}

/*
 * Quantized sources: a checkpoint holding a quantized layout castfs does
 * not dequantize exactly, or sitting in a model directory whose
 * config.json declares one, is rejected (no views, listed with the reason
 * in /.castfs/rejected); one holding FP8 block weights gets the cast views.
 */
static void ck_quant(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_md_quant mq = { 0 };
	struct castfs_qsrc q;
	char *dir = ns_parent_path(ck->path);
	int rc = dir ? ns_ckpt_dir_quant(ns, dir, &mq) : -ENOMEM;
	bool sharded = !rc &&
		       (mq.fp8_block || mq.ct_fp8 || mq.ct_fp4 || mq.ct_w4 ||
			mq.bnb_4bit) &&
		       ck_dir_sharded(ns, dir);
	unsigned w4 = !rc && mq.ct_w4 ? (mq.ct_w4_asym ? CASTFS_QSRC_W4ASYM :
							 CASTFS_QSRC_W4SYM) :
					0;
	unsigned kinds = rc ? 0 : castfs_md_quant_kinds(&mq);

	free(dir);
	if (!rc && mq.quantized && !castfs_md_quant_dequantized(&mq))
		rc = castfs_diag_set(&d, -ENOTSUP,
				     "config.json: quantization_config with "
				     "quant_method '%s'%s is a layout castfs "
				     "does not dequantize: no views",
				     mq.method, mq.detail);
	if (!rc) {
		const struct castfs_qsrc_opts o = {
			.flags = (mq.fp8_block || mq.ct_fp8 || mq.ct_fp4 ?
					  CASTFS_QSRC_STRICT :
					  0) |
				 (sharded ? CASTFS_QSRC_XSHARD : 0) |
				 (sharded && mq.bnb_4bit ? CASTFS_QSRC_Q4XS :
							   0) |
				 (mq.mxfp4 ? CASTFS_QSRC_MX : 0) | w4,
			.brows = mq.block_rows,
			.bcols = mq.block_cols,
			.declared = kinds,
			.ct_strategies = mq.ct_fp8_strategies,
		};

		rc = castfs_qsrc_scan_opts(ck->h, &o, &q, &d);
	}
	if (!rc) {
		ck->xshard = q.nxshard > 0;
		ck->quant = q.nfp8 > 0 || q.nmxfp4 > 0 || q.nbnb4 > 0 ||
			    q.nctw4 > 0 || ck->xshard;
		ck->qbrows = mq.block_rows;
		ck->qbcols = mq.block_cols;
		ck->qw4flags = w4;
		ck->qdeclared = kinds;
		ck->qct_strategies = mq.ct_fp8_strategies;
		castfs_qsrc_fini(&q);
		return;
	}
	castfs_header_free(ck->h);
	ck->h = NULL;
	ck_fail(ck, rc, rc == -ENOMEM ? "out of memory" : d.msg);
}

/*
 * Read and validate the header of @path, which must still be @st. Under
 * the source guard: a file open for writing is not parsed now (-EAGAIN),
 * and a writer arriving during the parse makes it -ESTALE. Neither is
 * cached: the next lookup tries again.
 */
static void ck_load(struct castfs_ns *ns, struct ns_ckpt *ck,
		    const struct stat *st)
{
	int fd = ns_src_open_in(ns, ck->path, O_RDONLY);
	int begun;

	if (fd < 0) {
		ck->err = fd;
		snprintf(ck->reason, sizeof(ck->reason), "open: %s",
			 strerror(-fd));
		return;
	}
	begun = ns_guard_read_begin(ns, fd);
	if (begun < 0) {
		ck_fail(ck, begun,
			begun == -EAGAIN ? "being written" :
					   "changed while being read");
		goto out_close;
	}
	ck_parse(ns, ck, fd, st);
	if (!ns_guard_read_end(ns, fd, begun) && !ck->err) {
		castfs_header_free(ck->h);
		ck->h = NULL;
		ck_fail(ck, -ESTALE, "changed while being read");
	}
out_close:
	close(fd);
	if (ck->h)
		ck_quant(ns, ck);
}

static struct ns_ckpt *ck_new(struct castfs_ns *ns, const char *path,
			      const struct stat *st)
{
	struct ns_ckpt *ck = calloc(1, sizeof(*ck));

	if (!ck)
		return NULL;
	ck->nviews = ns->views->n;
	ck->fini = ns->ckpt_fini;
	ck->plans = calloc(ck->nviews ? ck->nviews : 1, sizeof(*ck->plans));
	ck->plan_err =
		calloc(ck->nviews ? ck->nviews : 1, sizeof(*ck->plan_err));
	ck->path = strdup(path);
	pthread_mutex_init(&ck->lock, NULL);
	if (!ck->plans || !ck->plan_err || !ck->path) {
		ck_free(ck, ck->nviews);
		return NULL;
	}
	ck->refs = 1;
	ck->dev = st->st_dev;
	ck->ino = st->st_ino;
	ck->size = st->st_size;
	ck->mtime = st->st_mtim;
	ck->ctime = st->st_ctim;
	return ck;
}

/* Caller holds ck_lock. Entry of identity @st, with a new reference. */
static struct ns_ckpt *ck_find_locked(struct castfs_ns *ns,
				      const struct stat *st)
{
	struct ns_ckpt *ck = ns->ckpts[ck_bucket(ns, st->st_dev, st->st_ino)];

	for (; ck; ck = ck->hnext) {
		if (ck_matches(ck, st)) {
			ck_ref(ck);
			return ck;
		}
	}
	return NULL;
}

/* Caller holds ck_lock. Insert @ck, dropping older identities of its file
 * (they live on while open files hold them). */
static void ck_insert_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct ns_ckpt **pp = &ns->ckpts[ck_bucket(ns, ck->dev, ck->ino)], *o;

	while ((o = *pp)) {
		if (o->dev == ck->dev && o->ino == ck->ino) {
			ns_ckpt_unlink_locked(ns, o); /* *pp is now the next */
			ns_ckpt_unref(o);
			continue;
		}
		pp = &o->hnext;
	}
	ck_ref(ck); /* the table's reference */
	ck->in_table = true;
	ck->hnext = ns->ckpts[ck_bucket(ns, ck->dev, ck->ino)];
	ns->ckpts[ck_bucket(ns, ck->dev, ck->ino)] = ck;
	ck->pnext = ns->ckpaths[ns_ckpt_path_bucket(ns, ck->path)];
	ns->ckpaths[ns_ckpt_path_bucket(ns, ck->path)] = ck;
	if (++ns->ck_count > 2 * ns->ck_nbuckets)
		ck_grow_locked(ns);
}

/* Caller holds ck_lock. Take @ck off the chain by identity. */
static void ck_unlink_id_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	struct ns_ckpt **pp = &ns->ckpts[ck_bucket(ns, ck->dev, ck->ino)];

	for (; *pp; pp = &(*pp)->hnext) {
		if (*pp == ck) {
			*pp = ck->hnext;
			return;
		}
	}
}

void ns_ckpt_unlink_locked(struct castfs_ns *ns, struct ns_ckpt *ck)
{
	ck_unlink_id_locked(ns, ck);
	ck_unlink_path_locked(ns, ck);
	ns_ckpt_lru_del_locked(ns, ck);
	if (ck->in_table)
		ns->ck_count--;
	ck->in_table = false;
}

static void ck_log_rejected(struct castfs_ns *ns, const struct ns_ckpt *ck)
{
	castfs_stats_count(ns->stats, CASTFS_SCTR_HEADERS_REJECTED, 1);
	ns_logf(ns, ck->path, "rejected: %s", ck->reason);
}

/* Caller holds ck_lock. An entry of identity @st (with a reference) once
 * no parse of it is under way, or NULL. */
static struct ns_ckpt *ck_find_loaded_locked(struct castfs_ns *ns,
					     const struct stat *st)
{
	struct ns_ckpt *ck = ck_find_locked(ns, st);

	while (ck && ck->loading)
		pthread_cond_wait(&ns->ck_loaded, &ns->ck_lock);
	return ck;
}

/* Parse @ck, entered in the table as loading; then publish it, or take it
 * out of the table again if what went wrong was transient. */
static void ck_load_shared(struct castfs_ns *ns, struct ns_ckpt *ck,
			   const struct stat *st)
{
	ck_load(ns, ck, st);
	castfs_stats_count(ns->stats, CASTFS_SCTR_HEADERS_PARSED, 1);
	pthread_mutex_lock(&ns->ck_lock);
	ck->loading = false;
	if (ns_err_transient(ck->err) && ck->in_table) {
		ns_ckpt_unlink_locked(ns, ck);
		ns_ckpt_unref(ck); /* the table's reference */
	} else if (ck->h && ck->in_table) {
		/* a pack's seek table too: 4 KiB frames of a 100 GB store
		 * are 500 MB of it (a bug hunt: never counted nor evicted) */
		ns_ckpt_lru_add_locked(
			ns, ck,
			ns_ckpt_header_cost(ck->h) +
				(ck->zix ? castfs_zst_index_bytes(ck->zix) :
					   0));
	}
	pthread_cond_broadcast(&ns->ck_loaded);
	pthread_mutex_unlock(&ns->ck_lock);
	if (ck->err && !ns_err_transient(ck->err)) {
		ns_ctl_ck_changed(ns);
		ck_log_rejected(ns, ck);
	}
}

/* Caller holds ck_lock. The entry of identity @st once loaded, or, if
 * there is none, @fresh entered in the table as loading (NULL returned). */
static struct ns_ckpt *ck_find_or_enter_locked(struct castfs_ns *ns,
					       const struct stat *st,
					       struct ns_ckpt *fresh)
{
	struct ns_ckpt *ck = ck_find_loaded_locked(ns, st);

	if (!ck && fresh) {
		/* In the table before the parse, so that concurrent lookups
		 * of this identity wait for it rather than parse again. */
		fresh->loading = true;
		ck_insert_locked(ns, fresh);
		ns_ckpt_fails_restore_locked(ns, fresh);
	}
	return ck;
}

/* The cached entry of identity @st once parsed (a reference, made the
 * most recently used), or NULL. */
static struct ns_ckpt *ck_cached(struct castfs_ns *ns, const struct stat *st)
{
	struct ns_ckpt *ck;

	pthread_mutex_lock(&ns->ck_lock);
	ck = ck_find_loaded_locked(ns, st);
	if (ck)
		ns_ckpt_lru_touch_locked(ns, ck);
	pthread_mutex_unlock(&ns->ck_lock);
	return ck;
}

int ns_ckpt_get(struct castfs_ns *ns, const char *path, const struct stat *st,
		struct ns_ckpt **out)
{
	struct ns_ckpt *ck = ck_cached(ns, st), *fresh = NULL;

	if (!ck) {
		fresh = ck_new(ns, path, st);
		if (!fresh)
			return -ENOMEM;
		pthread_mutex_lock(&ns->ck_lock);
		ck = ck_find_or_enter_locked(ns, st, fresh);
		pthread_mutex_unlock(&ns->ck_lock);
	}
	if (ck) {
		ns_ckpt_unref(fresh); /* never in the table nor shared */
		castfs_stats_count(ns->stats, CASTFS_SCTR_HEADER_CACHE_HITS, 1);
		*out = ck;
		return 0;
	}
	/* Parse outside the lock: a 100 MB header takes a while. */
	ck_load_shared(ns, fresh, st);
	if (ns_ckpt_over_budget(ns))
		ns_ckpt_trim(ns);
	*out = fresh;
	return 0;
}

int ns_ckpt_loaded(struct castfs_ns *ns, const struct stat *st,
		   struct ns_ckpt **out)
{
	struct ns_ckpt *ck = ck_cached(ns, st);

	if (!ck)
		return -ENOENT;
	if (!ck->h) {
		ns_ckpt_put(ns, ck);
		return -ENOENT;
	}
	castfs_stats_count(ns->stats, CASTFS_SCTR_HEADER_CACHE_HITS, 1);
	*out = ck;
	return 0;
}

/* What a lookup of a checkpoint that has no header says: a rejected file
 * has no views (ENOENT); one changed while read is going away (ESTALE);
 * a lack of memory or descriptors is said as it is. */
static int ck_lookup_err(int err)
{
	if (err == -ENOMEM || err == -EMFILE || err == -ENFILE)
		return err;
	return ns_err_transient(err) ? -ESTALE : -ENOENT;
}

int ns_ckpt_valid(struct castfs_ns *ns, const char *path, struct stat *st,
		  struct ns_ckpt **out)
{
	struct ns_ckpt *ck;
	char *packed = NULL;
	int rc = ns_src_stat_in(ns, path, st);

	/* No X.safetensors: its pack X.safetensors.zst(g) stands in. */
	if (rc == -ENOENT) {
		rc = ns_packed_find(ns, path, &packed, st);
		if (rc)
			return rc;
	}
	if (!rc && !S_ISREG(st->st_mode))
		rc = -ENOENT;
	if (!rc)
		rc = ns_ckpt_get(ns, packed ? packed : path, st, &ck);
	free(packed);
	if (rc)
		return rc;
	if (!ck->h) {
		/* Being written or changed while read: the version looked
		 * up is going away (ESTALE); rejected files have no views. */
		rc = ck_lookup_err(ck->err);
		ns_ckpt_put(ns, ck);
		return rc;
	}
	*out = ck;
	return 0;
}

bool ns_ckpt_rejected(struct castfs_ns *ns, const char *path, char *why,
		      size_t len)
{
	struct ns_ckpt *ck;
	struct stat st;
	char *packed = NULL;
	bool bad = false;
	int rc = ns_src_stat_in(ns, path, &st);

	if (rc == -ENOENT)
		rc = ns_packed_find(ns, path, &packed, &st);
	if (!rc && S_ISREG(st.st_mode) &&
	    ns_ckpt_get(ns, packed ? packed : path, &st, &ck) == 0) {
		bad = !ck->h && !ns_err_transient(ck->err);
		if (bad && len)
			snprintf(why, len, "%s", ck->reason);
		ns_ckpt_put(ns, ck);
	}
	free(packed);
	return bad;
}

/* The quantized-source options of @ck's plans: its FP8 block size, and
 * the layouts its folder declares (a shard holding no quantized weight
 * of such a folder is planned as its siblings are). */
const struct castfs_qsrc_opts *ns_ckpt_qopts(const struct ns_ckpt *ck,
					     struct castfs_qsrc_opts *o)
{
	*o = (struct castfs_qsrc_opts){ .brows = ck->qbrows,
					.bcols = ck->qbcols,
					.declared = ck->qdeclared,
					.ct_strategies = ck->qct_strategies };
	return o;
}

/* Caller holds ck->lock. Build the plan of view @idx (its estimated size
 * to *@built), or say why it cannot be: a failure that is not transient
 * is kept like a plan, so a view that cannot be built is not rebuilt per
 * lookup. */
static int ck_plan_locked(struct castfs_ns *ns, struct ns_ckpt *ck, int idx,
			  const struct castfs_view *view, size_t *built,
			  struct castfs_diag *d)
{
	struct castfs_qsrc_opts o;
	int rc;

	if (ck->plans[idx]) {
		castfs_stats_count(ns->stats, CASTFS_SCTR_PLAN_CACHE_HITS, 1);
		return 0;
	}
	if (ck->plan_err[idx])
		return castfs_diag_set(d, ck->plan_err[idx],
				       "view '%s' cannot be built (%s)",
				       view->name,
				       strerror(-ck->plan_err[idx]));
	rc = castfs_view_plan_opts(view, ck->h, ns_ckpt_qopts(ck, &o),
				   &ck->plans[idx], d);
	if (!rc)
		castfs_stats_count(ns->stats, CASTFS_SCTR_PLANS_BUILT, 1);
	if (!rc)
		*built = ns_ckpt_plan_cost(ck->plans[idx]);
	else if (!ns_err_transient(rc))
		ck->plan_err[idx] = rc;
	return rc;
}

/* Source path @path's view turned out not to build: the listing of its
 * directory, which showed the view and will not any more, changed. */
static void ck_listing_changed(struct castfs_ns *ns, const char *path)
{
	const char *slash = strrchr(path, '/');
	struct ns_node dir = { .kind = NS_DIR };
	char *d;

	if (!slash) {
		ns_listing_changed(ns, CASTFS_NS_ROOT_ID);
		return;
	}
	d = strndup(path, (size_t)(slash - path));
	if (d && ns_src_stat(ns, d, &dir.st) == 0)
		ns_listing_changed(ns, ns_node_id(&dir));
	free(d);
}

int ns_ckpt_plan(struct castfs_ns *ns, struct ns_ckpt *ck,
		 const struct castfs_view *view, const struct castfs_plan **out,
		 struct castfs_diag *d)
{
	int idx = ns_view_index(ns, view);
	size_t built = 0;
	bool learned;
	int rc;

	if (idx < 0 || (size_t)idx >= ck->nviews || !ck->h)
		return -EINVAL;
	pthread_mutex_lock(&ck->lock);
	learned = !ck->plan_err[idx];
	rc = ck_plan_locked(ns, ck, idx, view, &built, d);
	learned = learned && ck->plan_err[idx];
	if (!rc)
		*out = ck->plans[idx];
	pthread_mutex_unlock(&ck->lock);
	if (built)
		ns_ckpt_charge(ns, ck, built);
	if (learned) {
		ns_ctl_ck_changed(ns); /* /.castfs/refused shows it now */
		ck_listing_changed(ns, ck->path);
	}
	return rc;
}

bool ns_ckpt_view_fails(struct ns_ckpt *ck, int idx)
{
	bool fails;

	if (idx < 0 || (size_t)idx >= ck->nviews)
		return false;
	pthread_mutex_lock(&ck->lock);
	fails = ck->plan_err[idx] != 0;
	pthread_mutex_unlock(&ck->lock);
	return fails;
}

static void rejected_add(struct castfs_ns *ns, cJSON *arr,
			 const struct ns_ckpt *ck)
{
	char *path, *reason;
	struct stat st;
	cJSON *o;

	/* Only files still there as they were when rejected. */
	if (ns_src_stat_in(ns, ck->path, &st) || !ck_matches(ck, &st))
		return;
	o = cJSON_CreateObject();
	if (!o)
		return;
	/* Names from the source tree: valid UTF-8, reversibly (escape.h).
	 * The reason quotes its names escaped already: made safe only. */
	path = castfs_escape(ck->path, strlen(ck->path));
	reason = castfs_escape_text(ck->reason, strlen(ck->reason));
	if (path && reason) {
		cJSON_AddStringToObject(o, "path", path);
		cJSON_AddStringToObject(o, "error", strerror(-ck->err));
		cJSON_AddStringToObject(o, "reason", reason);
		cJSON_AddItemToArray(arr, o);
	} else {
		cJSON_Delete(o);
	}
	free(path);
	free(reason);
}

char *ns_ckpt_rejected_json(struct castfs_ns *ns)
{
	cJSON *arr = cJSON_CreateArray();
	char *out;

	if (!arr)
		return NULL;
	pthread_mutex_lock(&ns->ck_lock);
	for (size_t i = 0; i < ns->ck_nbuckets; i++) {
		for (struct ns_ckpt *ck = ns->ckpts[i]; ck; ck = ck->hnext) {
			if (!ck->loading && !ck->h)
				rejected_add(ns, arr, ck);
		}
	}
	pthread_mutex_unlock(&ns->ck_lock);
	out = cJSON_Print(arr);
	cJSON_Delete(arr);
	return out;
}

/* {"path", "views", "reason"} per errno of @ck's views that cannot be
 * built; caller holds ck_lock. */
static int view_refusals_add(struct castfs_ns *ns, cJSON *arr,
			     struct ns_ckpt *ck)
{
	int rc = 0;

	pthread_mutex_lock(&ck->lock);
	for (size_t i = 0; !rc && i < ck->nviews; i++) {
		int err = ck->plan_err[i];
		char why[160], *path;
		cJSON *o, *views;
		bool seen = false;

		for (size_t j = 0; j < i; j++)
			seen = seen || ck->plan_err[j] == err;
		if (!err || seen)
			continue; /* one object per errno, listing its views */
		snprintf(why, sizeof(why),
			 "the view cannot be built: %s (the daemon log "
			 "says why)",
			 strerror(-err));
		path = castfs_escape(ck->path, strlen(ck->path));
		o = cJSON_CreateObject();
		rc = -ENOMEM;
		if (path && o && cJSON_AddStringToObject(o, "path", path) &&
		    (views = cJSON_AddArrayToObject(o, "views")) &&
		    cJSON_AddStringToObject(o, "reason", why)) {
			rc = 0;
			for (size_t j = i; !rc && j < ck->nviews; j++) {
				if (ck->plan_err[j] == err &&
				    !cJSON_AddItemToArray(
					    views,
					    cJSON_CreateString(
						    ns->views->v[j].name)))
					rc = -ENOMEM;
			}
		}
		free(path);
		if (!rc)
			cJSON_AddItemToArray(arr, o);
		else
			cJSON_Delete(o);
	}
	pthread_mutex_unlock(&ck->lock);
	return rc;
}

int ns_ckpt_view_refusals(struct castfs_ns *ns, cJSON *arr)
{
	int rc = 0;

	pthread_mutex_lock(&ns->ck_lock);
	for (size_t i = 0; !rc && i < ns->ck_nbuckets; i++) {
		for (struct ns_ckpt *ck = ns->ckpts[i]; !rc && ck;
		     ck = ck->hnext) {
			if (!ck->loading && ck->h)
				rc = view_refusals_add(ns, arr, ck);
		}
	}
	pthread_mutex_unlock(&ns->ck_lock);
	return rc;
}

void ns_ckpt_drop_path(struct castfs_ns *ns, const char *path)
{
	struct ns_ckpt **pp, *ck;

	pthread_mutex_lock(&ns->ck_lock);
	pp = &ns->ckpaths[ns_ckpt_path_bucket(ns, path)];
	while ((ck = *pp)) {
		if (strcmp(ck->path, path) == 0) {
			ns_ckpt_unlink_locked(ns, ck); /* *pp is now the next */
			ns_ckpt_unref(ck);
			continue;
		}
		pp = &ck->pnext;
	}
	pthread_mutex_unlock(&ns->ck_lock);
}

void ns_ckpt_cache_fini(struct castfs_ns *ns)
{
	for (size_t i = 0; ns->ckpts && i < ns->ck_nbuckets; i++) {
		while (ns->ckpts[i]) {
			struct ns_ckpt *ck = ns->ckpts[i];

			ns->ckpts[i] = ck->hnext;
			ns_ckpt_unref(ck);
		}
	}
	free(ns->ckpts);
	free(ns->ckpaths);
	ns->ckpts = ns->ckpaths = NULL;
	ns->ck_nbuckets = ns->ck_count = 0;
	ns_ckpt_fails_fini(ns);
	ns_mdtext_free(ns->dir_config);
	ns->dir_config = NULL;
}

int ns_ckpt_packed_stat(struct castfs_ns *ns, const char *path, struct stat *st)
{
	struct ns_ckpt *ck;
	int rc = ns_ckpt_valid(ns, path, st, &ck);

	if (rc)
		return rc;
	rc = ck->zix ? 0 : -ENOENT;
	ns_ckpt_put(ns, ck);
	return rc;
}

bool ns_ckpt_offers(const struct ns_ckpt *ck, const struct castfs_view *v)
{
	if (ck->xshard)
		return false; /* a companion is in another shard */
	return !ck->quant || castfs_view_dequantizes(v);
}

int ns_ckpt_has_view(struct castfs_ns *ns, const char *path,
		     const struct castfs_view *view, struct stat *st)
{
	struct ns_ckpt *ck;
	int rc = ns_ckpt_valid(ns, path, st, &ck);

	if (rc)
		return rc;
	if (view && !ns_ckpt_offers(ck, view))
		rc = -ENOENT;
	ns_ckpt_put(ns, ck);
	return rc;
}

/* Whether @path is a file directly in directory @dir. */
static bool in_dir(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	const char *rest = path;

	if (n) {
		if (strncmp(path, dir, n) != 0 || path[n] != '/')
			return false;
		rest = path + n + 1;
	}
	return strchr(rest, '/') == NULL;
}

void ns_ckpt_drop_dir(struct castfs_ns *ns, const char *dir)
{
	pthread_mutex_lock(&ns->ck_lock);
	for (size_t i = 0; i < ns->ck_nbuckets; i++) {
		struct ns_ckpt **pp = &ns->ckpts[i], *ck;

		while ((ck = *pp)) {
			if (in_dir(ck->path, dir)) {
				/* Off both chains (the watcher's drop by path
				 * walks the other one) and the LRU list. */
				ns_ckpt_unlink_locked(ns, ck);
				ns_ckpt_unref(ck);
				continue;
			}
			pp = &ck->hnext;
		}
	}
	/* Which views build can follow config.json; the failures kept for
	 * evicted entries do not say which directory they were in. */
	ns_ckpt_fails_fini(ns);
	pthread_mutex_unlock(&ns->ck_lock);
}
