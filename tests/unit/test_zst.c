/* SPDX-License-Identifier: MIT */
/*
 * lib/source: seekable-zstd packs. The expected decoded bytes are the
 * original input; hostile packs are built by editing valid ones, and the
 * plain zstd stream comes from libzstd itself, not from castfs.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "common/bytes.h"
#include "source/zst.h"
#include "source/zst_internal.h"
#include "unit.h"
#include "unit_membuf.h"

static void pack(const uint8_t *in, size_t n, size_t frame, bool sums,
		 const uint64_t *cuts, size_t ncuts, struct membuf *out)
{
	struct castfs_zst_pack_opts o = { .frame_size = frame,
					  .level = 1,
					  .checksums = sums,
					  .cuts = cuts,
					  .ncuts = ncuts };

	membuf_pack(out, in, n, &o);
}

static int open_index(const struct membuf *m, struct castfs_zcache *c,
		      struct castfs_mem_reader *mr,
		      struct castfs_zst_index **ix, struct castfs_diag *d)
{
	castfs_mem_reader_init(mr, m->p, m->n);
	return castfs_zst_index_read(&mr->r, m->n, c, ix, d);
}

#define N_IN (3u * 65536u + 1234u)

START_TEST(test_zst__random_ranges_equal_input)
{
	uint64_t cuts[] = { 100, 70000, 70001 };
	uint8_t *in = membuf_input(N_IN, 1), *buf = malloc(N_IN);
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	struct membuf m;

	pack(in, N_IN, 16384, _i, cuts, 3, &m);
	ck_assert_int_eq(castfs_zcache_new(40000, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	ck_assert_uint_eq(castfs_zst_index_size(ix), N_IN);
	ck_assert_int_eq(castfs_zst_index_checksums(ix), _i);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, N_IN, 0), 0);
	ck_assert_mem_eq(buf, in, N_IN);
	srand(7);
	for (int k = 0; k < 2000; k++) {
		size_t off = (size_t)rand() % N_IN;
		size_t len = 1 + (size_t)rand() % (k % 2 ? 40000 : 64);

		if (len > N_IN - off)
			len = N_IN - off;
		ck_assert_int_eq(castfs_reader_read(&zr.r, buf, len, off), 0);
		ck_assert_mem_eq(buf, in + off, len);
	}
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_gt(st.hits, 0);
	ck_assert_uint_le(st.cached_bytes, 40000);
	ck_assert_uint_eq(st.errors, 0);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

/* Frames end at every cut and hold at most the frame size. */
START_TEST(test_zst__frames_respect_cuts)
{
	uint64_t cuts[] = { 8, 100, 20000 };
	uint8_t *in = membuf_input(50000, 2);
	struct membuf m;
	size_t nf, esz;
	uint64_t at = 0, expect[] = { 8, 100, 16484, 20000, 36384, 50000 };
	uint8_t *out = malloc(50000);

	pack(in, 50000, 16384, false, cuts, 3, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	ck_assert_uint_eq(nf, 6);
	esz = 8;
	for (size_t i = 0; i < nf; i++) {
		const uint8_t *e = m.p + m.n - 9 - (nf - i) * esz;

		at += castfs_load_le32(e + 4);
		ck_assert_uint_eq(at, expect[i]);
	}
	/* libzstd decodes the whole pack to the input: skippable table. */
	ck_assert_uint_eq(ZSTD_decompress(out, 50000, m.p, m.n), 50000);
	ck_assert_mem_eq(out, in, 50000);
	free(out);
	free(m.p);
	free(in);
}
END_TEST

static int reject_reason(struct membuf *m, struct castfs_diag *d)
{
	struct castfs_zcache *c;
	struct castfs_zst_index *ix = NULL;
	struct castfs_mem_reader mr;
	int rc;

	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	rc = open_index(m, c, &mr, &ix, d);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return rc;
}

START_TEST(test_zst__plain_zstd_rejected)
{
	uint8_t *in = membuf_input(10000, 3);
	struct membuf m = { malloc(ZSTD_compressBound(10000)), 0, 0 };
	struct castfs_diag d = { { 0 } };

	m.n = ZSTD_compress(m.p, ZSTD_compressBound(10000), in, 10000, 3);
	ck_assert(!ZSTD_isError(m.n));
	ck_assert_int_eq(reject_reason(&m, &d), -EINVAL);
	ck_assert_ptr_nonnull(strstr(d.msg, "no seek table"));
	free(m.p);
	free(in);
}
END_TEST

START_TEST(test_zst__truncated_rejected)
{
	uint8_t *in = membuf_input(30000, 4);
	struct membuf m;
	size_t full;

	pack(in, 30000, 4096, true, NULL, 0, &m);
	full = m.n;
	for (size_t cut = 1; cut < full; cut += 97) {
		m.n = full - cut;
		ck_assert_int_ne(reject_reason(&m, NULL), 0);
	}
	free(m.p);
	free(in);
}
END_TEST

/*
 * Sizes that lie and still add up, 8 bytes apart (frame 1 says 8 more,
 * the last 8 less): every frame between them decodes to its own size with
 * its own good checksum, 8 bytes late by the table. Reads there fail,
 * whether they jump there first (_i 0) or come in order (_i 1); frames
 * before the lie read. A frame whose header is not one (_i 2: frame 1's
 * magic broken, the table true) hides where the later frames lie: they
 * fail too.
 */
START_TEST(test_zst__shifted_frames_fail)
{
	uint8_t *in = membuf_input(30000, 7), buf[4096];
	struct membuf m;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	size_t nf, at;

	pack(in, 30000, 4096, true, NULL, 0, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	ck_assert_uint_ge(nf, 5);
	at = m.n - 9 - nf * 12;
	if (_i == 2) {
		m.p[castfs_load_le32(m.p + at)] ^= 0xFF;
	} else {
		castfs_store_le32(m.p + at + 12 + 4,
				  castfs_load_le32(m.p + at + 12 + 4) + 8);
		castfs_store_le32(
			m.p + at + (nf - 1) * 12 + 4,
			castfs_load_le32(m.p + at + (nf - 1) * 12 + 4) - 8);
	}
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	if (_i >= 1) {
		ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4096, 0), 0);
		ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 100, 4096),
				 -EIO);
	}
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4096, 12288), -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 100, 20000), -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4096, 0), 0);
	ck_assert_mem_eq(buf, in, 4096);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(in);
}
END_TEST

