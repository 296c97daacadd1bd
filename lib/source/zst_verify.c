/* SPDX-License-Identifier: MIT */
/*
 * castfs_zst_verify: a pack read back through the reader a mount serves it
 * with, against the original. castfs pack runs it before the pack takes its
 * name (and before --remove deletes the original): the tiered coder and the
 * grouping are castfs's own code, and a frame they get wrong would carry a
 * checksum of its wrong bytes, which no later read could tell from right.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "source/zst.h"
#include "source/zst_internal.h"

/* Bytes compared per step: two buffers of this per thread, plus the
 * frame cache the threads share. */
#define VERIFY_CHUNK (4u << 20)

/* The steps, taken in offset order by the threads of an ordered
 * pipeline (zst_pipe_run()). */
struct verify_job {
	const struct castfs_reader *zr, *orig;
	uint64_t size;
	const struct castfs_zst_verify_opts *o;
	uint64_t next; /* the next step's offset */
	uint64_t done; /* bytes compared so far */
};

/* A thread's buffers and step. */
struct verify_slot {
	uint8_t *got, *want;
	uint64_t off;
	size_t n;
};

/* The first offset in [0, @n) where @a and @b differ; @n if none. */
static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	size_t i = 0;

	/* memcmp is the fast scan; the byte loop only runs on a mismatch. */
	if (!memcmp(a, b, n))
		return n;
	while (a[i] == b[i])
		i++;
	return i;
}

/* The pipeline's work: one step compared, or the error with the first
 * differing offset in its reason. */
static int verify_step(void *ctx, void *slot, struct castfs_diag *d)
{
	const struct verify_job *j = ctx;
	struct verify_slot *sl = slot;
	size_t i;
	int rc = castfs_reader_read(j->orig, sl->want, sl->n, sl->off);

	if (rc)
		return castfs_diag_set(d, rc, "reading the original at %llu",
				       (unsigned long long)sl->off);
	rc = castfs_reader_read(j->zr, sl->got, sl->n, sl->off);
	if (rc)
		return castfs_diag_set(d, rc,
				       "the pack does not decode at %llu (a "
				       "frame fails or its checksum "
				       "mismatches)",
				       (unsigned long long)sl->off);
	i = first_diff(sl->got, sl->want, sl->n);
	if (i == sl->n)
		return 0;
	return castfs_diag_set(d, -EBADMSG,
			       "the pack decodes to other bytes than the "
			       "original from byte %llu",
			       (unsigned long long)(sl->off + i));
}

/* The pipeline's take: the next step; the steps are in offset order, so
 * the first failing one holds the first failure in the file. */
static bool verify_take(void *ctx, void *slot)
{
	struct verify_job *j = ctx;
	struct verify_slot *sl = slot;

	if (j->next >= j->size)
		return false;
	sl->off = j->next;
	sl->n = (size_t)CASTFS_MIN(j->size - j->next, VERIFY_CHUNK);
	j->next += sl->n;
	return true;
}

/* The pipeline's commit: progress, in order. */
static int verify_commit(void *ctx, void *slot, struct castfs_diag *d)
{
	struct verify_job *j = ctx;
	const struct verify_slot *sl = slot;
	int rc;

	j->done += sl->n;
	rc = j->o && j->o->progress ?
		     j->o->progress(j->o->progress_ctx, j->done, j->size) :
		     0;
	return rc ? castfs_diag_set(d, rc, "stopped by its caller") : 0;
}

static void verify_slot_free(void *ctx, void *slot)
{
	struct verify_slot *sl = slot;

	(void)ctx;
	free(sl->got);
	free(sl->want);
}

static int verify_slot_init(void *ctx, void *slot)
{
	const struct verify_job *j = ctx;
	struct verify_slot *sl = slot;
	/* A small pack needs no more than its size. */
	size_t cap = (size_t)CASTFS_MAX(CASTFS_MIN(j->size, VERIFY_CHUNK), 1);

	sl->got = malloc(cap);
	sl->want = malloc(cap);
	if (sl->got && sl->want)
		return 0;
	verify_slot_free(ctx, sl);
	return -ENOMEM;
}

static const struct zst_pipe_ops verify_ops = {
	.slot_size = sizeof(struct verify_slot),
	.slot_init = verify_slot_init,
	.slot_free = verify_slot_free,
	.take = verify_take,
	.work = verify_step,
	.commit = verify_commit,
};

int castfs_zst_verify(const struct castfs_reader *pack, uint64_t pack_size,
		      const struct castfs_reader *orig, uint64_t orig_size,
		      const struct castfs_zst_verify_opts *o,
		      struct castfs_diag *d)
{
	struct castfs_zst_index *ix = NULL;
	struct castfs_zst_reader zr;
	struct verify_job j = {
		.zr = &zr.r, .orig = orig, .size = orig_size, .o = o
	};
	struct castfs_zcache *c;
	int rc = castfs_zcache_new(CASTFS_ZCACHE_DEFAULT, &c);

	if (rc)
		return rc;
	rc = castfs_zst_index_read(pack, pack_size, c, &ix, d);
	if (!rc && castfs_zst_index_size(ix) != orig_size)
		rc = castfs_diag_set(
			d, -EBADMSG,
			"the pack decodes to %llu bytes, the "
			"original has %llu",
			(unsigned long long)castfs_zst_index_size(ix),
			(unsigned long long)orig_size);
	if (!rc) {
		castfs_zst_reader_init(&zr, ix, pack);
		rc = zst_pipe_run(&verify_ops, &j, o ? o->threads : 0, d);
	}
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return rc;
}
