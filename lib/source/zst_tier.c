/* SPDX-License-Identifier: MIT */
/*
 * Tiered frames of grouped packs (FORMATS.md, "Tiered frames"): the last
 * plane (the bf16 or fp32 exponent, a 2-byte element's high byte) in
 * fixed-width rank codes, which decode about ten times faster than zstd's
 * Huffman literals for nearly the same size, and the other planes stored
 * raw. Validating parser and the scalar reference of the loops the AVX2
 * and AVX-512 variants replace (zst_tier_pack.c writes the frames).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/isa.h"
#include "source/zst_internal.h"

/* Payload: count u32, ntiers u8, widths u8[3], lengths u32[4]. */
#define TIER_HDR 24u

struct tier_frame {
	size_t count; /* elements: bytes of each plane */
	unsigned planes; /* the coded one last */
	unsigned shift; /* low bits of the coded plane stored apart: 0 or 1 */
	unsigned nt; /* coded tiers, 1..ZST_TIER_MAX */
	unsigned w[ZST_TIER_MAX];
	size_t n[ZST_TIER_MAX + 1]; /* codes in stream k; n[nt] raw bytes */
	size_t len[ZST_TIER_MAX + 1];
	const uint8_t *stream[ZST_TIER_MAX + 1];
	const uint8_t *table; /* rank -> symbol, zst_tier_ranks() bytes */
	const uint8_t *low; /* shift: the low bit of each coded byte */
	const uint8_t *raw; /* the w - 1 raw planes */
};

/* The variant decodes (and castfs pack's coding) run, chosen once: the
 * best this CPU runs that
 * CASTFS_ISA allows (common/isa.h; avx2: as on a CPU without AVX-512
 * VBMI2). */
static enum zst_tier_isa tier_isa = ZST_TIER_SCALAR;
static pthread_once_t tier_once = PTHREAD_ONCE_INIT;

static void tier_choose(void)
{
	if (castfs_isa_allows(CASTFS_ISA_AVX512) &&
	    zst_tier_isa_runs(ZST_TIER_AVX512))
		tier_isa = ZST_TIER_AVX512;
	else if (castfs_isa_allows(CASTFS_ISA_AVX2) &&
		 zst_tier_isa_runs(ZST_TIER_AVX2))
		tier_isa = ZST_TIER_AVX2;
}

enum zst_tier_isa zst_tier_isa_best(void)
{
	pthread_once(&tier_once, tier_choose);
	return tier_isa;
}

static bool width_ok(unsigned w)
{
	return w == 1 || w == 2 || w == 4;
}

unsigned zst_tier_ranks(unsigned nt, const unsigned *w)
{
	unsigned r = 0;

	for (unsigned k = 0; k < nt; k++)
		r += (1u << w[k]) - 1;
	return r;
}

static size_t stream_bytes(size_t n, unsigned w)
{
	return (n * w + 7) / 8;
}

/* The reference: popcount may be a call where the build has no POPCNT. */
static size_t escapes_count_scalar(const uint8_t *p, size_t len, unsigned w)
{
	size_t e = 0;

	for (size_t at = 0; at < len; at += 8)
		e += (size_t)__builtin_popcountll(
			zst_tier_escape_bits(p, len, w, at));
	return e;
}

/* Whether the bits after the last code of stream @k are zero. */
static bool padding_zero(const struct tier_frame *f, unsigned k)
{
	unsigned used = (unsigned)(f->n[k] * f->w[k] % 8);

	return used == 0 || (f->stream[k][f->len[k] - 1] >> used) == 0;
}

static bool table_distinct(const uint8_t *t, unsigned r)
{
	uint8_t seen[256] = { 0 };

	for (unsigned i = 0; i < r; i++) {
		if (seen[t[i]])
			return false;
		seen[t[i]] = 1;
	}
	return true;
}

/* The fixed header of payload @p (@m bytes) into @f: true when legal. */
static bool header_parse(struct tier_frame *f, const uint8_t *p, size_t m)
{
	if (m < TIER_HDR)
		return false;
	f->count = castfs_load_le32(p);
	f->nt = p[4];
	if (f->nt < 1 || f->nt > ZST_TIER_MAX)
		return false;
	for (unsigned k = 0; k < ZST_TIER_MAX; k++) {
		f->w[k] = p[5 + k];
		if (k < f->nt ? !width_ok(f->w[k]) : f->w[k] != 0)
			return false;
	}
	for (unsigned k = 0; k <= ZST_TIER_MAX; k++) {
		f->len[k] = castfs_load_le32(p + 8 + 4 * k);
		if (k > f->nt && f->len[k])
			return false;
	}
	return true;
}

