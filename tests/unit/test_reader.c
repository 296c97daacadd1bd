/* SPDX-License-Identifier: MIT */
/*
 * common/reader: the composite reader of a sharded source. Each part is a
 * memory reader over its own buffer; a read at castfs_part_off(k, off)
 * must give part k's bytes at off, and a read of a part that does not
 * exist or across a part's offset space must fail, never wrap. The fd
 * reader's map op against the bytes the test wrote, and a file shortened
 * under its mapping (SIGBUS) against the -EIO castfs_fault_call promises.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/reader.h"
#include "unit.h"

static const char one[] = "the first part", two[] = "PART TWO";

START_TEST(test_reader__parts_by_offset)
{
	struct castfs_mem_reader a, b;
	const struct castfs_reader *parts[2] = { &a.r, &b.r };
	struct castfs_multi_reader mr;
	char buf[16] = { 0 };

	castfs_mem_reader_init(&a, one, sizeof(one) - 1);
	castfs_mem_reader_init(&b, two, sizeof(two) - 1);
	castfs_multi_reader_init(&mr, parts, 2);
	ck_assert_int_eq(
		castfs_reader_read(&mr.r, buf, 5, castfs_part_off(0, 4)), 0);
	ck_assert_mem_eq(buf, "first", 5);
	ck_assert_int_eq(
		castfs_reader_read(&mr.r, buf, 3, castfs_part_off(1, 5)), 0);
	ck_assert_mem_eq(buf, "TWO", 3);
	/* past the end of a part: short, hence EIO, not the next part */
	ck_assert_int_eq(
		castfs_reader_read(&mr.r, buf, 4, castfs_part_off(1, 6)), -EIO);
}
END_TEST

START_TEST(test_reader__no_such_part)
{
	struct castfs_mem_reader a;
	const struct castfs_reader *parts[1] = { &a.r };
	struct castfs_multi_reader mr;
	char buf[4];

	castfs_mem_reader_init(&a, one, sizeof(one) - 1);
	castfs_multi_reader_init(&mr, parts, 1);
	ck_assert_int_eq(
		castfs_reader_read(&mr.r, buf, 1, castfs_part_off(1, 0)), -EIO);
	ck_assert_int_eq(castfs_reader_read(&mr.r, buf, 1, UINT64_MAX), -EIO);
	/* a read that would run from part 0 into part 1's offsets */
	ck_assert_int_eq(castfs_reader_read(&mr.r, buf, 2,
					    castfs_part_off(1, 0) - 1),
			 -EIO);
}
END_TEST

/* A part with a visit or map op: hands its bytes as one piece, recording
 * where (and the visit's @how). */
struct vpart {
	struct castfs_mem_reader m;
	uint64_t off;
	size_t n;
	unsigned how;
};

static int vpart_map(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		     void *arg)
{
	struct vpart *v = ctx;
	struct castfs_piece p = { .bytes = v->m.data + off, .n = n };

	v->off = off;
	v->n = n;
	return fn(arg, &p);
}

static int vpart_visit(void *ctx, uint64_t off, size_t n, unsigned how,
		       castfs_visit_fn fn, void *arg)
{
	struct vpart *v = ctx;

	v->how = how;
	return vpart_map(ctx, off, n, fn, arg);
}

static int keep_piece(void *arg, const struct castfs_piece *p)
{
	memcpy(arg, p->bytes, p->n);
	return 0;
}

/* A composite of a plain part and a part @b whose ops the test sets. */
struct two_parts {
	struct castfs_mem_reader a;
	struct vpart b;
	const struct castfs_reader *parts[2];
	struct castfs_multi_reader mr;
};

static struct vpart *two_parts_init(struct two_parts *t)
{
	castfs_mem_reader_init(&t->a, one, sizeof(one) - 1);
	castfs_mem_reader_init(&t->b.m, two, sizeof(two) - 1);
	t->b.m.r.ctx = &t->b;
	t->b.off = 99;
	t->parts[0] = &t->a.r;
	t->parts[1] = &t->b.m.r;
	castfs_multi_reader_init(&t->mr, t->parts, 2);
	return &t->b;
}

/* A visit goes to its part's visit op at the part's own offset; a part
 * without one declines; a part that does not exist fails. */
START_TEST(test_reader__visit_by_part)
{
	struct two_parts t;
	struct vpart *b = two_parts_init(&t);
	struct castfs_multi_reader *m = &t.mr;
	char buf[16] = { 0 };

	b->m.r.visit = vpart_visit;
	ck_assert_ptr_nonnull(m->r.visit);
	ck_assert_int_eq(m->r.visit(m->r.ctx, castfs_part_off(1, 2), 6,
				    2 | CASTFS_VISIT_BF16, keep_piece, buf),
			 0);
	ck_assert_uint_eq(b->off, 2);
	ck_assert_uint_eq(b->n, 6);
	ck_assert_uint_eq(b->how, 2 | CASTFS_VISIT_BF16);
	ck_assert_mem_eq(buf, "RT TWO", 6);
	ck_assert_int_eq(m->r.visit(m->r.ctx, castfs_part_off(0, 0), 2, 2,
				    keep_piece, buf),
			 -ENOTSUP);
	ck_assert_int_eq(m->r.visit(m->r.ctx, castfs_part_off(2, 0), 2, 2,
				    keep_piece, buf),
			 -EIO);
}
END_TEST

