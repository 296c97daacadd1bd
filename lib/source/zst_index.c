/* SPDX-License-Identifier: MIT */
/*
 * The seek table of a seekable-zstd file: read from the end, validated
 * against the file's length, turned into running offsets for bisection.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "common/bytes.h"
#include "common/ckd.h"
#include "source/zst_internal.h"

/* Entries per read of the table, so that a huge table needs no huge buffer. */
#define ZST_ENTRY_BATCH 1024u

/* Bytes a frame may take beyond zstd's bound for its decoded size: the
 * plane headers of a tiered frame, a small skippable frame beside it. */
#define ZST_FRAME_SLACK (64u << 10)

struct zst_footer {
	uint64_t nframes;
	unsigned entry_size; /* 8, or 12 with checksums */
	uint64_t table_start; /* offset of the skippable frame */
};

static int footer_read(const struct castfs_reader *raw, uint64_t raw_size,
		       struct zst_footer *f, struct castfs_diag *d)
{
	uint8_t b[ZST_FOOTER_SIZE];
	uint8_t h[ZST_SKIPPABLE_HEADER];
	uint64_t tsize;
	int rc;

	if (raw_size < ZST_SKIPPABLE_HEADER + ZST_FOOTER_SIZE)
		return castfs_diag_set(d, -EINVAL,
				       "too short for a seek table");
	rc = castfs_reader_read(raw, b, sizeof(b), raw_size - sizeof(b));
	if (rc)
		return rc;
	if (castfs_load_le32(b + 5) != ZST_SEEKABLE_MAGIC)
		return castfs_diag_set(
			d, -EINVAL, "no seek table (not a seekable zstd file)");
	if (b[4] & ZST_DESC_RESERVED)
		return castfs_diag_set(d, -EINVAL,
				       "seek table: reserved bits set");
	f->nframes = castfs_load_le32(b);
	if (f->nframes > CASTFS_ZST_MAX_FRAMES)
		return castfs_diag_set(d, -EFBIG, "seek table: %llu frames",
				       (unsigned long long)f->nframes);
	f->entry_size = b[4] & ZST_DESC_CHECKSUM ? 12 : 8;
	tsize = f->nframes * f->entry_size + ZST_FOOTER_SIZE;
	if (raw_size < tsize + ZST_SKIPPABLE_HEADER)
		return castfs_diag_set(d, -EINVAL,
				       "seek table longer than the file");
	f->table_start = raw_size - tsize - ZST_SKIPPABLE_HEADER;
	rc = castfs_reader_read(raw, h, sizeof(h), f->table_start);
	if (rc)
		return rc;
	if (castfs_load_le32(h) != ZST_SKIPPABLE_MAGIC ||
	    castfs_load_le32(h + 4) != tsize)
		return castfs_diag_set(
			d, -EINVAL, "seek table: bad skippable frame header");
	return 0;
}

static int index_alloc(struct castfs_zst_index *ix, bool checksums)
{
	size_t n = ix->nframes + 1;

	ix->coff = calloc(n, sizeof(*ix->coff));
	ix->doff = calloc(n, sizeof(*ix->doff));
	if (checksums)
		ix->sum = calloc(n, sizeof(*ix->sum));
	ix->prefix = calloc(1, sizeof(*ix->prefix) + n);
	if (ix->prefix) /* before any failure: the free destroys it */
		pthread_mutex_init(&ix->prefix->lock, NULL);
	if (!ix->coff || !ix->doff || (checksums && !ix->sum) || !ix->prefix)
		return -ENOMEM;
	ix->checksums = checksums;
	return 0;
}

/* Add entry @i (@e: its bytes) to the running sums; checks the limits. */
static int entry_add(struct castfs_zst_index *ix, size_t i, const uint8_t *e,
		     struct castfs_diag *d)
{
	uint32_t csize = castfs_load_le32(e);
	uint32_t dsize = castfs_load_le32(e + 4);