/* Each lie in the table: sizes that do not add up, reserved bits, magic. */
START_TEST(test_zst__lying_table_rejected)
{
	uint8_t *in = membuf_input(30000, 5);
	struct membuf m;
	size_t nf, at;
	struct castfs_diag d = { { 0 } };

	pack(in, 30000, 4096, false, NULL, 0, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	at = m.n - 9 - nf * 8; /* the first entry */
	switch (_i) {
	case 0: /* compressed size one byte off */
		castfs_store_le32(m.p + at, castfs_load_le32(m.p + at) + 1);
		break;
	case 1: /* reserved descriptor bit */
		m.p[m.n - 5] |= 0x04;
		break;
	case 2: /* frame count one more than the entries */
		castfs_store_le32(m.p + m.n - 9, (uint32_t)nf + 1);
		break;
	case 3: /* a decoded size over the limit */
		castfs_store_le32(m.p + at + 4, CASTFS_ZST_MAX_FRAME + 1);
		break;
	default: /* the skippable frame's magic */
		m.p[at - 8] ^= 1;
		break;
	}
	ck_assert_int_lt(reject_reason(&m, &d), 0);
	ck_assert(d.msg[0]);
	free(m.p);
	free(in);
}
END_TEST

/*
 * A table that adds up but gives frame 0 more compressed bytes than zstd
 * could need for its 4096 decoded ones (80 KiB of zeros inserted after
 * it): a worker would read them all into its buffer before decoding (a
 * bug hunt: 4 GiB claimed by an 8 KiB sparse pack). Refused at the table.
 */
START_TEST(test_zst__compressed_size_over_bound_rejected)
{
	uint8_t *in = membuf_input(30000, 5), *big;
	const size_t pad = 80u << 10;
	struct membuf m;
	size_t nf, at, c0;
	struct castfs_diag d = { { 0 } };

	pack(in, 30000, 4096, false, NULL, 0, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	at = m.n - 9 - nf * 8;
	/* entry 0 is the header frame: the first 4096-byte frame is the
	 * first entry whose decoded size is 4096 */
	c0 = 0;
	for (size_t k = 0; k < nf; k++, at += 8) {
		if (castfs_load_le32(m.p + at + 4) == 4096)
			break;
		c0 += castfs_load_le32(m.p + at);
	}
	c0 += castfs_load_le32(m.p + at);
	castfs_store_le32(m.p + at, castfs_load_le32(m.p + at) + (uint32_t)pad);
	big = calloc(1, m.n + pad);
	ck_assert_ptr_nonnull(big);
	memcpy(big, m.p, c0);
	memcpy(big + c0 + pad, m.p + c0, m.n - c0);
	free(m.p);
	m.p = big;
	m.n += pad;
	ck_assert_int_eq(reject_reason(&m, &d), -EFBIG);
	ck_assert_msg(strstr(d.msg, "over zstd's bound"), "%s", d.msg);
	free(m.p);
	free(in);
}
END_TEST

/*
 * A lying decoded size (the table says one byte less, and the next frame
 * one more: the totals still agree), a corrupt frame and a wrong checksum
 * all fail reads of that frame with EIO and count; other frames still read.
 */
START_TEST(test_zst__bad_frame_fails_read_only)
{
	uint8_t *in = membuf_input(30000, 6), buf[4096];
	struct membuf m;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	size_t nf, at;

	pack(in, 30000, 4096, true, NULL, 0, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	at = m.n - 9 - nf * 12;
	if (_i == 0) {
		castfs_store_le32(m.p + at + 4, 4095);
		castfs_store_le32(m.p + at + 16, 4097);
	} else if (_i == 1) {
		m.p[castfs_load_le32(m.p + at) / 2] ^= 0x5a;
	} else {
		m.p[at + 8] ^= 1;
	}
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 100, 10), -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4000, 0), -EIO);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4096, 8192), 0);
	ck_assert_mem_eq(buf, in + 8192, 4096);
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.errors, 2);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(in);
}
END_TEST

struct zthread {
	const struct castfs_zst_reader *zr;
	const uint8_t *in;
	unsigned seed;
	size_t span, maxlen; /* offsets below span, lengths up to maxlen */
	int bad;
};

static void *zthread_run(void *arg)
{
	struct zthread *t = arg;
	uint8_t *buf = malloc(40000);

	for (int k = 0; k < 1500; k++) {
		size_t off = (size_t)rand_r(&t->seed) % t->span;
		size_t len = 1 + (size_t)rand_r(&t->seed) % t->maxlen;

		if (len > N_IN - off)
			len = N_IN - off;
		if (castfs_reader_read(&t->zr->r, buf, len, off) ||
		    memcmp(buf, t->in + off, len))
			t->bad++;
	}
	free(buf);
	return NULL;
}

/*
 * Threads reading the same frames at once always get the input. With a
 * cache that holds every frame and reads that never cover a whole frame
 * (those decode straight into the reader's buffer), each frame is decoded
 * exactly once, however many threads wanted it at the same time.
 */
