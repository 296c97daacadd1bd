/* SPDX-License-Identifier: MIT */
/*
 * Seekable-zstd sources: the standard Zstandard seekable format (facebook/zstd
 * contrib/seekable_format v0.1.0) read through the struct castfs_reader
 * vtable, so that every layer above serves a packed checkpoint unchanged, and
 * written by castfs_zst_pack().
 */
#ifndef CASTFS_ZST_H
#define CASTFS_ZST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/reader.h"

/* Largest decoded frame castfs accepts: it bounds a decode's memory. */
#define CASTFS_ZST_MAX_FRAME (64u << 20)
/* Most frames a seek table may list (the reference library's limit). */
#define CASTFS_ZST_MAX_FRAMES 0x8000000u
/* Default capacity of the decoded-frame cache. */
#define CASTFS_ZCACHE_DEFAULT (16u << 20)

/*
 * The decoded-frame cache and decoder-context pool, shared by every seekable
 * source of one namespace. Thread-safe.
 */
struct castfs_zcache;

struct castfs_zcache_stats {
	uint64_t hits; /* partial-frame reads served from the cache */
	uint64_t misses; /* frames decoded (into the cache or straight out) */
	uint64_t bytes_decoded; /* decoded bytes produced by those decodes */
	uint64_t errors; /* frames that failed to read, decode or verify */
	uint64_t cached_bytes; /* decoded bytes held now */
};

/*
 * castfs_zcache_new - a cache holding up to @capacity decoded bytes.
 * @capacity: 0 keeps nothing (every partial read decodes its frame).
 * @out: on success a new cache, owned by the caller (castfs_zcache_free()).
 *
 * Returns 0 or -ENOMEM (*@out untouched).
 */
int castfs_zcache_new(size_t capacity, struct castfs_zcache **out);

/*
 * castfs_zcache_free - release @c, its frames and decoder contexts. Every
 * index bound to @c must be freed first. NULL is accepted.
 */
void castfs_zcache_free(struct castfs_zcache *c);

/* castfs_zcache_stats_get - a snapshot of @c's counters. Thread-safe. */
void castfs_zcache_stats_get(struct castfs_zcache *c,
			     struct castfs_zcache_stats *out);

/*
 * How a frame of a grouped pack stores its bytes (FORMATS.md): the byte
 * planes of 2- or 4-byte elements, with the bf16/fp32 exponent first made
 * a whole byte, and the last plane of the TIERED ones in rank codes
 * (zst_tier.c). A standard pack stores every frame as NONE.
 */
enum castfs_zst_transform {
	CASTFS_ZST_NONE,
	CASTFS_ZST_PLANES2, /* fp16 and other 2-byte elements */
	CASTFS_ZST_BF16,
	CASTFS_ZST_PLANES4, /* 4-byte elements other than fp32 */
	CASTFS_ZST_F32,
	CASTFS_ZST_BF16_TIERED, /* bf16 as above, its exponent tier-coded */
	CASTFS_ZST_F32_TIERED, /* fp32 as F32, its exponent tier-coded */
	CASTFS_ZST_PLANES2_TIERED, /* as PLANES2, the high byte tier-coded */
	CASTFS_ZST_TRANSFORM_COUNT,
};

/* The parsed, validated seek table of one file. Immutable; thread-safe. */
struct castfs_zst_index;

/*
 * castfs_zst_index_read - read and validate the seek table at the end of
 * the @raw_size bytes of @raw.
 * @cache: the cache the index's frames are kept in; must outlive the index.
 * @out: on success a new index owned by the caller (castfs_zst_index_free()).
 * @d: optional diagnostic (why the file is not a usable seekable pack).
 *
 * Checks the footer magic and reserved bits, the skippable frame's magic and
 * length, that the compressed sizes add up to exactly the bytes before the
 * seek table, the frame limits above and the 64-bit total. Frame contents
 * are checked when they are decoded. Returns 0, -EINVAL (no or a lying seek
 * table: a plain zstd stream, a truncated file), -EFBIG (a frame or frame
 * count over castfs's limits), -ENOMEM or @raw's error; *@out untouched.
 * Thread-safe.
 */