/* The map op goes to its part the same way, and not to its visit op. */
START_TEST(test_reader__map_by_part)
{
	struct two_parts t;
	struct vpart *b = two_parts_init(&t);
	struct castfs_multi_reader *m = &t.mr;
	char buf[16] = { 0 };

	b->m.r.map = vpart_map;
	ck_assert_int_eq(m->r.visit(m->r.ctx, castfs_part_off(1, 2), 6, 2,
				    keep_piece, buf),
			 -ENOTSUP);
	ck_assert_int_eq(m->r.map(m->r.ctx, castfs_part_off(1, 3), 5,
				  keep_piece, buf),
			 0);
	ck_assert_uint_eq(b->off, 3);
	ck_assert_uint_eq(b->n, 5);
	ck_assert_mem_eq(buf, "T TWO", 5);
	ck_assert_int_eq(m->r.map(m->r.ctx, castfs_part_off(0, 0), 2,
				  keep_piece, buf),
			 -ENOTSUP);
	ck_assert_int_eq(m->r.map(m->r.ctx, castfs_part_off(2, 0), 2,
				  keep_piece, buf),
			 -EIO);
}
END_TEST

/* ---- the map op of the fd reader (a mapped source) ---- */

#define MAP_FILE_LEN (1u << 20)

/* A temporary file of MAP_FILE_LEN bytes, byte i = (i * 7 + i / 4099). */
static int map_file(uint8_t **want)
{
	char path[] = "/tmp/castfs-test-map-XXXXXX";
	int fd = mkstemp(path);
	uint8_t *b = malloc(MAP_FILE_LEN);

	ck_assert_int_ge(fd, 0);
	ck_assert_ptr_nonnull(b);
	unlink(path);
	for (size_t i = 0; i < MAP_FILE_LEN; i++)
		b[i] = (uint8_t)(i * 7 + i / 4099);
	ck_assert_int_eq(pwrite(fd, b, MAP_FILE_LEN, 0), MAP_FILE_LEN);
	*want = b;
	return fd;
}

struct map_seen {
	int calls;
	uint8_t *copy;
	size_t n;
	int truncate_fd; /* >= 0: shorten this file, then touch the piece */
};

static int map_keep(void *arg, const struct castfs_piece *p)
{
	struct map_seen *m = arg;
	volatile uint8_t sink = 0;

	m->calls++;
	ck_assert_ptr_null(p->sm);
	if (m->truncate_fd >= 0) {
		ck_assert_int_eq(ftruncate(m->truncate_fd, 0), 0);
		for (size_t i = 0; i < p->n; i += 4096)
			sink ^= p->bytes[i];
		(void)sink;
		return 0; /* not reached: the first touch faults */
	}
	m->copy = malloc(p->n);
	ck_assert_ptr_nonnull(m->copy);
	memcpy(m->copy, p->bytes, p->n);
	m->n = p->n;
	return 0;
}

static void on_bus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (!castfs_fault_escape(si->si_addr))
		signal(sig, SIG_DFL);
}

static void route_sigbus(void)
{
	struct sigaction sa = { .sa_sigaction = on_bus,
				.sa_flags = SA_SIGINFO | SA_NODEFER };

	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGBUS, &sa, NULL), 0);
}

/* Without castfs_fd_reader_map() nothing is mapped. */
START_TEST(test_reader__map_not_offered)
{
	struct castfs_fd_reader fr;

	castfs_fd_reader_init(&fr, 0);
	ck_assert_ptr_null(fr.r.map);
}
END_TEST

/* A mapped range hands over exactly the file's bytes, at any offset. */
START_TEST(test_reader__map_bytes)
{
	static const uint64_t offs[] = { 0, 1, 4095, 4096, 65537, 300001 };
	static const size_t lens[] = { CASTFS_MAP_MIN, CASTFS_MAP_MIN + 3,
				       (MAP_FILE_LEN / 2) + 12345 };
	struct castfs_fd_reader fr;
	uint8_t *want;
	int fd = map_file(&want);

	castfs_fd_reader_init(&fr, fd);
	castfs_fd_reader_map(&fr);
	for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
		for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
			struct map_seen m = { .truncate_fd = -1 };

			ck_assert_int_eq(fr.r.map(fr.r.ctx, offs[i], lens[j],
						  map_keep, &m),
					 0);
			ck_assert_int_eq(m.calls, 1);
			ck_assert_uint_eq(m.n, lens[j]);
			ck_assert_mem_eq(m.copy, want + offs[i], lens[j]);
			free(m.copy);
		}
	free(want);
	close(fd);
}
END_TEST

