/* SPDX-License-Identifier: MIT */
/*
 * lib/source: tiered frames (zst_tier.c) of bf16, fp32 and 2-byte
 * elements. Every tier decoder this CPU runs equals the scalar reference
 * on random and adversarial codes, and every low-bit merge a bit-by-bit
 * loop; frames decode to the planes they were made of (the input is the
 * oracle); hostile frames (valid ones edited) fail with -EIO; and grouped
 * packs of bf16, fp32 and fp16 weights use them and read back as their
 * input.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "source/zst.h"
#include "source/zst_internal.h"
#include "unit.h"
#include "unit_membuf.h"

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* Codes of @n elements: 0 random, 1 all escapes, 2 no escape, 3 one
 * escape in 61, the rest one code. */
static void codes_fill(uint8_t *c, size_t len, unsigned kind, uint32_t *s)
{
	for (size_t i = 0; i < len; i++) {
		uint8_t b = (uint8_t)lcg(s);

		c[i] = kind == 0 ? b : kind == 1 ? 0xFF : kind == 2 ? 0 : b;
		if (kind == 3)
			c[i] = i % 61 ? 0x00 : 0xFF;
	}
}

/* The escapes among the first @n codes of @w bits at @c, one at a time. */
static size_t escapes_among(const uint8_t *c, size_t n, unsigned w)
{
	unsigned esc = (1u << w) - 1;
	size_t e = 0;

	for (size_t i = 0; i < n; i++)
		e += ((c[i * w / 8] >> (i * w % 8)) & esc) == esc;
	return e;
}

/*
 * The vector decoders against the reference for widths 1, 2, 4, counts
 * around their 32- and 64-code steps and buffers at odd addresses; bytes
 * past the @n outputs must be left alone, and the next tier's bytes end
 * where its allocation does (a sanitizer build sees any read past them).
 */
START_TEST(test_zst_tier__expand_isas_equal_scalar)
{
	static const size_t counts[] = { 0,  1,	 7,   31,  32,	33,  63,
					 64, 65, 127, 128, 999, 4099 };
	static const unsigned widths[] = { 1, 2, 4 };
	enum zst_tier_isa isa = (enum zst_tier_isa)_i;
	size_t cap = 4200;
	uint8_t *codes = malloc(cap), *next = malloc(cap);
	uint8_t *want = malloc(cap + 64), *got = malloc(cap + 64), map[16];
	uint32_t s = 3;

	ck_assert(zst_tier_isa_runs(isa));
	for (size_t i = 0; i < cap; i++)
		next[i] = (uint8_t)lcg(&s);
	for (unsigned m = 0; m < 16; m++)
		map[m] = (uint8_t)(0xC0 + m);
	for (unsigned a = 0; a < 3; a++)
		for (unsigned kind = 0; kind < 4; kind++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(*counts);
			     c++) {
				size_t n = counts[c], at = c % 5;
				size_t len = (n * widths[a] + 7) / 8;
				size_t esc;

				codes_fill(codes + at, len, kind, &s);
				esc = escapes_among(codes + at, n, widths[a]);
				memset(want, 0x5A, cap + 64);
				memset(got, 0x5A, cap + 64);
				zst_tier_expand_isa(want + at, codes + at, n,
						    widths[a], map,
						    next + cap - esc, esc, NULL,
						    ZST_TIER_SCALAR);
				zst_tier_expand_isa(got + at, codes + at, n,
						    widths[a], map,
						    next + cap - esc, esc, NULL,
						    isa);
				ck_assert_mem_eq(got, want, cap + 64);
				ck_assert_uint_eq(
					zst_tier_escapes_isa(codes + at, len,
							     widths[a], isa),
					zst_tier_escapes_isa(codes + at, len,
							     widths[a],
							     ZST_TIER_SCALAR));
			}
	free(codes);
	free(next);
	free(want);
	free(got);
}
END_TEST

/* The tiered transforms, and their widths. */
static const enum castfs_zst_transform tiered[] = { CASTFS_ZST_BF16_TIERED,
						    CASTFS_ZST_F32_TIERED,
						    CASTFS_ZST_PLANES2_TIERED };