int castfs_zst_index_read(const struct castfs_reader *raw, uint64_t raw_size,
			  struct castfs_zcache *cache,
			  struct castfs_zst_index **out, struct castfs_diag *d);

/* castfs_zst_index_free - release @ix; NULL is accepted. */
void castfs_zst_index_free(struct castfs_zst_index *ix);

/* castfs_zst_index_size - the decoded (original) size of the file. */
uint64_t castfs_zst_index_size(const struct castfs_zst_index *ix);

/*
 * castfs_zst_raw_off - the offset in the packed file of the frame holding
 * decoded offset @off (the end of the frames for @off >= the decoded size):
 * where to advise read-ahead of a reader at @off.
 */
uint64_t castfs_zst_raw_off(const struct castfs_zst_index *ix, uint64_t off);

/* castfs_zst_index_frames - the number of frames in the seek table. */
size_t castfs_zst_index_frames(const struct castfs_zst_index *ix);

/* castfs_zst_index_bytes - the memory @ix holds: 21 to 25 bytes a frame
 * (offsets, checksums, transforms, placement), for the cache's account. */
size_t castfs_zst_index_bytes(const struct castfs_zst_index *ix);

/* castfs_zst_index_checksums - whether the table carries frame checksums. */
bool castfs_zst_index_checksums(const struct castfs_zst_index *ix);

/* castfs_zst_index_grouped - whether the file is a grouped pack (its last
 * frame before the table is castfs's grouping marker). */
bool castfs_zst_index_grouped(const struct castfs_zst_index *ix);

/*
 * A reader of the decoded bytes of a seekable file: @ix over the compressed
 * bytes @raw (both borrowed; they must outlive the reader). A read decodes
 * each frame it touches: a frame it covers whole straight into the caller's
 * buffer, a frame it cuts through the cache. A frame that fails to decode,
 * whose size disagrees with the table or whose checksum mismatches fails the
 * read with -EIO (counted in the cache's errors). Thread-safe.
 */
struct castfs_zst_reader {
	struct castfs_reader r;
	const struct castfs_zst_index *ix;
	const struct castfs_reader *raw;
};

void castfs_zst_reader_init(struct castfs_zst_reader *zr,
			    const struct castfs_zst_index *ix,
			    const struct castfs_reader *raw);

/* Receives the packed bytes in order; returns 0 or a negative errno. */
struct castfs_writer {
	int (*write)(void *ctx, const void *buf, size_t n);
	void *ctx;
};

struct castfs_zst_pack_opts {
	size_t frame_size; /* decoded bytes per frame, 1..CASTFS_ZST_MAX_FRAME */
	int level; /* zstd compression level */
	bool checksums; /* write frame checksums in the seek table (XXH64;
			 * CRC32C of tiered frames) */
	const uint64_t *cuts; /* sorted offsets no frame may straddle */
	size_t ncuts;
	/*
	 * Grouped packs: the transform of the bytes from cuts[k] to the next
	 * cut (enum castfs_zst_transform; where cuts repeat an offset, the
	 * last one counts), and NONE before cuts[0]. NULL: a standard pack.
	 * The pieces of a transformed span must hold whole elements, so
	 * frame_size must then be a multiple of 4.
	 */
	const uint8_t *cut_transforms;
	/* Called after each frame with decoded and packed bytes so far
	 * (from one thread at a time, in file order). A negative errno
	 * returned stops the pack: nothing more is written, and the pack
	 * returns it (how a CLI's Ctrl-C ends a run cleanly). */
	int (*progress)(void *ctx, uint64_t in, uint64_t out);
	void *progress_ctx;
	/* Threads coding frames at once (0 or 1: the caller's only; at most
	 * 16, and fewer where their buffers, four frames each, would pass
	 * 256 MiB). The pack is the same bytes, and the failure reported
	 * the file's first, whatever their number. */
	unsigned threads;
};