/* Short ranges and ranges past the end are declined, nothing called:
 * pread serves (or fails) them. */
START_TEST(test_reader__map_declines)
{
	struct castfs_fd_reader fr;
	struct map_seen m = { .truncate_fd = -1 };
	uint8_t *want;
	int fd = map_file(&want);

	castfs_fd_reader_init(&fr, fd);
	castfs_fd_reader_map(&fr);
	ck_assert_int_eq(fr.r.map(fr.r.ctx, 0, CASTFS_MAP_MIN - 1, map_keep,
				  &m),
			 -ENOTSUP);
	ck_assert_int_eq(fr.r.map(fr.r.ctx, MAP_FILE_LEN - 4096, CASTFS_MAP_MIN,
				  map_keep, &m),
			 -ENOTSUP);
	ck_assert_int_eq(m.calls, 0);
	free(want);
	close(fd);
}
END_TEST

/* A file shortened under the mapping: the touch raises SIGBUS, the call
 * ends with -EIO, and the process goes on (a second read says EOF). */
START_TEST(test_reader__map_fault_is_eio)
{
	struct castfs_fd_reader fr;
	struct map_seen m;
	uint8_t *want, byte;
	int fd = map_file(&want);

	route_sigbus();
	castfs_fd_reader_init(&fr, fd);
	castfs_fd_reader_map(&fr);
	m = (struct map_seen){ .truncate_fd = fd };
	ck_assert_int_eq(fr.r.map(fr.r.ctx, 8192, 256u << 10, map_keep, &m),
			 -EIO);
	ck_assert_int_eq(m.calls, 1);
	ck_assert_int_eq(pread(fd, &byte, 1, 0), 0);
	/* and the guard is gone: a second fault in a new call is caught too */
	ck_assert_int_eq(pwrite(fd, want, MAP_FILE_LEN, 0), MAP_FILE_LEN);
	m = (struct map_seen){ .truncate_fd = fd };
	ck_assert_int_eq(fr.r.map(fr.r.ctx, 0, 128u << 10, map_keep, &m), -EIO);
	free(want);
	close(fd);
}
END_TEST

static int escape_outside(void *arg)
{
	static const char elsewhere[8];

	/* an address outside the guarded range is someone else's fault */
	*(bool *)arg = castfs_fault_escape(elsewhere);
	return 7;
}

START_TEST(test_reader__fault_escape_only_in_range)
{
	char range[64] = { 0 };
	bool escaped = true;

	ck_assert_int_eq(castfs_fault_call(range, sizeof(range), escape_outside,
					   &escaped),
			 7);
	ck_assert(!escaped);
	/* no guarded call at all */
	ck_assert(!castfs_fault_escape(range));
}
END_TEST

struct nested {
	char outer[64], inner[64];
	int inner_returned;
};

/* A fault in the parent's range, taken inside a narrower nested call. */
static int fault_in_outer(void *arg)
{
	struct nested *n = arg;

	(void)castfs_fault_escape(n->outer + 10); /* does not return */
	n->inner_returned = 1;
	return 0;
}

static int call_inner(void *arg)
{
	struct nested *n = arg;
	int rc = castfs_fault_call(n->inner, sizeof(n->inner), fault_in_outer,
				   n);

	n->inner_returned = rc == 0 ? 2 : 3;
	return rc;
}

/* Nested calls with disjoint ranges: a fault in the outer range ends the
 * outer call (and the inner one with it), not the process; the guards are
 * all gone after. */
START_TEST(test_reader__fault_nested_outer_range)
{
	struct nested n = { .inner_returned = 0 };

	ck_assert_int_eq(castfs_fault_call(n.outer, sizeof(n.outer), call_inner,
					   &n),
			 -EIO);
	ck_assert_int_eq(n.inner_returned, 0);
	ck_assert(!castfs_fault_escape(n.outer));
	ck_assert(!castfs_fault_escape(n.inner));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("reader");
	TCase *tc = tcase_create("multi");

	tcase_add_test(tc, test_reader__parts_by_offset);
	tcase_add_test(tc, test_reader__no_such_part);
	tcase_add_test(tc, test_reader__visit_by_part);
	tcase_add_test(tc, test_reader__map_by_part);
	suite_add_tcase(s, tc);
	tc = tcase_create("map");
	tcase_add_test(tc, test_reader__map_not_offered);
	tcase_add_test(tc, test_reader__map_bytes);
	tcase_add_test(tc, test_reader__map_declines);
	tcase_add_test(tc, test_reader__map_fault_is_eio);
	tcase_add_test(tc, test_reader__fault_escape_only_in_range);
	tcase_add_test(tc, test_reader__fault_nested_outer_range);
	suite_add_tcase(s, tc);
	return s;
}
