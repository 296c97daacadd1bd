/* SPDX-License-Identifier: MIT */
/*
 * The writer of tiered frames (zst_tier.c reads them): ranks the coded
 * plane's symbols by count, picks the tier widths that give the fewest
 * bytes and writes the rank codes, tier by tier, then the raw planes.
 */
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

#define TIER_HDR 24u

struct tier_plan {
	unsigned nt;
	unsigned w[ZST_TIER_MAX];
	size_t n[ZST_TIER_MAX + 1];
	size_t size; /* the whole frame's bytes */
	size_t fixed; /* the bytes whatever the widths: low bits, raw planes */
};

struct tier_rank {
	uint8_t sym[256]; /* by rank: count desc, then value asc */
	uint8_t of[256]; /* the rank of each byte value */
	size_t cum[257]; /* cum[r]: elements whose rank is below r */
};

static int rank_cmp(const void *a, const void *b, void *hist)
{
	const size_t *h = hist;
	uint8_t x = *(const uint8_t *)a, y = *(const uint8_t *)b;

	if (h[x] != h[y])
		return h[x] > h[y] ? -1 : 1;
	return (int)x - (int)y;
}

/* The symbols of the coded plane @ex: each byte less its @shift low bits
 * (stored apart, as the low-bit stream). */
static void ranks_of(struct tier_rank *rk, const uint8_t *ex, size_t count,
		     unsigned shift)
{
	/* Four counts per value, summed after: a plane's few common values
	 * would otherwise have each increment wait for the last one's
	 * store (count < 2^29, zst_tier_encode()). */
	uint32_t part[4][256] = { { 0 } };
	size_t hist[256], i = 0;

	for (; i + 4 <= count; i += 4) {
		part[0][ex[i] >> shift]++;
		part[1][ex[i + 1] >> shift]++;
		part[2][ex[i + 2] >> shift]++;
		part[3][ex[i + 3] >> shift]++;
	}
	for (; i < count; i++)
		part[0][ex[i] >> shift]++;
	for (unsigned v = 0; v < 256; v++)
		hist[v] = (size_t)part[0][v] + part[1][v] + part[2][v] +
			  part[3][v];
	for (unsigned v = 0; v < 256; v++)
		rk->sym[v] = (uint8_t)v;
	qsort_r(rk->sym, 256, 1, rank_cmp, hist);
	rk->cum[0] = 0;
	for (unsigned r = 0; r < 256; r++) {
		rk->of[rk->sym[r]] = (uint8_t)r;
		rk->cum[r + 1] = rk->cum[r] + hist[rk->sym[r]];
	}
}

/* The frame's size with widths @p->w[0..nt), filling @p->n. */
static size_t plan_size(struct tier_plan *p, const struct tier_rank *rk,
			size_t count)
{
	size_t size = ZST_SKIPPABLE_HEADER + TIER_HDR + p->fixed;
	unsigned base = 0;

	p->n[0] = count;
	for (unsigned k = 0; k < p->nt; k++) {
		size += (p->n[k] * p->w[k] + 7) / 8;
		base += (1u << p->w[k]) - 1;
		p->n[k + 1] = count - rk->cum[base < 256 ? base : 256];
	}
	p->size = size + p->n[p->nt] + zst_tier_ranks(p->nt, p->w);
	return p->size;
}

/* The fewest bytes over every choice of 1..3 widths in {1, 2, 4}. */
static void plan_best(struct tier_plan *best, const struct tier_rank *rk,
		      size_t count, size_t fixed)
{
	static const unsigned wv[3] = { 1, 2, 4 };
	struct tier_plan p = { .fixed = fixed };

	best->size = 0;
	for (unsigned nt = 1; nt <= ZST_TIER_MAX; nt++) {
		unsigned combos = nt == 1 ? 3 : nt == 2 ? 9 : 27;

		for (unsigned c = 0; c < combos; c++) {
			p.nt = nt;
			for (unsigned k = 0, x = c; k < nt; k++, x /= 3)
				p.w[k] = wv[x % 3];
			plan_size(&p, rk, count);
			if (!best->size || p.size < best->size)
				*best = p;
		}
	}
}

struct bitw {
	uint8_t *p;
	size_t bit;
};

static void bits_put(struct bitw *b, unsigned code, unsigned w)
{
	b->p[b->bit / 8] |= (uint8_t)(code << (b->bit % 8));
	b->bit += w;
}

/* Every symbol's codes: tier by tier until its rank is in one, or the
 * raw symbol after escaping every tier. */
static void codes_write(struct bitw *bw, uint8_t *raw,
			const struct tier_plan *p, const struct tier_rank *rk,
			const uint8_t *ex, size_t count, unsigned shift)
{
	size_t j = 0;

	for (size_t i = 0; i < count; i++) {
		uint8_t sym = (uint8_t)(ex[i] >> shift);
		unsigned r = rk->of[sym], base = 0, k;

		for (k = 0; k < p->nt; k++) {
			unsigned esc = (1u << p->w[k]) - 1;

			if (r < base + esc) {
				bits_put(&bw[k], r - base, p->w[k]);
				break;
			}
			bits_put(&bw[k], esc, p->w[k]);
			base += esc;
		}
		if (k == p->nt)
			raw[j++] = sym;
	}
}

#if ZST_HAVE_X86
/*
 * The vector coders' plan: every symbol's rank into @a, then one tier at
 * a time, each tier's codes from the ranks that escaped the ones before
 * it (ping-ponged between @a and @b), and the ranks that escape every
 * tier back to their symbols.
 */