START_TEST(test_zst__threads_share_frames)
{
	uint8_t *in = membuf_input(N_IN, 9);
	size_t caps[] = { 1 << 20, 20000, 0 };
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	struct zthread t[4];
	pthread_t th[4];
	struct membuf m;

	pack(in, N_IN, 8192, true, NULL, 0, &m);
	ck_assert_int_eq(castfs_zcache_new(caps[_i], &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	for (int k = 0; k < 4; k++) {
		t[k] = (struct zthread){ &zr,  in,    (unsigned)k + 1,
					 N_IN, 40000, 0 };
		if (_i == 0) { /* the last frame is short: leave it out */
			t[k].span = N_IN - 1234 - 5000;
			t[k].maxlen = 5000;
		}
		ck_assert_int_eq(
			pthread_create(&th[k], NULL, zthread_run, &t[k]), 0);
	}
	for (int k = 0; k < 4; k++) {
		pthread_join(th[k], NULL);
		ck_assert_int_eq(t[k].bad, 0);
	}
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.errors, 0);
	ck_assert_uint_le(st.cached_bytes, caps[_i]);
	if (_i == 0) /* everything fits: each frame is decoded into it once */
		ck_assert_uint_le(st.bytes_decoded, N_IN);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(in);
}
END_TEST

/* A memory reader whose first read waits until the gate opens: the
 * decode holding it keeps its frame "being decoded" meanwhile. */
struct gate {
	struct castfs_mem_reader mr;
	pthread_mutex_t lock;
	pthread_cond_t opened;
	bool open;
	int calls;
};

static ssize_t gate_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct gate *g = ctx;

	pthread_mutex_lock(&g->lock);
	if (++g->calls == 1)
		while (!g->open)
			pthread_cond_wait(&g->opened, &g->lock);
	pthread_mutex_unlock(&g->lock);
	return g->mr.r.pread(g->mr.r.ctx, buf, n, off);
}

static void gate_init(struct gate *g)
{
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->opened, NULL);
}

/* Let the pread held at the gate, and every later one, through. */
static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->opened);
	pthread_mutex_unlock(&g->lock);
}

static void gate_fini(struct gate *g)
{
	pthread_cond_destroy(&g->opened);
	pthread_mutex_destroy(&g->lock);
}

static int gate_calls(struct gate *g)
{
	int n;

	pthread_mutex_lock(&g->lock);
	n = g->calls;
	pthread_mutex_unlock(&g->lock);
	return n;
}

struct waiter {
	const struct castfs_zst_reader *zr;
	uint64_t off;
	pid_t tid;
	int rc;
};

static void *waiter_run(void *arg)
{
	struct waiter *w = arg;
	uint8_t buf[64];

	__atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
	w->rc = castfs_reader_read(&w->zr->r, buf, sizeof(buf), w->off);
	return NULL;
}

/* Whether thread @tid sleeps (state S: here, waiting on the cache). */
static bool thread_sleeps(pid_t tid)
{
	char path[64], st[256];
	FILE *f;
	char *p = NULL;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	f = fopen(path, "r");
	if (f && fgets(st, sizeof(st), f))
		p = strrchr(st, ')');
	if (f)
		fclose(f);
	return p && p[1] == ' ' && p[2] == 'S';
}

/*
 * Two readers of one corrupt frame at once: the second waits for the
 * first's decode (it reads nothing itself), and both get -EIO from the
 * one failed decode. The failed frame is not left in the cache: once the
 * source is good again the same range reads back, as do other frames.
 */
START_TEST(test_zst__waiter_on_failed_frame_gets_eio)
{
	uint8_t *in = membuf_input(30000, 7), buf[4096];
	struct membuf m;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct gate g = { .calls = 0 };
	struct castfs_reader raw = { .pread = gate_pread, .ctx = &g };
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	struct waiter w[2];
	pthread_t th[2];
	size_t nf, bad;

	pack(in, 30000, 4096, true, NULL, 0, &m);
	nf = castfs_load_le32(m.p + m.n - 9);
	bad = castfs_load_le32(m.p + m.n - 9 - nf * 12) / 2; /* in frame 0 */
	m.p[bad] ^= 0x5a;
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &g.mr, &ix, NULL), 0);
	gate_init(&g);
	castfs_zst_reader_init(&zr, ix, &raw);
	for (int k = 0; k < 2; k++) {
		w[k] = (struct waiter){ .zr = &zr, .off = 10 + 200u * k };
		ck_assert_int_eq(
			pthread_create(&th[k], NULL, waiter_run, &w[k]), 0);
		if (k ==
		    0) /* the first is decoding frame 0, held at the gate */
			while (gate_calls(&g) == 0)
				sched_yield();
	}
	/* the second is waiting for frame 0 (or, were it wrongly decoding
	 * it again, past the gate) */
	while (gate_calls(&g) == 1 &&
	       !(__atomic_load_n(&w[1].tid, __ATOMIC_SEQ_CST) &&
		 thread_sleeps(w[1].tid)))
		sched_yield();
	gate_open(&g);
	for (int k = 0; k < 2; k++) {
		pthread_join(th[k], NULL);
		ck_assert_int_eq(w[k].rc, -EIO);
	}
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.errors, 1);
	ck_assert_int_eq(gate_calls(&g), 1);
	m.p[bad] ^= 0x5a;
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 100, 10), 0);
	ck_assert_mem_eq(buf, in + 10, 100);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 4000, 9000), 0);
	ck_assert_mem_eq(buf, in + 9000, 4000);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	gate_fini(&g);
	free(m.p);
	free(in);
}
END_TEST

