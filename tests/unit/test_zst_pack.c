/* SPDX-License-Identifier: MIT */
/*
 * lib/source's threads (zst_threads.c's ordered pipeline, as castfs pack
 * and castfs unpack run it): a pack coded, or a pack decoded, by several
 * threads is the same bytes as one thread's (standard and grouped, cuts,
 * checksums), its progress comes in file order, a failing read or write
 * is reported for the first piece in the file that fails, whatever the
 * timing, and threads without buffers leave their work to the others.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "source/zst.h"
#include "source/zst_internal.h"
#include "unit.h"
#include "unit_membuf.h"

struct progress {
	uint64_t in, out;
	unsigned calls;
	unsigned stop_at; /* the call that returns -EINTR; 0: none */
};

static int note(void *ctx, uint64_t in, uint64_t out)
{
	struct progress *p = ctx;

	ck_assert_uint_gt(in, p->in);
	ck_assert_uint_gt(out, p->out);
	p->in = in;
	p->out = out;
	return ++p->calls == p->stop_at ? -EINTR : 0;
}

#define N_IN (600u * 1024u + 333u)

/* A header, then pieces of bf16, fp32, 2-byte and plain bytes. */
static const uint64_t cuts[] = { 96, 200000, 200000, 400000, 400000, 500000 };
static const uint8_t tr[] = { CASTFS_ZST_BF16,	  CASTFS_ZST_NONE,
			      CASTFS_ZST_F32,	  CASTFS_ZST_NONE,
			      CASTFS_ZST_PLANES2, CASTFS_ZST_NONE };

/* Pack @in with 4 KiB frames by @threads threads (_i: standard, grouped,
 * each with and without checksums). */
static void pack_by(struct membuf *m, const uint8_t *in, int kind,
		    unsigned threads, struct progress *p)
{
	struct castfs_zst_pack_opts o = {
		.frame_size = 4096,
		.level = 1,
		.checksums = kind & 1,
		.cuts = cuts,
		.ncuts = sizeof(cuts) / sizeof(*cuts),
		.cut_transforms = kind & 2 ? tr : NULL,
		.progress = p ? note : NULL,
		.progress_ctx = p,
		.threads = threads,
	};

	membuf_pack(m, in, N_IN, &o);
}

START_TEST(test_zst_pack__threads_write_the_same_bytes)
{
	uint8_t *in = membuf_input(N_IN, 31);
	struct membuf one, many;
	struct progress p = { 0 };

	pack_by(&one, in, _i, 1, NULL);
	for (unsigned threads = 2; threads <= 17; threads += 5) {
		memset(&p, 0, sizeof(p));
		pack_by(&many, in, _i, threads, &p);
		ck_assert_uint_eq(many.n, one.n);
		ck_assert_msg(!memcmp(many.p, one.p, one.n),
			      "%u threads wrote other bytes", threads);
		/* One call per frame (over 150 of them), the last with
		 * every byte in (the table and marker are not counted). */
		ck_assert_uint_gt(p.calls, 150);
		ck_assert_uint_eq(p.in, N_IN);
		ck_assert_uint_lt(p.out, one.n);
		free(many.p);
	}
	free(one.p);
	free(in);
}
END_TEST

/*
 * _i: 1 or 5 threads. A progress callback that returns -EINTR (castfs
 * pack's Ctrl-C) stops the pack at that frame: the error is returned,
 * the frames before it and that one were written, nothing after (no
 * further frame, no seek table), and it is not called again.
 */
START_TEST(test_zst_pack__progress_stops_the_pack)
{
	uint8_t *in = membuf_input(N_IN, 37);
	struct membuf whole, cut = { 0 };
	struct castfs_mem_reader mr;
	struct castfs_writer w = { mem_write, &cut };
	struct progress p = { .stop_at = 40 };
	struct castfs_diag d = { { 0 } };
	struct castfs_zst_pack_opts o = {
		.frame_size = 4096,
		.level = 1,
		.checksums = true,
		.cuts = cuts,
		.ncuts = sizeof(cuts) / sizeof(*cuts),
		.cut_transforms = tr,
		.progress = note,
		.progress_ctx = &p,
		.threads = _i ? 5 : 1,
	};

	castfs_mem_reader_init(&mr, in, N_IN);
	ck_assert_int_eq(castfs_zst_pack(&mr.r, N_IN, &o, &w, &d), -EINTR);
	ck_assert_uint_eq(p.calls, 40);
	/* Exactly the 40 frames reported, the same bytes as a whole pack's
	 * beginning. */
	ck_assert_uint_eq(cut.n, p.out);
	o.progress = NULL;
	membuf_pack(&whole, in, N_IN, &o);
	ck_assert_uint_gt(whole.n, cut.n);
	ck_assert(!memcmp(whole.p, cut.p, cut.n));
	free(whole.p);
	free(cut.p);
	free(in);
}
END_TEST

