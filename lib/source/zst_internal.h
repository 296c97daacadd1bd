/* SPDX-License-Identifier: MIT */
/*
 * Private to lib/source/: the seek table layout, the codec wrappers of zst.c
 * (the one file that sees zstd's size_t error codes, STYLE R3) and the
 * decoded-frame cache.
 */
#ifndef CASTFS_ZST_INTERNAL_H
#define CASTFS_ZST_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/bytes.h"
#include "source/zst.h"

#define ZST_SKIPPABLE_MAGIC 0x184D2A5Eu /* the seek table's frame */
#define ZST_SEEKABLE_MAGIC 0x8F92EAB1u /* the last four bytes */
#define ZST_FOOTER_SIZE 9u
#define ZST_SKIPPABLE_HEADER 8u
#define ZST_DESC_CHECKSUM 0x80u
#define ZST_DESC_RESERVED 0x7Cu
/* The grouping marker: a skippable frame, the last before the table,
 * holding ZST_GROUPED_TAG and one transform byte per frame. */
#define ZST_GROUPED_MAGIC 0x184D2A57u
#define ZST_GROUPED_TAG "CASTFSG1"
#define ZST_GROUPED_TAG_LEN 8u

/*
 * An ordered pipeline (zst_pipe_run()): items taken in order by the
 * threads, worked on at once, and committed one at a time in the order
 * taken, so what is committed (a pack's frames, an unpacked file's bytes)
 * is the same whatever the threads' number and timing. Each thread keeps
 * its buffers and current item in a slot of @slot_size bytes (zeroed).
 */
struct zst_pipe_ops {
	size_t slot_size;
	/* 0, or -ENOMEM with nothing left to free: that thread then takes
	 * no item, and the others do them. */
	int (*slot_init)(void *ctx, void *slot);
	void (*slot_free)(void *ctx, void *slot);
	/* Under the pipeline's lock: the next item into @slot; false when
	 * none is left. */
	bool (*take)(void *ctx, void *slot);
	/* Unlocked, beside the other threads: 0, or the error with its
	 * reason in @d. */
	int (*work)(void *ctx, void *slot, struct castfs_diag *d);
	/* Unlocked, on the item's turn (one thread at a time, in order):
	 * 0, or the error with its reason in @d. */
	int (*commit)(void *ctx, void *slot, struct castfs_diag *d);
};

/*
 * zst_pipe_run - every item of @ops over @ctx, on @threads threads (0 or
 * 1: the caller's only; at most 16), the caller's among them. Items after the first that fails are not committed.
 * Returns 0; the first failing item's error (in order, whatever the
 * threads' timing), its reason in @d; or -ENOMEM when no thread got a slot.
 */
int zst_pipe_run(const struct zst_pipe_ops *ops, void *ctx, unsigned threads,
		 struct castfs_diag *d);

struct castfs_zst_index {
	struct castfs_zcache *cache;
	uint64_t id; /* the cache's key for this file's frames */
	size_t nframes;
	bool checksums;
	uint64_t *coff; /* nframes + 1 compressed offsets, running sums */
	uint64_t *doff; /* nframes + 1 decoded offsets */
	uint32_t *sum; /* nframes checksums, or NULL */
	uint8_t *xform; /* grouped packs: a transform per frame, else NULL */
	struct zst_prefix *prefix; /* where frames truly lie (zst_cache.c) */
};

/* What the frames' own headers say of where frames lie, learnt in file
 * order (zst_cache.c, prefix_check()). */
struct zst_prefix {
	pthread_mutex_t lock;
	size_t k; /* frames [0, k) have their true sizes added to sum */
	uint64_t sum;
	bool lost; /* a frame's true size is unknown: those after it too */
	uint8_t placed[]; /* per frame: 0 unknown, ZST_PLACED, ZST_MISPLACED */
};

#define ZST_PLACED 1u
#define ZST_MISPLACED 2u

/* The bytes of a grouped frame a visit hands over at a time: a piece the
 * visitor's reads find in the first-level cache (zst_cache.c). */