/* Grouping is a bijection: every bf16 pattern, and fp32 bit patterns. */
START_TEST(test_zst__group_round_trip)
{
	static const enum castfs_zst_transform ts[] = { CASTFS_ZST_PLANES2,
							CASTFS_ZST_BF16,
							CASTFS_ZST_PLANES4,
							CASTFS_ZST_F32 };
	enum castfs_zst_transform t = ts[_i];
	size_t n = 65536 * 2;
	uint8_t *in = malloc(n), *g = malloc(n), *back = malloc(n);

	for (size_t i = 0; i < 65536; i++)
		castfs_store_le16(in + 2 * i, (uint16_t)(i * 40503u));
	zst_group(g, in, n, t);
	zst_ungroup(back, g, n, t);
	ck_assert_mem_eq(back, in, n);
	/* aligned, with a scalar tail after the vector steps */
	for (size_t k = 1; k < 70; k += 3) {
		size_t m = k * zst_group_width(t);

		memset(back, 0, n);
		zst_group(g, in + 6, m, t);
		zst_ungroup(back, g, m, t);
		ck_assert_mem_eq(back, in + 6, m);
		ck_assert_uint_eq(back[m], 0);
	}
	/* an unaligned destination takes the portable path */
	memset(back, 0, n);
	zst_group(g, in, n - 4, t);
	zst_ungroup(back + 1, g, n - 4, t);
	ck_assert_mem_eq(back + 1, in, n - 4);
	if (t == CASTFS_ZST_BF16) { /* 1.0 = 0x3F80: exponent 127 first */
		castfs_store_le16(in, 0x3F80);
		zst_group(g, in, 2, t);
		ck_assert_uint_eq(g[1], 127);
		ck_assert_uint_eq(g[0], 0);
	}
	if (t == CASTFS_ZST_F32) { /* -2.0f = 0xC0000000: exponent 128 */
		castfs_store_le32(in, 0xC0000000u);
		zst_group(g, in, 4, t);
		ck_assert_uint_eq(g[3], 128);
		ck_assert_uint_eq(g[2], 0x80);
	}
	free(in);
	free(g);
	free(back);
}
END_TEST

/*
 * Variant @isa of the grouping (@group) or the un-grouping against the
 * scalar reference on random bytes (bf16 and fp32 elements with every
 * sign and exponent), for element counts around the vector steps (odd
 * ones, short ones, a frame's worth), with the side the variants take
 * as they come (the grouping's source, the un-grouping's destination)
 * at every alignment.
 */
static void isa_against_scalar(enum zst_isa isa, bool group)
{
	static const enum castfs_zst_transform ts[] = {
		CASTFS_ZST_NONE, CASTFS_ZST_PLANES2, CASTFS_ZST_BF16,
		CASTFS_ZST_PLANES4, CASTFS_ZST_F32
	};
	static const size_t counts[] = { 0,  1,	 15, 16,  17,  31,   32,
					 33, 63, 65, 127, 999, 65537 };
	size_t cap = 4 * 65537 + 8;
	uint8_t *src = malloc(cap), *want = malloc(cap), *got = malloc(cap);
	uint32_t seed = group ? 7 : 99;

	ck_assert(zst_isa_runs(isa)); /* registered only where it runs */
	for (size_t i = 0; i < cap; i++) {
		seed = seed * 1664525u + 1013904223u;
		src[i] = (uint8_t)(seed >> 24);
	}
	for (size_t a = 0; a < sizeof(ts) / sizeof(ts[0]); a++) {
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]);
		     c++) {
			size_t n = counts[c] * zst_group_width(ts[a]);

			for (size_t at = 0; at < 4; at++) {
				memset(want, 0xAA, cap);
				memset(got, 0xAA, cap);
				if (group) {
					zst_group_isa(want + 1, src + at, n,
						      ts[a], ZST_ISA_SCALAR);
					zst_group_isa(got + 1, src + at, n,
						      ts[a], isa);
				} else {
					zst_ungroup_isa(want + at, src + 1, n,
							ts[a], ZST_ISA_SCALAR);
					zst_ungroup_isa(got + at, src + 1, n,
							ts[a], isa);
				}
				ck_assert_mem_eq(got, want, cap);
			}
		}
	}
	free(src);
	free(want);
	free(got);
}

/* Every un-grouping variant this CPU runs equals the scalar reference. */
START_TEST(test_zst__ungroup_isas_equal_scalar)
{
	isa_against_scalar((enum zst_isa)_i, false);
}
END_TEST

/* Every grouping variant this CPU runs (castfs pack) equals the scalar
 * reference. */
START_TEST(test_zst__group_isas_equal_scalar)
{
	isa_against_scalar((enum zst_isa)_i, true);
}
END_TEST

/* Each frame's seek-table checksum is libxxhash's XXH64 (low 32 bits) of
 * what libzstd decodes it to: for a grouped frame, its planes. */
static void sums_are_xxh64_of_frames(const struct membuf *m)
{
	size_t nf = castfs_load_le32(m->p + m->n - 9), off = 0;
	const uint8_t *e = m->p + m->n - 9 - nf * 12;

	for (size_t i = 0; i < nf; i++, e += 12) {
		size_t cs = castfs_load_le32(e), ds = castfs_load_le32(e + 4);
		uint8_t *dec = malloc(ds + 1);

		ck_assert_uint_eq(ZSTD_decompress(dec, ds, m->p + off, cs), ds);
		if (ds) /* not the transform marker (skippable, sum 0) */
			ck_assert_uint_eq(castfs_load_le32(e + 8),
					  (uint32_t)XXH64(dec, ds, 0));
		free(dec);
		off += cs;
	}
}

/* A grouped pack reads back as the input; libzstd decodes it to the
 * grouped bytes, which differ; a bad transform byte is rejected. */
