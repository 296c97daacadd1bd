/* SPDX-License-Identifier: MIT */
/*
 * The writer of seekable-zstd files: independent frames that never straddle
 * a cut (the caller's tensor boundaries), then the seek table, so that the
 * stock zstd -d decodes the file to the original bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

struct pack_state {
	const struct castfs_zst_pack_opts *o;
	const struct castfs_writer *w;
	struct zst_cctx *cc;
	uint8_t *in, *out, *planes; /* planes: grouped packs only */
	uint8_t *tier; /* grouped packs: a tiered frame, ps->out_cap bytes */
	uint8_t *xform; /* grouped packs: the transform of each frame */
	size_t out_cap;
	uint8_t *table; /* 12 bytes per frame: csize, dsize, checksum */
	size_t nframes, table_cap;
	uint64_t in_done, out_done;
};

/*
 * The end of the piece starting at @pos: the frame size or the next cut.
 * Afterwards cuts[*k - 1] is the last cut at or before @pos.
 */
static uint64_t piece_end(const struct castfs_zst_pack_opts *o, size_t *k,
			  uint64_t pos, uint64_t size)
{
	uint64_t end = size - pos > o->frame_size ? pos + o->frame_size : size;

	while (*k < o->ncuts && o->cuts[*k] <= pos)
		(*k)++;
	if (*k < o->ncuts && o->cuts[*k] < end)
		end = o->cuts[*k];
	return end;
}

static int table_grow(struct pack_state *ps)
{
	size_t cap = ps->table_cap ? 2 * ps->table_cap : 256;
	uint8_t *t = realloc(ps->table, cap * 12);
	uint8_t *x = ps->o->cut_transforms ? realloc(ps->xform, cap) : NULL;

	if (t)
		ps->table = t;
	if (x)
		ps->xform = x;
	if (!t || (ps->o->cut_transforms && !x))
		return -ENOMEM;
	ps->table_cap = cap;
	return 0;
}

static int table_add(struct pack_state *ps, uint32_t csize, uint32_t dsize,
		     uint32_t sum, enum castfs_zst_transform t)
{
	if (ps->nframes == CASTFS_ZST_MAX_FRAMES)
		return -EFBIG;
	if (ps->nframes == ps->table_cap && table_grow(ps))
		return -ENOMEM;
	if (ps->xform)
		ps->xform[ps->nframes] = (uint8_t)t;
	castfs_store_le32(ps->table + ps->nframes * 12, csize);
	castfs_store_le32(ps->table + ps->nframes * 12 + 4, dsize);
	castfs_store_le32(ps->table + ps->nframes * 12 + 8, sum);
	ps->nframes++;
	return 0;
}

/*
 * A bf16, fp32 or 2-byte frame tier-coded when that is at most 2 % bigger
 * than zstd's coding (in ps->out, @got bytes): its last plane decodes
 * about ten times faster than Huffman literals, worth more than the last
 * 1-2 % of ratio. Planes zstd's matches shrink by more (repetitive ones)
 * stay zstd.
 */
static size_t piece_tier(struct pack_state *ps, size_t n, size_t got,
			 enum castfs_zst_transform *t)
{
	enum castfs_zst_transform tt = zst_xform_tier(*t);
	size_t tier = tt == CASTFS_ZST_NONE ?
			      0 :
			      zst_tier_encode(ps->tier, ps->out_cap, ps->planes,
					      n / zst_group_width(tt), tt);

	if (!tier || tier * 50 > got * 51)
		return got;
	memcpy(ps->out, ps->tier, tier);
	*t = tt;
	return tier;
}

/* Compress @n bytes of ps->in stored as *@t (which piece_tier() may make
 * tiered) into ps->out; the bytes as grouped to *@kept (ps->in itself
 * when not grouped). */
static size_t piece_encode(struct pack_state *ps, size_t n,
			   enum castfs_zst_transform *t, const uint8_t **kept)
{
	unsigned w = zst_group_width(*t);
	size_t got;

	*kept = ps->in;
	if (w == 1)
		return zst_encode_frame(ps->cc, ps->out, ps->out_cap, ps->in,
					n);
	zst_group(ps->planes, ps->in, n, *t);
	*kept = ps->planes;
	got = zst_encode_planes(ps->cc, ps->out, ps->out_cap, ps->planes, n, w);
	if (got && ps->tier)
		got = piece_tier(ps, n, got, t);
	return got;
}

/* The checksum of the frame just coded: @got bytes in ps->out, its @n
 * bytes as grouped (the planes one after another) at @kept. */
static uint32_t piece_sum(const struct pack_state *ps, const uint8_t *kept,
			  size_t n, size_t got, enum castfs_zst_transform t)
{
	const uint8_t *plane[ZST_MAX_PLANES];
	unsigned w = zst_group_width(t);

	if (!ps->o->checksums)
		return 0;
	for (unsigned k = 0; k < w; k++)
		plane[k] = kept + k * (n / w);
	return zst_frame_sum(t, ps->out, got, plane, n);
}

static int pack_piece(struct pack_state *ps, const struct castfs_reader *src,
		      uint64_t pos, size_t n, enum castfs_zst_transform t,
		      struct castfs_diag *d)
{
	const uint8_t *kept;
	size_t got;
	int rc = castfs_reader_read(src, ps->in, n, pos);

