/* SPDX-License-Identifier: MIT */
/*
 * lib/source: grouped frames parsed by castfs (zst_decode_planes), the
 * planes' checksum and un-grouping from planes that do not lie one after
 * the other. The expected planes are libzstd's own decode of each frame
 * (ZSTD_decompress) and the expected checksum libxxhash's XXH64 of them;
 * hostile frames are valid ones edited.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
/* ZSTD_frameHeaderSize: where a frame's first block starts. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "common/bytes.h"
#include "source/zst.h"
#include "source/zst_internal.h"
#include "unit.h"
#include "unit_membuf.h"

/* @n bytes of bf16 weights (@w 2) or fp32 weights (@w 4), roughly
 * N(0, 0.02): a sum of four uniforms from an LCG. */
static uint8_t *make_weights(size_t n, unsigned w, uint32_t seed)
{
	uint8_t *p = malloc(n);

	for (size_t i = 0; i + w <= n; i += w) {
		float x = -2.0f;
		uint32_t bits;

		for (int k = 0; k < 4; k++) {
			seed = seed * 1664525u + 1013904223u;
			x += (float)(seed >> 8) / (float)(1u << 24);
		}
		x *= 0.0346f;
		memcpy(&bits, &x, 4);
		if (w == 2)
			castfs_store_le16(p + i, (uint16_t)(bits >> 16));
		else
			castfs_store_le32(p + i, bits);
	}
	return p;
}

/* A grouped frame of @in (@n bytes) as castfs pack --grouped writes it. */
struct gframe {
	uint8_t *z; /* the frame */
	size_t zn;
	uint8_t *planes; /* libzstd's decode of it: the grouped bytes */
	size_t n;
	unsigned w;
};

static void gframe_make(struct gframe *g, const uint8_t *in, size_t n,
			enum castfs_zst_transform t)
{
	struct zst_cctx *cc = zst_cctx_new(1, true);
	uint8_t *grouped = malloc(n);
	size_t cap = zst_bound(n);

	ck_assert_ptr_nonnull(cc);
	g->w = zst_group_width(t);
	g->n = n;
	g->z = malloc(cap + 16);
	zst_group(grouped, in, n, t);
	g->zn = zst_encode_planes(cc, g->z, cap, grouped, n, g->w);
	ck_assert_uint_gt(g->zn, 0);
	g->planes = malloc(n);
	ck_assert_uint_eq(ZSTD_decompress(g->planes, n, g->z, g->zn), n);
	ck_assert_mem_eq(g->planes, grouped, n);
	zst_cctx_free(cc);
	free(grouped);
}

static void gframe_free(struct gframe *g)
{
	free(g->z);
	free(g->planes);
}

/* Whether @p lies in the @n bytes at @base. */
static bool lies_in(const uint8_t *p, const uint8_t *base, size_t n)
{
	return p >= base && p < base + n;
}

/* Decode @g with zst_decode_planes; check every plane against libzstd's
 * decode; the number of planes left in the frame (not copied). */
static unsigned decode_check(const struct gframe *g)
{
	struct zst_dctx *dc = zst_dctx_new();
	uint8_t *dst = malloc(g->n);
	const uint8_t *plane[ZST_MAX_PLANES];
	size_t count = g->n / g->w;
	unsigned in_place = 0;

	ck_assert_int_eq(
		zst_decode_planes(dc, dst, g->n, g->z, g->zn, g->w, plane), 0);
	for (unsigned p = 0; p < g->w; p++) {
		ck_assert_mem_eq(plane[p], g->planes + p * count, count);
		in_place += lies_in(plane[p], g->z, g->zn);
	}
	ck_assert_uint_eq(zst_checksum_planes(plane, g->w, count),
			  (uint32_t)XXH64(g->planes, g->n, 0));
	zst_dctx_free(dc);
	free(dst);
	return in_place;
}

/*
 * The frames pack writes: bf16 in 256 KiB frames (each plane one block:
 * the mantissa plane raw, used in place), 1 MiB frames (planes of several
 * blocks: copied), fp32, a short frame, constant bytes (RLE blocks) and a
 * repeating cycle (zstd's matches: decoded by zstd whole). Each decodes to
 * libzstd's planes.
 */
START_TEST(test_zst_planes__frames_decode_as_libzstd)
{
	static const struct {
		size_t n;
		enum castfs_zst_transform t;
		int fill; /* 0 weights, 1 constant, 2 a cycle of 37 values */
		unsigned min_in_place, max_in_place;
	} c[] = {
		{ 256u << 10, CASTFS_ZST_BF16, 0, 1, 1 },
		{ 1u << 20, CASTFS_ZST_BF16, 0, 0, 0 },
		{ 512u << 10, CASTFS_ZST_F32, 0, 1, 3 },
		{ 4000, CASTFS_ZST_BF16, 0, 0, 1 },
		{ 256u << 10, CASTFS_ZST_PLANES2, 1, 0, 0 },
		{ 256u << 10, CASTFS_ZST_BF16, 2, 0, 0 },
	};
	uint8_t *in = make_weights(c[_i].n, zst_group_width(c[_i].t), 7);
	struct gframe g;
	unsigned got;

	for (size_t i = 0; c[_i].fill && i + 1 < c[_i].n; i += 2)
		castfs_store_le16(in + i, c[_i].fill == 1 ?
						  0x3F80u :
						  (uint16_t)(0x3C00u + i % 37));
	gframe_make(&g, in, c[_i].n, c[_i].t);
	got = decode_check(&g);
	ck_assert_msg(got >= c[_i].min_in_place && got <= c[_i].max_in_place,
		      "case %d: %u planes in place", _i, got);
	gframe_free(&g);
	free(in);
}
END_TEST