#define ZST_VISIT_CHUNK (16u << 10)

/* A decoder context with its compressed-bytes buffer (zst.c). */
struct zst_dctx {
	void *z; /* ZSTD_DCtx, seen as such only in zst.c */
	void *buf;
	size_t cap;
	void *ubuf; /* grouped frames are un-grouped from here */
	size_t ucap;
	uint8_t chunk[ZST_VISIT_CHUNK]; /* a visit's un-grouped piece */
	struct zst_dctx *next; /* the cache's pool of idle contexts */
};

/* Buffers an idle decoder context keeps (zst_dctx_trim()): those of
 * castfs pack's default frames (1 MiB, 256 KiB grouped) and then some. */
#define ZST_POOL_KEEP (4u << 20)

/* zst_dctx_new - a context, or NULL when out of memory. */
struct zst_dctx *zst_dctx_new(void);
void zst_dctx_free(struct zst_dctx *dc);

/* zst_dctx_trim - free @dc's buffers of more than @keep bytes (they grow
 * again on demand). */
void zst_dctx_trim(struct zst_dctx *dc, size_t keep);

/*
 * zst_dctx_buf - @dc's buffer of at least @n bytes (grown as needed), or
 * NULL when out of memory. Valid until the next call on @dc.
 */
void *zst_dctx_buf(struct zst_dctx *dc, size_t n);

/*
 * zst_decode_frame - decode the one frame of @csize bytes at @src into
 * exactly @dsize bytes at @dst. Returns 0, or -EIO when @src is not exactly
 * one zstd frame, fails to decode, or decodes to another size.
 */
int zst_decode_frame(struct zst_dctx *dc, void *dst, size_t dsize,
		     const void *src, size_t csize);

/* The bytes of a frame that hold its header, at most (ZSTD's bound). */
#define ZST_FRAME_HEAD 18u

/*
 * zst_frame_content_size - the decoded size the header of the zstd frame
 * whose first @n bytes are at @h says, in *@size. Returns 0, -ENODATA when
 * the header does not say (only decoding the frame tells), or -EBADMSG
 * when @h holds no zstd frame header.
 */
int zst_frame_content_size(const void *h, size_t n, uint64_t *size);

/* The most planes a grouped frame has (4-byte elements). */
#define ZST_MAX_PLANES 4u

/*
 * zst_decode_planes - decode the one frame of @csize bytes at @src, the @w
 * equal byte planes of a grouped frame (@dsize bytes in all, a multiple of
 * @w), and point @plane[p] at plane p: into @dst (@dsize bytes), or, for a
 * plane the frame stores raw as one block, into @src itself (no copy; valid
 * while @src is). Frames castfs does not parse itself are decoded by zstd
 * into @dst. Returns 0, or -EIO as zst_decode_frame(); @plane is then
 * undefined and @dst clobbered.
 */
int zst_decode_planes(struct zst_dctx *dc, void *dst, size_t dsize,
		      const void *src, size_t csize, unsigned w,
		      const uint8_t **plane);

/* zst_checksum_planes - zst_checksum() of the @w planes of @count bytes
 * each at @plane, as if they were one buffer in order. */
uint32_t zst_checksum_planes(const uint8_t *const *plane, unsigned w,
			     size_t count);

/*
 * zst_ungroup_planes - zst_ungroup() of @n bytes whose planes (@n / width
 * of @t bytes each) lie at @plane[0..width) rather than one after the
 * other. Thread-safe.
 */
void zst_ungroup_planes(uint8_t *dst, const uint8_t *const *plane, size_t n,
			enum castfs_zst_transform t);

struct zst_cctx; /* a compressor context (zst.c) */

/* zst_dctx_ubuf - @dc's second buffer, as zst_dctx_buf(). */
void *zst_dctx_ubuf(struct zst_dctx *dc, size_t n);

/* zst_group_width - the element width of transform @t (1 for NONE). */
unsigned zst_group_width(enum castfs_zst_transform t);