/*
 * A reader of @in that fails the reads covering @bad[0] (EIO) and @bad[1]
 * (ENXIO, a later piece). With @order set both failing reads happen, in
 * turn: @order 1 fails the later piece first (the earlier read waits for
 * that), @order 2 the earlier one first (once the later read has begun,
 * which then waits for it). A wait gives up after a second.
 */
struct bad_reader {
	const uint8_t *in;
	uint64_t bad[2];
	int order;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool began[2], failed[2];
};

/* Under r->lock: wait until @flag is set, or a second passed. */
static void wait_for(struct bad_reader *r, const bool *flag)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 1;
	while (!*flag &&
	       pthread_cond_timedwait(&r->cond, &r->lock, &until) == 0)
		;
}

/* Read @k of the two failing ones: its turn, then its error. */
static ssize_t bad_read(struct bad_reader *r, int k)
{
	pthread_mutex_lock(&r->lock);
	r->began[k] = true;
	pthread_cond_broadcast(&r->cond);
	if (r->order == 1 && k == 0)
		wait_for(r, &r->failed[1]);
	if (r->order == 2 && k == 0)
		wait_for(r, &r->began[1]);
	if (r->order == 2 && k == 1)
		wait_for(r, &r->failed[0]);
	pthread_mutex_unlock(&r->lock);
	/* The second to fail returns 2 ms later, so that the pack has
	 * recorded the first one's failure by then. */
	if ((r->order == 1 && k == 0) || (r->order == 2 && k == 1))
		usleep(2000);
	pthread_mutex_lock(&r->lock);
	r->failed[k] = true;
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return k ? -ENXIO : -EIO;
}

static ssize_t bad_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct bad_reader *r = ctx;

	for (int k = 0; k < 2; k++)
		if (r->bad[k] >= off && r->bad[k] < off + n)
			return bad_read(r, k);
	memcpy(buf, r->in + off, n);
	return (ssize_t)n;
}

/* A writer that fails its @fail-th call (from 1) with -ENOSPC. */
struct bad_writer {
	struct membuf m;
	unsigned calls, fail;
};

static int bad_write(void *ctx, const void *buf, size_t n)
{
	struct bad_writer *w = ctx;

	if (++w->calls == w->fail)
		return -ENOSPC;
	return mem_write(&w->m, buf, n);
}

/* Pack N_IN bytes read by @rd into @w (grouped, with checksums) by
 * @threads threads. */
static int pack_through(const struct castfs_reader *rd, struct bad_writer *w,
			unsigned threads, struct castfs_diag *d)
{
	struct castfs_writer wr = { bad_write, w };
	struct castfs_zst_pack_opts o = { .frame_size = 4096,
					  .level = 1,
					  .checksums = true,
					  .cuts = cuts,
					  .ncuts = sizeof(cuts) / sizeof(*cuts),
					  .cut_transforms = tr,
					  .threads = threads };

	castfs_diag_clear(d);
	return castfs_zst_pack(rd, N_IN, &o, &wr, d);
}

/* The failure named is the file's first, by 1 (_i 0) or 5 threads: a
 * read failing before or after a later piece's read fails (a pack that
 * kept the first failure in time, or the last, names the later one), and
 * a write failing. */
