/* SPDX-License-Identifier: MIT */
/*
 * The codec: libzstd and xxHash behind 0/-errno wrappers. zstd's size_t
 * error codes appear in this file only (STYLE R3).
 */
#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>
#include <zstd.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

struct zst_cctx {
	ZSTD_CCtx *z;
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
	    (grouped && !cctx_set(cc->z, ZSTD_c_minMatch, 7))) {
		zst_cctx_free(cc);
		return NULL;
	}
	return cc;
}

void zst_cctx_free(struct zst_cctx *cc)
{
	if (!cc)
		return;
	ZSTD_freeCCtx(cc->z);
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

size_t zst_encode_planes(struct zst_cctx *cc, void *dst, size_t cap,
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
