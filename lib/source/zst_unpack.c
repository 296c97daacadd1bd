/* SPDX-License-Identifier: MIT */
/*
 * castfs_zst_unpack: a pack's decoded bytes written out in order, its
 * frames decoded (and their checksums checked) by several threads at once
 * through the reader a mount serves the pack with.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "source/zst.h"
#include "source/zst_internal.h"

/* Decoded bytes a step holds (or one frame, where it is larger). */
#define UNPACK_STEP (4u << 20)
/* The threads' buffers together, at most (one thread gets its own). */
#define UNPACK_MAX_BUFFERS ((size_t)256 << 20)

/* The steps, whole frames each, taken in file order by the threads of an
 * ordered pipeline (zst_pipe_run()) and written in that order. */
struct unpack_job {
	const struct castfs_zst_index *ix;
	struct castfs_zst_reader zr;
	const struct castfs_zst_unpack_opts *o;
	const struct castfs_writer *w;
	size_t cap; /* the largest step */
	size_t next; /* the next step's first frame */
	uint64_t done; /* bytes written */
};

/* A thread's buffer and step: frames [first, end). */
struct unpack_slot {
	uint8_t *buf;
	size_t first, end;
};

/* The end of the step starting at frame @i: whole frames up to
 * UNPACK_STEP bytes, or the one frame that is larger. */
static size_t step_end(const struct castfs_zst_index *ix, size_t i)
{
	uint64_t off = ix->doff[i];
	size_t j = i;

	/* Empty (skippable) frames ride along with their neighbours. */
	while (j < ix->nframes &&
	       (ix->doff[j] == off || ix->doff[j + 1] - off <= UNPACK_STEP))
		j++;
	return j;
}

/* The largest step of @ix, at least 1 byte (an empty file's buffer). */
static size_t step_cap(const struct castfs_zst_index *ix)
{
	uint64_t cap = 1;

	for (size_t i = 0, j; i < ix->nframes; i = j) {
		j = step_end(ix, i);
		cap = CASTFS_MAX(cap, ix->doff[j] - ix->doff[i]);
	}
	return (size_t)cap;
}

static bool unpack_take(void *ctx, void *slot)
{
	struct unpack_job *j = ctx;
	struct unpack_slot *sl = slot;
	const struct castfs_zst_index *ix = j->ix;

	if (j->next >= ix->nframes)
		return false;
	sl->first = j->next;
	sl->end = step_end(ix, j->next);
	j->next = sl->end;
	return true;
}

/* Why frame @i (decoded bytes [@at, @at + @n)) failed with @rc. */
static int frame_failed(struct castfs_diag *d, int rc, size_t i, uint64_t at,
			size_t n)
{
	return castfs_diag_set(d, rc,
			       "frame %zu (decoded bytes %llu to %llu) %s", i,
			       (unsigned long long)at,
			       (unsigned long long)(at + n),
			       rc == -EIO ? "does not decode or its checksum "
					    "mismatches" :
					    "could not be read");
}

/* The pipeline's work: the step's frames decoded one by one (each
 * straight into the buffer), so a failure names its frame. */
static int unpack_decode(void *ctx, void *slot, struct castfs_diag *d)
{
	const struct unpack_job *j = ctx;
	const struct castfs_zst_index *ix = j->ix;
	struct unpack_slot *sl = slot;

	for (size_t i = sl->first; i < sl->end; i++) {
		uint64_t at = ix->doff[i];
		size_t n = (size_t)(ix->doff[i + 1] - at);
		int rc;

		if (n == 0)
			continue; /* an empty (skippable) frame */
		rc = castfs_reader_read(
			&j->zr.r, sl->buf + (at - ix->doff[sl->first]), n, at);
		if (rc)
			return frame_failed(d, rc, i, at, n);
	}
	return 0;
}

/* The pipeline's commit: the step written, in order. */
static int unpack_write(void *ctx, void *slot, struct castfs_diag *d)
{
	struct unpack_job *j = ctx;
	const struct unpack_slot *sl = slot;
	size_t n = (size_t)(j->ix->doff[sl->end] - j->ix->doff[sl->first]);
	int rc = j->w->write(j->w->ctx, sl->buf, n);

	if (rc)
		return castfs_diag_set(d, rc, "writing the output: %s",
				       strerror(-rc));
	j->done += n;
	rc = j->o && j->o->progress ?
		     j->o->progress(j->o->progress_ctx, j->done,
				    castfs_zst_index_size(j->ix)) :
		     0;
	return rc ? castfs_diag_set(d, rc, "stopped by its caller") : 0;
}

static int unpack_slot_init(void *ctx, void *slot)
{
	const struct unpack_job *j = ctx;
	struct unpack_slot *sl = slot;

	sl->buf = malloc(j->cap);
	return sl->buf ? 0 : -ENOMEM;
}

static void unpack_slot_free(void *ctx, void *slot)
{
	struct unpack_slot *sl = slot;

	(void)ctx;
	free(sl->buf);
}

static const struct zst_pipe_ops unpack_ops = {
	.slot_size = sizeof(struct unpack_slot),
	.slot_init = unpack_slot_init,
	.slot_free = unpack_slot_free,
	.take = unpack_take,
	.work = unpack_decode,
	.commit = unpack_write,
};

int castfs_zst_unpack(const struct castfs_zst_index *ix,
		      const struct castfs_reader *raw,
		      const struct castfs_zst_unpack_opts *o,
		      const struct castfs_writer *w, struct castfs_diag *d)
{
	struct unpack_job j = { .ix = ix, .o = o, .w = w, .cap = step_cap(ix) };
	size_t fit = CASTFS_MAX(UNPACK_MAX_BUFFERS / j.cap, 1);
	unsigned threads = o ? o->threads : 0;

	castfs_zst_reader_init(&j.zr, ix, raw);
	threads = (unsigned)CASTFS_MIN((size_t)threads, fit);
	return zst_pipe_run(&unpack_ops, &j, threads, d);
}