/* zst_group / zst_ungroup - @n bytes (whole elements) from @src to @dst
 * (not overlapping) into byte planes and back. Both run the fastest
 * variant this CPU has, chosen once (CASTFS_ISA=scalar forces the
 * reference). Thread-safe. */
void zst_group(uint8_t *dst, const uint8_t *src, size_t n,
	       enum castfs_zst_transform t);
void zst_ungroup(uint8_t *dst, const uint8_t *src, size_t n,
		 enum castfs_zst_transform t);

#if defined(__x86_64__) || defined(__i386__)
#define ZST_HAVE_X86 1
#else
#define ZST_HAVE_X86 0
#endif

/* The un-grouping variants: the scalar reference and the vector loops. */
enum zst_isa { ZST_ISA_SCALAR, ZST_ISA_SSE2, ZST_ISA_AVX2, ZST_ISA_COUNT };

/* zst_isa_runs - whether variant @isa is built and this CPU runs it. */
bool zst_isa_runs(enum zst_isa isa);

/* zst_ungroup_isa - zst_ungroup() with variant @isa, which must run (for
 * tests that hold every variant to the reference). */
void zst_ungroup_isa(uint8_t *dst, const uint8_t *src, size_t n,
		     enum castfs_zst_transform t, enum zst_isa isa);

/* zst_ungroup_planes_isa - zst_ungroup_planes() with variant @isa, which
 * must run (tests). */
void zst_ungroup_planes_isa(uint8_t *dst, const uint8_t *const *plane, size_t n,
			    enum castfs_zst_transform t, enum zst_isa isa);

/* zst_group_isa - zst_group() with variant @isa, which must run (tests). */
void zst_group_isa(uint8_t *dst, const uint8_t *src, size_t n,
		   enum castfs_zst_transform t, enum zst_isa isa);

/* The AVX2 loops (zst_group_avx2.c): the leading elements they grouped or
 * un-grouped, a multiple of 32; the caller does the rest. */
size_t zst_group2_avx2(uint8_t *lo, uint8_t *hi, const uint8_t *src,
		       size_t count, bool bf16);
size_t zst_group4_avx2(uint8_t *const *b, const uint8_t *src, size_t count,
		       bool f32);
size_t zst_ungroup2_avx2(uint16_t *dst, const uint8_t *lo, const uint8_t *hi,
			 size_t count, bool bf16);
size_t zst_ungroup4_avx2(uint32_t *dst, const uint8_t *const *b, size_t count,
			 bool f32);

/*
 * zst_encode_planes - compress @n bytes of @w equal planes into one frame,
 * ending a zstd block at each plane boundary (a block mixing planes
 * compresses worse). Returns the frame's size, or 0 on failure.
 */
size_t zst_encode_planes(struct zst_cctx *cc, void *dst, size_t cap,
			 const void *src, size_t n, unsigned w);

/*
 * zst_crc32c - CRC32C (Castagnoli) of the @n bytes at @buf: the checksum
 * of a tiered frame (FORMATS.md). The fastest variant this CPU has,
 * chosen once (CASTFS_ISA=scalar forces the byte-table reference).
 * zst_crc32c_isa - the same with variant @isa, which must run.
 */
enum zst_crc_isa { ZST_CRC_SCALAR, ZST_CRC_SSE42, ZST_CRC_AVX512 };
uint32_t zst_crc32c(const void *buf, size_t n);
uint32_t zst_crc32c_isa(const void *buf, size_t n, enum zst_crc_isa isa);
/* zst_crc_isa_runs - whether @isa is built and this CPU runs it. */
bool zst_crc_isa_runs(enum zst_crc_isa isa);

/* The SSE4.2 variant's stream length: long enough that joining three
 * costs little, short enough that the streams stay in L1 together. */
#define ZST_CRC_STREAM 4096u
/* zst_crc_shift - the CRC register @crc followed by @streams (1 or 2)
 * times ZST_CRC_STREAM zero bytes. zst_crc32c_sse42 - the raw register
 * @crc updated with @n bytes at @p (SSE4.2 only). */
