/* SPDX-License-Identifier: MIT */
/*
 * The writer of seekable-zstd files: independent frames that never straddle
 * a cut (the caller's tensor boundaries), then the seek table, so that the
 * stock zstd -d decodes the file to the original bytes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "source/zst_internal.h"

/* The threads' buffers together, at most (one thread gets its own
 * whatever the frame size). */
#define PACK_MAX_BUFFERS ((size_t)256 << 20)

/* A piece taken: its place, and what it became in its slot. */
struct piece {
	uint64_t pos;
	size_t n, got;
	enum castfs_zst_transform t;
	uint32_t sum;
};

/* The buffers and compressor of one packing thread, and its piece. */
struct pack_slot {
	struct zst_cctx *cc;
	uint8_t *in, *out, *planes; /* planes: grouped packs only */
	uint8_t *tier; /* grouped packs: a tiered frame, out_cap bytes */
	struct piece pc;
};

/*
 * The pieces, taken in file order by the threads of an ordered pipeline
 * (zst_pipe_run()): each codes its piece into its slot, and the frames
 * are written in file order, so the pack is the same bytes whatever the
 * threads' number and timing.
 */
struct pack_state {
	const struct castfs_zst_pack_opts *o;
	const struct castfs_writer *w;
	const struct castfs_reader *src;
	uint64_t size;
	size_t out_cap;
	uint64_t pos; /* the next piece to take starts here */
	size_t k; /* piece_end()'s cut cursor at @pos */
	uint8_t *xform; /* grouped packs: the transform of each frame */
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
static size_t piece_tier(struct pack_slot *sl, size_t out_cap, size_t n,
			 size_t got, enum castfs_zst_transform *t)
{
	enum castfs_zst_transform tt = zst_xform_tier(*t);
	size_t tier = tt == CASTFS_ZST_NONE ?
			      0 :
			      zst_tier_encode(sl->tier, out_cap, sl->planes,
					      n / zst_group_width(tt), tt);

	if (!tier || tier * 50 > got * 51)
		return got;
	memcpy(sl->out, sl->tier, tier);
	*t = tt;
	return tier;
}

/* Compress @n bytes of @sl->in stored as *@t (which piece_tier() may
 * make tiered) into @sl->out; the bytes as grouped to *@kept (@sl->in
 * itself when not grouped). */
static size_t piece_encode(struct pack_slot *sl, size_t out_cap, size_t n,
			   enum castfs_zst_transform *t, const uint8_t **kept)
{
	unsigned w = zst_group_width(*t);
	size_t got;

