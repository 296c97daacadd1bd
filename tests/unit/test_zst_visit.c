/* SPDX-License-Identifier: MIT */
/*
 * lib/source: the visit op of a grouped pack's reader, which hands a bf16
 * frame over as its two planes, fp16 and fp32 frames as theirs where the
 * visitor takes them, and other frames as bytes. The pieces, un-grouped
 * here by the bit layouts themselves (not castfs's un-grouping), must give
 * back the packed input; a corrupt frame fails its range with -EIO and its
 * neighbours still read.
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

#define HDR 96u /* a stand-in header, stored untransformed */
#define BF16_LEN 70000u /* then bf16 elements, frames of 8192 bytes */
#define N_IN (HDR + BF16_LEN + 3000u) /* and a plain tail */
#define FRAME 8192u

static uint8_t *make_input(unsigned seed)
{
	uint8_t *p = malloc(N_IN);

	srand(seed);
	for (size_t i = 0; i < N_IN; i++)
		p[i] = (uint8_t)((i & 1) ? 0x3C ^ (rand() & 1) : rand());
	return p;
}

/* make_input() with bf16 elements as weights have them: exponents a
 * few steps below 2^-6 with geometric odds, which castfs pack codes in
 * tiers (make_input()'s four equally likely ones stay zstd). */
static uint8_t *make_weights(unsigned seed)
{
	uint8_t *p = make_input(seed);

	for (size_t i = HDR; i + 2 <= HDR + BF16_LEN; i += 2) {
		unsigned r = (unsigned)rand(), e = 121;

		while ((r & 1) && e > 100) {
			e--;
			r >>= 1;
		}
		castfs_store_le16(p + i,
				  (uint16_t)((r & 0x8000u) | e << 7 |
					     ((unsigned)rand() & 0x7Fu)));
	}
	return p;
}

/* A grouped pack of @in (checksums on) into @m. */
static void pack_grouped(const uint8_t *in, struct membuf *m)
{
	static const uint64_t cuts[] = { HDR, HDR + BF16_LEN };
	static const uint8_t tr[] = { CASTFS_ZST_BF16, CASTFS_ZST_NONE };

	membuf_pack_grouped(m, in, N_IN, FRAME, cuts, tr, 2);
}

/* Pieces put back together; planes un-grouped by the bf16 layout. */
struct sink {
	uint8_t *out;
	size_t at;
	unsigned planes, bytes;
};

static int collect(void *arg, const struct castfs_piece *p)
{
	struct sink *s = arg;

	ck_assert_uint_eq(p->n % 2, 0);
	if (!p->sm) {
		memcpy(s->out + s->at, p->bytes, p->n);
		s->bytes++;
	} else {
		for (size_t k = 0; k < p->n / 2; k++) {
			uint16_t v = (uint16_t)(((p->sm[k] & 0x80u) << 8) |
						((unsigned)p->ex[k] << 7) |
						(p->sm[k] & 0x7Fu));

			castfs_store_le16(s->out + s->at + 2 * k, v);
		}
		s->planes++;
	}
	s->at += p->n;
	return 0;
}

struct fixture {
	uint8_t *in;
	struct membuf m;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
};

static void open_pack(struct fixture *f, size_t cache)
{
	ck_assert_int_eq(castfs_zcache_new(cache, &f->c), 0);
	castfs_mem_reader_init(&f->mr, f->m.p, f->m.n);
	ck_assert_int_eq(
		castfs_zst_index_read(&f->mr.r, f->m.n, f->c, &f->ix, NULL), 0);
	castfs_zst_reader_init(&f->zr, f->ix, &f->mr.r);
	ck_assert_ptr_nonnull(f->zr.r.visit);
}

static void close_pack(struct fixture *f)
{
	castfs_zst_index_free(f->ix);
	castfs_zcache_free(f->c);
	free(f->m.p);
	free(f->in);
}