/* Planes of @count elements of @w bytes whose last plane is: 0 one
 * value, 1 all 256 values evenly, 2 N(0, 0.02)-like exponents (a sum of
 * uniforms; fp16-like high bytes for w 2 with @fp16), 3 a few hundred of
 * 40 values then all 256 once each. The other planes are random. */
static uint8_t *planes_make(size_t count, unsigned kind, uint32_t s, unsigned w,
			    bool fp16)
{
	uint8_t *p = malloc(w * count);

	for (size_t i = 0; i < count; i++) {
		uint32_t r = lcg(&s);
		uint8_t e = 121;

		for (unsigned k = 0; k + 1 < w; k++)
			p[k * count + i] = (uint8_t)(lcg(&s) >> k);
		if (kind == 1)
			e = (uint8_t)(r >> 8);
		else if (kind == 2)
			e = (uint8_t)(118 + (r % 5) + ((r >> 4) % 5) -
				      ((r >> 9) % 3));
		else if (kind == 3)
			e = i < 256 ? (uint8_t)i : (uint8_t)(100 + r % 40);
		if (fp16 && kind == 2) /* sign, exponent 5-14, 2 mantissa */
			e = (uint8_t)((r >> 16 & 0x80) | ((e - 108) & 31) << 2 |
				      (r >> 12 & 3));
		p[(w - 1) * count + i] = e;
	}
	return p;
}

static size_t tier_frame(uint8_t **z, const uint8_t *planes, size_t count,
			 enum castfs_zst_transform t)
{
	size_t cap = 8 * count + 512, got;

	*z = malloc(cap);
	got = zst_tier_encode(*z, cap, planes, count, t);
	ck_assert_uint_gt(got, 0);
	return got;
}

/*
 * Planes of @count elements of @w bytes whose last plane draws its ranks
 * from a geometric law of ratio @q / 256 (0: every symbol evenly), the
 * ranks then scattered over the byte values (an odd multiplier): spreads
 * of every shape, so that the coder picks every number of tiers and every
 * width.
 */
static uint8_t *planes_geometric(size_t count, unsigned w, unsigned q,
				 uint32_t s)
{
	uint8_t *p = malloc(w * count);

	for (size_t i = 0; i < count; i++) {
		unsigned r = 0;

		for (unsigned k = 0; k + 1 < w; k++)
			p[k * count + i] = (uint8_t)(lcg(&s) >> 8);
		/* lcg() gives 24 bits: its top 8 are a byte */
		if (!q)
			r = lcg(&s) >> 16;
		while (q && r < 255 && (lcg(&s) >> 16) < q)
			r++;
		p[(w - 1) * count + i] = (uint8_t)(r * 167u + 11u);
	}
	return p;
}

/*
 * The coder of every variant this CPU runs writes the scalar coder's
 * frames byte for byte: the three tiered transforms, counts around its
 * 64-symbol steps, spreads from one symbol to all 256 evenly. Between
 * them the frames use one, two and three tiers and every width in the
 * first tier and in later ones (read from their headers).
 */
START_TEST(test_zst_tier__encode_isas_equal_scalar)
{
	enum zst_tier_isa isa = (enum zst_tier_isa)_i;
	static const size_t counts[] = { 1,   63,   64,	  65,	127,
					 128, 1000, 4113, 65536 };
	static const unsigned qs[] = { 255, 250, 230, 200, 160, 128,
				       90,  50,	 20,  1,   0 };
	unsigned seen_nt = 0, seen_w0 = 0, seen_wk = 0;

	for (unsigned x = 0; x < 3; x++)
		for (size_t qi = 0; qi < sizeof(qs) / sizeof(*qs); qi++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(*counts);
			     c++) {
				enum castfs_zst_transform t = tiered[x];
				unsigned w = zst_group_width(t);
				size_t count = counts[c];
				size_t cap = 8 * count + 512;
				uint8_t *in = planes_geometric(
					count, w, qs[qi], (uint32_t)(c + qi));
				uint8_t *want = malloc(cap), *got = malloc(cap);
				size_t nw = zst_tier_encode_isa(
					want, cap, in, count, t,
					ZST_TIER_SCALAR);
				size_t ng = zst_tier_encode_isa(got, cap, in,
								count, t, isa);
				const uint8_t *h = want + 8;

				ck_assert_uint_gt(nw, 0);
				ck_assert_uint_eq(ng, nw);
				ck_assert_msg(
					!memcmp(got, want, nw),
					"t %u q %u count %zu: other bytes", x,
					qs[qi], count);
				seen_nt |= 1u << h[4];
				seen_w0 |= 1u << h[5];
				for (unsigned k = 1; k < h[4]; k++)
					seen_wk |= 1u << h[5 + k];
				free(in);
				free(want);
				free(got);
			}
	ck_assert_uint_eq(seen_nt, 0xE); /* 1, 2 and 3 tiers */
	ck_assert_uint_eq(seen_w0, 0x16); /* widths 1, 2 and 4 */
	ck_assert_uint_eq(seen_wk, 0x16);
}
END_TEST