START_TEST(test_zst__grouped_pack_reads_back)
{
	uint8_t *in = membuf_input(N_IN, 11), *buf = malloc(N_IN);
	uint64_t cuts[] = { 96, 60000, 60000, 120000, 120000, 150000 };
	uint8_t tr[] = { CASTFS_ZST_BF16, CASTFS_ZST_NONE,    CASTFS_ZST_F32,
			 CASTFS_ZST_NONE, CASTFS_ZST_PLANES2, CASTFS_ZST_NONE };
	struct castfs_mem_reader mr;
	struct castfs_writer w;
	struct castfs_zst_pack_opts o = { .frame_size = 8192,
					  .level = 1,
					  .checksums = true,
					  .cuts = cuts,
					  .ncuts = 6,
					  .cut_transforms = tr };
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_zst_reader zr;
	struct membuf m = { 0 };

	w = (struct castfs_writer){ mem_write, &m };
	castfs_mem_reader_init(&mr, in, N_IN);
	ck_assert_int_eq(castfs_zst_pack(&mr.r, N_IN, &o, &w, NULL), 0);
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	ck_assert(castfs_zst_index_grouped(ix));
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, N_IN, 0), 0);
	ck_assert_mem_eq(buf, in, N_IN);
	for (size_t off = 0; off < N_IN; off += 3001) {
		size_t len = N_IN - off < 5000 ? N_IN - off : 5000;

		ck_assert_int_eq(castfs_reader_read(&zr.r, buf, len, off), 0);
		ck_assert_mem_eq(buf, in + off, len);
	}
	ck_assert_uint_eq(ZSTD_decompress(buf, N_IN, m.p, m.n), N_IN);
	ck_assert(memcmp(buf, in, N_IN) != 0);
	sums_are_xxh64_of_frames(&m);
	castfs_zst_index_free(ix);
	/* The marker's first transform byte (the header frame) made F32. */
	m.p[m.n - 9 - castfs_load_le32(m.p + m.n - 9) * 12 - 8 -
	    castfs_load_le32(m.p + m.n - 9)] = CASTFS_ZST_TRANSFORM_COUNT;
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), -EINVAL);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

/*
 * The grouping marker's own rules (FORMATS.md), checked on a pack without
 * checksums, where no checksum of the marker hides them: a transform byte
 * past the last transform, a transform on the marker frame itself, and a
 * transform whose element width does not divide its frame's decoded size
 * are each refused (-EINVAL) when the pack is opened, never un-grouped.
 */
START_TEST(test_zst__grouped_marker_rules)
{
	uint8_t *in = membuf_input(N_IN, 12);
	uint64_t cuts[] = { 96, 60000, 120000 };
	uint8_t tr[] = { CASTFS_ZST_BF16, CASTFS_ZST_F32, CASTFS_ZST_NONE };
	struct castfs_mem_reader mr;
	struct castfs_zst_pack_opts o = { .frame_size = 8192,
					  .level = 1,
					  .cuts = cuts,
					  .ncuts = 3,
					  .cut_transforms = tr };
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_diag d;
	struct membuf m = { 0 };
	uint32_t nf;
	size_t table, marks, last;
	struct {
		size_t frame;
		uint8_t t;
	} bad[3];

	membuf_pack(&m, in, N_IN, &o);
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	ck_assert(castfs_zst_index_grouped(ix));
	castfs_zst_index_free(ix);
	/* No checksums: 8-byte entries after the table's 8-byte header; the
	 * marker's transform bytes (one per frame) end where it begins. */
	nf = castfs_load_le32(m.p + m.n - 9);
	table = m.n - 9 - (size_t)nf * 8 - 8;
	marks = table - nf;
	/* The last data frame: [120000 + k * 8192, N_IN) holds 4114 bytes,
	 * whole 2-byte but not 4-byte elements. */
	last = nf - 2;
	ck_assert_uint_eq(castfs_load_le32(m.p + table + 8 + last * 8 + 4),
			  (N_IN - 120000) % 8192);
	ck_assert_uint_eq(m.p[marks + last], CASTFS_ZST_NONE);
	bad[0].frame = 1;
	bad[0].t = CASTFS_ZST_TRANSFORM_COUNT;
	bad[1].frame = nf - 1;
	bad[1].t = CASTFS_ZST_BF16;
	bad[2].frame = last;
	bad[2].t = CASTFS_ZST_F32;
	for (size_t k = 0; k < 3; k++) {
		uint8_t was = m.p[marks + bad[k].frame];

		m.p[marks + bad[k].frame] = bad[k].t;
		memset(&d, 0, sizeof(d));
		ck_assert_msg(open_index(&m, c, &mr, &ix, &d) == -EINVAL,
			      "edit %zu accepted", k);
		ck_assert_ptr_nonnull(strstr(d.msg, "grouping marker"));
		m.p[marks + bad[k].frame] = was;
	}
	/* The same edit to a width the frame holds is taken. */
	m.p[marks + last] = CASTFS_ZST_BF16;
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(in);
}
END_TEST

/* @n bytes of bf16 weights, roughly N(0, 0.02) (a sum of four uniforms),
 * truncated from float as a bf16 checkpoint holds them. */
static uint8_t *make_bf16_weights(size_t n, uint32_t seed)
{
	uint8_t *p = malloc(n);

	for (size_t i = 0; i + 1 < n; i += 2) {
		float x = -2.0f;
		uint32_t bits;

		for (int k = 0; k < 4; k++) {
			seed = seed * 1664525u + 1013904223u;
			x += (float)(seed >> 8) / (float)(1u << 24);
		}
		x *= 0.02f * 1.7320508f; /* the sum's sigma is 1/sqrt(3) */
		memcpy(&bits, &x, 4);
		castfs_store_le16(p + i, (uint16_t)(bits >> 16));
	}
	return p;
}

