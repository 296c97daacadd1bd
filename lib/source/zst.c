/* SPDX-License-Identifier: MIT */
/*
 * The codec: libzstd and xxHash behind 0/-errno wrappers. zstd's size_t
 * error codes appear in this file only (STYLE R3).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
/* XXH64_state_t on the stack: a frame's planes are hashed in pieces. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
/* For ZSTD_compressSequences (literal-only frames of grouped packs): in
 * libzstd's experimental section, exported by its shared library too. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

struct zst_cctx {
	ZSTD_CCtx *z;
	ZSTD_CCtx *lit; /* grouped packs: literal-only frames */
	ZSTD_Sequence *seq; /* their block delimiters */
	size_t seq_cap;
};

struct zst_dctx *zst_dctx_new(void)
{
	struct zst_dctx *dc = calloc(1, sizeof(*dc));

	if (!dc)
		return NULL;
	dc->z = ZSTD_createDCtx();
	if (!dc->z) {
		free(dc);
		return NULL;
	}
	return dc;
}

void zst_dctx_free(struct zst_dctx *dc)
{
	if (!dc)
		return;
	ZSTD_freeDCtx((ZSTD_DCtx *)dc->z);
	free(dc->buf);
	free(dc->ubuf);
	free(dc);
}

void zst_dctx_trim(struct zst_dctx *dc, size_t keep)
{
	if (dc->cap > keep) {
		free(dc->buf);
		dc->buf = NULL;
		dc->cap = 0;
	}
	if (dc->ucap > keep) {
		free(dc->ubuf);
		dc->ubuf = NULL;
		dc->ucap = 0;
	}
}

void *zst_dctx_buf(struct zst_dctx *dc, size_t n)
{
	void *p;

	if (n <= dc->cap)
		return dc->buf;
	p = realloc(dc->buf, n);
	if (!p)
		return NULL;
	dc->buf = p;
	dc->cap = n;
	return p;
}

void *zst_dctx_ubuf(struct zst_dctx *dc, size_t n)
{
	void *p;

	if (n <= dc->ucap)
		return dc->ubuf;
	p = realloc(dc->ubuf, n);
	if (!p)
		return NULL;
	dc->ubuf = p;
	dc->ucap = n;
	return p;
}

int zst_decode_frame(struct zst_dctx *dc, void *dst, size_t dsize,
		     const void *src, size_t csize)
{
	size_t got;

	/* ZSTD_decompressDCtx would also decode frames that follow. */
	got = ZSTD_findFrameCompressedSize(src, csize);
	if (ZSTD_isError(got) || got != csize)
		return -EIO;
	if ((castfs_load_le32(src) & 0xFFFFFFF0u) == 0x184D2A50u)
		return dsize == 0 ? 0 : -EIO; /* a skippable frame */
	got = ZSTD_decompressDCtx((ZSTD_DCtx *)dc->z, dst, dsize, src, csize);
	if (ZSTD_isError(got) || got != dsize)
		return -EIO;
	return 0;
}

int zst_frame_content_size(const void *h, size_t n, uint64_t *size)
{
	unsigned long long s = ZSTD_getFrameContentSize(h, n);

	if (s == ZSTD_CONTENTSIZE_ERROR)
		return -EBADMSG;
	if (s == ZSTD_CONTENTSIZE_UNKNOWN)
		return -ENODATA;
	*size = s;
	return 0;
}

uint32_t zst_checksum(const void *buf, size_t n)
{
	return (uint32_t)XXH64(buf, n, 0);
}

uint32_t zst_checksum_planes(const uint8_t *const *plane, unsigned w,
			     size_t count)
{
	XXH64_state_t st;

	/* XXH64 streamed over the pieces equals XXH64 of their
	 * concatenation, the bytes the seek table's checksum is of. */
	XXH64_reset(&st, 0);
	for (unsigned p = 0; p < w; p++)
		XXH64_update(&st, plane[p], count);
	return (uint32_t)XXH64_digest(&st);
}