static int visit(struct fixture *f, uint64_t off, size_t n, struct sink *s)
{
	memset(s, 0, sizeof(*s));
	s->out = malloc(n + 1);
	return f->zr.r.visit(f->zr.r.ctx, off, n, 2 | CASTFS_VISIT_BF16,
			     collect, s);
}

/* Loop: 0 a cache too small to keep a frame, 1 one that keeps them all. */
START_TEST(test_zst_visit__pieces_give_the_input)
{
	struct fixture f = { .in = make_input(3) };
	struct sink s;
	unsigned seed = 7, planes = 0;

	pack_grouped(f.in, &f.m);
	open_pack(&f, _i ? 1u << 20 : 1);
	ck_assert_int_eq(visit(&f, 0, N_IN & ~1u, &s), 0);
	ck_assert_mem_eq(s.out, f.in, N_IN & ~1u);
	ck_assert_uint_ge(s.planes, BF16_LEN / FRAME);
	free(s.out);
	for (int k = 0; k < 300; k++) {
		size_t off = 2 * ((size_t)rand_r(&seed) % (N_IN / 2));
		size_t n = 2 * ((size_t)rand_r(&seed) % (3 * FRAME / 2));

		if (n > (N_IN & ~1u) - off)
			n = (N_IN & ~1u) - off;
		ck_assert_int_eq(visit(&f, off, n, &s), 0);
		ck_assert_uint_eq(s.at, n);
		ck_assert_mem_eq(s.out, f.in + off, n);
		planes += s.planes;
		free(s.out);
	}
	/* Whole bf16 frames were handed as planes, unless cached. */
	if (!_i)
		ck_assert_uint_gt(planes, 0);
	close_pack(&f);
}
END_TEST

/* Odd offsets or lengths are declined before anything is handed over;
 * a standard pack offers no visit op at all. */
START_TEST(test_zst_visit__declines_odd_ranges)
{
	struct fixture f = { .in = make_input(4) };
	struct sink s;

	pack_grouped(f.in, &f.m);
	open_pack(&f, 1u << 20);
	ck_assert_int_eq(visit(&f, HDR + 1, 100, &s), -ENOTSUP);
	ck_assert_uint_eq(s.at, 0);
	free(s.out);
	ck_assert_int_eq(visit(&f, HDR, 101, &s), -ENOTSUP);
	ck_assert_uint_eq(s.at, 0);
	free(s.out);
	ck_assert_int_eq(visit(&f, N_IN - 2, 4, &s), -ENOTSUP);
	free(s.out);
	castfs_zst_index_free(f.ix);
	free(f.m.p);
	{
		struct castfs_mem_reader mr;
		struct castfs_writer w = { mem_write, &f.m };
		struct castfs_zst_pack_opts o = { .frame_size = FRAME,
						  .level = 1 };

		memset(&f.m, 0, sizeof(f.m));
		castfs_mem_reader_init(&mr, f.in, N_IN);
		ck_assert_int_eq(castfs_zst_pack(&mr.r, N_IN, &o, &w, NULL), 0);
		castfs_mem_reader_init(&f.mr, f.m.p, f.m.n);
		ck_assert_int_eq(castfs_zst_index_read(&f.mr.r, f.m.n, f.c,
						       &f.ix, NULL),
				 0);
		castfs_zst_reader_init(&f.zr, f.ix, &f.mr.r);
		ck_assert_ptr_null(f.zr.r.visit);
	}
	close_pack(&f);
}
END_TEST

/* The compressed offset of frame @k, from the seek table. */
static size_t frame_coff(const struct membuf *m, size_t k)
{
	size_t nf = castfs_load_le32(m->p + m->n - 9);
	size_t at = m->n - 9 - nf * 12, off = 0;

	for (size_t i = 0; i < k; i++)
		off += castfs_load_le32(m->p + at + 12 * i);
	return off;
}

/*
 * A byte changed in the middle of bf16 frame 3 (frame 0 is the header):
 * a range over it fails with -EIO, whole or cut, cached or not; the
 * frames beside it still give the input.
 */