uint32_t zst_crc_shift(uint32_t crc, unsigned streams);
uint32_t zst_crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n);

/*
 * The AVX-512 variant's fold constants, pairs (lo, hi) per 128-bit lane
 * of x^(D+63) and x^(D-1) mod P (reflected, in a 64-bit word's top half):
 * D = 2048 bits (a step), 512 (one register onto the next), and 384, 256,
 * 128, none (the four lanes of the last register onto its last lane).
 * zst_crc32c_avx512 - the raw register @crc updated with the whole
 * 256-byte steps of the @n >= 256 bytes at @p.
 */
struct zst_crc_folds {
	uint64_t by2048[8], by512[8], lanes[8];
};
uint32_t zst_crc32c_avx512(uint32_t crc, const uint8_t *p, size_t n,
			   const struct zst_crc_folds *k);

/* zst_checksum - the low 32 bits of XXH64(@buf, @n, seed 0). */
uint32_t zst_checksum(const void *buf, size_t n);

/*
 * zst_frame_sum - the seek-table checksum of a frame of transform @t, the
 * one rule the packer writes and the reader checks (FORMATS.md): of a
 * tiered frame, CRC32C of its @csize bytes as stored at @stored; of any
 * other, zst_checksum() of its @dsize decoded bytes as grouped, the
 * zst_group_width(@t) planes of @dsize / width bytes each at @plane (one
 * plane, the bytes themselves, for CASTFS_ZST_NONE). Thread-safe.
 */
uint32_t zst_frame_sum(enum castfs_zst_transform t, const void *stored,
		       size_t csize, const uint8_t *const *plane, size_t dsize);

/* A compressor context (zst.c). */
struct zst_cctx;

/* zst_cctx_new - a context at @level (with zstd's minimum match 7 when
 * @grouped: byte planes compress better so), or NULL when out of memory. */
struct zst_cctx *zst_cctx_new(int level, bool grouped);
void zst_cctx_free(struct zst_cctx *cc);

/* zst_bound - the most bytes one frame of @n bytes compresses to. */
size_t zst_bound(size_t n);

/*
 * zst_encode_frame - compress @n bytes into one frame at @dst (capacity
 * @cap >= zst_bound(@n)). Returns the frame's size, or 0 on failure.
 */
size_t zst_encode_frame(struct zst_cctx *cc, void *dst, size_t cap,
			const void *src, size_t n);

/*
 * Tiered frames (zst_tier.c, FORMATS.md): a skippable frame of
 * ZST_TIER_MAGIC holding the last plane of a grouped frame (the bf16 or
 * fp32 exponent, the high byte of other 2-byte elements) in up to
 * ZST_TIER_MAX tiers of fixed-width rank codes and the other planes raw.
 */
#define ZST_TIER_MAGIC 0x184D2A58u
#define ZST_TIER_MAX 3u

/* zst_xform_tiered - whether frames of @t are tiered frames. */
static inline bool zst_xform_tiered(enum castfs_zst_transform t)
{
	return t == CASTFS_ZST_BF16_TIERED || t == CASTFS_ZST_F32_TIERED ||
	       t == CASTFS_ZST_PLANES2_TIERED;
}

/* zst_xform_tier - the tiered transform of frames of @t: the same planes
 * in a tiered frame; CASTFS_ZST_NONE when @t has none. */
static inline enum castfs_zst_transform
zst_xform_tier(enum castfs_zst_transform t)
{
	if (t == CASTFS_ZST_BF16)
		return CASTFS_ZST_BF16_TIERED;
	if (t == CASTFS_ZST_F32)
		return CASTFS_ZST_F32_TIERED;
	if (t == CASTFS_ZST_PLANES2)
		return CASTFS_ZST_PLANES2_TIERED;
	return CASTFS_ZST_NONE;
}