uint32_t zst_frame_sum(enum castfs_zst_transform t, const void *stored,
		       size_t csize, const uint8_t *const *plane, size_t dsize)
{
	unsigned w = zst_group_width(t);

	if (zst_xform_tiered(t))
		return zst_crc32c(stored, csize);
	if (w == 1)
		return zst_checksum(plane[0], dsize);
	return zst_checksum_planes(plane, w, dsize / w);
}

/*
 * Grouped frames parsed by castfs (RFC 8878, section 3.1.1): a frame of
 * castfs pack --grouped holds each plane in its own blocks; a plane of raw
 * bytes (a bf16 mantissa plane: sign and 7 mantissa bits, near-random) is
 * one raw block of exactly the plane, used where it lies in the
 * compressed buffer instead of zstd copying it out. Only frames whose
 * compressed blocks hold literals alone (no sequence: they need no
 * history, so a plane left in place cannot be missed) take this path;
 * any other frame, well-formed or not, is decoded by zstd as a whole.
 */
enum { ZB_RAW, ZB_RLE, ZB_COMPRESSED, ZB_RESERVED };

struct zblock {
	const uint8_t *p; /* the block's content in the frame */
	size_t size; /* Block_Size: content bytes, or RLE's decoded bytes */
	unsigned type;
	bool last;
};

/* The block at @at (before @end) of at most @bmax bytes into @b: true,
 * or false when its header or content does not fit or is reserved. */
static bool block_at(const uint8_t *at, const uint8_t *end, size_t bmax,
		     struct zblock *b)
{
	uint32_t h;
	size_t stored;