/* Whether the @n bytes at @p are all below 128 (symbols of 7 bits). */
static bool below_128(const uint8_t *p, size_t n)
{
	uint8_t any = 0;

	for (size_t i = 0; i < n; i++)
		any |= p[i];
	return any < 128;
}

/* After the raw tier: the low-bit stream when shifted, its padding 0,
 * then exactly the raw planes. */
static bool tail_parse(struct tier_frame *f, const uint8_t *p, size_t m,
		       size_t at)
{
	size_t lown = f->shift ? (f->count + 7) / 8 : 0;
	unsigned used = (unsigned)(f->count % 8);

	if (m - at < lown)
		return false;
	f->low = p + at;
	if (lown && used && f->low[lown - 1] >> used)
		return false;
	at += lown;
	f->raw = p + at;
	return m - at == (f->planes - 1) * f->count;
}

/* Streams and planes after the header: each length exactly what the
 * escapes of the stream before need, the payload exactly consumed. */
static bool streams_parse(struct tier_frame *f, const uint8_t *p, size_t m)
{
	unsigned r = zst_tier_ranks(f->nt, f->w);
	size_t at = TIER_HDR + r;

	if (m < at || !table_distinct(p + TIER_HDR, r) ||
	    (f->shift && !below_128(p + TIER_HDR, r)))
		return false;
	f->table = p + TIER_HDR;
	f->n[0] = f->count;
	for (unsigned k = 0; k <= f->nt; k++) {
		if (m - at < f->len[k])
			return false;
		f->stream[k] = p + at;
		at += f->len[k];
		if (k == f->nt)
			return f->len[k] == f->n[k] &&
			       (!f->shift ||
				below_128(f->stream[k], f->n[k])) &&
			       tail_parse(f, p, m, at);
		if (f->len[k] != stream_bytes(f->n[k], f->w[k]) ||
		    !padding_zero(f, k))
			return false;
		f->n[k + 1] = zst_tier_escapes_isa(f->stream[k], f->len[k],
						   f->w[k], tier_isa);
	}
	return false;
}

static int frame_parse(struct tier_frame *f, size_t dsize, const uint8_t *src,
		       size_t csize)
{
	size_t m = csize - ZST_SKIPPABLE_HEADER;

	if (!f->planes || csize < ZST_SKIPPABLE_HEADER ||
	    castfs_load_le32(src) != ZST_TIER_MAGIC ||
	    castfs_load_le32(src + 4) != m)
		return -EIO;
	src += ZST_SKIPPABLE_HEADER;
	if (!header_parse(f, src, m) || f->count * f->planes != dsize ||
	    !streams_parse(f, src, m))
		return -EIO;
	return 0;
}

/* The codes of the whole bytes at @codes (the first @n codes' worth)
 * mapped through @lut, 8 / @w output bytes per code byte by a table of
 * every code byte built first; the codes done. */
static size_t map_bytes(uint8_t *out, const uint8_t *codes, size_t n,
			unsigned w, const uint8_t *lut)
{
	unsigned per = 8 / w, esc = (1u << w) - 1;
	size_t nb = n / per;
	uint8_t t[256][8];

	if (nb < 1024) /* the table costs 256 code bytes' worth */
		return 0;
	for (unsigned v = 0; v < 256; v++)
		for (unsigned k = 0; k < per; k++)
			t[v][k] = lut[(v >> (k * w)) & esc];
	for (size_t b = 0; b < nb; b++)
		memcpy(out + b * per, t[codes[b]], per);
	return nb * per;
}

/*
 * The low bits put back: each byte of @ex (a symbol) shifted up by one,
 * bit i of @low below it. Eight bytes a step: bit k of a low byte spread
 * to byte k by a multiply, the masked bytes then made 0 or 1.
 */
void zst_tier_lowbits_scalar(uint8_t *ex, const uint8_t *low, size_t count)
{
	const uint64_t ones = 0x0101010101010101ull;
	size_t i = 0;

	for (; i + 8 <= count; i += 8) {
		uint64_t x = castfs_load_le64(ex + i);
		uint64_t b = (uint64_t)low[i / 8] * ones &
			     0x8040201008040201ull;

		b = ((b + 0x7F7F7F7F7F7F7F7Full) >> 7) & ones;
		castfs_store_le64(ex + i, ((x << 1) & ~ones) | b);
	}
	for (; i < count; i++)
		ex[i] = (uint8_t)(ex[i] << 1 | ((low[i / 8] >> (i % 8)) & 1u));
}

/*
 * Two passes, without a branch per code (escapes are a third of tier 1's
 * codes, unpredictable: a branch each made this loop 80 % of a read):
 * every code through the map, then the escapes' bytes put in place, the
 * escapes found a word at a time as zst_tier_escapes_isa() counts them.
 */