/* Frames decode to the planes they were made of: the raw planes in
 * place at the frame's end, the coded plane in the buffer. */
START_TEST(test_zst_tier__frames_round_trip)
{
	static const size_t counts[] = { 1, 63, 1001, 65536 };

	for (unsigned x = 0; x < 3; x++)
		for (unsigned kind = 0; kind < 4; kind++)
			for (size_t c = 0; c < 4; c++) {
				enum castfs_zst_transform t = tiered[x];
				unsigned w = zst_group_width(t);
				size_t count = counts[c];
				uint8_t *in = planes_make(count, kind,
							  17 + kind, w, x == 2);
				uint8_t *dst = malloc(w * count), *z;
				const uint8_t *plane[4];
				size_t zn = tier_frame(&z, in, count, t);

				ck_assert_int_eq(zst_tier_decode(dst, w * count,
								 z, zn, t,
								 plane),
						 0);
				ck_assert_ptr_eq(plane[0],
						 z + zn - (w - 1) * count);
				for (unsigned k = 0; k < w; k++)
					ck_assert_mem_eq(plane[k],
							 in + k * count, count);
				/* Another transform's planes do not fit. */
				ck_assert_int_eq(
					zst_tier_decode(dst, w * count, z, zn,
							tiered[(x + 1) % 3],
							plane),
					-EIO);
				free(in);
				free(z);
				free(dst);
			}
}
END_TEST

/* The low-bit merge each variant fuses into tier 0 (expand with @low)
 * against the reference's expand and a loop over bits: widths 1, 2, 4,
 * counts around the 8-, 32- and 64-code steps, at odd addresses; bytes
 * past @n are left alone, and neither the codes nor the low bits are
 * read past their ends (a sanitizer build sees that). */
START_TEST(test_zst_tier__lowbits_isas_equal_bitwise)
{
	enum zst_tier_isa isa = (enum zst_tier_isa)_i;
	static const size_t counts[] = { 0,  1,	 7,  8,	 9,  31,  32,  33,
					 63, 64, 65, 71, 95, 127, 129, 4099 };
	static const unsigned widths[] = { 1, 2, 4 };
	size_t cap = 4200;
	uint8_t *want = malloc(cap), *got = malloc(cap), *next = malloc(cap);
	uint8_t map[16];
	uint32_t s = 11;

	for (size_t i = 0; i < cap; i++)
		next[i] = (uint8_t)(lcg(&s) & 0x7F);
	for (unsigned m = 0; m < 16; m++)
		map[m] = (uint8_t)(lcg(&s) & 0x7F);
	for (unsigned a = 0; a < 3; a++)
		for (size_t c = 0; c < sizeof(counts) / sizeof(*counts); c++) {
			size_t n = counts[c], at = c % 7, lown = (n + 7) / 8;
			size_t len = (n * widths[a] + 7) / 8, esc;
			uint8_t *codes = malloc(len + !len),
				*low = malloc(lown + !lown);

			codes_fill(codes, len, c % 4, &s);
			esc = escapes_among(codes, n, widths[a]);
			for (size_t i = 0; i < lown; i++)
				low[i] = (uint8_t)lcg(&s);
			if (n % 8) /* the stream's padding bits are zero */
				low[lown - 1] &= (uint8_t)((1u << (n % 8)) - 1);
			memset(want, 0x5A, cap);
			memset(got, 0x5A, cap);
			zst_tier_expand_isa(want + at, codes, n, widths[a], map,
					    next + cap - esc, esc, NULL,
					    ZST_TIER_SCALAR);
			for (size_t i = 0; i < n; i++)
				want[at + i] =
					(uint8_t)(want[at + i] * 2 +
						  ((low[i / 8] >> (i % 8)) &
						   1));
			zst_tier_expand_isa(got + at, codes, n, widths[a], map,
					    next + cap - esc, esc, low, isa);
			ck_assert_mem_eq(got, want, cap);
			free(codes);
			free(low);
		}
	free(want);
	free(got);
	free(next);
}
END_TEST

