/* SPDX-License-Identifier: MIT */
/*
 * Open files: a snapshot of what one open serves (a plan and the source it
 * reads, or a pass-through source), with the check that the source is
 * still the identity the plan was built from after every read.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ns/ns_file_internal.h"
#include "plan/plan_layer.h"

struct castfs_file {
	/* Shares: the handle's, and one per request using it (a resent
	 * request may outlive the RELEASE; fs/fs.h, castfs_fh_get). */
	_Atomic unsigned refs;
	struct castfs_ns *ns;
	int fd; /* the source, or -1 for plans of memory only */
	bool guarded; /* the guard reports writers of fd */
	struct castfs_fd_reader fr;
	struct castfs_zst_reader zr; /* over fr, for a packed source */
	const struct castfs_reader *src; /* &fr.r or &zr.r */
	struct stat ident;
	struct ns_ckpt *ck;
	const struct castfs_plan *plan; /* NULL: pass-through */
	struct castfs_plan *owned;
	struct ns_memshare *shared; /* owner of plan, or NULL */
	const struct castfs_plan *base; /* the plan reads this view, or NULL */
	uint64_t size;
	int view;
	bool direct;
	bool counted; /* castfs_stats_open() counted it: close counts too */
	/* Opened again for a previous daemon's handle, with a text this
	 * open made (a control file): until it is read from offset 0, a
	 * read elsewhere would go on in another text than the one the
	 * reader began (castfs_ns_reopen()). */
	atomic_bool fresh_text;
	_Atomic uint64_t next_off; /* where the last read ended */
	_Atomic uint64_t ra_end; /* the source is advised up to here */
	/* A composite source (the shards of a model folder): part 0 is this
	 * file's own source, part k > 0 the source of parts[k], a file that
	 * only opens and guards it; src is then &mr.r over part_r. */
	size_t nparts;
	struct castfs_file **parts;
	const struct castfs_reader **part_r;
	struct castfs_multi_reader mr;
};

/* Source bytes a sequential reader's source is advised ahead of it. */
#define NS_RA_AHEAD (16u << 20)
/*
 * Reads starting this close to where the last one ended count as
 * sequential: the kernel's read-ahead sends several requests at once and
 * threads serve them in any order.
 */
#define NS_RA_SLACK (8u << 20)

static int file_alloc(struct castfs_ns *ns, int view, struct castfs_file **out)
{
	struct castfs_file *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	atomic_init(&f->refs, 1);
	f->ns = ns;
	f->fd = -1;
	f->view = view;
	*out = f;
	return 0;
}

/*
 * Open source @path and check it is still identity @ident. The guard
 * watches first, so that any write after the identity check is reported;
 * a file open for writing right now is refused with -ESTALE: its bytes are
 * in flux, and the version the reader looked up is going away.
 */
static int open_source(struct castfs_ns *ns, const char *path,
		       const struct stat *ident, struct castfs_file *f)
{
	struct stat now;
	const struct castfs_zst_index *zix = f->ck ? f->ck->zix : NULL;
	/* A pack is read from the file on disk, through its seek table. */
	int fd = ns_src_open_in(ns, zix ? f->ck->path : path, O_RDONLY);
	int watch;

	if (fd < 0)
		return fd == -ENOENT || fd == -ELOOP ? -ESTALE : fd;
	watch = ns_guard_watch(ns, fd);
	if (watch < 0) {
		close(fd);
		return -ESTALE;
	}
	f->guarded = watch == 0;
	if (fstat(fd, &now) < 0 || !ns_same_file(&now, ident)) {
		if (f->guarded)
			ns_guard_unwatch(ns, fd);
		f->guarded = false;
		close(fd);
		return -ESTALE;
	}
	f->fd = fd;
	f->ident = *ident;
	castfs_fd_reader_init(&f->fr, fd);
	/* Under a lease no writer can shorten the file while a read is in
	 * flight: the source may be read through a mapping. */
	if (f->guarded)
		castfs_fd_reader_map(&f->fr);
	f->src = &f->fr.r;
	if (zix) {
		castfs_zst_reader_init(&f->zr, zix, &f->fr.r);
		f->src = &f->zr.r;
	}
	return 0;
}

int ns_file_new_plan(struct castfs_ns *ns, const char *path,
		     const struct stat *ident, struct ns_ckpt *ck,
		     const struct castfs_plan *plan,
		     struct castfs_plan *owned_plan, int view_idx,
		     struct castfs_file **out)
{
	struct castfs_file *f;
	int rc = file_alloc(ns, view_idx, &f);

