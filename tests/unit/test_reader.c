/* SPDX-License-Identifier: MIT */
/*
 * common/reader: the composite reader of a sharded source. Each part is a
 * memory reader over its own buffer; a read at castfs_part_off(k, off)
 * must give part k's bytes at off, and a read of a part that does not
 * exist or across a part's offset space must fail, never wrap.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

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

/* A part with a visit op: hands its bytes as one piece, recording where. */
struct vpart {
	struct castfs_mem_reader m;
	uint64_t off;
	size_t n;
};

static int vpart_visit(void *ctx, uint64_t off, size_t n, castfs_visit_fn fn,
		       void *arg)
{
	struct vpart *v = ctx;
	struct castfs_piece p = { .bytes = v->m.data + off, .n = n };

	v->off = off;
	v->n = n;
	return fn(arg, &p);
}

static int keep_piece(void *arg, const struct castfs_piece *p)
{
	memcpy(arg, p->bytes, p->n);
	return 0;
}

/* A visit goes to its part's visit op at the part's own offset; a part
 * without one declines; a part that does not exist fails. */
START_TEST(test_reader__visit_by_part)
{
	struct castfs_mem_reader a;
	struct vpart b = { .off = 99 };
	const struct castfs_reader *parts[2] = { &a.r, &b.m.r };
	struct castfs_multi_reader mr;
	char buf[16] = { 0 };

	castfs_mem_reader_init(&a, one, sizeof(one) - 1);
	castfs_mem_reader_init(&b.m, two, sizeof(two) - 1);
	b.m.r.ctx = &b;
	b.m.r.visit = vpart_visit;
	castfs_multi_reader_init(&mr, parts, 2);
	ck_assert_ptr_nonnull(mr.r.visit);
	ck_assert_int_eq(mr.r.visit(mr.r.ctx, castfs_part_off(1, 2), 6,
				    keep_piece, buf),
			 0);
	ck_assert_uint_eq(b.off, 2);
	ck_assert_uint_eq(b.n, 6);
	ck_assert_mem_eq(buf, "RT TWO", 6);
	ck_assert_int_eq(mr.r.visit(mr.r.ctx, castfs_part_off(0, 0), 2,
				    keep_piece, buf),
			 -ENOTSUP);
	ck_assert_int_eq(mr.r.visit(mr.r.ctx, castfs_part_off(2, 0), 2,
				    keep_piece, buf),
			 -EIO);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("reader");
	TCase *tc = tcase_create("multi");

	tcase_add_test(tc, test_reader__parts_by_offset);
	tcase_add_test(tc, test_reader__no_such_part);
	tcase_add_test(tc, test_reader__visit_by_part);
	suite_add_tcase(s, tc);
	return s;
}