START_TEST(test_zst_visit__bad_frame_fails_its_range_only)
{
	struct fixture f = { .in = make_input(5) };
	size_t bad = HDR + 2 * FRAME; /* frame 3's decoded offset */
	size_t c0, c1;
	struct sink s;

	pack_grouped(f.in, &f.m);
	c0 = frame_coff(&f.m, 3);
	c1 = frame_coff(&f.m, 4);
	f.m.p[c0 + (c1 - c0) / 2] ^= 0x10;
	open_pack(&f, _i ? 1u << 20 : 1);
	ck_assert_int_eq(visit(&f, bad, FRAME, &s), -EIO);
	free(s.out);
	ck_assert_int_eq(visit(&f, bad - FRAME, 3 * FRAME, &s), -EIO);
	ck_assert_uint_eq(s.at, FRAME); /* the frame before it was handed */
	ck_assert_mem_eq(s.out, f.in + bad - FRAME, FRAME);
	free(s.out);
	ck_assert_int_eq(visit(&f, bad + 100, 200, &s), -EIO);
	free(s.out);
	ck_assert_int_eq(visit(&f, bad - FRAME, FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + bad - FRAME, FRAME);
	free(s.out);
	ck_assert_int_eq(visit(&f, bad + FRAME, FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + bad + FRAME, FRAME);
	free(s.out);
	close_pack(&f);
}
END_TEST

/*
 * A memory source that offers the map op as a leased file does: the
 * bytes handed where they lie. Counts its calls; declines them all (as
 * the fd reader does a short range) when @decline is set. Its preads
 * keep the largest count asked.
 */
struct mapped_mem {
	struct castfs_mem_reader mr;
	ssize_t (*pread)(void *ctx, void *buf, size_t n, uint64_t off);
	unsigned maps;
	size_t pread_max;
	bool decline;
};

static ssize_t mapped_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct mapped_mem *mm = ctx;

	mm->pread_max = n > mm->pread_max ? n : mm->pread_max;
	return mm->pread(&mm->mr, buf, n, off);
}

static int mapped_map(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		      void *arg)
{
	struct mapped_mem *mm = ctx;

	mm->maps++;
	if (mm->decline)
		return -ENOTSUP;
	ck_assert_uint_le(off + n, mm->mr.len);
	return fn(arg,
		  &(struct castfs_piece){ .bytes = mm->mr.data + off, .n = n });
}

/* The reader @f opens over its pack, through @mm's map op. */
static void open_mapped(struct fixture *f, struct mapped_mem *mm, size_t cache)
{
	open_pack(f, cache);
	castfs_mem_reader_init(&mm->mr, f->m.p, f->m.n);
	mm->mr.r.ctx = mm;
	mm->pread = f->mr.r.pread;
	mm->mr.r.pread = mapped_pread;
	mm->mr.r.map = mapped_map;
	mm->maps = 0;
	mm->pread_max = 0;
	mm->decline = false;
	castfs_zst_reader_init(&f->zr, f->ix, &mm->mr.r);
}

/* pread of @n bytes at @off through @f's reader equals the input. */
static void pread_ok(struct fixture *f, uint64_t off, size_t n)
{
	uint8_t *buf = malloc(n + 1);

	ck_assert_int_eq(f->zr.r.pread(f->zr.r.ctx, buf, n, off), (ssize_t)n);
	ck_assert_mem_eq(buf, f->in + off, n);
	free(buf);
}

/*
 * Frames cut by a range go through the cache: a visit that cuts bf16
 * frames, then visits and preads (at odd offsets and lengths, a cut
 * element at either end) inside the frames it cached, give the input.
 * Loop: 0 pread source, 1 a source with the map op.
 */
START_TEST(test_zst_visit__cut_frames_read_at_any_offset)
{
	struct fixture f = { .in = make_input(6) };
	struct mapped_mem mm;
	size_t at = HDR + FRAME / 2 + 10; /* cuts frames 1 and 3 */
	struct sink s;

	pack_grouped(f.in, &f.m);
	if (_i)
		open_mapped(&f, &mm, 1u << 20);
	else
		open_pack(&f, 1u << 20);
	ck_assert_int_eq(visit(&f, at, 2 * FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + at, 2 * FRAME);
	free(s.out);
	for (size_t k = 0; k < 64; k++) {
		size_t off = HDR + 1 + 37 * k, n = 1 + (k * 131) % 700;

		pread_ok(&f, off, n);
		pread_ok(&f, at + 2 * FRAME - n, n);
		ck_assert_int_eq(visit(&f, (off + 1) & ~(size_t)1, n & ~1u, &s),
				 0);
		ck_assert_mem_eq(s.out, f.in + ((off + 1) & ~(size_t)1),
				 n & ~1u);
		free(s.out);
	}
	pread_ok(&f, HDR + FRAME - 1, 2); /* one byte of two frames each */
	pread_ok(&f, 0, N_IN);
	close_pack(&f);
}
END_TEST

/*
 * A frame corrupt in the middle of a mapped pack: every range over it,
 * visited or read, fails with -EIO, and its neighbours are exact.
 */
START_TEST(test_zst_visit__mapped_bad_frame_fails_every_range_over_it)
{
	struct fixture f = { .in = make_input(8) };
	size_t bad = HDR + 2 * FRAME, c0, c1;
	struct mapped_mem mm;
	uint8_t buf[3 * FRAME];
	struct sink s;

	pack_grouped(f.in, &f.m);
	c0 = frame_coff(&f.m, 3);
	c1 = frame_coff(&f.m, 4);
	f.m.p[c0 + (c1 - c0) / 2] ^= 0x10;
	open_mapped(&f, &mm, 1u << 20);
	for (size_t k = 0; k < 40; k++) {
		size_t off = bad - FRAME + 2 * (k * 97 % FRAME);
		size_t n = FRAME + 2 + 2 * (k * 61 % (FRAME / 2));

		ck_assert_int_eq(visit(&f, off, n, &s), -EIO);
		free(s.out);
		ck_assert_int_eq(f.zr.r.pread(f.zr.r.ctx, buf, n + 1, off + 1),
				 -EIO);
	}
	pread_ok(&f, bad - FRAME, FRAME);
	pread_ok(&f, bad + FRAME, FRAME);
	ck_assert_int_eq(visit(&f, bad + FRAME, FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + bad + FRAME, FRAME);
	free(s.out);
	close_pack(&f);
}
END_TEST

/*
 * Whole tiered frames in a row are decoded from one mapping of their
 * compressed bytes and verified after the visitor has them: a visit of
 * eight whole bf16 frames gives the input through the map op (loop 0),
 * and the same where the map op declines (loop 1: pread, as before, the
 * map op asked once). A
 * byte changed in frame 4 (loop 2): the run fails with -EIO once that
 * frame is handed, the frames before it handed exact, the error counted;
 * runs beside it still read.
 */
START_TEST(test_zst_visit__mapped_runs_verified)
{
	struct fixture f = { .in = make_weights(9) };
	struct castfs_zcache_stats st;
	struct mapped_mem mm;
	struct sink s;
	size_t c0, c1;

	pack_grouped(f.in, &f.m);
	if (_i == 2) {
		c0 = frame_coff(&f.m, 4);
		c1 = frame_coff(&f.m, 5);
		f.m.p[c0 + (c1 - c0) / 2] ^= 0x10;
	}
	open_mapped(&f, &mm, 1);
	mm.decline = _i == 1;
	if (_i < 2) {
		ck_assert_int_eq(visit(&f, HDR, 8 * FRAME, &s), 0);
		ck_assert_mem_eq(s.out, f.in + HDR, 8 * FRAME);
		ck_assert_uint_eq(s.planes, 8);
		/* One mapping for the run, or one refusal for the range: not
		 * a request per frame. */
		ck_assert_uint_eq(mm.maps, 1);
		free(s.out);
		close_pack(&f);
		return;
	}
	ck_assert_int_eq(visit(&f, HDR, 8 * FRAME, &s), -EIO);
	ck_assert_uint_eq(mm.maps, 1);
	ck_assert_uint_ge(s.at, 3 * FRAME);
	ck_assert_mem_eq(s.out, f.in + HDR, 3 * FRAME);
	free(s.out);
	castfs_zcache_stats_get(f.c, &st);
	ck_assert_uint_eq(st.errors, 1);
	ck_assert_int_eq(visit(&f, HDR + 4 * FRAME, 4 * FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + HDR + 4 * FRAME, 4 * FRAME);
	free(s.out);
	ck_assert_int_eq(visit(&f, HDR, 3 * FRAME, &s), 0);
	ck_assert_mem_eq(s.out, f.in + HDR, 3 * FRAME);
	free(s.out);
	ck_assert_uint_eq(mm.maps, 3);
	close_pack(&f);
}
END_TEST

/* A visit of @n bytes at @off through @f's reader gives the input. */
static void visit_ok(struct fixture *f, size_t off, size_t n)
{
	struct sink s;

	ck_assert_int_eq(visit(f, off, n, &s), 0);
	ck_assert_mem_eq(s.out, f->in + off, n);
	free(s.out);
}

/* @f's frame cache has counted @misses, @hits and @errors, and holds
 * @cached bytes. */
static void cache_is(struct fixture *f, uint64_t misses, uint64_t hits,
		     uint64_t errors, uint64_t cached)
{
	struct castfs_zcache_stats st;

	castfs_zcache_stats_get(f->c, &st);
	ck_assert_uint_eq(st.misses, misses);
	ck_assert_uint_eq(st.hits, hits);
	ck_assert_uint_eq(st.errors, errors);
	ck_assert_uint_eq(st.cached_bytes, cached);
}

/*
 * A range that starts inside a frame not cached (a request the kernel's
 * read-ahead sent before the one ending in that frame was served) maps
 * it with the run: a visit of 2.5 frames from the middle of frame 1 to
 * the middle of frame 4 is exact, one mapping, no frame read, the two cut
 * frames cached with the halves not served; the rest of each then comes
 * from the cache (two hits) and, served whole, leaves it.
 */
START_TEST(test_zst_visit__mapped_run_decodes_its_cut_start)
{
	struct fixture f = { .in = make_weights(17) };
	size_t a = HDR + FRAME / 2, b = HDR + 3 * FRAME + FRAME / 2;
	struct mapped_mem mm;

	pack_grouped(f.in, &f.m);
	open_mapped(&f, &mm, 1u << 20);
	visit_ok(&f, a, b - a);
	ck_assert_uint_eq(mm.maps, 1);
	ck_assert_uint_le(mm.pread_max, ZST_FRAME_HEAD);
	cache_is(&f, 4, 0, 0, 2 * FRAME);
	visit_ok(&f, HDR, FRAME / 2);
	pread_ok(&f, b, FRAME / 2);
	cache_is(&f, 4, 2, 0, 0);
	close_pack(&f);
}
END_TEST

/*
 * A mapped run whose range ends inside a frame maps that frame too and
 * decodes it from there into the cache (a sequential reader's next range
 * starts in it): a visit of 3.5 whole bf16 frames is exact, one mapping,
 * no frame read (the only preads are frame headers), the cut frame
 * cached; the next range takes the rest of it from the cache, served
 * whole, it leaves. Loop 1: a byte changed in the cut frame fails the
 * visit with -EIO, counted once, the frame not cached (not left "being
 * decoded" either: the next read of it fails again instead of waiting),
 * and the frames before it still read.
 */
START_TEST(test_zst_visit__mapped_run_decodes_its_cut_end)
{
	struct fixture f = { .in = make_weights(13) };
	size_t at = HDR + 3 * FRAME + FRAME / 2, c0, c1;
	struct mapped_mem mm;
	uint8_t buf[FRAME];
	struct sink s;

	pack_grouped(f.in, &f.m);
	if (_i) {
		c0 = frame_coff(&f.m, 4); /* frame 0 is the header's */
		c1 = frame_coff(&f.m, 5);
		f.m.p[c0 + (c1 - c0) / 2] ^= 0x10;
	}
	open_mapped(&f, &mm, 1u << 20);
	ck_assert_int_eq(visit(&f, HDR, at - HDR, &s), _i ? -EIO : 0);
	ck_assert_uint_eq(mm.maps, 1);
	ck_assert_uint_le(mm.pread_max, ZST_FRAME_HEAD);
	ck_assert_mem_eq(s.out, f.in + HDR, 3 * FRAME);
	cache_is(&f, 4, 0, _i, _i ? 0 : FRAME);
	if (!_i)
		ck_assert_mem_eq(s.out + 3 * FRAME, f.in + HDR + 3 * FRAME,
				 FRAME / 2);
	free(s.out);
	if (_i) {
		ck_assert_int_eq(f.zr.r.pread(f.zr.r.ctx, buf, 2, at), -EIO);
		pread_ok(&f, HDR + 2 * FRAME, FRAME);
		close_pack(&f);
		return;
	}
	visit_ok(&f, at, FRAME / 2 + 2 * FRAME);
	cache_is(&f, 6, 1, 0, 0);
	close_pack(&f);
}
END_TEST

/* A pack of a 2-byte span (fp16), an fp32 span and a plain 4-byte span
 * (int32), frames of FRAME bytes, random data. */
#define W_HDR 64u
#define W_LEN (5 * FRAME + 1000u)
#define W_N (W_HDR + 3 * W_LEN)

/* Pieces of a visit of @how put back: planes by the fp16 (2) or fp32
 * (4, the exponent a byte) layout, each piece's kind counted. */
struct wsink {
	uint8_t out[W_N];
	size_t at;
	unsigned w, planes, bytes, bytes_max;
};

static int wcollect(void *arg, const struct castfs_piece *p)
{
	struct wsink *s = arg;
	const uint8_t *const *pl = p->planes;

	ck_assert_ptr_null(p->sm);
	ck_assert_uint_eq(p->n % s->w, 0);
	if (!pl) {
		memcpy(s->out + s->at, p->bytes, p->n);
		s->bytes++;
		s->bytes_max = p->n > s->bytes_max ? (unsigned)p->n :
						     s->bytes_max;
	}
	for (size_t k = 0; pl && k < p->n / s->w; k++) {
		uint8_t *d = s->out + s->at + s->w * k;

		if (s->w == 2) {
			d[0] = pl[0][k];
			d[1] = pl[1][k];
		} else {
			castfs_store_le32(
				d, (uint32_t)(pl[2][k] & 0x80u) << 24 |
					   (uint32_t)pl[3][k] << 23 |
					   (uint32_t)(pl[2][k] & 0x7Fu) << 16 |
					   (uint32_t)pl[1][k] << 8 | pl[0][k]);
		}
	}
	s->planes += pl != NULL;
	s->at += p->n;
	return 0;
}

/*
 * Loop over (span, how): planes only where the visitor takes the frame's
 * kind (fp16 planes for a 2-byte frame, fp32 planes for an fp32 frame,
 * never for int32 or bf16 flags), otherwise bytes of at most 16 KiB per
 * piece; either way the input back. A range a whole element off is
 * declined.
 */
START_TEST(test_zst_visit__wide_frames_planes_where_taken)
{
	static const uint64_t cuts[] = { W_HDR, W_HDR + W_LEN,
					 W_HDR + 2 * W_LEN };
	static const uint8_t tr[] = { CASTFS_ZST_PLANES2, CASTFS_ZST_F32,
				      CASTFS_ZST_PLANES4 };
	static const struct {
		unsigned span, how, planes;
	} cases[] = {
		{ 0, 2 | CASTFS_VISIT_F16, 1 },	 { 0, 2, 0 },
		{ 0, 2 | CASTFS_VISIT_BF16, 0 }, { 0, 2 | CASTFS_VISIT_F32, 0 },
		{ 1, 4 | CASTFS_VISIT_F32, 1 },	 { 1, 4 | CASTFS_VISIT_F16, 0 },
		{ 2, 4 | CASTFS_VISIT_F32, 0 },
	};
	unsigned k = (unsigned)_i, w = cases[k].how & CASTFS_VISIT_SIZE;
	uint64_t off = W_HDR + cases[k].span * W_LEN;
	struct fixture f = { .in = malloc(W_N) };
	struct wsink *s = calloc(1, sizeof(*s));
	unsigned seed = 5;

	for (size_t i = 0; i < W_N; i++)
		f.in[i] = (uint8_t)rand_r(&seed);
	membuf_pack_grouped(&f.m, f.in, W_N, FRAME, cuts, tr, 3);
	open_pack(&f, 1);
	s->w = w;
	ck_assert_int_eq(f.zr.r.visit(f.zr.r.ctx, off, W_LEN, cases[k].how,
				      wcollect, s),
			 0);
	ck_assert_uint_eq(s->at, W_LEN);
	ck_assert_mem_eq(s->out, f.in + off, W_LEN);
	if (cases[k].planes)
		ck_assert_uint_eq(s->planes, (W_LEN + FRAME - 1) / FRAME);
	else
		ck_assert_uint_eq(s->planes, 0);
	ck_assert_uint_le(s->bytes_max, 16u << 10);
	s->at = 0;
	ck_assert_int_eq(f.zr.r.visit(f.zr.r.ctx, off + w / 2, 2 * w,
				      cases[k].how, wcollect, s),
			 -ENOTSUP);
	ck_assert_uint_eq(s->at, 0);
	free(s);
	close_pack(&f);
}
END_TEST

/*
 * Frames cut by a visit are cached as planes and handed as planes: the
 * tail of one frame, a whole one and the head of the next come as three
 * pieces of planes, none of bytes, then the first frame's head from the
 * cache. A frame that has handed out each of its bytes once is dropped;
 * one read twice stays. Odd reads inside cached frames (elements cut at
 * either end) and a visitor that takes bytes only give the input.
 * Loop: fp16 then fp32 span; random (zstd planes), then weights (tiers).
 */
START_TEST(test_zst_visit__cut_frames_kept_as_planes)
{
	static const uint64_t cuts[] = { W_HDR, W_HDR + W_LEN,
					 W_HDR + 2 * W_LEN };
	static const uint8_t tr[] = { CASTFS_ZST_PLANES2, CASTFS_ZST_F32,
				      CASTFS_ZST_PLANES4 };
	unsigned span = (unsigned)_i % 2, w = span ? 4 : 2, seed = 11;
	uint32_t wseed = 11;
	unsigned how = w | (span ? CASTFS_VISIT_F32 : CASTFS_VISIT_F16);
	uint64_t off = W_HDR + span * W_LEN, cut = off + FRAME / 2;
	struct fixture f = { .in = malloc(W_N) };
	struct wsink *s = calloc(1, sizeof(*s));
	struct castfs_zcache_stats st;

	for (size_t i = 0; i < W_N; i++)
		f.in[i] = (uint8_t)rand_r(&seed);
	if (_i >= 2)
		membuf_fill_weights(f.in, off, W_LEN, w == 2, &wseed);
	membuf_pack_grouped(&f.m, f.in, W_N, FRAME, cuts, tr, 3);
	open_pack(&f, 1u << 20);
	for (size_t i = 0; i < f.ix->nframes; i++)
		if (f.ix->doff[i] == off) /* the weights' frames are tiered */
			ck_assert_int_eq(zst_xform_tiered(f.ix->xform[i]),
					 _i >= 2);
	s->w = w;
	ck_assert_int_eq(
		f.zr.r.visit(f.zr.r.ctx, cut, 2 * FRAME, how, wcollect, s), 0);
	ck_assert_mem_eq(s->out, f.in + cut, 2 * FRAME);
	ck_assert_uint_eq(s->planes, 3);
	ck_assert_uint_eq(s->bytes, 0);
	castfs_zcache_stats_get(f.c, &st);
	ck_assert_uint_eq(st.cached_bytes, 2 * FRAME); /* the cut two */
	memset(s, 0, sizeof(*s));
	s->w = w;
	ck_assert_int_eq(
		f.zr.r.visit(f.zr.r.ctx, off, FRAME / 2, how, wcollect, s), 0);
	ck_assert_mem_eq(s->out, f.in + off, FRAME / 2);
	ck_assert_uint_eq(s->planes, 1);
	castfs_zcache_stats_get(f.c, &st);
	ck_assert_uint_eq(st.hits, 1);
	ck_assert_uint_eq(st.cached_bytes, FRAME); /* frame 0 all served */
	/* Frame 2's head again, then its tail: read twice, it stays. */
	memset(s, 0, sizeof(*s));
	s->w = w;
	ck_assert_int_eq(f.zr.r.visit(f.zr.r.ctx, off + 2 * FRAME, FRAME / 2,
				      how, wcollect, s),
			 0);
	ck_assert_mem_eq(s->out, f.in + off + 2 * FRAME, FRAME / 2);
	pread_ok(&f, cut + 2 * FRAME, FRAME / 2);
	castfs_zcache_stats_get(f.c, &st);
	ck_assert_uint_eq(st.cached_bytes, FRAME);
	for (size_t k = 1; k < 2 * w; k++) {
		pread_ok(&f, off + 2 * FRAME + k, 2 * w - k);
		pread_ok(&f, off + 2 * FRAME + FRAME - 3 * w + k, 1);
	}
	/* A visitor taking bytes only: the cached frame un-grouped a
	 * piece at a time. */
	memset(s, 0, sizeof(*s));
	s->w = w;
	ck_assert_int_eq(f.zr.r.visit(f.zr.r.ctx, off + 2 * FRAME + w,
				      FRAME - 2 * w, w, wcollect, s),
			 0);
	ck_assert_mem_eq(s->out, f.in + off + 2 * FRAME + w, FRAME - 2 * w);
	ck_assert_uint_eq(s->planes, 0);
	castfs_zcache_stats_get(f.c, &st);
	ck_assert_uint_eq(st.misses, 3);
	ck_assert_uint_eq(st.errors, 0);
	free(s);
	close_pack(&f);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("zst_visit");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(tc, test_zst_visit__pieces_give_the_input, 0, 2);
	tcase_add_test(tc, test_zst_visit__declines_odd_ranges);
	tcase_add_loop_test(tc, test_zst_visit__bad_frame_fails_its_range_only,
			    0, 2);
	tcase_add_loop_test(tc, test_zst_visit__cut_frames_read_at_any_offset,
			    0, 2);
	tcase_add_test(
		tc, test_zst_visit__mapped_bad_frame_fails_every_range_over_it);
	tcase_add_loop_test(tc, test_zst_visit__wide_frames_planes_where_taken,
			    0, 7);
	tcase_add_loop_test(tc, test_zst_visit__mapped_runs_verified, 0, 3);
	tcase_add_loop_test(tc, test_zst_visit__mapped_run_decodes_its_cut_end,
			    0, 2);
	tcase_add_test(tc, test_zst_visit__mapped_run_decodes_its_cut_start);
	tcase_add_loop_test(tc, test_zst_visit__cut_frames_kept_as_planes, 0,
			    4);
	suite_add_tcase(s, tc);
	return s;
}