/* Offsets in a frame: the payload's header fields. */
#define F_NT 12u
#define F_W 13u
#define F_LEN 16u
#define F_TABLE 32u

/* Frame @z (@zn bytes) with one edit @k; the size it now has. */
static size_t frame_edit(uint8_t *z, size_t zn, unsigned k)
{
	size_t s0 = F_TABLE +
		    zst_tier_ranks(z[F_NT], (unsigned[]){ z[F_W], z[F_W + 1],
							  z[F_W + 2] });

	switch (k) {
	case 0: /* truncated by a byte */
		return zn - 1;
	case 1: /* truncated, the frame's size field agreeing */
		castfs_store_le32(z + 4, castfs_load_le32(z + 4) - 1);
		return zn - 1;
	case 2: /* stream 1's length off by one */
		castfs_store_le32(z + F_LEN, castfs_load_le32(z + F_LEN) + 1);
		return zn;
	case 3: /* too many escapes: stream 2 is too short for them */
		memset(z + s0, 0xFF, castfs_load_le32(z + F_LEN) - 1);
		return zn;
	case 4: /* a symbol twice in the table */
		z[F_TABLE + 1] = z[F_TABLE];
		return zn;
	case 5: /* width 3 */
		z[F_W] = 3;
		return zn;
	case 6: /* no tier; then four */
		z[F_NT] = 0;
		return zn;
	case 7:
		z[F_NT] = 4;
		return zn;
	case 8: /* a trailing byte, the size field agreeing */
		castfs_store_le32(z + 4, castfs_load_le32(z + 4) + 1);
		return zn + 1;
	case 10: /* a byte moved from stream 2 to stream 1: same total */
		castfs_store_le32(z + F_LEN, castfs_load_le32(z + F_LEN) + 1);
		castfs_store_le32(z + F_LEN + 4,
				  castfs_load_le32(z + F_LEN + 4) - 1);
		return zn;
	case 11: { /* a zero byte (no escape) appended to stream 1 */
		size_t end = s0 + castfs_load_le32(z + F_LEN);

		memmove(z + end + 1, z + end, zn - end);
		z[end] = 0;
		castfs_store_le32(z + F_LEN, castfs_load_le32(z + F_LEN) + 1);
		castfs_store_le32(z + 4, castfs_load_le32(z + 4) + 1);
		return zn + 1;
	}
	case 9: /* a zstd frame's magic */
		castfs_store_le32(z, 0xFD2FB528u);
		return zn;
	default: /* the padding after stream 1's last code */
		z[s0 + castfs_load_le32(z + F_LEN) - 1] |= 0x80;
		return zn;
	}
}

/* Edits of a PLANES2_TIERED frame @z (@zn bytes, @count elements): its
 * low-bit stream's padding, a rank symbol or a raw tier symbol of 8 bits. */
static size_t frame_edit_low(uint8_t *z, size_t zn, size_t count, unsigned k)
{
	unsigned nt = z[F_NT];
	size_t at =
		F_TABLE + zst_tier_ranks(nt, (unsigned[]){ z[F_W], z[F_W + 1],
							   z[F_W + 2] });
	size_t raw_len = castfs_load_le32(z + F_LEN + 4 * nt);

	for (unsigned j = 0; j < nt; j++)
		at += castfs_load_le32(z + F_LEN + 4 * j);
	if (k == 13) /* the padding after the last low bit */
		z[at + raw_len + count / 8] |= 0x80;
	else if (k == 14) /* a rank's symbol of 8 bits */
		z[F_TABLE] |= 0x80;
	else /* a raw tier's symbol of 8 bits */
		z[at] |= 0x80;
	ck_assert_uint_gt(raw_len, 0);
	return zn;
}

