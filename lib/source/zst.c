/* SPDX-License-Identifier: MIT */
/*
 * The codec: libzstd and xxHash behind 0/-errno wrappers. zstd's size_t
 * error codes appear in this file only (STYLE R3).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
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

uint32_t zst_checksum(const void *buf, size_t n)
{
	return (uint32_t)XXH64(buf, n, 0);
}

static bool cctx_set(ZSTD_CCtx *z, ZSTD_cParameter p, int v)
{
	return !ZSTD_isError(ZSTD_CCtx_setParameter(z, p, v));
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