/* Pack @in (@n bytes, one bf16 tensor after a 64-byte header) grouped in
 * 256 KiB frames; check it reads back whole and by ranges; its size. */
static size_t grouped_size(const uint8_t *in, size_t n)
{
	struct castfs_mem_reader mr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_zst_reader zr;
	struct membuf m;
	uint8_t *buf = malloc(n);

	membuf_pack_bf16(&m, in, n);
	ck_assert_int_eq(castfs_zcache_new(1 << 20, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, n, 0), 0);
	ck_assert_mem_eq(buf, in, n);
	for (size_t off = 1; off < n; off += 100003) {
		size_t len = n - off < 300000 ? n - off : 300000;

		ck_assert_int_eq(castfs_reader_read(&zr.r, buf, len, off), 0);
		ck_assert_mem_eq(buf, in + off, len);
	}
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(buf);
	free(m.p);
	return m.n;
}

/*
 * Grouped frames code weights' planes as literals (FORMATS.md): normal
 * bf16 weights pack near their order-0 entropy bound (about 1.53; zstd's
 * matches gave 1.47), and planes that repeat still get zstd's matches (a
 * short cycle of values: Huffman alone could not pass 8x).
 */
START_TEST(test_zst__grouped_literals_and_matches)
{
	size_t n = (2u << 20) + 64;
	uint8_t *in = make_bf16_weights(n, 5);
	size_t got = grouped_size(in, n);

	ck_assert_msg((double)n / (double)got >= 1.49, "ratio %.3f",
		      (double)n / (double)got);
	for (size_t i = 64; i + 1 < n; i += 2)
		castfs_store_le16(in + i, (uint16_t)(0x3C00u + (i / 2) % 37));
	got = grouped_size(in, n);
	ck_assert_msg(n / got >= 20, "ratio %zu", n / got);
	memset(in + 64, 0, n - 64);
	ck_assert_uint_lt(grouped_size(in, n), n / 100);
	free(in);
}
END_TEST

/*
 * Frames larger than the whole cache, read in pieces as 1 MiB FUSE
 * requests read a pack with 32 MiB frames: each frame is decoded once and
 * kept alone (before, one decode per piece), and the cache holds one such
 * frame over its capacity, no more. Then an idle context keeps no buffer
 * of such a frame. Capacity 0 keeps nothing.
 */
START_TEST(test_zst__frames_larger_than_cache_decoded_once)
{
	size_t caps[] = { 5000, 0 }, piece = 1000;
	uint8_t *in = membuf_input(N_IN, 3), *buf = malloc(N_IN);
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zcache_stats st;
	struct membuf m;

	pack(in, N_IN, 8192, false, NULL, 0, &m);
	ck_assert_int_eq(castfs_zcache_new(caps[_i], &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	for (size_t at = 0; at < N_IN; at += piece) {
		size_t n = N_IN - at < piece ? N_IN - at : piece;

		ck_assert_int_eq(castfs_reader_read(&zr.r, buf + at, n, at), 0);
		castfs_zcache_stats_get(c, &st);
		ck_assert_uint_le(st.cached_bytes, caps[_i] ? 8192 : 0);
	}
	ck_assert_mem_eq(buf, in, N_IN);
	castfs_zcache_stats_get(c, &st);
	if (caps[_i])
		ck_assert_uint_eq(st.bytes_decoded, N_IN);
	else /* one decode per piece */
		ck_assert_uint_gt(st.bytes_decoded, 4 * (uint64_t)N_IN);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	free(m.p);
	free(buf);
	free(in);
}
END_TEST

/*
 * Read-ahead sends requests for the end of one frame larger than the
 * cache and the start of the next at once, and the workers take them in
 * any order. A request for the previous frame while the next is being
 * decoded is served from the cache: the next frame is charged to the
 * cache once decoded, not when its decode starts (which dropped the
 * previous one, decoded it again for that request, and then dropped the
 * next one being decoded: each frame twice, seen in CI).
 */
START_TEST(test_zst__previous_frame_kept_while_next_decodes)
{
	uint8_t *in = membuf_input(30000, 5), buf[1000];
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct gate g = { .calls = 0 };
	struct castfs_reader gated = { .pread = gate_pread, .ctx = &g };
	struct castfs_zst_reader zr, zg;
	struct castfs_zcache_stats st;
	struct waiter w;
	pthread_t th;
	struct membuf m;

	pack(in, 30000, 8192, false, NULL, 0, &m);
	ck_assert_int_eq(castfs_zcache_new(5000, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &g.mr, &ix, NULL), 0);
	gate_init(&g);
	castfs_zst_reader_init(&zr, ix, &g.mr.r);
	castfs_zst_reader_init(&zg, ix, &gated);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 1000, 6000), 0);
	/* frame 1, held at the gate while being decoded */
	w = (struct waiter){ .zr = &zg, .off = 8192 + 100 };
	ck_assert_int_eq(pthread_create(&th, NULL, waiter_run, &w), 0);
	while (gate_calls(&g) == 0)
		sched_yield();
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 1000, 7000), 0);
	ck_assert_mem_eq(buf, in + 7000, 1000);
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.bytes_decoded, 8192); /* frame 0 once */
	gate_open(&g);
	pthread_join(th, NULL);
	ck_assert_int_eq(w.rc, 0);
	/* frame 1 kept alone once decoded, and read from the cache */
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.cached_bytes, 8192);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, 1000, 9000), 0);
	ck_assert_mem_eq(buf, in + 9000, 1000);
	castfs_zcache_stats_get(c, &st);
	ck_assert_uint_eq(st.bytes_decoded, 2 * 8192);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	gate_fini(&g);
	free(m.p);
	free(in);
}
END_TEST