/*
 * Edits 0-12 of frames of each tiered transform, 13-15 of the 2-byte
 * one's low bits and 7-bit symbols: each fails with -EIO, as does the
 * unedited frame given the wrong size.
 */
START_TEST(test_zst_tier__hostile_frames_rejected)
{
	size_t count = 1001; /* 2-bit codes and the low bits leave padding */
	unsigned k = (unsigned)_i;

	for (unsigned x = k < 13 ? 0 : 2; x < 3; x++) {
		enum castfs_zst_transform t = tiered[x];
		unsigned w = zst_group_width(t);
		uint8_t *in = planes_make(count, k < 13 ? 2 : 3, 5, w, x == 2);
		uint8_t *dst = malloc(w * count + w), *z;
		const uint8_t *plane[4];
		size_t zn = tier_frame(&z, in, count, t);
		uint8_t *e = malloc(zn + 1);

		/* The frame the edits assume: two ranks or more, and stream
		 * 1 neither all escapes nor none. */
		ck_assert_uint_ge(zst_tier_ranks(z[F_NT],
						 (unsigned[]){ z[F_W],
							       z[F_W + 1],
							       z[F_W + 2] }),
				  2);
		memcpy(e, z, zn);
		ck_assert_int_eq(
			zst_tier_decode(dst, w * count, e, zn, t, plane), 0);
		ck_assert_int_eq(zst_tier_decode(dst, w * count + w, e, zn, t,
						 plane),
				 -EIO);
		memcpy(e, z, zn);
		e[zn] = 0;
		zn = k < 13 ? frame_edit(e, zn, k) :
			      frame_edit_low(e, zn, count, k);
		ck_assert_int_eq(
			zst_tier_decode(dst, w * count, e, zn, t, plane), -EIO);
		free(in);
		free(z);
		free(e);
		free(dst);
	}
}
END_TEST

/* bf16 weights, roughly N(0, 0.02), after a 64-byte header. */
static uint8_t *weights_make(size_t n)
{
	uint8_t *p = calloc(1, n);
	uint32_t s = 9;

	for (size_t i = 64; i + 1 < n; i += 2) {
		float x = -2.0f;
		uint32_t bits;

		for (int k = 0; k < 4; k++)
			x += (float)lcg(&s) / (float)(1u << 24);
		x *= 0.02f * 1.7320508f;
		memcpy(&bits, &x, 4);
		castfs_store_le16(p + i, (uint16_t)(bits >> 16));
	}
	return p;
}

/* CRC32C bit by bit, as RFC 3720 (B.4) defines it: the oracle, apart
 * from the library's table. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
	uint32_t c = ~0u;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & -(c & 1));
	}
	return ~c;
}

/* The check value of the CRC catalogue (CRC-32/ISCSI) and RFC 3720's
 * B.4 vectors, with every variant this CPU runs. */
START_TEST(test_zst_tier__crc32c_check_values)
{
	uint8_t zeros[32] = { 0 }, ones[32], inc[32];

	memset(ones, 0xFF, sizeof(ones));
	for (unsigned i = 0; i < 32; i++)
		inc[i] = (uint8_t)i;
	for (unsigned isa = ZST_CRC_SCALAR; isa <= ZST_CRC_AVX512; isa++) {
		if (!zst_crc_isa_runs(isa))
			continue;
		ck_assert_uint_eq(zst_crc32c_isa("123456789", 9, isa),
				  0xE3069283u);
		ck_assert_uint_eq(zst_crc32c_isa(zeros, 32, isa), 0x8A9136AAu);
		ck_assert_uint_eq(zst_crc32c_isa(ones, 32, isa), 0x62A8AB43u);
		ck_assert_uint_eq(zst_crc32c_isa(inc, 32, isa), 0x46DD794Eu);
		ck_assert_uint_eq(zst_crc32c_isa(inc, 0, isa), 0);
	}
	ck_assert_uint_eq(zst_crc32c("123456789", 9), 0xE3069283u);
}
END_TEST