	if (dsize > CASTFS_ZST_MAX_FRAME)
		return castfs_diag_set(d, -EFBIG,
				       "frame %zu: %u bytes decoded, over %u",
				       i, dsize, CASTFS_ZST_MAX_FRAME);
	/* Every frame, a skippable one too, holds at least its 8-byte header. */
	if (csize < ZST_SKIPPABLE_HEADER)
		return castfs_diag_set(
			d, -EINVAL, "frame %zu: %u compressed bytes", i, csize);
	/* A frame is read whole into a worker's buffer before it decodes:
	 * 4 GiB claimed for a few decoded bytes cost the daemon that much
	 * per worker (a bug hunt: 4.2 GB from an 8 KiB sparse pack). No
	 * encoder needs more than the bound (frames of no decoded bytes are
	 * never read: the grouping marker is read on its own). */
	if (dsize && csize > ZSTD_COMPRESSBOUND(dsize) + ZST_FRAME_SLACK)
		return castfs_diag_set(d, -EFBIG,
				       "frame %zu: %u compressed bytes for %u "
				       "decoded, over zstd's bound",
				       i, csize, dsize);
	if (castfs_ckd_add(&ix->coff[i + 1], ix->coff[i], csize) ||
	    castfs_ckd_add(&ix->doff[i + 1], ix->doff[i], dsize))
		return castfs_diag_set(d, -EOVERFLOW, "seek table overflows");
	if (ix->sum)
		ix->sum[i] = castfs_load_le32(e + 8);
	return 0;
}

static int entries_read(struct castfs_zst_index *ix,
			const struct castfs_reader *raw,
			const struct zst_footer *f, struct castfs_diag *d)
{
	uint8_t buf[ZST_ENTRY_BATCH * 12];
	uint64_t off = f->table_start + ZST_SKIPPABLE_HEADER;
	size_t i = 0;

	while (i < ix->nframes) {
		size_t n = ix->nframes - i;
		int rc;

		if (n > ZST_ENTRY_BATCH)
			n = ZST_ENTRY_BATCH;
		rc = castfs_reader_read(raw, buf, n * f->entry_size, off);
		if (rc)
			return rc;
		for (size_t k = 0; k < n; k++, i++) {
			rc = entry_add(ix, i, buf + k * f->entry_size, d);
			if (rc)
				return rc;
		}
		off += n * f->entry_size;
	}
	/* The reference reader does not check this; a lying table fails here. */
	if (ix->coff[ix->nframes] != f->table_start)
		return castfs_diag_set(
			d, -EINVAL,
			"seek table: frames cover %llu bytes, "
			"the file has %llu before the table",
			(unsigned long long)ix->coff[ix->nframes],
			(unsigned long long)f->table_start);
	return 0;
}

/* Transform bytes of the marker at frame @m into a new ix->xform. */
static int grouped_parse(struct castfs_zst_index *ix, const uint8_t *p,
			 size_t m, struct castfs_diag *d)
{
	if (memcmp(p, ZST_GROUPED_TAG, ZST_GROUPED_TAG_LEN))
		return castfs_diag_set(d, -EINVAL, "grouping marker: bad tag");
	p += ZST_GROUPED_TAG_LEN;
	for (size_t i = 0; i < ix->nframes; i++) {
		uint64_t dsize = ix->doff[i + 1] - ix->doff[i];

		if (p[i] >= CASTFS_ZST_TRANSFORM_COUNT || (i == m && p[i]) ||
		    dsize % zst_group_width(p[i]))
			return castfs_diag_set(d, -EINVAL,
					       "grouping marker: frame %zu: "
					       "transform %u does not fit",
					       i, p[i]);
	}
	ix->xform = malloc(ix->nframes);
	if (!ix->xform)
		return -ENOMEM;
	memcpy(ix->xform, p, ix->nframes);
	return 0;
}

/*
 * A grouped pack ends with castfs's marker: a skippable frame of
 * ZST_GROUPED_MAGIC holding the tag and a transform byte per frame.
 */