void zst_tier_expand_scalar(uint8_t *out, const uint8_t *codes, size_t n,
			    unsigned w, const uint8_t *map, const uint8_t *next,
			    const uint8_t *low)
{
	unsigned esc = (1u << w) - 1, lg = w >> 1; /* log2 of 1, 2, 4 */
	size_t i = 0, j = 0, bits = n * w, len = (bits + 7) / 8;
	uint8_t lut[16] = { 0 };

	memcpy(lut, map, esc);
	i = map_bytes(out, codes, n, w, lut);
	for (const uint8_t *b = codes + i * w / 8; i < n; b++)
		for (unsigned s = 0; s < 8 && i < n; s += w, i++)
			out[i] = lut[(*b >> s) & esc];
	for (size_t at = 0; at < len; at += 8) {
		uint64_t m = zst_tier_escape_bits(codes, len, w, at);

		if (bits - 8 * at < 64) /* not the bits after the last code */
			m &= (1ull << (bits - 8 * at)) - 1;
		for (; m; m &= m - 1)
			out[(8 * at + (size_t)__builtin_ctzll(m)) >> lg] =
				next[j++];
	}
	if (low)
		zst_tier_lowbits_scalar(out, low, n);
}

size_t zst_tier_escapes_isa(const uint8_t *p, size_t len, unsigned w,
			    enum zst_tier_isa isa)
{
#if ZST_HAVE_X86
	if (isa == ZST_TIER_AVX512)
		return zst_tier_escapes_avx512(p, len, w);
	if (isa == ZST_TIER_AVX2)
		return zst_tier_escapes_avx2(p, len, w);
#endif
	(void)isa;
	return escapes_count_scalar(p, len, w);
}

bool zst_tier_isa_runs(enum zst_tier_isa isa)
{
	if (isa == ZST_TIER_SCALAR)
		return true;
#if ZST_HAVE_X86
	if (isa == ZST_TIER_AVX2)
		return __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("popcnt");
	return isa == ZST_TIER_AVX512 && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vbmi") &&
	       __builtin_cpu_supports("avx512vbmi2") &&
	       __builtin_cpu_supports("avx512vpopcntdq");
#else
	return false;
#endif
}

void zst_tier_expand_isa(uint8_t *out, const uint8_t *codes, size_t n,
			 unsigned w, const uint8_t *map, const uint8_t *next,
			 size_t nnext, const uint8_t *low,
			 enum zst_tier_isa isa)
{
#if ZST_HAVE_X86
	if (isa == ZST_TIER_AVX512) {
		zst_tier_expand_avx512(out, codes, n, w, map, next, nnext, low);
		return;
	}
	if (isa == ZST_TIER_AVX2) {
		zst_tier_expand_avx2(out, codes, n, w, map, next, nnext, low);
		return;
	}
#endif
	(void)nnext;
	zst_tier_expand_scalar(out, codes, n, w, map, next, low);
}

/*
 * Tiers from the last back: tier k's output is read by tier k - 1, so
 * outputs alternate between the coded plane's place (@dst + (w - 1) *
 * count, tier 1's) and the start of @dst, which the raw planes (read
 * where they lie in @src) leave free.
 */
int zst_tier_decode(uint8_t *dst, size_t dsize, const uint8_t *src,
		    size_t csize, enum castfs_zst_transform t,
		    const uint8_t **plane)
{
	struct tier_frame f = {
		.planes = zst_xform_tiered(t) ? zst_group_width(t) : 0,
		.shift = t == CASTFS_ZST_PLANES2_TIERED,
	};
	const uint8_t *next, *table;
	uint8_t *coded;
	int rc;

	pthread_once(&tier_once, tier_choose);
	rc = frame_parse(&f, dsize, src, csize);
	if (rc)
		return rc;
	coded = dst + (f.planes - 1) * f.count;
	next = f.stream[f.nt];
	table = f.table + zst_tier_ranks(f.nt, f.w);
	for (unsigned k = f.nt; k-- > 0;) {
		uint8_t *out = k % 2 ? dst : coded;

		table -= (1u << f.w[k]) - 1;
		/* Tier 0's bytes are the plane's symbols: the low bits go
		 * below them as they are stored, not in a pass of their own. */
		zst_tier_expand_isa(out, f.stream[k], f.n[k], f.w[k], table,
				    next, f.n[k + 1],
				    k == 0 && f.shift ? f.low : NULL, tier_isa);
		next = out;
	}
	for (unsigned p = 0; p + 1 < f.planes; p++)
		plane[p] = f.raw + p * f.count;
	plane[f.planes - 1] = coded;
	return 0;
}