	if (end - at < 3)
		return false;
	h = (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16;
	b->last = h & 1;
	b->type = (h >> 1) & 3;
	b->size = h >> 3;
	b->p = at + 3;
	stored = b->type == ZB_RLE ? 1 : b->size;
	return b->type != ZB_RESERVED && b->size <= bmax &&
	       stored <= (size_t)(end - b->p);
}

/* The size of the literals section at @p (its header and content). */
static size_t literals_size(const uint8_t *p)
{
	unsigned type = p[0] & 3, sf = (p[0] >> 2) & 3;
	uint32_t lhc = castfs_load_le32(p);

	if (type <= 1) { /* Raw_Literals_Block, RLE_Literals_Block */
		size_t hsz = sf == 1 ? 2 : sf == 3 ? 3 : 1;
		size_t regen = sf == 1 ? (lhc & 0xFFFFu) >> 4 :
			       sf == 3 ? (lhc & 0xFFFFFFu) >> 4 :
					 (size_t)p[0] >> 3;

		return hsz + (type == 0 ? regen : 1);
	}
	if (sf <= 1)
		return 3 + ((lhc >> 14) & 0x3FFu);
	if (sf == 2)
		return 4 + (lhc >> 18);
	return 5 + (lhc >> 22) + ((size_t)p[4] << 10);
}

/* Whether compressed block @b holds literals only: its literals section,
 * then Number_of_Sequences 0 as its last byte. */
static bool block_literals_only(const struct zblock *b)
{
	size_t lit;

	if (b->size < 5) /* literals_size() reads 5 bytes */
		return false;
	lit = literals_size(b->p);
	return lit + 1 == b->size && b->p[lit] == 0;
}

/* Decode @b to @dst + *@pos (at most @room bytes) and advance *@pos:
 * true, or false when it does not fit or decode. */
static bool block_decode(struct zst_dctx *dc, uint8_t *dst, size_t *pos,
			 size_t room, const struct zblock *b)
{
	size_t got = b->size;

	switch (b->type) {
	case ZB_RAW:
		if (got > room)
			return false;
		memcpy(dst + *pos, b->p, got);
		break;
	case ZB_RLE:
		if (got > room)
			return false;
		memset(dst + *pos, b->p[0], got);
		break;
	default:
		if (!block_literals_only(b))
			return false;
		got = ZSTD_decompressBlock((ZSTD_DCtx *)dc->z, dst + *pos, room,
					   b->p, b->size);
		if (ZSTD_isError(got))
			return false;
	}
	*pos += got;
	return true;
}

/* The frame header of @src if a grouped frame can be parsed here. */
static bool planes_header(struct zst_dctx *dc, ZSTD_frameHeader *fh,
			  size_t dsize, const void *src, size_t csize)
{
	return ZSTD_getFrameHeader(fh, src, csize) == 0 &&
	       fh->frameType == ZSTD_frame && fh->frameContentSize == dsize &&
	       !fh->dictID && !fh->checksumFlag && fh->headerSize <= csize &&
	       fh->windowSize <= (1ull << ZSTD_WINDOWLOG_LIMIT_DEFAULT) &&
	       !ZSTD_isError(ZSTD_decompressBegin((ZSTD_DCtx *)dc->z));
}

/* zst_decode_planes() by castfs's parser: 0, or -1 for "let zstd do it". */
static int planes_direct(struct zst_dctx *dc, uint8_t *dst, size_t dsize,
			 const uint8_t *src, size_t csize, unsigned w,
			 const uint8_t **plane)
{
	const uint8_t *at, *end = src + csize;
	size_t count = dsize / w, pos = 0;
	ZSTD_frameHeader fh;
	struct zblock b;

	if (!planes_header(dc, &fh, dsize, src, csize))
		return -1;
	for (unsigned p = 0; p < w; p++)
		plane[p] = dst + p * count;
	for (at = src + fh.headerSize;;
	     at = b.p + (b.type == ZB_RLE ? 1 : b.size)) {
		size_t room = dsize - pos;

		if (!block_at(at, end, fh.blockSizeMax, &b))
			return -1;
		if (room > fh.blockSizeMax)
			room = fh.blockSizeMax;
		if (b.type == ZB_RAW && b.size == count && pos % count == 0 &&
		    pos < dsize) {
			plane[pos / count] = b.p;
			pos += count;
		} else if (!block_decode(dc, dst, &pos, room, &b)) {
			return -1;
		}
		if (b.last)
			break;
	}
	return b.p + (b.type == ZB_RLE ? 1 : b.size) == end && pos == dsize ?
		       0 :
		       -1;
}

int zst_decode_planes(struct zst_dctx *dc, void *dst, size_t dsize,
		      const void *src, size_t csize, unsigned w,
		      const uint8_t **plane)
{
	size_t count = dsize / w;
	int rc;

	assert(w >= 1 && w <= ZST_MAX_PLANES && dsize % w == 0);
	if (count && !planes_direct(dc, dst, dsize, src, csize, w, plane))
		return 0;
	rc = zst_decode_frame(dc, dst, dsize, src, csize);
	for (unsigned p = 0; !rc && p < w; p++)
		plane[p] = (const uint8_t *)dst + p * count;
	return rc;
}

static bool cctx_set(ZSTD_CCtx *z, ZSTD_cParameter p, int v)
{
	return !ZSTD_isError(ZSTD_CCtx_setParameter(z, p, v));
}

bool castfs_zst_level_valid(int level)
{
	return level >= ZSTD_minCLevel() && level <= ZSTD_maxCLevel();
}

struct zst_cctx *zst_cctx_new(int level, bool grouped)
{
	struct zst_cctx *cc = calloc(1, sizeof(*cc));