/* The offset of the first block header of frame @z. */
static size_t first_block(const uint8_t *z, size_t zn)
{
	size_t h = ZSTD_frameHeaderSize(z, zn);

	ck_assert(!ZSTD_isError(h));
	return h;
}

/*
 * A bf16 frame edited: truncated at its end or inside the raw plane, a raw
 * block's size one short, a reserved block type, a byte after the last
 * block, the exponent block's size short: each fails with -EIO, as
 * libzstd fails it. A byte changed inside the raw plane decodes (raw bytes
 * have no redundancy) but changes the planes' checksum.
 */
START_TEST(test_zst_planes__edited_frames_fail)
{
	size_t n = 256u << 10;
	uint8_t *in = make_weights(n, 2, 9), *dst = malloc(n);
	struct zst_dctx *dc = zst_dctx_new();
	const uint8_t *plane[ZST_MAX_PLANES];
	struct gframe g;
	size_t b, zn;
	uint32_t h;

	gframe_make(&g, in, n, CASTFS_ZST_BF16);
	b = first_block(g.z, g.zn);
	h = (uint32_t)g.z[b] | (uint32_t)g.z[b + 1] << 8 |
	    (uint32_t)g.z[b + 2] << 16;
	ck_assert_uint_eq((h >> 1) & 3, 0); /* the mantissa plane: raw */
	ck_assert_uint_eq(h >> 3, n / 2);
	zn = g.zn;
	switch (_i) {
	case 0:
		zn = g.zn - 1;
		break;
	case 1:
		zn = b + 3 + 1000;
		break;
	case 2:
		h -= 8; /* Block_Size one less */
		break;
	case 3:
		h |= 6; /* Block_Type 3, reserved */
		break;
	case 4:
		g.z[zn++] = 0;
		break;
	case 5: {
		/* the exponent block's Block_Size 10 bytes short */
		uint8_t *e = g.z + b + 3 + n / 2;
		uint32_t eh = (uint32_t)e[0] | (uint32_t)e[1] << 8 |
			      (uint32_t)e[2] << 16;

		eh -= 10u << 3;
		e[0] = (uint8_t)eh;
		e[1] = (uint8_t)(eh >> 8);
		e[2] = (uint8_t)(eh >> 16);
		break;
	}
	default:
		g.z[b + 3 + 777] ^= 0x40;
		break;
	}
	g.z[b] = (uint8_t)h;
	g.z[b + 1] = (uint8_t)(h >> 8);
	g.z[b + 2] = (uint8_t)(h >> 16);
	if (_i < 6) {
		ck_assert(ZSTD_isError(ZSTD_decompress(dst, n, g.z, zn)) ||
			  ZSTD_decompress(dst, n, g.z, zn) != n);
		ck_assert_int_eq(
			zst_decode_planes(dc, dst, n, g.z, zn, 2, plane), -EIO);
	} else {
		ck_assert_int_eq(
			zst_decode_planes(dc, dst, n, g.z, zn, 2, plane), 0);
		ck_assert_uint_ne(zst_checksum_planes(plane, 2, n / 2),
				  (uint32_t)XXH64(g.planes, n, 0));
	}
	zst_dctx_free(dc);
	gframe_free(&g);
	free(dst);
	free(in);
}
END_TEST

/*
 * Differential: random edits (1-3 bytes) of a bf16 frame of each kind —
 * noise (both planes raw blocks, used in place) and weights (a raw plane
 * and a Huffman block) — decode with zst_decode_planes exactly when
 * libzstd decodes them to the frame's size, and then to libzstd's bytes.
 */