/*
 * Every variant equals the bitwise CRC over random lengths 0..100k from
 * odd addresses: no stream round, one to eight (the SSE4.2 variant's
 * three streams of ZST_CRC_STREAM bytes), each tail size 0..7 and
 * lengths one short of and just past a round; then 256 to 767 bytes:
 * one and two of the AVX-512 variant's steps with every tail it leaves.
 */
START_TEST(test_zst_tier__crc32c_isas_equal_bitwise)
{
	size_t round = 3 * ZST_CRC_STREAM, cap = 10 * round + 32;
	uint8_t *buf = malloc(cap);
	uint32_t seed = 7;

	for (size_t i = 0; i < cap; i++)
		buf[i] = (uint8_t)lcg(&seed);
	for (unsigned k = 0; k < 400; k++) {
		size_t n = k < 40 ? k :
			   k < 60 ? ((k - 40) / 2 + 1) * round - 1 + k % 2 * 8 :
				    lcg(&seed) % 100001;
		size_t off = lcg(&seed) % 16;
		uint32_t want = crc32c_bitwise(buf + off, n);

		for (unsigned isa = ZST_CRC_SCALAR; isa <= ZST_CRC_AVX512;
		     isa++)
			if (zst_crc_isa_runs(isa))
				ck_assert_msg(zst_crc32c_isa(buf + off, n,
							     isa) == want,
					      "isa %u, %zu bytes at +%zu", isa,
					      n, off);
	}
	for (size_t n = 256; n < 768; n++)
		for (unsigned isa = ZST_CRC_SCALAR; isa <= ZST_CRC_AVX512;
		     isa++)
			if (zst_crc_isa_runs(isa))
				ck_assert_msg(zst_crc32c_isa(buf + 3, n, isa) ==
						      crc32c_bitwise(buf + 3,
								     n),
					      "isa %u, %zu bytes", isa, n);
	free(buf);
}
END_TEST

/* The marker's transform byte of frame @i of pack @m. */
static uint8_t marker_xform(const struct membuf *m, size_t i)
{
	size_t nf = castfs_load_le32(m->p + m->n - 9);
	size_t table = m->n - 9 - nf * 12 - 8;

	return m->p[table - nf + i];
}

/* The compressed offset of frame @i (entries of 12 bytes). */
static size_t frame_off(const struct membuf *m, size_t i)
{
	size_t nf = castfs_load_le32(m->p + m->n - 9), off = 0;
	const uint8_t *e = m->p + m->n - 9 - nf * 12;

	for (size_t k = 0; k < i; k++)
		off += castfs_load_le32(e + 12 * k);
	return off;
}

/*
 * A grouped pack of bf16 weights is tier-coded (so this cannot pass on
 * zstd frames), keeps the ratio goal (1.47) and reads back as its input;
 * a frame edited to width 3 and one with a flipped mantissa byte fail
 * their ranges with -EIO, counted, while their neighbours read back.
 */
START_TEST(test_zst_tier__grouped_pack_uses_tiers)
{
	size_t n = (1u << 20) + 64, fs = 256 << 10;
	uint8_t *in = weights_make(n), *buf = malloc(n);
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_zcache_stats st;
	struct membuf m = { 0 };

	membuf_pack_bf16(&m, in, n);
	for (size_t i = 1; i <= 4; i++)
		ck_assert_uint_eq(marker_xform(&m, i), CASTFS_ZST_BF16_TIERED);
	ck_assert_msg((double)n / (double)m.n >= 1.47, "ratio %.3f",
		      (double)n / (double)m.n);
	/* A tiered frame's checksum: CRC32C of the frame as stored. */
	for (size_t i = 1; i <= 4; i++) {
		size_t nf = castfs_load_le32(m.p + m.n - 9);
		const uint8_t *e = m.p + m.n - 9 - nf * 12 + 12 * i;

		ck_assert_uint_eq(castfs_load_le32(e + 8),
				  crc32c_bitwise(m.p + frame_off(&m, i),
						 castfs_load_le32(e)));
	}
	m.p[frame_off(&m, 2) + F_W] = 3;
	/* A raw sign+mantissa byte: any value decodes; the checksum (of
	 * the frame as stored) must catch it. */
	m.p[frame_off(&m, 5) - 5] ^= 0x10;
	ck_assert_int_eq(castfs_zcache_new(0, &c), 0);
	castfs_mem_reader_init(&mr, m.p, m.n);
	ck_assert_int_eq(castfs_zst_index_read(&mr.r, m.n, c, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, fs, 64), 0);
	ck_assert_mem_eq(buf, in + 64, fs);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 10, 64 + fs + 7), -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, fs, 64 + 2 * fs), 0);
	ck_assert_mem_eq(buf, in + 64 + 2 * fs, fs);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, fs, 64 + 3 * fs), -EIO);
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.errors, 2);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

