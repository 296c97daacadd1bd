/* SPDX-License-Identifier: MIT */
/*
 * castfs_zst_verify: a pack read back through the reader a mount serves it
 * with, against the original. castfs pack runs it before the pack takes its
 * name (and before --remove deletes the original): the tiered coder and the
 * grouping are castfs's own code, and a frame they get wrong would carry a
 * checksum of its wrong bytes, which no later read could tell from right.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "source/zst.h"
#include "source/zst_internal.h"

/* Bytes compared per step: two buffers of this per thread, plus the
 * frame cache the threads share. */
#define VERIFY_CHUNK (4u << 20)

/* The steps, handed out in offset order to the threads. */
struct verify_job {
	const struct castfs_reader *zr, *orig;
	uint64_t size;
	const struct castfs_zst_verify_opts *o;
	pthread_mutex_t lock;
	uint64_t next; /* the next step's offset */
	uint64_t done; /* bytes compared so far */
	uint64_t bad; /* the lowest offset that failed; UINT64_MAX: none */
	int rc; /* its error */
	struct castfs_diag d; /* its reason */
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

/* One step: 0, or the error with its offset in *@at and reason in @d. */
static int verify_step(const struct verify_job *j, uint64_t off, size_t n,
		       uint8_t *got, uint8_t *want, uint64_t *at,
		       struct castfs_diag *d)
{
	size_t i;
	int rc = castfs_reader_read(j->orig, want, n, off);

	*at = off;
	if (rc)
		return castfs_diag_set(d, rc, "reading the original at %llu",
				       (unsigned long long)off);
	rc = castfs_reader_read(j->zr, got, n, off);
	if (rc)
		return castfs_diag_set(d, rc,
				       "the pack does not decode at %llu (a "
				       "frame fails or its checksum "
				       "mismatches)",
				       (unsigned long long)off);
	i = first_diff(got, want, n);
	if (i == n)
		return 0;
	*at = off + i;
	return castfs_diag_set(d, -EBADMSG,
			       "the pack decodes to other bytes than the "
			       "original from byte %llu",
			       (unsigned long long)*at);
}

/* Under j->lock: keep failure @rc at @at if it lies before the one kept. */
static void job_fail_locked(struct verify_job *j, uint64_t at, int rc,
			    const struct castfs_diag *d)
{
	if (at >= j->bad)
		return;
	j->bad = at;
	j->rc = rc;
	j->d = *d;
}

/* Take steps until none is left below the lowest failure: so the failure
 * reported is the first in the file, whatever the threads' timing. */
static void *verify_run(void *arg)
{
	struct verify_job *j = arg;
	/* A small pack needs no more than its size. */
	size_t cap = (size_t)CASTFS_MAX(CASTFS_MIN(j->size, VERIFY_CHUNK), 1);
	uint8_t *got = malloc(cap), *want = malloc(cap);
	struct castfs_diag d = { { 0 } };

	pthread_mutex_lock(&j->lock);
	/* Without buffers this thread takes no step; a difference another
	 * one found says more than ENOMEM. */
	if ((!got || !want) && j->bad == UINT64_MAX)
		job_fail_locked(j, 0, -ENOMEM, &d);
	while (got && want && j->next < j->size && j->next < j->bad) {
		uint64_t off = j->next, at;
		size_t n = (size_t)CASTFS_MIN(j->size - off, VERIFY_CHUNK);
		int rc;

		j->next += VERIFY_CHUNK;
		pthread_mutex_unlock(&j->lock);
		castfs_diag_clear(&d);
		rc = verify_step(j, off, n, got, want, &at, &d);
		pthread_mutex_lock(&j->lock);
		j->done += n;
		if (rc)
			job_fail_locked(j, at, rc, &d);
		else if (j->bad == UINT64_MAX && j->o && j->o->progress)
			j->o->progress(j->o->progress_ctx, j->done, j->size);
	}
	pthread_mutex_unlock(&j->lock);
	free(got);
	free(want);
	return NULL;
}

/* Every decoded byte of @zr against @orig, by @o->threads threads. */
static int verify_bytes(const struct castfs_reader *zr,
			const struct castfs_reader *orig, uint64_t size,
			const struct castfs_zst_verify_opts *o,
			struct castfs_diag *d)
{
	struct verify_job j = {
		.zr = zr, .orig = orig, .size = size, .o = o, .bad = UINT64_MAX
	};
	pthread_mutex_init(&j.lock, NULL);
	zst_run_threads(verify_run, &j, o ? o->threads : 0);
	pthread_mutex_destroy(&j.lock);
	if (j.bad == UINT64_MAX)
		return 0;
	if (j.d.msg[0])
		castfs_diag_set(d, j.rc, "%s", j.d.msg);
	return j.rc;
}

int castfs_zst_verify(const struct castfs_reader *pack, uint64_t pack_size,
		      const struct castfs_reader *orig, uint64_t orig_size,
		      const struct castfs_zst_verify_opts *o,
		      struct castfs_diag *d)
{
	struct castfs_zst_index *ix = NULL;
	struct castfs_zst_reader zr;
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
		rc = verify_bytes(&zr.r, orig, orig_size, o, d);
	}
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return rc;
}