START_TEST(test_zst_planes__edits_agree_with_libzstd)
{
	size_t n = 2048;
	uint8_t *in = make_weights(n, 2, 21), *want = malloc(n),
		*dst = malloc(n), *z;
	struct zst_dctx *dc = zst_dctx_new();
	const uint8_t *plane[ZST_MAX_PLANES];
	uint32_t seed = 77u + (uint32_t)_i;
	struct gframe g;
	int decoded = 0;

	for (size_t i = 0; _i == 0 && i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		in[i] = (uint8_t)(seed >> 24);
	}
	gframe_make(&g, in, n, CASTFS_ZST_BF16);
	ck_assert_uint_ge(decode_check(&g), (_i == 0 ? 2u : 1u));
	z = malloc(g.zn);
	for (int k = 0; k < 3000; k++) {
		size_t ref, edits;
		int rc;

		memcpy(z, g.z, g.zn);
		seed = seed * 1664525u + 1013904223u;
		edits = 1 + (seed >> 30) % 3;
		for (size_t e = 0; e < edits; e++) {
			seed = seed * 1664525u + 1013904223u;
			z[(seed >> 8) % g.zn] ^= (uint8_t)(1u << (seed & 7));
		}
		ref = ZSTD_decompress(want, n, z, g.zn);
		rc = zst_decode_planes(dc, dst, n, z, g.zn, 2, plane);
		if (ZSTD_isError(ref) || ref != n) {
			ck_assert_msg(rc == -EIO, "edit %d: decoded", k);
			continue;
		}
		ck_assert_msg(rc == 0, "edit %d: %d", k, rc);
		decoded++;
		ck_assert_mem_eq(plane[0], want, n / 2);
		ck_assert_mem_eq(plane[1], want + n / 2, n / 2);
	}
	ck_assert_int_gt(decoded, 1000); /* edits of raw bytes decode */
	zst_dctx_free(dc);
	gframe_free(&g);
	free(z);
	free(dst);
	free(want);
	free(in);
}
END_TEST

/*
 * Through the reader: a grouped pack with checksums whose second frame
 * has a byte changed inside its raw plane fails reads of that frame with
 * EIO (the checksum is verified over the planes where they lie) and
 * counts the error; the frames around it read back as the input.
 */
START_TEST(test_zst_planes__corrupt_raw_plane_eio)
{
	size_t n = (768u << 10) + 64;
	uint8_t *in = make_weights(n, 2, 3), *buf = malloc(n);
	struct membuf m;
	struct castfs_mem_reader mr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	size_t f2;

	membuf_pack_bf16(&m, in, n);
	/* frames: the header's (64 bytes), then three of 256 KiB */
	f2 = ZSTD_findFrameCompressedSize(m.p, m.n);
	f2 += ZSTD_findFrameCompressedSize(m.p + f2, m.n - f2);
	m.p[f2 + first_block(m.p + f2, m.n - f2) + 3 + 4321] ^= 0x01;
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	castfs_mem_reader_init(&mr, m.p, m.n);
	ck_assert_int_eq(castfs_zst_index_read(&mr.r, m.n, c, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 64 + (256u << 10), 0),
			 0);
	ck_assert_mem_eq(buf, in, 64 + (256u << 10));
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 100,
					    64 + (256u << 10) + 5000),
			 -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 256u << 10,
					    64 + (256u << 10)),
			 -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 256u << 10,
					    64 + (512u << 10)),
			 0);
	ck_assert_mem_eq(buf, in + 64 + (512u << 10), 256u << 10);
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.errors, 2);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

/* Un-grouping from planes in separate buffers, every variant and width,
 * equals the reference over the planes one after the other (counts with
 * and without a vector tail, an odd destination address). */
START_TEST(test_zst_planes__ungroup_planes_equal_reference)
{
	static const enum castfs_zst_transform ts[] = { CASTFS_ZST_PLANES2,
							CASTFS_ZST_BF16,
							CASTFS_ZST_PLANES4,
							CASTFS_ZST_F32 };
	static const size_t counts[] = { 1, 31, 64, 1000, 4099 };

	for (size_t k = 0; k < 4; k++) {
		unsigned w = zst_group_width(ts[k]);

		for (size_t j = 0; j < 5; j++) {
			size_t count = counts[j], n = count * w;
			uint8_t *src = make_weights(n + 4, 4, (uint32_t)j);
			uint8_t *want = malloc(n), *got = malloc(n + 1);
			const uint8_t *plane[ZST_MAX_PLANES];
			uint8_t *sep[ZST_MAX_PLANES];

			for (unsigned p = 0; p < w; p++) {
				sep[p] = malloc(count);
				memcpy(sep[p], src + p * count, count);
				plane[p] = sep[p];
			}
			zst_ungroup_isa(want, src, n, ts[k], ZST_ISA_SCALAR);
			for (int isa = 0; isa < ZST_ISA_COUNT; isa++) {
				if (!zst_isa_runs((enum zst_isa)isa))
					continue;
				for (size_t odd = 0; odd < 2; odd++) {
					zst_ungroup_planes_isa(
						got + odd, plane, n, ts[k],
						(enum zst_isa)isa);
					ck_assert_mem_eq(got + odd, want, n);
				}
			}
			for (unsigned p = 0; p < w; p++)
				free(sep[p]);
			free(src);
			free(want);
			free(got);
		}
	}
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("zst_planes");
	TCase *tc = tcase_create("zst_planes");

	tcase_add_loop_test(tc, test_zst_planes__frames_decode_as_libzstd, 0,
			    6);
	tcase_add_loop_test(tc, test_zst_planes__edited_frames_fail, 0, 7);
	tcase_add_loop_test(tc, test_zst_planes__edits_agree_with_libzstd, 0,
			    2);
	tcase_add_test(tc, test_zst_planes__corrupt_raw_plane_eio);
	tcase_add_test(tc, test_zst_planes__ungroup_planes_equal_reference);
	suite_add_tcase(s, tc);
	return s;
}
