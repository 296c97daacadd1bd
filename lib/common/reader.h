/* SPDX-License-Identifier: MIT */
/*
 * The one way libcastfs reads source bytes: a small vtable, so that tests can
 * use memory-backed sources and the daemon a file descriptor.
 */
#ifndef CASTFS_READER_H
#define CASTFS_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct castfs_lend;

struct castfs_reader {
	/*
	 * Read exactly @n bytes at @off into @buf. Returns @n, or a negative
	 * errno. A short read is the reader's error to report (-EIO): the
	 * plan never asks for bytes past the end of the source it was built
	 * from, so a short read means the source changed or failed.
	 */
	ssize_t (*pread)(void *ctx, void *buf, size_t n, uint64_t off);
	void *ctx;
	/*
	 * Optional (NULL: never lends): lend source bytes at @off without
	 * copying them, see castfs_reader_lend(). Readers whose bytes already
	 * sit in memory they own (a decoded frame in the zst cache) lend them,
	 * so that a generator converts straight from there.
	 */
	int (*lend)(void *ctx, uint64_t off, size_t n, struct castfs_lend *l);
	/* Give back what lend() lent (called with the lending reader's ctx). */
	void (*unlend)(void *ctx, void *token);
};

/*
 * Source bytes lent by a reader: @len bytes at @p, valid and unchanged
 * until castfs_reader_unlend(); or, when @p is NULL, nothing lent and
 * @len the bytes the caller had best read with pread first.
 */
struct castfs_lend {
	const void *p;
	size_t len;
	const struct castfs_reader *owner; /* the reader that lent them */
	void *token; /* the owner's, for unlend() */
};

/* castfs_reader_read - call @r->pread; map short reads to -EIO. */
int castfs_reader_read(const struct castfs_reader *r, void *buf, size_t n,
		       uint64_t off);

/*
 * castfs_reader_lend - lend up to @n (> 0) bytes at @off of @r into @l.
 * On 0, either @l->p holds 1..@n bytes at @off, pinned until
 * castfs_reader_unlend(@l) (the caller must call it, once), or @l->p is
 * NULL and @l->len (1..@n) says how many bytes to read with pread before
 * asking again (all @n for a reader that never lends). Returns a negative
 * errno as pread would (-EIO for a frame that fails), then nothing is
 * lent. Thread-safe if @r is.
 */
int castfs_reader_lend(const struct castfs_reader *r, uint64_t off, size_t n,
		       struct castfs_lend *l);

/* castfs_reader_unlend - give back what @l holds (nothing if @l->p is NULL). */
void castfs_reader_unlend(const struct castfs_lend *l);

/*
 * A reader over a file descriptor (pread, retrying EINTR and partial
 * reads). @fd stays owned by the caller. Thread-safe: pread has no offset.
 */
struct castfs_fd_reader {
	struct castfs_reader r;
	int fd;
};

void castfs_fd_reader_init(struct castfs_fd_reader *fr, int fd);

/* A reader over caller-owned memory of @len bytes; for tests and fuzzers. */
struct castfs_mem_reader {
	struct castfs_reader r;
	const uint8_t *data;
	size_t len;
};

void castfs_mem_reader_init(struct castfs_mem_reader *mr, const void *data,
			    size_t len);

/*
 * A composite source of several parts (the shards of a model folder): the
 * top bits of a source offset select the part, so that one plan can point
 * into several files. Byte @off of part @k is at castfs_part_off(k, off).
 */
#define CASTFS_PART_SHIFT 48
#define CASTFS_PART_MAX 4096u /* parts a composite reader accepts */

static inline uint64_t castfs_part_off(size_t k, uint64_t off)
{
	return ((uint64_t)k << CASTFS_PART_SHIFT) | off;
}

struct castfs_multi_reader {
	struct castfs_reader r;
	const struct castfs_reader *const *parts;
	size_t n;
};

/*
 * castfs_multi_reader_init - a reader over the @n readers @parts (borrowed:
 * they and the array must outlive @mr). A read of a part that does not
 * exist, or one that crosses the end of a part's offset space, is -EIO
 * (a plan never asks for one). Thread-safe if the parts are.
 */
void castfs_multi_reader_init(struct castfs_multi_reader *mr,
			      const struct castfs_reader *const *parts,
			      size_t n);

#endif