/* zst_tier_ranks - the ranks @nt tiers of widths @w hold (each 2^w - 1). */
unsigned zst_tier_ranks(unsigned nt, const unsigned *w);

/*
 * zst_tier_encode - the tiered frame of transform @t (zst_xform_tiered())
 * of the @count elements whose planes (zst_group()'s order, one after the
 * other) are at @planes, into @dst (@cap bytes), with the widths that make
 * it smallest. Returns its size, or 0 when it does not fit @cap or @count
 * is 0 or too large for the header. Thread-safe.
 */
size_t zst_tier_encode(void *dst, size_t cap, const uint8_t *planes,
		       size_t count, enum castfs_zst_transform t);

/*
 * zst_tier_decode - decode the tiered frame of transform @t of @csize
 * bytes at @src into the w planes of @dsize bytes (w its width): @plane[p]
 * for p < w - 1 the raw planes where they lie in @src (valid while @src
 * is), @plane[w - 1] the coded plane at @dst + (w - 1) * @dsize / w; the
 * rest of @dst is scratch. Returns 0, or -EIO when the frame is not
 * exactly one legal tiered frame of @t and @dsize bytes (@dst clobbered).
 * Thread-safe.
 */
int zst_tier_decode(uint8_t *dst, size_t dsize, const uint8_t *src,
		    size_t csize, enum castfs_zst_transform t,
		    const uint8_t **plane);

/* The tier decoders: the scalar reference, AVX2, AVX-512 VBMI2. */
enum zst_tier_isa { ZST_TIER_SCALAR, ZST_TIER_AVX2, ZST_TIER_AVX512 };

/* zst_tier_isa_best - the variant this process decodes and codes with:
 * the best this CPU runs that CASTFS_ISA allows, chosen once. */
enum zst_tier_isa zst_tier_isa_best(void);

/*
 * zst_tier_encode_isa - zst_tier_encode() coding with variant @isa, which
 * must run (tests): the scalar reference, AVX2 or AVX-512 VBMI2. The
 * same bytes whatever the variant.
 */
size_t zst_tier_encode_isa(void *dst, size_t cap, const uint8_t *planes,
			   size_t count, enum castfs_zst_transform t,
			   enum zst_tier_isa isa);

/*
 * The vector tier coders (zst_tier_pack_avx512.c, zst_tier_pack_avx2.c),
 * one tier at a time (zst_tier_pack.c drives them):
 * zst_tier_step_* - the codes of the @n ranks at @in (64 bytes of slack,
 * which the AVX2 one zeroes; the tier of width @w holding the ranks from
 * @base) to @out (zeroed, LSB-first), the ranks escaping it to @next (64
 * bytes of slack), in order. Returns how many escaped.
 * zst_tier_ranks_avx512 - the ranks @of[@ex[i] >> @shift] of @count
 * symbols to @dst (64 bytes of slack).
 * zst_tier_lowbits_pack_* - the low-bit stream of a 2-byte tiered frame
 * (@d zeroed, (@count + 7) / 8 bytes): its leading symbols, a multiple of
 * the step; returns how many, the caller does the rest.
 */
size_t zst_tier_step_avx512(uint8_t *out, uint8_t *next, uint8_t *in, size_t n,
			    unsigned w, unsigned base);
size_t zst_tier_step_avx2(uint8_t *out, uint8_t *next, uint8_t *in, size_t n,
			  unsigned w, unsigned base);
void zst_tier_ranks_avx512(uint8_t *dst, const uint8_t *ex, size_t count,
			   unsigned shift, const uint8_t *of);
size_t zst_tier_lowbits_pack_avx512(uint8_t *d, const uint8_t *ex,
				    size_t count);
size_t zst_tier_lowbits_pack_avx2(uint8_t *d, const uint8_t *ex, size_t count);

/* zst_tier_isa_runs - whether @isa is built and this CPU runs it. */
bool zst_tier_isa_runs(enum zst_tier_isa isa);