/*
 * castfs_zst_level_valid - whether zstd has compression level @level
 * (ZSTD_minCLevel() to ZSTD_maxCLevel(); 0 is its default). zstd would
 * clamp another one without a word, so castfs_zst_pack() refuses it.
 */
bool castfs_zst_level_valid(int level);

/*
 * castfs_zst_pack - compress the @size bytes of @src into a seekable file
 * written to @w: one independent frame per piece (a piece never straddles a
 * cut and holds at most @o->frame_size bytes), then the seek table.
 *
 * A grouped pack (@o->cut_transforms) stores each piece's byte planes and
 * ends with castfs's grouping marker frame; zstd -d then yields the grouped
 * bytes, not the original, so it takes its own file extension.
 *
 * Returns 0, -EINVAL (bad options), -EFBIG (more frames than the format
 * allows), -ENOMEM, -EIO (the compressor failed), or the reader's or
 * writer's error. Thread-safe (no shared state); @src is read and @w
 * written from @o->threads threads (@w one call at a time, in order).
 */
int castfs_zst_pack(const struct castfs_reader *src, uint64_t size,
		    const struct castfs_zst_pack_opts *o,
		    const struct castfs_writer *w, struct castfs_diag *d);

struct castfs_zst_verify_opts {
	/* Called after each step with decoded bytes compared and the total
	 * (from one thread at a time, @done increasing). A negative errno
	 * returned stops the read-back, which returns it. */
	int (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	/* Threads comparing 4 MiB steps at once (0 or 1: the caller's only;
	 * at most 16). The failure reported is the first in the file
	 * whatever their number. */
	unsigned threads;
};

/*
 * castfs_zst_verify - whether the pack of @pack_size bytes read by @pack
 * decodes, through the reader a mount serves it with (seek table, frames,
 * checksums), to exactly the @orig_size bytes read by @orig.
 * @o: optional: a progress callback, and threads to share the work.
 *
 * Returns 0; -EBADMSG when it decodes to other bytes or another size (the
 * first differing offset in @d); -EINVAL or -EFBIG when its seek table does
 * not validate; -EIO when a frame fails to decode or its checksum
 * mismatches; -ENOMEM; or a reader's error. The reason is in @d.
 * Memory: two 4 MiB buffers per thread and a frame cache of
 * CASTFS_ZCACHE_DEFAULT. Thread-safe when @pack and @orig are.
 */
int castfs_zst_verify(const struct castfs_reader *pack, uint64_t pack_size,
		      const struct castfs_reader *orig, uint64_t orig_size,
		      const struct castfs_zst_verify_opts *o,
		      struct castfs_diag *d);

struct castfs_zst_unpack_opts {
	/* Called after each step with decoded bytes written and the total
	 * (from one thread at a time, @done increasing). A negative errno
	 * returned stops the unpack: nothing more is written, and the
	 * unpack returns it. */
	int (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	/* Threads decoding frames at once (0 or 1: the caller's only; at
	 * most 16, and fewer where their buffers would pass 256 MiB). */
	unsigned threads;
};

/*
 * castfs_zst_unpack - write the decoded bytes of the pack @ix (its
 * compressed bytes read by @raw) to @w, in order: its frames decoded, and
 * their checksums checked, as a mount reads them, by @o->threads threads
 * at once; @w is called one step at a time, in order.
 * @o: optional: a progress callback, and threads to share the work.
 *
 * Returns 0; -EIO when a frame fails to decode or its checksum mismatches
 * (the first such frame in the file named in @d, and nothing from it on
 * written); -ENOMEM; or @raw's or @w's error. Memory: per thread a buffer
 * of 4 MiB or the pack's largest frame, whichever is larger.
 */
int castfs_zst_unpack(const struct castfs_zst_index *ix,
		      const struct castfs_reader *raw,
		      const struct castfs_zst_unpack_opts *o,
		      const struct castfs_writer *w, struct castfs_diag *d);

#endif