	if (rc)
		return castfs_diag_set(d, rc, "reading at %llu",
				       (unsigned long long)pos);
	if (n % zst_group_width(t))
		return castfs_diag_set(d, -EINVAL,
				       "bytes at %llu: not whole elements",
				       (unsigned long long)pos);
	got = piece_encode(ps, n, &t, &kept);
	if (!got)
		return castfs_diag_set(d, -EIO, "zstd failed to compress");
	rc = ps->w->write(ps->w->ctx, ps->out, got);
	if (rc)
		return castfs_diag_set(d, rc, "writing the pack");
	rc = table_add(ps, (uint32_t)got, (uint32_t)n,
		       piece_sum(ps, kept, n, got, t), t);
	if (rc)
		return castfs_diag_set(d, rc, "too many frames");
	ps->in_done += n;
	ps->out_done += got;
	if (ps->o->progress)
		ps->o->progress(ps->o->progress_ctx, ps->in_done, ps->out_done);
	return 0;
}

/* The skippable frame holding the table, then the footer. */
static int table_write(struct pack_state *ps)
{
	size_t esize = ps->o->checksums ? 12 : 8;
	size_t len = ps->nframes * esize + ZST_FOOTER_SIZE;
	uint8_t *buf = malloc(ZST_SKIPPABLE_HEADER + len);
	uint8_t *p = buf;
	int rc;

	if (!buf)
		return -ENOMEM;
	castfs_store_le32(p, ZST_SKIPPABLE_MAGIC);
	castfs_store_le32(p + 4, (uint32_t)len);
	p += ZST_SKIPPABLE_HEADER;
	for (size_t i = 0; i < ps->nframes; i++, p += esize) {
		castfs_store_le32(p, castfs_load_le32(ps->table + i * 12));
		castfs_store_le32(p + 4,
				  castfs_load_le32(ps->table + i * 12 + 4));
		if (ps->o->checksums)
			castfs_store_le32(p + 8, castfs_load_le32(ps->table +
								  i * 12 + 8));
	}
	castfs_store_le32(p, (uint32_t)ps->nframes);
	p[4] = ps->o->checksums ? ZST_DESC_CHECKSUM : 0;
	castfs_store_le32(p + 5, ZST_SEEKABLE_MAGIC);
	rc = ps->w->write(ps->w->ctx, buf, ZST_SKIPPABLE_HEADER + len);
	free(buf);
	return rc;
}

/* Grouped packs end with the marker: the transform of every frame. */
static int marker_write(struct pack_state *ps)
{
	size_t len = ZST_GROUPED_TAG_LEN + ps->nframes + 1;
	uint8_t *buf = malloc(ZST_SKIPPABLE_HEADER + len);
	int rc;

	if (!buf)
		return -ENOMEM;
	castfs_store_le32(buf, ZST_GROUPED_MAGIC);
	castfs_store_le32(buf + 4, (uint32_t)len);
	memcpy(buf + 8, ZST_GROUPED_TAG, ZST_GROUPED_TAG_LEN);
	memcpy(buf + 8 + ZST_GROUPED_TAG_LEN, ps->xform, ps->nframes);
	buf[8 + len - 1] = CASTFS_ZST_NONE; /* the marker itself */
	rc = ps->w->write(ps->w->ctx, buf, ZST_SKIPPABLE_HEADER + len);
	if (!rc)
		rc = table_add(ps, (uint32_t)(ZST_SKIPPABLE_HEADER + len), 0, 0,
			       CASTFS_ZST_NONE);
	free(buf);
	return rc;
}

static int pack_all(struct pack_state *ps, const struct castfs_reader *src,
		    uint64_t size, struct castfs_diag *d)
{
	const uint8_t *tr = ps->o->cut_transforms;
	uint64_t pos = 0;
	size_t k = 0;
	int rc;

	while (pos < size) {
		uint64_t end = piece_end(ps->o, &k, pos, size);
		enum castfs_zst_transform t =
			tr && k ? (enum castfs_zst_transform)tr[k - 1] :
				  CASTFS_ZST_NONE;

		rc = pack_piece(ps, src, pos, (size_t)(end - pos), t, d);
		if (rc)
			return rc;
		pos = end;
	}
	rc = tr ? marker_write(ps) : 0;
	return rc ? rc : table_write(ps);
}

int castfs_zst_pack(const struct castfs_reader *src, uint64_t size,
		    const struct castfs_zst_pack_opts *o,
		    const struct castfs_writer *w, struct castfs_diag *d)
{
	struct pack_state ps = { .o = o, .w = w };
	int rc = -ENOMEM;

	if (o->frame_size == 0 || o->frame_size > CASTFS_ZST_MAX_FRAME)
		return castfs_diag_set(d, -EINVAL,
				       "frame size must be 1..%u bytes",
				       CASTFS_ZST_MAX_FRAME);
	if (o->cut_transforms && o->frame_size % 4)
		return castfs_diag_set(d, -EINVAL,
				       "a grouped pack's frame size must be a "
				       "multiple of 4");
	ps.out_cap = zst_bound(o->frame_size);
	ps.in = malloc(o->frame_size);
	ps.out = malloc(ps.out_cap);
	ps.planes = o->cut_transforms ? malloc(o->frame_size) : ps.in;
	ps.tier = o->cut_transforms ? malloc(ps.out_cap) : NULL;
	ps.cc = zst_cctx_new(o->level, o->cut_transforms != NULL);
	if (ps.in && ps.out && ps.planes && ps.cc &&
	    (ps.tier || !o->cut_transforms))
		rc = pack_all(&ps, src, size, d);
	zst_cctx_free(ps.cc);
	free(ps.tier);
	if (ps.planes != ps.in)
		free(ps.planes);
	free(ps.xform);
	free(ps.table);
	free(ps.out);
	free(ps.in);
	return rc;
}