	*kept = sl->in;
	if (w == 1)
		return zst_encode_frame(sl->cc, sl->out, out_cap, sl->in, n);
	zst_group(sl->planes, sl->in, n, *t);
	*kept = sl->planes;
	got = zst_encode_planes(sl->cc, sl->out, out_cap, sl->planes, n, w);
	if (got && sl->tier)
		got = piece_tier(sl, out_cap, n, got, t);
	return got;
}

/* The checksum of the frame just coded: @got bytes at @out, its @n
 * bytes as grouped (the planes one after another) at @kept. */
static uint32_t piece_sum(const struct castfs_zst_pack_opts *o,
			  const uint8_t *out, const uint8_t *kept, size_t n,
			  size_t got, enum castfs_zst_transform t)
{
	const uint8_t *plane[ZST_MAX_PLANES];
	unsigned w = zst_group_width(t);

	if (!o->checksums)
		return 0;
	for (unsigned k = 0; k < w; k++)
		plane[k] = kept + k * (n / w);
	return zst_frame_sum(t, out, got, plane, n);
}

/* The pipeline's work: read and code the slot's piece. */
static int piece_code(void *ctx, void *slot, struct castfs_diag *d)
{
	const struct pack_state *ps = ctx;
	struct pack_slot *sl = slot;
	struct piece *pc = &sl->pc;
	const uint8_t *kept;
	int rc = castfs_reader_read(ps->src, sl->in, pc->n, pc->pos);

	if (rc)
		return castfs_diag_set(d, rc, "reading at %llu",
				       (unsigned long long)pc->pos);
	if (pc->n % zst_group_width(pc->t))
		return castfs_diag_set(d, -EINVAL,
				       "bytes at %llu: not whole elements",
				       (unsigned long long)pc->pos);
	pc->got = piece_encode(sl, ps->out_cap, pc->n, &pc->t, &kept);
	if (!pc->got)
		return castfs_diag_set(d, -EIO, "zstd failed to compress");
	pc->sum = piece_sum(ps->o, sl->out, kept, pc->n, pc->got, pc->t);
	return 0;
}

/* The pipeline's take: the next piece into the slot; false when none is
 * left. */
static bool piece_take(void *ctx, void *slot)
{
	struct pack_state *ps = ctx;
	struct pack_slot *sl = slot;
	const uint8_t *tr = ps->o->cut_transforms;
	uint64_t end;

	if (ps->pos >= ps->size)
		return false;
	end = piece_end(ps->o, &ps->k, ps->pos, ps->size);
	sl->pc = (struct piece){
		.pos = ps->pos,
		.n = (size_t)(end - ps->pos),
		.t = tr && ps->k ? (enum castfs_zst_transform)tr[ps->k - 1] :
				   CASTFS_ZST_NONE,
	};
	ps->pos = end;
	return true;
}

/* The pipeline's commit, on the piece's turn: write the slot's frame and
 * add it to the table. */
static int piece_write(void *ctx, void *slot, struct castfs_diag *d)
{
	struct pack_state *ps = ctx;
	const struct pack_slot *sl = slot;
	const struct piece *pc = &sl->pc;
	int rc = ps->w->write(ps->w->ctx, sl->out, pc->got);

	if (rc)
		return castfs_diag_set(d, rc, "writing the pack: %s",
				       strerror(-rc));
	rc = table_add(ps, (uint32_t)pc->got, (uint32_t)pc->n, pc->sum, pc->t);
	if (rc)
		return castfs_diag_set(d, rc, "too many frames");
	ps->in_done += pc->n;
	ps->out_done += pc->got;
	rc = ps->o->progress ? ps->o->progress(ps->o->progress_ctx, ps->in_done,
					       ps->out_done) :
			       0;
	return rc ? castfs_diag_set(d, rc, "stopped by its caller") : 0;
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
	/* Checked like a tiered frame: a transform byte changed to another
	 * legal one passes every frame's own checksum and un-groups wrong. */
	if (!rc)
		rc = table_add(ps, (uint32_t)(ZST_SKIPPABLE_HEADER + len), 0,
			       ps->o->checksums ?
				       zst_crc32c(buf,
						  ZST_SKIPPABLE_HEADER + len) :
				       0,
			       CASTFS_ZST_NONE);
	free(buf);
	return rc;
}

static void slot_free(void *ctx, void *slot)
{
	struct pack_slot *sl = slot;

	(void)ctx;
	zst_cctx_free(sl->cc);
	free(sl->tier);
	if (sl->planes != sl->in)
		free(sl->planes);
	free(sl->out);
	free(sl->in);
}

static int slot_init(void *ctx, void *slot)
{
	const struct pack_state *ps = ctx;
	const struct castfs_zst_pack_opts *o = ps->o;
	struct pack_slot *sl = slot;
	bool grouped = o->cut_transforms != NULL;

	sl->in = malloc(o->frame_size);
	sl->out = malloc(ps->out_cap);
	sl->planes = grouped ? malloc(o->frame_size) : sl->in;
	sl->tier = grouped ? malloc(ps->out_cap) : NULL;
	sl->cc = zst_cctx_new(o->level, grouped);
	if (sl->in && sl->out && sl->planes && sl->cc && (sl->tier || !grouped))
		return 0;
	slot_free(ctx, sl);
	return -ENOMEM;
}

static const struct zst_pipe_ops pack_ops = {
	.slot_size = sizeof(struct pack_slot),
	.slot_init = slot_init,
	.slot_free = slot_free,
	.take = piece_take,
	.work = piece_code,
	.commit = piece_write,
};

/* The threads a pack gets: as asked, and no more than keep their buffers
 * (four frames each) within PACK_MAX_BUFFERS (zst_pipe_run() caps the
 * count too). */
static unsigned pack_threads(const struct castfs_zst_pack_opts *o)
{
	size_t fit = PACK_MAX_BUFFERS / (4 * o->frame_size);

	return (unsigned)CASTFS_MIN((size_t)o->threads, CASTFS_MAX(fit, 1));
}

int castfs_zst_pack(const struct castfs_reader *src, uint64_t size,
		    const struct castfs_zst_pack_opts *o,
		    const struct castfs_writer *w, struct castfs_diag *d)
{
	struct pack_state ps = { .o = o, .w = w, .src = src, .size = size };
	int rc;

	if (o->frame_size == 0 || o->frame_size > CASTFS_ZST_MAX_FRAME)
		return castfs_diag_set(d, -EINVAL,
				       "frame size must be 1..%u bytes",
				       CASTFS_ZST_MAX_FRAME);
	if (!castfs_zst_level_valid(o->level))
		return castfs_diag_set(d, -EINVAL, "no zstd level %d",
				       o->level);
	if (o->cut_transforms && o->frame_size % 4)
		return castfs_diag_set(d, -EINVAL,
				       "a grouped pack's frame size must be a "
				       "multiple of 4");
	ps.out_cap = zst_bound(o->frame_size);
	rc = zst_pipe_run(&pack_ops, &ps, pack_threads(o), d);
	if (!rc && o->cut_transforms)
		rc = marker_write(&ps);
	if (!rc)
		rc = table_write(&ps);
	free(ps.xform);
	free(ps.table);
	return rc;
}