START_TEST(test_zst__idle_context_trimmed)
{
	struct zst_dctx *dc = zst_dctx_new();

	ck_assert_ptr_nonnull(dc);
	ck_assert_ptr_nonnull(zst_dctx_buf(dc, 1000));
	ck_assert_ptr_nonnull(zst_dctx_ubuf(dc, ZST_POOL_KEEP + 1));
	zst_dctx_trim(dc, ZST_POOL_KEEP);
	ck_assert_uint_eq(dc->cap, 1000);
	ck_assert_uint_eq(dc->ucap, 0);
	ck_assert_ptr_null(dc->ubuf);
	ck_assert_ptr_nonnull(zst_dctx_ubuf(dc, 64));
	zst_dctx_free(dc);
}
END_TEST

START_TEST(test_zst__bad_frame_size_option)
{
	uint8_t in[16] = { 0 };
	struct castfs_mem_reader mr;
	struct membuf m = { 0 };
	struct castfs_writer w = { mem_write, &m };
	struct castfs_zst_pack_opts o = { .frame_size = 0, .level = 1 };

	castfs_mem_reader_init(&mr, in, sizeof(in));
	ck_assert_int_eq(castfs_zst_pack(&mr.r, sizeof(in), &o, &w, NULL),
			 -EINVAL);
	o.frame_size = CASTFS_ZST_MAX_FRAME + 1;
	ck_assert_int_eq(castfs_zst_pack(&mr.r, sizeof(in), &o, &w, NULL),
			 -EINVAL);
	/* A level zstd lacks is refused, not clamped to its nearest
	 * (ZSTD_maxCLevel() is 22 in every zstd since 1.3). */
	o.frame_size = 4096;
	ck_assert(castfs_zst_level_valid(22) && castfs_zst_level_valid(-5));
	ck_assert(!castfs_zst_level_valid(23));
	o.level = 23;
	ck_assert_int_eq(castfs_zst_pack(&mr.r, sizeof(in), &o, &w, NULL),
			 -EINVAL);
	ck_assert_uint_eq(m.n, 0);
	o.level = 22;
	ck_assert_int_eq(castfs_zst_pack(&mr.r, sizeof(in), &o, &w, NULL), 0);
	free(m.p);
}
END_TEST

/* castfs pack's read-back (castfs_zst_verify): progress to the end. */
struct vprog {
	uint64_t done, total;
	int calls;
	int stop_at; /* the call that returns -EINTR; 0: none */
};

static int vprog_note(void *ctx, uint64_t done, uint64_t total)
{
	struct vprog *p = ctx;

	ck_assert_uint_gt(done, p->done);
	p->done = done;
	p->total = total;
	return ++p->calls == p->stop_at ? -EINTR : 0;
}

/* Verify the pack @m against the @n bytes at @orig by @threads threads
 * (the options only with @threads or @p). */
static int verify_by(const struct membuf *m, const uint8_t *orig, size_t n,
		     unsigned threads, struct vprog *p, struct castfs_diag *d)
{
	struct castfs_mem_reader pr, orr;
	struct castfs_zst_verify_opts o = { p ? vprog_note : NULL, p, threads };

	castfs_mem_reader_init(&pr, m->p, m->n);
	castfs_mem_reader_init(&orr, orig, n);
	return castfs_zst_verify(&pr.r, m->n, &orr.r, n,
				 p || threads ? &o : NULL, d);
}

static int verify(const struct membuf *m, const uint8_t *orig, size_t n,
		  struct vprog *p, struct castfs_diag *d)
{
	return verify_by(m, orig, n, 0, p, d);
}

/* Over 12 MiB (four steps of the read-back), by 1 (_i 0) or 3 threads:
 * a grouped pack equals its input; an input that differs is named by the
 * offset of its first different byte, also where a later step (another
 * thread's) differs too. */
#define N_VERIFY ((4u << 20) + 6000u)
#define N_VERIFY3 ((12u << 20) + 6000u)

START_TEST(test_zst__verify_names_first_difference)
{
	static const size_t at[][2] = { { 0, 0 },
					{ 64, (12u << 20) + 5 },
					{ (4u << 20) + 777, (8u << 20) + 1 },
					{ (8u << 20) + 3, (8u << 20) + 9 },
					{ N_VERIFY3 - 1, 0 } };
	unsigned threads = _i ? 3 : 1;
	uint8_t *in = make_bf16_weights(N_VERIFY3, 21), *other;
	struct vprog p = { 0 };
	struct castfs_diag d = { { 0 } };
	struct membuf m;
	char want[64];

	membuf_pack_bf16(&m, in, N_VERIFY3);
	ck_assert_int_eq(verify_by(&m, in, N_VERIFY3, threads, &p, &d), 0);
	ck_assert_uint_eq(p.done, N_VERIFY3);
	ck_assert_uint_eq(p.total, N_VERIFY3);
	ck_assert_int_eq(p.calls, 4);
	/* A progress callback's -EINTR (Ctrl-C) ends the read-back there. */
	p = (struct vprog){ .stop_at = 2 };
	ck_assert_int_eq(verify_by(&m, in, N_VERIFY3, threads, &p, &d), -EINTR);
	ck_assert_int_eq(p.calls, 2);
	ck_assert_uint_eq(p.done, 8u << 20);
	other = malloc(N_VERIFY3);
	for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
		memcpy(other, in, N_VERIFY3);
		other[at[k][0]] ^= 0x20;
		if (at[k][1])
			other[at[k][1]] ^= 0x01;
		castfs_diag_clear(&d);
		ck_assert_int_eq(verify_by(&m, other, N_VERIFY3, threads, NULL,
					   &d),
				 -EBADMSG);
		snprintf(want, sizeof(want), "from byte %zu", at[k][0]);
		ck_assert_msg(strstr(d.msg, want), "%s: %s", want, d.msg);
	}
	free(other);
	free(m.p);
	free(in);
}
END_TEST