	if (!cc)
		return NULL;
	cc->z = ZSTD_createCCtx();
	if (!cc->z || !cctx_set(cc->z, ZSTD_c_compressionLevel, level) ||
	    !cctx_set(cc->z, ZSTD_c_contentSizeFlag, 1) ||
	    (grouped && !cctx_set(cc->z, ZSTD_c_minMatch, 7)))
		goto fail;
	if (!grouped)
		return cc;
	cc->lit = ZSTD_createCCtx();
	if (!cc->lit || !cctx_set(cc->lit, ZSTD_c_compressionLevel, level) ||
	    !cctx_set(cc->lit, ZSTD_c_contentSizeFlag, 1) ||
	    !cctx_set(cc->lit, ZSTD_c_blockDelimiters,
		      ZSTD_sf_explicitBlockDelimiters))
		goto fail;
	return cc;
fail:
	zst_cctx_free(cc);
	return NULL;
}

void zst_cctx_free(struct zst_cctx *cc)
{
	if (!cc)
		return;
	ZSTD_freeCCtx(cc->z);
	ZSTD_freeCCtx(cc->lit);
	free(cc->seq);
	free(cc);
}

size_t zst_bound(size_t n)
{
	return ZSTD_compressBound(n);
}

size_t zst_encode_frame(struct zst_cctx *cc, void *dst, size_t cap,
			const void *src, size_t n)
{
	size_t got = ZSTD_compress2(cc->z, dst, cap, src, n);

	return ZSTD_isError(got) ? 0 : got;
}

/* The planes with zstd's match finder, a block ending at each plane. */
static size_t encode_planes_lz(struct zst_cctx *cc, void *dst, size_t cap,
			       const void *src, size_t n, unsigned w)
{
	ZSTD_outBuffer out = { dst, cap, 0 };
	size_t plane = n / w;

	if (ZSTD_isError(ZSTD_CCtx_reset(cc->z, ZSTD_reset_session_only)) ||
	    ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(cc->z, n)))
		return 0;
	for (unsigned p = 0; p < w; p++) {
		ZSTD_inBuffer in = { (const char *)src + p * plane, plane, 0 };
		ZSTD_EndDirective how = p + 1 < w ? ZSTD_e_flush : ZSTD_e_end;
		size_t left;

		do {
			left = ZSTD_compressStream2(cc->z, &out, &in, how);
			if (ZSTD_isError(left) || (left && out.pos == cap))
				return 0;
		} while (left);
	}
	return out.pos;
}

/* Block delimiters cutting @n bytes of @w planes into zstd blocks of at
 * most ZSTD_BLOCKSIZE_MAX, each inside one plane; their count, 0 when out
 * of memory. */
static size_t plane_blocks(struct zst_cctx *cc, size_t n, unsigned w)
{
	size_t plane = n / w,
	       per = (plane + ZSTD_BLOCKSIZE_MAX - 1) / ZSTD_BLOCKSIZE_MAX;
	size_t k = 0;

	if (per * w > cc->seq_cap) {
		ZSTD_Sequence *s = realloc(cc->seq, per * w * sizeof(*s));

		if (!s)
			return 0;
		cc->seq = s;
		cc->seq_cap = per * w;
	}
	for (unsigned p = 0; p < w; p++) {
		for (size_t at = 0; at < plane; at += ZSTD_BLOCKSIZE_MAX) {
			size_t len = plane - at < ZSTD_BLOCKSIZE_MAX ?
					     plane - at :
					     ZSTD_BLOCKSIZE_MAX;

			cc->seq[k++] =
				(ZSTD_Sequence){ .litLength = (unsigned)len };
		}
	}
	return k;
}

/* The planes as literals only (Huffman-coded, or raw where that does not
 * pay), no matches, a block ending at each plane. */
static size_t encode_planes_lit(struct zst_cctx *cc, void *dst, size_t cap,
				const void *src, size_t n, unsigned w)
{
	size_t k = plane_blocks(cc, n, w), got;

	if (!k ||
	    ZSTD_isError(ZSTD_CCtx_reset(cc->lit, ZSTD_reset_session_only)))
		return 0;
	got = ZSTD_compressSequences(cc->lit, dst, cap, cc->seq, k, src, n);
	return ZSTD_isError(got) ? 0 : got;
}

/*
 * Byte planes of weights are near-random bytes with a skewed histogram
 * (the exponent): zstd's matches there are short, cost bits and make the
 * decoder walk sequences, so literal-only blocks are both smaller (bf16
 * N(0, 0.02): 1.51 against 1.47) and decode about twice as fast. Planes
 * that do repeat (a cycle of a few values, constants) are what matches
 * are for: both codings are tried, and the matches kept only when they
 * save more than a tenth (a slower decode for a few bytes is a bad trade).
 */
size_t zst_encode_planes(struct zst_cctx *cc, void *dst, size_t cap,
			 const void *src, size_t n, unsigned w)
{
	size_t lit = encode_planes_lit(cc, dst, cap, src, n, w), lz;
	void *tmp = malloc(cap);

	if (!tmp)
		return lit;
	lz = encode_planes_lz(cc, tmp, cap, src, n, w);
	if (lz && (!lit || lz * 10 < lit * 9)) {
		memcpy(dst, tmp, lz);
		lit = lz;
	}
	free(tmp);
	return lit;
}
