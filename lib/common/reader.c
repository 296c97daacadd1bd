/* SPDX-License-Identifier: MIT */
/* fd-, memory-backed and composite implementations of struct castfs_reader. */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/reader.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

int castfs_reader_read(const struct castfs_reader *r, void *buf, size_t n,
		       uint64_t off)
{
	ssize_t got = r->pread(r->ctx, buf, n, off);

	if (got < 0)
		return (int)got;
	return (size_t)got == n ? 0 : -EIO;
}

int castfs_reader_map(const struct castfs_reader *r, uint64_t off, size_t n,
		      castfs_visit_fn fn, void *arg)
{
	return r->map ? r->map(r->ctx, off, n, fn, arg) : -ENOTSUP;
}

static ssize_t fd_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct castfs_fd_reader *fr = ctx;
	size_t done = 0;

	while (done < n) {
		ssize_t got = pread(fr->fd, (char *)buf + done, n - done,
				    (off_t)(off + done));

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			break; /* EOF: the caller turns the short count into EIO */
		done += (size_t)got;
	}
	return (ssize_t)done;
}

void castfs_fd_reader_init(struct castfs_fd_reader *fr, int fd)
{
	fr->r.pread = fd_pread;
	fr->r.ctx = fr;
	fr->r.visit = NULL;
	fr->r.map = NULL;
	fr->fd = fd;
}

/* Set once a kernel refuses MADV_POPULATE_READ: mapping is then no gain. */
static atomic_bool populate_unsupported;

struct map_call {
	castfs_visit_fn fn;
	void *arg;
	struct castfs_piece piece;
};

static int map_call_run(void *arg)
{
	struct map_call *c = arg;

	return c->fn(c->arg, &c->piece);
}

static int fd_map(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		  void *arg)
{
	const struct castfs_fd_reader *fr = ctx;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t lo = off & ~(page - 1);
	size_t len = (size_t)(off + n - lo);
	struct map_call c = { .fn = fn, .arg = arg };
	uint8_t *p;
	int rc;

	if (n < CASTFS_MAP_MIN || atomic_load(&populate_unsupported))
		return -ENOTSUP;
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, fr->fd, (off_t)lo);
	if (p == MAP_FAILED)
		return -ENOTSUP; /* pread will say what is wrong, if anything */
	/*
	 * One system call maps every page (instead of a fault per 64 KiB),
	 * and a page that cannot be read fails here, not as a SIGBUS: pread
	 * then reports the error.
	 */
	if (madvise(p, len, MADV_POPULATE_READ) < 0) {
		if (errno == EINVAL)
			atomic_store(&populate_unsupported, true);
		munmap(p, len);
		return -ENOTSUP;
	}
	c.piece.bytes = p + (off - lo);
	c.piece.n = n;
	rc = castfs_fault_call(p, len, map_call_run, &c);
	munmap(p, len);
	return rc;
}

void castfs_fd_reader_map(struct castfs_fd_reader *fr)
{
	fr->r.map = fd_map;
}

static ssize_t mem_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct castfs_mem_reader *mr = ctx;
	size_t avail;

	if (off >= mr->len)
		return 0;
	avail = mr->len - (size_t)off;
	if (n > avail)
		n = avail;
	memcpy(buf, mr->data + off, n);
	return (ssize_t)n;
}

void castfs_mem_reader_init(struct castfs_mem_reader *mr, const void *data,
			    size_t len)
{
	mr->r.pread = mem_pread;
	mr->r.ctx = mr;
	mr->r.visit = NULL;
	mr->r.map = NULL;
	mr->data = data;
	mr->len = len;
}

/* The part holding [@off, @off + @n) and the offset in it; NULL when the
 * range is not inside one part (every extent lies inside one tensor, hence
 * inside one part, so that is a lie of the caller's). */
static const struct castfs_reader *part_of(const struct castfs_multi_reader *mr,
					   uint64_t off, size_t n, uint64_t *in)
{
	uint64_t k = off >> CASTFS_PART_SHIFT;

	*in = off & ((UINT64_C(1) << CASTFS_PART_SHIFT) - 1);
	if (k >= mr->n || n > (UINT64_C(1) << CASTFS_PART_SHIFT) - *in)
		return NULL;
	return mr->parts[k];
}

static ssize_t multi_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	uint64_t in;
	const struct castfs_reader *p = part_of(ctx, off, n, &in);

	return p ? p->pread(p->ctx, buf, n, in) : -EIO;
}

/* A visit or a mapping (@map) goes to the part's own op: the shards of
 * a model folder may be grouped packs, or leased files. */
static int multi_hand(void *ctx, uint64_t off, size_t n, unsigned how,
		      castfs_visit_fn fn, void *arg, bool map)
{
	uint64_t in;
	const struct castfs_reader *p = part_of(ctx, off, n, &in);

	if (!p)
		return -EIO;
	if (map)
		return p->map ? p->map(p->ctx, in, n, fn, arg) : -ENOTSUP;
	return p->visit ? p->visit(p->ctx, in, n, how, fn, arg) : -ENOTSUP;
}

static int multi_visit(void *ctx, uint64_t off, size_t n, unsigned how,
		       castfs_visit_fn fn, void *arg)
{
	return multi_hand(ctx, off, n, how, fn, arg, false);
}

static int multi_map(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		     void *arg)
{
	return multi_hand(ctx, off, n, 0, fn, arg, true);
}

void castfs_multi_reader_init(struct castfs_multi_reader *mr,
			      const struct castfs_reader *const *parts,
			      size_t n)
{
	mr->r.pread = multi_pread;
	mr->r.ctx = mr;
	mr->r.visit = multi_visit;
	mr->r.map = multi_map;
	mr->parts = parts;
	mr->n = n;
}