START_TEST(test_zst_pack__first_failure_in_the_file_named)
{
	unsigned threads = _i ? 5 : 1;
	uint8_t *in = membuf_input(N_IN, 32);
	struct castfs_diag d = { { 0 } };

	for (int round = 0; round < 40; round++) {
		/* Piece 31 (the header, then 4 KiB pieces from 96) fails with
		 * EIO; one of the next four, which the other threads take
		 * meanwhile, with ENXIO, before or after it. */
		uint64_t start = 96 + 4096 * 30, at = start + 17;
		struct bad_reader r = {
			.in = in,
			.bad = { at, at + 4096 * (round % 4 + 1) },
			.order = threads > 1 ? round % 2 + 1 : 0,
		};
		struct castfs_reader rd = { .pread = bad_pread, .ctx = &r };
		struct bad_writer w = { .fail = 0 };
		struct castfs_mem_reader mr;
		char want[64];

		pthread_mutex_init(&r.lock, NULL);
		pthread_cond_init(&r.cond, NULL);
		ck_assert_int_eq(pack_through(&rd, &w, threads, &d), -EIO);
		snprintf(want, sizeof(want), "reading at %llu",
			 (unsigned long long)start);
		ck_assert_msg(!strcmp(d.msg, want), "%s: %s", want, d.msg);
		if (threads > 1) /* both failed, in the order asked */
			ck_assert(r.failed[0] && r.failed[1]);
		pthread_cond_destroy(&r.cond);
		pthread_mutex_destroy(&r.lock);
		free(w.m.p);

		/* The 30th write fails; no read does, and no write follows. */
		w = (struct bad_writer){ .fail = 30 };
		castfs_mem_reader_init(&mr, in, N_IN);
		ck_assert_int_eq(pack_through(&mr.r, &w, threads, &d), -ENOSPC);
		ck_assert_msg(
			strstr(d.msg,
			       "writing the pack: No space left on device"),
			"%s", d.msg);
		ck_assert_uint_eq(w.calls, 30);
		free(w.m.p);
	}
	free(in);
}
END_TEST

/* Unpacking: a pack of N_BIG bytes in frames of @frame (the pipeline's
 * 4 MiB steps then hold several frames, or one frame each when they are
 * larger), with and without grouping. */
#define N_BIG ((20u << 20) + 333u)
static const uint64_t big_cuts[] = { 96, 5000000, 5000000, 9000000 };
static const uint8_t big_tr[] = { CASTFS_ZST_BF16, CASTFS_ZST_NONE,
				  CASTFS_ZST_F32, CASTFS_ZST_NONE };

static void pack_big(struct membuf *m, const uint8_t *in, size_t frame,
		     bool grouped)
{
	struct castfs_zst_pack_opts o = {
		.frame_size = frame,
		.level = 1,
		.checksums = true,
		.cuts = big_cuts,
		.ncuts = sizeof(big_cuts) / sizeof(*big_cuts),
		.cut_transforms = grouped ? big_tr : NULL,
		.threads = 2,
	};

	membuf_pack(m, in, N_BIG, &o);
}

static int note_done(void *ctx, uint64_t done, uint64_t total)
{
	struct progress *p = ctx;

	ck_assert_uint_eq(total, N_BIG);
	ck_assert_uint_gt(done, p->in);
	p->in = done;
	return ++p->calls == p->stop_at ? -EINTR : 0;
}

/* Unpack the pack @m (read by @raw, or from @m where NULL) into @w by
 * @threads threads. */
static int unpack_through(const struct membuf *m,
			  const struct castfs_reader *raw, struct bad_writer *w,
			  unsigned threads, struct progress *p,
			  struct castfs_diag *d)
{
	struct castfs_writer wr = { bad_write, w };
	struct castfs_zst_unpack_opts o = { .progress = p ? note_done : NULL,
					    .progress_ctx = p,
					    .threads = threads };
	struct castfs_mem_reader mr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix = NULL;
	int rc;

	castfs_mem_reader_init(&mr, m->p, m->n);
	ck_assert_int_eq(castfs_zcache_new(CASTFS_ZCACHE_DEFAULT, &c), 0);
	ck_assert_int_eq(castfs_zst_index_read(&mr.r, m->n, c, &ix, NULL), 0);
	castfs_diag_clear(d);
	rc = castfs_zst_unpack(ix, raw ? raw : &mr.r, &o, &wr, d);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return rc;
}

/* _i: 64 KiB or 5 MiB frames, standard or grouped. */
START_TEST(test_zst_unpack__threads_write_the_original)
{
	uint8_t *in = membuf_input(N_BIG, 33);
	struct castfs_diag d = { { 0 } };
	struct membuf m;

	pack_big(&m, in, _i & 1 ? 5u << 20 : 64u << 10, _i & 2);
	for (unsigned threads = 1; threads <= 17; threads += 4) {
		struct bad_writer w = { .fail = 0 };
		struct progress p = { 0 };

		ck_assert_int_eq(unpack_through(&m, NULL, &w, threads, &p, &d),
				 0);
		ck_assert_uint_eq(w.m.n, N_BIG);
		ck_assert_msg(!memcmp(w.m.p, in, N_BIG),
			      "%u threads wrote other bytes", threads);
		/* One call per write, of at most 4 MiB or one frame. */
		ck_assert_uint_eq(p.in, N_BIG);
		ck_assert_uint_eq(p.calls, w.calls);
		ck_assert_uint_ge(w.calls, 5);
		free(w.m.p);
	}
	free(m.p);
	free(in);
}
END_TEST

