/* SPDX-License-Identifier: MIT */
/*
 * castfs_zst_verify: a pack read back through the reader a mount serves it
 * with, against the original. castfs pack runs it before the pack takes its
 * name (and before --remove deletes the original): the tiered coder and the
 * grouping are castfs's own code, and a frame they get wrong would carry a
 * checksum of its wrong bytes, which no later read could tell from right.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "source/zst.h"

/* Bytes compared per step: two buffers of this, plus the frame cache. */
#define VERIFY_CHUNK (4u << 20)

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

/* Every decoded byte of @zr against @orig, in order. */
static int verify_bytes(const struct castfs_reader *zr,
			const struct castfs_reader *orig, uint64_t size,
			const struct castfs_zst_verify_opts *o,
			struct castfs_diag *d)
{
	uint8_t *got = malloc(VERIFY_CHUNK), *want = malloc(VERIFY_CHUNK);
	int rc = got && want ? 0 : -ENOMEM;

	for (uint64_t off = 0; !rc && off < size; off += VERIFY_CHUNK) {
		size_t n = (size_t)CASTFS_MIN(size - off, VERIFY_CHUNK), at;

		rc = castfs_reader_read(orig, want, n, off);
		if (rc) {
			castfs_diag_set(d, rc, "reading the original at %llu",
					(unsigned long long)off);
			break;
		}
		rc = castfs_reader_read(zr, got, n, off);
		if (rc) {
			castfs_diag_set(d, rc,
					"the pack does not decode at %llu "
					"(a frame fails or its checksum "
					"mismatches)",
					(unsigned long long)off);
			break;
		}
		at = first_diff(got, want, n);
		if (at < n)
			rc = castfs_diag_set(d, -EBADMSG,
					     "the pack decodes to other bytes "
					     "than the original from byte %llu",
					     (unsigned long long)(off + at));
		else if (o && o->progress)
			o->progress(o->progress_ctx, off + n, size);
	}
	free(got);
	free(want);
	return rc;
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