static void codes_by_tier(struct bitw *bw, uint8_t *raw,
			  const struct tier_plan *p, const struct tier_rank *rk,
			  const uint8_t *ex, size_t count, unsigned shift,
			  enum zst_tier_isa isa, uint8_t *a, uint8_t *b)
{
	size_t n = count;
	unsigned base = 0;

	if (isa == ZST_TIER_AVX512)
		zst_tier_ranks_avx512(a, ex, count, shift, rk->of);
	else
		for (size_t i = 0; i < count; i++)
			a[i] = rk->of[ex[i] >> shift];
	for (unsigned k = 0; k < p->nt; k++) {
		uint8_t *t;

		n = isa == ZST_TIER_AVX512 ?
			    zst_tier_step_avx512(bw[k].p, b, a, n, p->w[k],
						 base) :
			    zst_tier_step_avx2(bw[k].p, b, a, n, p->w[k], base);
		base += (1u << p->w[k]) - 1;
		t = a, a = b, b = t;
	}
	for (size_t j = 0; j < n; j++)
		raw[j] = rk->sym[a[j]];
}
#endif

/*
 * codes_write() with variant @isa: the AVX-512 or AVX2 coder where asked,
 * with its scratch (two streams of ranks); the scalar one otherwise, and
 * where that scratch cannot be had.
 */
static void codes_write_isa(struct bitw *bw, uint8_t *raw,
			    const struct tier_plan *p,
			    const struct tier_rank *rk, const uint8_t *ex,
			    size_t count, unsigned shift, enum zst_tier_isa isa)
{
#if ZST_HAVE_X86
	uint8_t *scratch = isa != ZST_TIER_SCALAR ? malloc(2 * (count + 64)) :
						    NULL;

	if (scratch) {
		codes_by_tier(bw, raw, p, rk, ex, count, shift, isa, scratch,
			      scratch + count + 64);
		free(scratch);
		return;
	}
#endif
	(void)isa;
	codes_write(bw, raw, p, rk, ex, count, shift);
}

/* The low bit of each byte of @ex, LSB-first, the last byte's padding 0. */
static void lowbits_write(uint8_t *d, const uint8_t *ex, size_t count,
			  enum zst_tier_isa isa)
{
	size_t i = 0;

	memset(d, 0, (count + 7) / 8);
#if ZST_HAVE_X86
	if (isa == ZST_TIER_AVX512)
		i = zst_tier_lowbits_pack_avx512(d, ex, count);
	else if (isa == ZST_TIER_AVX2)
		i = zst_tier_lowbits_pack_avx2(d, ex, count);
#endif
	(void)isa;
	for (; i < count; i++)
		d[i / 8] |= (uint8_t)((ex[i] & 1u) << (i % 8));
}

static uint8_t *header_write(uint8_t *d, const struct tier_plan *p,
			     size_t count)
{
	castfs_store_le32(d, ZST_TIER_MAGIC);
	castfs_store_le32(d + 4, (uint32_t)(p->size - ZST_SKIPPABLE_HEADER));
	d += ZST_SKIPPABLE_HEADER;
	memset(d, 0, TIER_HDR);
	castfs_store_le32(d, (uint32_t)count);
	d[4] = (uint8_t)p->nt;
	for (unsigned k = 0; k <= p->nt; k++) {
		size_t len = k < p->nt ? (p->n[k] * p->w[k] + 7) / 8 : p->n[k];

		if (k < p->nt)
			d[5 + k] = (uint8_t)p->w[k];
		castfs_store_le32(d + 8 + 4 * k, (uint32_t)len);
	}
	return d + TIER_HDR;
}

size_t zst_tier_encode(void *dst, size_t cap, const uint8_t *planes,
		       size_t count, enum castfs_zst_transform t)
{
	return zst_tier_encode_isa(dst, cap, planes, count, t,
				   zst_tier_isa_best());
}

size_t zst_tier_encode_isa(void *dst, size_t cap, const uint8_t *planes,
			   size_t count, enum castfs_zst_transform t,
			   enum zst_tier_isa isa)
{
	unsigned w = zst_group_width(t);
	/* A 2-byte element's high byte (sign, 5 exponent and 2 mantissa
	 * bits for fp16) codes in fewer bytes without its last mantissa bit,
	 * which is near-random: that bit is stored apart. */
	unsigned shift = t == CASTFS_ZST_PLANES2_TIERED;
	const uint8_t *ex = planes + (w - 1) * count;
	size_t fixed = (w - 1) * count + (shift ? (count + 7) / 8 : 0);
	struct bitw bw[ZST_TIER_MAX];
	struct tier_rank rk;
	struct tier_plan p;
	uint8_t *d;
	unsigned r;

	if (!count || count > UINT32_MAX / 8 || !zst_xform_tiered(t))
		return 0;
	ranks_of(&rk, ex, count, shift);
	plan_best(&p, &rk, count, fixed);
	if (p.size > cap || p.size - ZST_SKIPPABLE_HEADER > UINT32_MAX)
		return 0;
	d = header_write(dst, &p, count);
	r = zst_tier_ranks(p.nt, p.w);
	/* Ranks past the last value present hold the absent values in
	 * ascending order: the table stays distinct (and, shifted, below
	 * 128: there are at most 45 ranks). */
	memcpy(d, rk.sym, r);
	d += r;
	for (unsigned k = 0; k < p.nt; k++) {
		size_t len = (p.n[k] * p.w[k] + 7) / 8;

		memset(d, 0, len);
		bw[k] = (struct bitw){ d, 0 };
		d += len;
	}
	codes_write_isa(bw, d, &p, &rk, ex, count, shift, isa);
	d += p.n[p.nt];
	if (shift) {
		lowbits_write(d, ex, count, isa);
		d += (count + 7) / 8;
	}
	memcpy(d, planes, (w - 1) * count);
	return p.size;
}