/* _i: 1 or 6 threads. A progress callback that returns -EINTR (castfs
 * unpack's Ctrl-C) stops the unpack: nothing is written after that step,
 * and the error is returned. */
START_TEST(test_zst_unpack__progress_stops_the_unpack)
{
	uint8_t *in = membuf_input(N_BIG, 39);
	struct castfs_diag d = { { 0 } };
	struct bad_writer w = { .fail = 0 };
	struct progress p = { .stop_at = 2 };
	struct membuf m;

	pack_big(&m, in, 64u << 10, true);
	ck_assert_int_eq(unpack_through(&m, NULL, &w, _i ? 6 : 1, &p, &d),
			 -EINTR);
	ck_assert_uint_eq(p.calls, 2);
	ck_assert_uint_eq(w.calls, 2);
	ck_assert_uint_eq(w.m.n, p.in);
	ck_assert_uint_lt(w.m.n, N_BIG);
	ck_assert(!memcmp(w.m.p, in, w.m.n));
	free(w.m.p);
	free(m.p);
	free(in);
}
END_TEST

/* The frame of @m holding decoded offset @at: its number and its
 * compressed bytes' offset in *@coff. */
static size_t frame_at(const struct membuf *m, uint64_t at, uint64_t *coff)
{
	struct castfs_mem_reader mr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix = NULL;
	size_t i = 0;

	castfs_mem_reader_init(&mr, m->p, m->n);
	ck_assert_int_eq(castfs_zcache_new(CASTFS_ZCACHE_DEFAULT, &c), 0);
	ck_assert_int_eq(castfs_zst_index_read(&mr.r, m->n, c, &ix, NULL), 0);
	while (i < ix->nframes && ix->doff[i + 1] <= at)
		i++;
	ck_assert_uint_lt(i, ix->nframes);

	*coff = ix->coff[i];
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return i;
}

/* The frame named is the file's first that fails, by 1 (_i 0) or 5
 * threads, whichever read fails first in time; a failing write stops the
 * writes. */
START_TEST(test_zst_unpack__first_failure_in_the_file_named)
{
	unsigned threads = _i ? 5 : 1;
	uint8_t *in = membuf_input(N_BIG, 34);
	struct castfs_diag d = { { 0 } };
	struct membuf m;

	/* 1 MiB frames: 4 to a step. The first failing frame lies 3 to 12
	 * frames before the second, in one of the four steps the other
	 * threads take while its own is read. */
	pack_big(&m, in, 1u << 20, true);
	for (int round = 0; round < 20; round++) {
		uint64_t c0, c1;
		size_t f0 = frame_at(&m, 6u << 20, &c0);
		size_t f1 =
			frame_at(&m, (6u + 3u * (round % 4 + 1)) << 20, &c1);
		struct bad_reader r = {
			.in = m.p,
			/* past each frame's header, which the check of
			 * where frames lie reads before (zst_cache.c) */
			.bad = { c0 + 64, c1 + 64 },
			.order = threads > 1 ? round % 2 + 1 : 0,
		};
		struct castfs_reader rd = { .pread = bad_pread, .ctx = &r };
		struct bad_writer w = { .fail = 0 };
		char want[32];
		int rc;

		ck_assert_uint_lt(f0, f1);
		pthread_mutex_init(&r.lock, NULL);
		pthread_cond_init(&r.cond, NULL);
		rc = unpack_through(&m, &rd, &w, threads, NULL, &d);
		ck_assert_msg(rc == -EIO, "%d %s (%zu %zu)", rc, d.msg, f0, f1);
		snprintf(want, sizeof(want), "frame %zu (", f0);
		ck_assert_msg(!strncmp(d.msg, want, strlen(want)), "%s: %s",
			      want, d.msg);
		if (threads > 1) /* both failed, in the order asked */
			ck_assert(r.failed[0] && r.failed[1]);
		/* Only the steps before the failing frame's were written. */
		ck_assert_uint_le(w.m.n, 6u << 20);
		ck_assert(!memcmp(w.m.p, in, w.m.n));
		pthread_cond_destroy(&r.cond);
		pthread_mutex_destroy(&r.lock);
		free(w.m.p);

		w = (struct bad_writer){ .fail = 3 };
		ck_assert_int_eq(unpack_through(&m, NULL, &w, threads, NULL,
						&d),
				 -ENOSPC);
		ck_assert_msg(
			strstr(d.msg,
			       "writing the output: No space left on device"),
			"%s", d.msg);
		ck_assert_uint_eq(w.calls, 3);
		free(w.m.p);
	}
	free(m.p);
	free(in);
}
END_TEST

