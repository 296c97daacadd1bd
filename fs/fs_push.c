/* SPDX-License-Identifier: MIT */
/*
 * Push-ahead (-o push_kb=N): when an open file is read sequentially, a
 * thread of its own converts the next N KiB beyond the reader and stores
 * them in the kernel's page cache (fuse_lowlevel_notify_store), so that
 * the reader's next reads and faults hit the cache instead of a round trip.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs.h"

/* Open files followed at once; the least recently read one is replaced. */
#define PUSH_STREAMS 8
/* One store: the kernel copies it into its pages in one write. */
#define PUSH_CHUNK (1u << 20)
/* A read this close to the last one (or to the pushed end) continues a
 * stream; one farther away is a random read and stops the pushing. */
#define PUSH_NEAR (2u << 20)
#define PUSH_PAGE 4096u

struct push_stream {
	uint64_t fh; /* 0: free slot */
	uint64_t ino;
	uint64_t size;
	uint64_t read_end; /* where the reader's last read ended */
	uint64_t pushed; /* bytes before this are in the kernel's cache */
	uint64_t target; /* push up to here */
	uint64_t used; /* LRU clock */
	/* The push file: opened by node id, owned by this stream, so that a
	 * RELEASE of the kernel's fh never waits for a push. */
	struct castfs_file *pf;
	bool busy; /* the thread is pushing from it (pf in use) */
	bool gone; /* released while busy: the thread frees it */
};

struct castfs_push {
	struct castfs_fs *fs;
	uint64_t ahead;
	uint64_t skip; /* the mount's read-ahead window */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;
	uint64_t clock;
	struct push_stream st[PUSH_STREAMS];
	struct castfs_scratch s;
	char *buf;
};

static struct push_stream *stream_find(struct castfs_push *p, uint64_t fh)
{
	for (size_t i = 0; i < PUSH_STREAMS; i++)
		if (p->st[i].fh == fh)
			return &p->st[i];
	return NULL;
}

/* A slot for a new stream: a free one, else the least recently read one
 * that is not being pushed (its push file is closed by the caller). */
static struct push_stream *stream_slot(struct castfs_push *p,
				       struct castfs_file **close_out)
{
	struct push_stream *best = NULL;

	for (size_t i = 0; i < PUSH_STREAMS; i++) {
		struct push_stream *s = &p->st[i];

		if (!s->fh)
			return s;
		if (!s->busy && (!best || s->used < best->used))
			best = s;
	}
	if (best) {
		*close_out = best->pf;
		memset(best, 0, sizeof(*best));
	}
	return best;
}

/* Under p->lock: a read of [@off, @off + @n) of stream @s. */
static void stream_read(struct castfs_push *p, struct push_stream *s,
			uint64_t off, uint64_t n)
{
	uint64_t end = off + n;
	uint64_t far =
		(s->pushed > s->read_end ? s->pushed : s->read_end) + PUSH_NEAR;
	bool seq = off + PUSH_NEAR >= s->read_end && off <= far;

	s->used = ++p->clock;
	if (!seq) {
		/* Random: stop; a push in flight ends with its chunk. */
		s->read_end = end;
		s->pushed = end;
		s->target = end;
		return;
	}
	if (end > s->read_end)
		s->read_end = end;
	/* The reader is past what was pushed: the kernel's own read-ahead
	 * has asked for the next window already; pushing it would only wait
	 * for its pages and copy the same bytes again. */
	if (end > s->pushed)
		s->pushed = end + p->skip;
	s->target = s->read_end + p->ahead;
	if (s->target > s->size)
		s->target = s->size;
	if (s->target > s->pushed)
		pthread_cond_signal(&p->wake);
}

void castfs_push_hint(struct castfs_push *p, uint64_t ino, uint64_t fh,
		      uint64_t off, size_t n, uint64_t size)
{
	struct castfs_file *drop = NULL;
	struct push_stream *s;

	if (!p || !fh || !n)
		return;
	pthread_mutex_lock(&p->lock);
	s = stream_find(p, fh);
	if (s) {
		stream_read(p, s, off, n);
	} else if ((s = stream_slot(p, &drop))) {
		/* The first read of a stream pushes nothing: one read is not
		 * yet a sequential reader. */
		*s = (struct push_stream){ .fh = fh, .ino = ino, .size = size };
		s->read_end = s->pushed = s->target = off + n;
		s->used = ++p->clock;
	}
	pthread_mutex_unlock(&p->lock);
	castfs_file_close(drop);
}

void castfs_push_forget(struct castfs_push *p, uint64_t fh)
{
	struct castfs_file *drop = NULL;
	struct push_stream *s;

	if (!p || !fh)
		return;
	pthread_mutex_lock(&p->lock);
	s = stream_find(p, fh);
	if (s && s->busy) {
		s->gone = true;
		s->target = s->pushed;
	} else if (s) {
		drop = s->pf;
		memset(s, 0, sizeof(*s));
	}
	pthread_mutex_unlock(&p->lock);
	castfs_file_close(drop);
}