	if (rc) {
		castfs_plan_free(owned_plan);
		return rc;
	}
	f->plan = plan;
	f->owned = owned_plan;
	f->size = plan->size;
	if (ck) {
		atomic_fetch_add(&ck->refs, 1);
		f->ck = ck;
	}
	if (path) {
		rc = open_source(ns, path, ident, f);
		if (rc) {
			castfs_file_close(f);
			return rc;
		}
	}
	castfs_stats_open(ns->stats, view_idx);
	f->counted = true;
	*out = f;
	return 0;
}

/* Part @k of composite file @f: source @path (@ident) of checkpoint @ck. */
static int part_open(struct castfs_file *f, size_t k, const char *path,
		     const struct stat *ident, struct ns_ckpt *ck)
{
	struct castfs_file *p;
	int rc = file_alloc(f->ns, CASTFS_STATS_OTHER, &p);

	if (rc)
		return rc;
	atomic_fetch_add(&ck->refs, 1);
	p->ck = ck;
	rc = open_source(f->ns, path, ident, p);
	if (rc) {
		castfs_file_close(p);
		return rc;
	}
	f->parts[k] = p;
	f->part_r[k] = p->src;
	return 0;
}

int ns_file_new_parts(struct castfs_ns *ns, size_t n, char *const *paths,
		      const struct stat *idents, struct ns_ckpt *const *cks,
		      const struct castfs_plan *plan,
		      struct castfs_plan *owned_plan, int view_idx,
		      struct castfs_file **out)
{
	struct castfs_file *f;
	int rc = ns_file_new_plan(ns, paths[0], &idents[0], cks[0], plan,
				  owned_plan, view_idx, &f);

	if (rc)
		return rc;
	f->parts = calloc(n, sizeof(*f->parts));
	f->part_r = calloc(n, sizeof(*f->part_r));
	rc = f->parts && f->part_r ? 0 : -ENOMEM;
	if (!rc)
		f->part_r[0] = f->src;
	for (size_t k = 1; !rc && k < n; k++) {
		rc = part_open(f, k, paths[k], &idents[k], cks[k]);
		if (!rc)
			f->nparts = k + 1;
	}
	if (rc) {
		castfs_file_close(f);
		return rc;
	}
	f->nparts = n;
	castfs_multi_reader_init(&f->mr, f->part_r, n);
	f->src = &f->mr.r;
	*out = f;
	return 0;
}

int ns_file_new_layered(struct castfs_ns *ns, const char *path,
			const struct stat *ident, struct ns_ckpt *ck,
			const struct castfs_plan *base,
			const struct castfs_plan *plan,
			struct castfs_plan *owned_plan, int view_idx,
			struct castfs_file **out)
{
	int rc = ns_file_new_plan(ns, path, ident, ck, plan, owned_plan,
				  view_idx, out);

	if (!rc)
		(*out)->base = base;
	return rc;
}

int ns_file_new_source(struct castfs_ns *ns, const char *path,
		       const struct stat *ident, struct castfs_file **out)
{
	struct castfs_file *f;
	int rc = file_alloc(ns, CASTFS_STATS_PASSTHROUGH, &f);

	if (rc)
		return rc;
	rc = open_source(ns, path, ident, f);
	if (rc) {
		castfs_file_close(f);
		return rc;
	}
	f->size = (uint64_t)ident->st_size;
	castfs_stats_open(ns->stats, f->view);
	f->counted = true;
	*out = f;
	return 0;
}

int ns_memshare_new(struct castfs_ns *ns, const void *data, size_t len,
		    struct ns_memshare **out)
{
	struct ns_memshare *m = calloc(1, sizeof(*m));
	int rc = m ? castfs_plan_new_mem(data, len, &m->plan) : -ENOMEM;

	if (rc) {
		free(m);
		return rc;
	}
	atomic_init(&m->refs, 1);
	m->cost = sizeof(*m) + len;
	atomic_fetch_add(&ns->ck_bytes, m->cost);
	*out = m;
	return 0;
}

void ns_memshare_put(struct castfs_ns *ns, struct ns_memshare *m)
{
	if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
		return;
	atomic_fetch_sub(&ns->ck_bytes, m->cost);
	castfs_plan_free(m->plan);
	free(m);
}

int ns_file_new_shared(struct castfs_ns *ns, struct ns_memshare *m,
		       struct castfs_file **out)
{
	int rc = ns_file_new_plan(ns, NULL, NULL, NULL, m->plan, NULL,
				  CASTFS_STATS_OTHER, out);