/* A pipeline whose threads' slots fail to start (@fail of them, counted
 * down): @items numbers, each worked on as its square and committed in
 * order. */
struct pipe_test {
	pthread_mutex_t lock;
	int fail;
	unsigned inits;
	size_t next, items, committed;
};

static int pt_init(void *ctx, void *slot)
{
	struct pipe_test *t = ctx;
	int rc = 0;

	(void)slot;
	pthread_mutex_lock(&t->lock);
	if (t->fail > 0) {
		t->fail--;
		rc = -ENOMEM;
	} else {
		t->inits++;
	}
	pthread_mutex_unlock(&t->lock);
	/* The threads that do get slots start late: those that fail have
	 * given up by then. */
	if (!rc)
		usleep(2000);
	return rc;
}

static void pt_free(void *ctx, void *slot)
{
	(void)ctx;
	(void)slot;
}

static bool pt_take(void *ctx, void *slot)
{
	struct pipe_test *t = ctx;

	if (t->next == t->items)
		return false;
	((size_t *)slot)[0] = t->next++;
	return true;
}

static int pt_work(void *ctx, void *slot, struct castfs_diag *d)
{
	size_t *s = slot;

	(void)ctx;
	(void)d;
	s[1] = s[0] * s[0];
	return 0;
}

static int pt_commit(void *ctx, void *slot, struct castfs_diag *d)
{
	struct pipe_test *t = ctx;
	const size_t *s = slot;

	(void)d;
	ck_assert_uint_eq(s[0], t->committed);
	ck_assert_uint_eq(s[1], s[0] * s[0]);
	t->committed++;
	return 0;
}

static const struct zst_pipe_ops pt_ops = {
	.slot_size = 2 * sizeof(size_t),
	.slot_init = pt_init,
	.slot_free = pt_free,
	.take = pt_take,
	.work = pt_work,
	.commit = pt_commit,
};

/* Threads that cannot get their buffers leave their items to the others
 * (castfs pack, its read-back and unpack then go on with fewer threads);
 * when none gets them, -ENOMEM and no item taken. */
START_TEST(test_zst_pipe__threads_without_slots_leave_their_work)
{
	for (int fail = 0; fail <= 6; fail++) {
		struct pipe_test t = { .fail = fail, .items = 1000 };
		int rc;

		pthread_mutex_init(&t.lock, NULL);
		rc = zst_pipe_run(&pt_ops, &t, 6, NULL);
		pthread_mutex_destroy(&t.lock);
		if (fail < 6) {
			ck_assert_int_eq(rc, 0);
			ck_assert_uint_eq(t.inits, 6 - fail);
			ck_assert_uint_eq(t.committed, 1000);
		} else {
			ck_assert_int_eq(rc, -ENOMEM);
			ck_assert_uint_eq(t.next, 0);
		}
	}
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("zst_pack");
	TCase *tc = tcase_create("zst_pack");

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_zst_pack__threads_write_the_same_bytes, 0,
			    4);
	tcase_add_loop_test(tc, test_zst_pack__first_failure_in_the_file_named,
			    0, 2);
	tcase_add_loop_test(tc, test_zst_pack__progress_stops_the_pack, 0, 2);
	tcase_add_loop_test(tc, test_zst_unpack__threads_write_the_original, 0,
			    4);
	tcase_add_loop_test(
		tc, test_zst_unpack__first_failure_in_the_file_named, 0, 2);
	tcase_add_loop_test(tc, test_zst_unpack__progress_stops_the_unpack, 0,
			    2);
	tcase_add_test(tc,
		       test_zst_pipe__threads_without_slots_leave_their_work);
	suite_add_tcase(s, tc);
	return s;
}