/* @n bytes: a 64-byte header, then roughly N(0, 0.02) fp32 weights, or
 * fp16 ones when @fp16 (rounded to nearest by the conversion). */
static uint8_t *weights_make_wide(size_t n, bool fp16)
{
	uint8_t *p = calloc(1, n);
	uint32_t s = 9;

	membuf_fill_weights(p, 64, n - 64, fp16, &s);
	return p;
}

/*
 * Grouped packs of fp32 and fp16 weights are tier-coded too (so this
 * cannot pass on zstd frames), fp32 keeps its ratio goal (1.18), and
 * both read back as their input, whole and at odd offsets.
 */
START_TEST(test_zst_tier__wide_packs_use_tiers)
{
	static const uint64_t cuts[] = { 64 };
	bool fp16 = _i;
	uint8_t tr[] = { fp16 ? CASTFS_ZST_PLANES2 : CASTFS_ZST_F32 };
	size_t n = (1u << 20) + 64, fs = 256 << 10;
	uint8_t *in = weights_make_wide(n, fp16), *buf = malloc(n);
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct membuf m = { 0 };
	double ratio;

	membuf_pack_grouped(&m, in, n, fs, cuts, tr, 1);
	for (size_t i = 1; i <= 4; i++)
		ck_assert_uint_eq(marker_xform(&m, i),
				  fp16 ? CASTFS_ZST_PLANES2_TIERED :
					 CASTFS_ZST_F32_TIERED);
	ratio = (double)n / (double)m.n;
	ck_assert_msg(fp16 || ratio >= 1.18, "ratio %.3f", ratio);
	ck_assert_int_eq(castfs_zcache_new(0, &c), 0);
	castfs_mem_reader_init(&mr, m.p, m.n);
	ck_assert_int_eq(castfs_zst_index_read(&mr.r, m.n, c, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, n, 0), 0);
	ck_assert_mem_eq(buf, in, n);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 1001, 64 + fs - 3), 0);
	ck_assert_mem_eq(buf, in + 64 + fs - 3, 1001);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("zst_tier");
	TCase *tc = tcase_create("zst_tier");

	/* The variants this CPU runs; the scalar one checks the harness. */
	for (int isa = ZST_TIER_SCALAR; isa <= ZST_TIER_AVX512; isa++)
		if (zst_tier_isa_runs((enum zst_tier_isa)isa))
			tcase_add_loop_test(
				tc, test_zst_tier__expand_isas_equal_scalar,
				isa, isa + 1);
	for (int isa = ZST_TIER_SCALAR; isa <= ZST_TIER_AVX512; isa++)
		if (zst_tier_isa_runs((enum zst_tier_isa)isa))
			tcase_add_loop_test(
				tc, test_zst_tier__lowbits_isas_equal_bitwise,
				isa, isa + 1);
	for (int isa = ZST_TIER_SCALAR; isa <= ZST_TIER_AVX512; isa++)
		if (zst_tier_isa_runs((enum zst_tier_isa)isa))
			tcase_add_loop_test(
				tc, test_zst_tier__encode_isas_equal_scalar,
				isa, isa + 1);
	tcase_add_test(tc, test_zst_tier__crc32c_check_values);
	tcase_add_test(tc, test_zst_tier__crc32c_isas_equal_bitwise);
	tcase_add_test(tc, test_zst_tier__frames_round_trip);
	tcase_add_loop_test(tc, test_zst_tier__hostile_frames_rejected, 0, 16);
	tcase_add_test(tc, test_zst_tier__grouped_pack_uses_tiers);
	tcase_add_loop_test(tc, test_zst_tier__wide_packs_use_tiers, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}