/*
 * zst_tier_expand_isa - one tier with variant @isa (which must run): the
 * @n codes of @w bits (1, 2 or 4) packed LSB-first at @codes to bytes at
 * @out, code c < 2^w - 1 as @map[c], each escape (2^w - 1) as the next
 * byte of @next, in order. @next holds @nnext bytes, exactly one per
 * escape among the @n codes. Reads at most ceil(@n * @w / 8) bytes of
 * @codes. Where @low is not NULL (tier 0 of a PLANES2_TIERED frame), each
 * byte is then (byte << 1) | bit i of @low (LSB-first, ceil(@n / 8)
 * bytes): zst_tier_lowbits_scalar() fused into the store.
 */
void zst_tier_expand_isa(uint8_t *out, const uint8_t *codes, size_t n,
			 unsigned w, const uint8_t *map, const uint8_t *next,
			 size_t nnext, const uint8_t *low,
			 enum zst_tier_isa isa);
/*
 * zst_tier_escapes_isa - the escapes among the codes of @w bits in the
 * @len bytes at @p (padding bits zero), with variant @isa (which must
 * run). zst_tier_escape_bits() - the escapes of the 8 bytes at @p + @at
 * (fewer at the end), one bit each: the shared step of the variants.
 */
size_t zst_tier_escapes_isa(const uint8_t *p, size_t len, unsigned w,
			    enum zst_tier_isa isa);
static inline uint64_t zst_tier_escape_bits(const uint8_t *p, size_t len,
					    unsigned w, size_t at)
{
	static const uint64_t low[5] = { 0, ~0ull, 0x5555555555555555ull, 0,
					 0x1111111111111111ull };
	uint64_t x = 0;

	if (len - at >= 8)
		x = castfs_load_le64(p + at);
	else
		for (size_t b = 0; at + b < len; b++)
			x |= (uint64_t)p[at + b] << (8 * b);
	/* A code's lowest bit stays set when all its bits are. */
	if (w >= 2)
		x &= x >> 1;
	if (w == 4)
		x &= x >> 2;
	return x & low[w];
}
size_t zst_tier_escapes_avx2(const uint8_t *p, size_t len, unsigned w);
size_t zst_tier_escapes_avx512(const uint8_t *p, size_t len, unsigned w);
void zst_tier_expand_scalar(uint8_t *out, const uint8_t *codes, size_t n,
			    unsigned w, const uint8_t *map, const uint8_t *next,
			    const uint8_t *low);
void zst_tier_expand_avx2(uint8_t *out, const uint8_t *codes, size_t n,
			  unsigned w, const uint8_t *map, const uint8_t *next,
			  size_t nnext, const uint8_t *low);
void zst_tier_expand_avx512(uint8_t *out, const uint8_t *codes, size_t n,
			    unsigned w, const uint8_t *map, const uint8_t *next,
			    size_t nnext, const uint8_t *low);

/*
 * zst_tier_lowbits_scalar - the low bits of a PLANES2_TIERED frame's
 * coded plane put back: each of the @count symbols at @ex becomes
 * (symbol << 1) | bit i of @low (LSB-first). The reference of the merge
 * the vector tier decoders fuse into tier 0.
 */
void zst_tier_lowbits_scalar(uint8_t *ex, const uint8_t *low, size_t count);

/* zst_xform_bf16 - whether frames of @t hold bf16 planes (exponent
 * aligned), whichever way they are coded. */
static inline bool zst_xform_bf16(enum castfs_zst_transform t)
{
	return t == CASTFS_ZST_BF16 || t == CASTFS_ZST_BF16_TIERED;
}

/* zst_xform_f32 - the same for fp32 planes. */
static inline bool zst_xform_f32(enum castfs_zst_transform t)
{
	return t == CASTFS_ZST_F32 || t == CASTFS_ZST_F32_TIERED;
}

/* zcache internals used by the reader (zst_cache.c). */
struct zst_frame;

/* zcache_next_id - a key no other index of @c has. */
uint64_t zcache_next_id(struct castfs_zcache *c);

#endif