	if (rc)
		return rc;
	atomic_fetch_add(&m->refs, 1);
	(*out)->shared = m;
	(*out)->direct = true;
	return 0;
}

static ssize_t no_source(void *ctx, void *buf, size_t n, uint64_t off)
{
	(void)ctx;
	(void)buf;
	(void)n;
	(void)off;
	return -EIO; /* a plan of memory only never reads its source */
}

static const struct castfs_reader null_reader = { no_source, NULL, NULL, NULL };

/* A writer came: whatever was read may mix two versions. */
static int stale(struct castfs_file *f)
{
	castfs_stats_count(f->ns->stats, CASTFS_SCTR_STALE_READS, 1);
	return -EIO;
}

/* The bytes just read are only good if the source did not change. */
static int check_source(struct castfs_file *f)
{
	struct stat now;

	if (f->fd < 0)
		return 0;
	if (fstat(f->fd, &now) < 0)
		return -errno;
	if (now.st_size != f->ident.st_size ||
	    now.st_mtim.tv_sec != f->ident.st_mtim.tv_sec ||
	    now.st_mtim.tv_nsec != f->ident.st_mtim.tv_nsec ||
	    now.st_ctim.tv_sec != f->ident.st_ctim.tv_sec ||
	    now.st_ctim.tv_nsec != f->ident.st_ctim.tv_nsec)
		return stale(f);
	return 0;
}

static ssize_t read_source(struct castfs_file *f, void *buf, size_t len,
			   uint64_t off)
{
	if (off >= f->size)
		return 0;
	if (len > f->size - off)
		len = (size_t)(f->size - off);
	return castfs_reader_read(f->src, buf, len, off) ?: (ssize_t)len;
}

/* A plan over a view: its source is the view's plan over the file. */
static ssize_t read_layered(struct castfs_file *f, struct castfs_scratch *s,
			    void *buf, size_t len, uint64_t off)
{
	struct castfs_scratch outer;
	struct castfs_plan_layer l;

	castfs_plan_layer_init(&l, f->base, f->src, s, &outer);
	return castfs_plan_read(f->plan, &l.r, &outer, buf, len, off);
}

/*
 * Sequential readers: ask the kernel to read the source ahead of them
 * (POSIX_FADV_WILLNEED), so that a cold source streams from the disk with
 * requests in flight while the daemon converts. One call per
 * NS_RA_AHEAD / 2 source bytes; random readers get none.
 */
static void source_readahead(struct castfs_file *f, uint64_t off, size_t n)
{
	uint64_t prev, src, end, from;

	prev = atomic_exchange_explicit(&f->next_off, off + n,
					memory_order_relaxed);
	/* a composite source's offsets are no file's offsets */
	if (f->fd < 0 || f->base || f->nparts || off > prev + NS_RA_SLACK ||
	    off + NS_RA_SLACK < prev)
		return;
	if (!f->plan)
		src = off + n;
	else if (off + n < f->plan->size)
		src = castfs_plan_src_off(f->plan, off + n);
	else
		return;
	if (src == UINT64_MAX)
		return;
	/* A pack's plan offsets are decoded ones: advise its frames. */
	if (f->ck && f->ck->zix)
		src = castfs_zst_raw_off(f->ck->zix, src);
	end = atomic_load_explicit(&f->ra_end, memory_order_relaxed);
	if (end >= src + NS_RA_AHEAD / 2 && end <= src + NS_RA_AHEAD)
		return; /* far enough ahead already */
	from = end > src && end < src + NS_RA_AHEAD ? end : src;
	if (!atomic_compare_exchange_strong(&f->ra_end, &end,
					    src + NS_RA_AHEAD))
		return; /* another thread is advising */
	/* A hint: its failure changes nothing. */
	(void)posix_fadvise(f->fd, (off_t)from,
			    (off_t)(src + NS_RA_AHEAD - from),
			    POSIX_FADV_WILLNEED);
}

static ssize_t read_any(struct castfs_file *f, struct castfs_scratch *s,
			void *buf, size_t len, uint64_t off)
{
	if (f->base)
		return read_layered(f, s, buf, len, off);
	if (f->plan)
		return castfs_plan_read(f->plan,
					f->fd >= 0 ? f->src : &null_reader, s,
					buf, len, off);
	return read_source(f, buf, len, off);
}

