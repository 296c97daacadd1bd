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

/*
 * A piece of source bytes handed to a visitor (castfs_reader.visit): @n
 * bytes at @bytes; or, when @sm is not NULL, @n / 2 bf16 elements stored
 * as two byte planes (a grouped pack's frame, lib/source/zst_group.c):
 * @sm[k] is element k's sign and 7 mantissa bits (s|mmmmmmm), @ex[k] its
 * 8 exponent bits; or, when @planes is not NULL, @n / w elements of w
 * bytes as w byte planes, @planes[p][k] byte p of element k, for fp32
 * with the exponent first made a byte (kernels/convert.h,
 * castfs_convert_grouped_fn). The bytes are borrowed for the call only.
 */
struct castfs_piece {
	const uint8_t *bytes;
	const uint8_t *sm;
	const uint8_t *ex;
	const uint8_t *const *planes;
	size_t n;
};

typedef int (*castfs_visit_fn)(void *arg, const struct castfs_piece *p);

/* castfs_reader.visit's @how: the element size, and the planes the
 * visitor takes besides bytes: bf16 frames' (@sm, @ex), plain 2-byte
 * frames' (fp16: @planes, low and high bytes), fp32 frames' (@planes,
 * the exponent a byte). */
#define CASTFS_VISIT_SIZE 0xFFu
#define CASTFS_VISIT_BF16 0x100u
#define CASTFS_VISIT_F16 0x200u
#define CASTFS_VISIT_F32 0x400u

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
	 * Optional (NULL: not offered). Hand the @n bytes at @off, elements
	 * of (@how & CASTFS_VISIT_SIZE) bytes (2 or 4), to @fn as pieces of
	 * whole elements, in order, without copying them where the reader
	 * can (a grouped pack's frame as its planes where @how takes that
	 * frame's kind, else un-grouped a cache-sized piece at a time).
	 * Returns 0, @fn's or the read's negative errno (pieces before it
	 * were handed, and maybe the piece the read failed on: a grouped
	 * pack read through a mapping verifies a frame once handed, so
	 * what @fn made of it is garbage then), or -ENOTSUP, having handed
	 * nothing, when the reader declines this range (read it with pread
	 * then).
	 */
	int (*visit)(void *ctx, uint64_t off, size_t n, unsigned how,
		     castfs_visit_fn fn, void *arg);
	/*
	 * Optional (NULL: not offered). Hand the @n bytes at @off to @fn as
	 * one piece of plain bytes where they lie (a mapping of the source),
	 * saving the copy a pread makes. Returns @fn's result; -EIO when a
	 * byte of the range could not be read (@fn may have been abandoned
	 * part-way: its output is garbage then); -ENOTSUP, having called
	 * nothing, when the reader declines the range.
	 */
	int (*map)(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		   void *arg);
};

/* castfs_reader_map - call @r->map; -ENOTSUP (nothing called) when @r
 * offers none. */
int castfs_reader_map(const struct castfs_reader *r, uint64_t off, size_t n,
		      castfs_visit_fn fn, void *arg);

/* castfs_reader_read - call @r->pread; map short reads to -EIO. */
int castfs_reader_read(const struct castfs_reader *r, void *buf, size_t n,
		       uint64_t off);

/*
 * A reader over a file descriptor (pread, retrying EINTR and partial
 * reads). @fd stays owned by the caller. Thread-safe: pread has no offset.
 */
struct castfs_fd_reader {
	struct castfs_reader r;
	int fd;
};

void castfs_fd_reader_init(struct castfs_fd_reader *fr, int fd);

/* Ranges at least this long are worth a mapping (castfs_fd_reader_map). */
#define CASTFS_MAP_MIN (64u << 10)

/*
 * castfs_fd_reader_map - offer the map op on @fr: ranges of at least
 * CASTFS_MAP_MIN bytes are mapped for the call (mmap, populated in one
 * system call, unmapped after, so the daemon's RSS does not grow with the
 * source), under castfs_fault_call(). Only for a file that nobody can
 * shorten while a read is in flight (a read lease held across each read):
 * a page that still cannot be read is -EIO, not a crash, once the
 * process routes SIGBUS to castfs_fault_escape().
 */
void castfs_fd_reader_map(struct castfs_fd_reader *fr);

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
 * (a plan never asks for one). A visit goes to the part's visit op
 * (-ENOTSUP when it has none). Thread-safe if the parts are.
 */
void castfs_multi_reader_init(struct castfs_multi_reader *mr,
			      const struct castfs_reader *const *parts,
			      size_t n);

#endif