static int grouped_read(struct castfs_zst_index *ix,
			const struct castfs_reader *raw, struct castfs_diag *d)
{
	size_t m = ix->nframes - 1;
	uint64_t len = ZST_GROUPED_TAG_LEN + (uint64_t)ix->nframes;
	uint8_t h[ZST_SKIPPABLE_HEADER], *p;
	int rc;

	if (ix->nframes == 0 || ix->doff[m + 1] != ix->doff[m] ||
	    ix->coff[m + 1] - ix->coff[m] != ZST_SKIPPABLE_HEADER + len)
		return 0;
	rc = castfs_reader_read(raw, h, sizeof(h), ix->coff[m]);
	if (rc || castfs_load_le32(h) != ZST_GROUPED_MAGIC)
		return rc;
	if (castfs_load_le32(h + 4) != len)
		return castfs_diag_set(d, -EINVAL, "grouping marker: length");
	p = malloc(ZST_SKIPPABLE_HEADER + (size_t)len);
	if (!p)
		return -ENOMEM;
	rc = castfs_reader_read(raw, p, ZST_SKIPPABLE_HEADER + (size_t)len,
				ix->coff[m]);
	/* With checksums, the marker's is CRC32C of it as stored, as for a
	 * tiered frame: a transform byte changed to another legal one would
	 * un-group a frame wrong behind its own good checksum. */
	if (!rc && ix->sum &&
	    zst_crc32c(p, ZST_SKIPPABLE_HEADER + (size_t)len) != ix->sum[m])
		rc = castfs_diag_set(d, -EINVAL,
				     "grouping marker: checksum mismatch");
	if (!rc)
		rc = grouped_parse(ix, p + ZST_SKIPPABLE_HEADER, m, d);
	free(p);
	return rc;
}

int castfs_zst_index_read(const struct castfs_reader *raw, uint64_t raw_size,
			  struct castfs_zcache *cache,
			  struct castfs_zst_index **out, struct castfs_diag *d)
{
	struct castfs_zst_index *ix;
	struct zst_footer f;
	int rc = footer_read(raw, raw_size, &f, d);

	if (rc)
		return rc;
	ix = calloc(1, sizeof(*ix));
	if (!ix)
		return -ENOMEM;
	ix->nframes = (size_t)f.nframes;
	rc = index_alloc(ix, f.entry_size == 12);
	if (rc)
		goto out_free;
	rc = entries_read(ix, raw, &f, d);
	if (!rc)
		rc = grouped_read(ix, raw, d);
	if (rc)
		goto out_free;
	ix->cache = cache;
	ix->id = zcache_next_id(cache);
	*out = ix;
	return 0;
out_free:
	castfs_zst_index_free(ix);
	return rc;
}

void castfs_zst_index_free(struct castfs_zst_index *ix)
{
	if (!ix)
		return;
	free(ix->coff);
	free(ix->doff);
	free(ix->sum);
	free(ix->xform);
	if (ix->prefix)
		pthread_mutex_destroy(&ix->prefix->lock);
	free(ix->prefix);
	free(ix);
}

uint64_t castfs_zst_index_size(const struct castfs_zst_index *ix)
{
	return ix->doff[ix->nframes];
}

size_t castfs_zst_index_frames(const struct castfs_zst_index *ix)
{
	return ix->nframes;
}

size_t castfs_zst_index_bytes(const struct castfs_zst_index *ix)
{
	size_t n = ix->nframes;

	return sizeof(*ix) + (n + 1) * 2 * sizeof(uint64_t) +
	       (ix->sum ? n * sizeof(uint32_t) : 0) + (ix->xform ? n : 0) +
	       (ix->prefix ? sizeof(*ix->prefix) + n : 0);
}

bool castfs_zst_index_checksums(const struct castfs_zst_index *ix)
{
	return ix->checksums;
}

bool castfs_zst_index_grouped(const struct castfs_zst_index *ix)
{
	return ix->xform != NULL;
}