/* CPU time of the calling thread (converting and its source reads: the
 * kernel's copy out of the page cache is system time of this thread).
 * 0 when the clock fails: the read is then counted as free. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec t;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t))
		return 0;
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The file of part @k of @f (part 0 is @f itself). */
static struct castfs_file *part_of(struct castfs_file *f, size_t k)
{
	return k ? f->parts[k] : f;
}

/* Enter the guard of every source of @f; false (nothing entered) when
 * one of them saw a writer. */
static bool guards_enter(struct castfs_file *f)
{
	const struct castfs_source_guard *g = f->ns->guard;
	size_t n = f->nparts ? f->nparts : 1;

	for (size_t k = 0; k < n; k++) {
		struct castfs_file *p = part_of(f, k);

		if (!p->guarded || g->enter(g->ctx, p->fd))
			continue;
		while (k--) {
			p = part_of(f, k);
			if (p->guarded)
				(void)g->leave(g->ctx, p->fd);
		}
		return false;
	}
	return true;
}

/* Leave the guard of every source of @f; false when one saw a writer. */
static bool guards_leave(struct castfs_file *f)
{
	const struct castfs_source_guard *g = f->ns->guard;
	size_t n = f->nparts ? f->nparts : 1;
	bool ok = true;

	for (size_t k = 0; k < n; k++) {
		struct castfs_file *p = part_of(f, k);

		if (p->guarded && !g->leave(g->ctx, p->fd))
			ok = false;
	}
	return ok;
}

/* check_source() of every source of @f that no guard watches. */
static int sources_check(struct castfs_file *f)
{
	size_t n = f->nparts ? f->nparts : 1;
	int rc = 0;

	for (size_t k = 0; !rc && k < n; k++) {
		struct castfs_file *p = part_of(f, k);

		rc = p->guarded ? 0 : check_source(p);
	}
	return rc;
}

ssize_t castfs_file_read(struct castfs_file *f, struct castfs_scratch *s,
			 void *buf, size_t len, uint64_t off)
{
	uint64_t t0;
	ssize_t n;
	int rc;

	castfs_stats_read_size(f->ns->stats, len);
	if (atomic_load_explicit(&f->fresh_text, memory_order_relaxed)) {
		if (off)
			return -ESTALE;
		atomic_store_explicit(&f->fresh_text, false,
				      memory_order_relaxed);
	}
	if (!guards_enter(f))
		return stale(f);
	/* Views only: the clock is a system call on some hosts (~1 us). */
	t0 = f->view >= 0 ? thread_cpu_ns() : 0;
	n = read_any(f, s, buf, len, off);
	if (f->view >= 0)
		castfs_stats_cpu(f->ns->stats, f->view, thread_cpu_ns() - t0);
	/* Under a lease every writer is reported: no fstat needed. */
	if (!guards_leave(f))
		return stale(f);
	rc = sources_check(f);
	if (rc)
		return rc;
	if (n > 0) {
		castfs_stats_read(f->ns->stats, f->view, (uint64_t)n);
		source_readahead(f, off, (size_t)n);
	}
	return n;
}

void ns_file_fresh_text(struct castfs_file *f)
{
	atomic_store(&f->fresh_text, true);
}

uint64_t castfs_file_size(const struct castfs_file *f)
{
	return f->size;
}

bool castfs_file_is_view(const struct castfs_file *f)
{
	return f->plan != NULL;
}

bool castfs_file_direct_io(const struct castfs_file *f)
{
	return f->direct;
}

int castfs_file_backing_fd(const struct castfs_file *f)
{
	if (f->plan || f->base || f->nparts || f->direct ||
	    (f->ck && f->ck->zix))
		return -1;
	return f->fd;
}

struct castfs_file *castfs_file_hold(struct castfs_file *f)
{
	/* The caller's share keeps refs above zero meanwhile. */
	atomic_fetch_add(&f->refs, 1);
	return f;
}

void castfs_file_close(struct castfs_file *f)
{
	if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	if (f->counted)
		castfs_stats_close(f->ns->stats, f->view);
	for (size_t k = 1; k < f->nparts; k++)
		castfs_file_close(f->parts[k]);
	free(f->parts);
	free(f->part_r);
	if (f->guarded)
		ns_guard_unwatch(f->ns, f->fd);
	if (f->fd >= 0)
		close(f->fd);
	ns_ckpt_put(f->ns, f->ck);
	castfs_plan_free(f->owned);
	ns_memshare_put(f->ns, f->shared);
	free(f);
}