/*
 * What the read-back is for: a pack whose frames decode cleanly to other
 * bytes than were packed (as a coder bug would write them). A tiered
 * frame without checksums, one byte of its raw plane changed, still
 * decodes: only the comparison tells.
 */
START_TEST(test_zst__verify_catches_clean_wrong_decode)
{
	static const uint64_t cuts[] = { 64 };
	static const uint8_t tr[] = { CASTFS_ZST_BF16 };
	struct castfs_zst_pack_opts o = { .frame_size = 256u << 10,
					  .level = 1,
					  .cuts = cuts,
					  .ncuts = 1,
					  .cut_transforms = tr };
	uint8_t *in = make_bf16_weights(N_VERIFY, 22), *buf = malloc(N_VERIFY);
	struct castfs_diag d = { { 0 } };
	struct castfs_mem_reader mr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix;
	struct castfs_zst_reader zr;
	struct membuf m;
	uint64_t end;

	membuf_pack(&m, in, N_VERIFY, &o);
	ck_assert_int_eq(verify(&m, in, N_VERIFY, NULL, &d), 0);
	ck_assert_int_eq(castfs_zcache_new(0, &c), 0);
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	ck_assert(zst_xform_tiered(ix->xform[1]));
	end = ix->coff[2]; /* the first tensor frame ends with a raw plane */
	castfs_zst_index_free(ix);
	m.p[end - 1] ^= 0x01;
	/* The pack still reads, wrongly. */
	ck_assert_int_eq(open_index(&m, c, &mr, &ix, NULL), 0);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	ck_assert_int_eq(castfs_reader_read(&zr.r, buf, N_VERIFY, 0), 0);
	ck_assert(memcmp(buf, in, N_VERIFY) != 0);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	ck_assert_int_eq(verify(&m, in, N_VERIFY, NULL, &d), -EBADMSG);
	ck_assert_msg(strstr(d.msg, "other bytes"), "%s", d.msg);
	free(buf);
	free(m.p);
	free(in);
}
END_TEST

/* A pack of another size, a frame that fails, a table that lies. */
START_TEST(test_zst__verify_reports_each_failure)
{
	uint8_t *in = membuf_input(30000, 23);
	struct castfs_diag d = { { 0 } };
	struct membuf m;
	size_t nf, at;

	pack(in, 30000, 4096, true, NULL, 0, &m);
	ck_assert_int_eq(verify(&m, in, 30000, NULL, &d), 0);
	ck_assert_int_eq(verify(&m, in, 29999, NULL, &d), -EBADMSG);
	ck_assert_msg(strstr(d.msg, "30000 bytes"), "%s", d.msg);
	nf = castfs_load_le32(m.p + m.n - 9);
	at = m.n - 9 - nf * 12;
	m.p[castfs_load_le32(m.p + at) / 2] ^= 0x5a; /* inside frame 0 */
	castfs_diag_clear(&d);
	ck_assert_int_eq(verify(&m, in, 30000, NULL, &d), -EIO);
	ck_assert_msg(strstr(d.msg, "does not decode"), "%s", d.msg);
	m.n -= 3; /* the footer cut */
	castfs_diag_clear(&d);
	ck_assert_int_eq(verify(&m, in, 30000, NULL, &d), -EINVAL);
	free(m.p);
	free(in);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("zst");
	TCase *tc = tcase_create("zst");

	tcase_add_loop_test(tc, test_zst__random_ranges_equal_input, 0, 2);
	tcase_add_test(tc, test_zst__frames_respect_cuts);
	tcase_add_test(tc, test_zst__plain_zstd_rejected);
	tcase_add_test(tc, test_zst__truncated_rejected);
	tcase_add_loop_test(tc, test_zst__lying_table_rejected, 0, 5);
	tcase_add_test(tc, test_zst__compressed_size_over_bound_rejected);
	tcase_add_loop_test(tc, test_zst__bad_frame_fails_read_only, 0, 3);
	tcase_add_loop_test(tc, test_zst__shifted_frames_fail, 0, 3);
	tcase_add_loop_test(tc, test_zst__threads_share_frames, 0, 3);
	tcase_add_test(tc, test_zst__waiter_on_failed_frame_gets_eio);
	tcase_add_loop_test(tc, test_zst__group_round_trip, 0, 4);
	/* The variants this CPU runs; the scalar one checks the harness. */
	for (int isa = ZST_ISA_SCALAR; isa < ZST_ISA_COUNT; isa++) {
		if (!zst_isa_runs((enum zst_isa)isa))
			continue;
		tcase_add_loop_test(tc, test_zst__ungroup_isas_equal_scalar,
				    isa, isa + 1);
		tcase_add_loop_test(tc, test_zst__group_isas_equal_scalar, isa,
				    isa + 1);
	}
	tcase_add_test(tc, test_zst__grouped_pack_reads_back);
	tcase_add_test(tc, test_zst__grouped_marker_rules);
	tcase_add_test(tc, test_zst__grouped_literals_and_matches);
	tcase_add_test(tc, test_zst__bad_frame_size_option);
	tcase_add_loop_test(tc, test_zst__frames_larger_than_cache_decoded_once,
			    0, 2);
	tcase_add_test(tc, test_zst__previous_frame_kept_while_next_decodes);
	tcase_add_test(tc, test_zst__idle_context_trimmed);
	tcase_add_loop_test(tc, test_zst__verify_names_first_difference, 0, 2);
	tcase_add_test(tc, test_zst__verify_catches_clean_wrong_decode);
	tcase_add_test(tc, test_zst__verify_reports_each_failure);
	suite_add_tcase(s, tc);
	return s;
}