/* Under p->lock: a stream with bytes to push, marked busy, or NULL. */
static struct push_stream *next_work(struct castfs_push *p)
{
	for (size_t i = 0; i < PUSH_STREAMS; i++) {
		struct push_stream *s = &p->st[i];

		if (s->fh && !s->busy && !s->gone && s->target > s->pushed) {
			s->busy = true;
			return s;
		}
	}
	return NULL;
}

/*
 * Store [@off, @off + @len) of @pf in the kernel's cache of @ino. The
 * bytes come from a guarded read (never two versions of the source); the
 * check after the store asks the guard again: if a writer came
 * meanwhile, the pages stored may be older than the change it is making,
 * so they are dropped again. A writer waits for castfs before it
 * changes anything (the lease), so pages that pass the second check were
 * stored before the change began, like any page a read brought in.
 */
static int push_chunk(struct castfs_push *p, struct castfs_file *pf,
		      uint64_t ino, uint64_t off, size_t len)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);
	ssize_t n = castfs_file_read(pf, &p->s, p->buf, len, off);
	int rc;

	if (n <= 0)
		return n < 0 ? (int)n : -ENODATA;
	bv.buf[0].size = (size_t)n;
	bv.buf[0].mem = p->buf;
	rc = fuse_lowlevel_notify_store(p->fs->se, ino, (off_t)off, &bv, 0);
	if (rc)
		return rc;
	rc = castfs_file_check(pf);
	if (rc)
		fuse_lowlevel_notify_inval_inode(p->fs->se, ino, 0, 0);
	return rc;
}

/* Push one chunk of @s (busy, so s->pf and s->ino are the thread's). */
static void push_one(struct castfs_push *p, struct push_stream *s)
{
	struct castfs_file *drop = NULL;
	uint64_t off, len;
	int rc = 0;

	/* Whole pages, so that the kernel marks them up to date. */
	off = s->pushed & ~(uint64_t)(PUSH_PAGE - 1);
	len = s->target - off;
	if (len > PUSH_CHUNK)
		len = PUSH_CHUNK;
	pthread_mutex_unlock(&p->lock);
	if (!s->pf)
		rc = castfs_ns_open(p->fs->ns, s->ino, &s->pf);
	if (!rc)
		rc = push_chunk(p, s->pf, s->ino, off, (size_t)len);
	pthread_mutex_lock(&p->lock);
	s->busy = false;
	if (s->gone || rc) {
		/* Released, or the source changed (or the kernel forgot the
		 * node): nothing more for this stream. */
		drop = s->pf;
		if (s->gone)
			memset(s, 0, sizeof(*s));
		else
			s->pf = NULL, s->target = s->pushed;
	} else if (off + len > s->pushed) {
		s->pushed = off + len;
	}
	if (drop) {
		pthread_mutex_unlock(&p->lock);
		castfs_file_close(drop);
		pthread_mutex_lock(&p->lock);
	}
}

static void *push_main(void *arg)
{
	struct castfs_push *p = arg;
	struct push_stream *s;

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		s = next_work(p);
		if (s)
			push_one(p, s);
		else
			pthread_cond_wait(&p->wake, &p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int castfs_push_start(struct castfs_fs *fs, unsigned ahead_kb,
		      struct castfs_push **out)
{
	struct castfs_push *p;
	int rc = -ENOMEM;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->fs = fs;
	p->ahead = (uint64_t)ahead_kb << 10;
	p->skip = getenv("CASTFS_PUSH_SKIP_KB") ?
			  (uint64_t)atoi(getenv("CASTFS_PUSH_SKIP_KB")) << 10 :
			  (uint64_t)fs->read_ahead_kb << 10;
	p->buf = malloc(PUSH_CHUNK);
	if (!p->buf || castfs_scratch_init(&p->s))
		goto out_free;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	rc = -pthread_create(&p->thread, NULL, push_main, p);
	if (rc)
		goto out_destroy;
	*out = p;
	return 0;
out_destroy:
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
out_free:
	castfs_scratch_fini(&p->s);
	free(p->buf);
	free(p);
	return rc;
}

int castfs_push_stop(struct castfs_push *p)
{
	struct timespec until;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	/* A store waits for pages a read holds locked; after the loop
	 * stopped that read is never answered: bounded wait, as the watcher. */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	if (pthread_timedjoin_np(p->thread, NULL, &until))
		return -EBUSY;
	for (size_t i = 0; i < PUSH_STREAMS; i++)
		castfs_file_close(p->st[i].pf);
	castfs_scratch_fini(&p->s);
	free(p->buf);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return 0;
}
