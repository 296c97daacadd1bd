/* SPDX-License-Identifier: MIT */
/*
 * fs/fs_watchq: the watcher's queue of changed paths. Checked against a
 * plain model (an array searched linearly): one entry per waiting path,
 * arrival order, masks or'ed, a handled path queued again by a new change,
 * and the same through the compaction of a queue that never runs empty.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../fs/fs_watchq.h"
#include "unit.h"

/* The model: waiting paths in arrival order with their masks. */
struct model {
	char path[4096][32];
	uint32_t mask[4096];
	size_t head, n;
};

static void model_add(struct model *m, const char *path, uint32_t mask)
{
	for (size_t i = m->head; i < m->n; i++) {
		if (strcmp(m->path[i], path) == 0) {
			m->mask[i] |= mask;
			return;
		}
	}
	ck_assert_uint_lt(m->n, 4096);
	snprintf(m->path[m->n], sizeof(m->path[0]), "%s", path);
	m->mask[m->n++] = mask;
}

/* Pop one from both; they must agree. */
static void pop_same(struct castfs_watchq *q, struct model *m)
{
	const struct castfs_watchq_item *it = castfs_watchq_pop(q);

	if (m->head == m->n) {
		ck_assert_ptr_null(it);
		return;
	}
	ck_assert_ptr_nonnull(it);
	ck_assert_str_eq(it->rel, m->path[m->head]);
	ck_assert_uint_eq(it->mask, m->mask[m->head]);
	m->head++;
}

START_TEST(test_watchq__one_entry_per_path_in_arrival_order)
{
	struct castfs_watchq q = { 0 };
	static struct model m;
	const struct castfs_watchq_item *it;

	memset(&m, 0, sizeof(m));
	ck_assert_int_eq(castfs_watchq_add(&q, "", "a", 1), 0);
	ck_assert_int_eq(castfs_watchq_add(&q, "d", "b", 2), 0);
	ck_assert_int_eq(castfs_watchq_add(&q, "", "a", 4), 0);
	ck_assert_int_eq(castfs_watchq_add(&q, "d/e", "a", 8), 0);
	model_add(&m, "a", 1);
	model_add(&m, "d/b", 2);
	model_add(&m, "a", 4);
	model_add(&m, "d/e/a", 8);
	ck_assert_uint_eq(m.n, 3);
	pop_same(&q, &m); /* a, 1|4 */
	/* Handled: a new change queues it again, after the others. */
	ck_assert_int_eq(castfs_watchq_add(&q, "", "a", 16), 0);
	model_add(&m, "a", 16);
	while (m.head < m.n)
		pop_same(&q, &m);
	pop_same(&q, &m);
	/* Empty: the next add starts over. */
	ck_assert_int_eq(castfs_watchq_add(&q, "x", "y", 32), 0);
	it = castfs_watchq_pop(&q);
	ck_assert_str_eq(it->rel, "x/y");
	ck_assert_uint_eq(it->mask, 32);
	castfs_watchq_clear(&q);
	ck_assert_ptr_null(castfs_watchq_pop(&q));
	castfs_watchq_fini(&q);
}
END_TEST

/* A queue that never runs empty: pops and adds interleaved over many
 * paths, with repeats, through the compaction of popped entries. */
START_TEST(test_watchq__a_queue_that_never_empties_stays_exact)
{
	struct castfs_watchq q = { 0 };
	static struct model m;
	unsigned seed = 12345;
	char name[32];

	memset(&m, 0, sizeof(m));
	for (unsigned round = 0; round < 40000; round++) {
		seed = seed * 1103515245u + 12345u;
		snprintf(name, sizeof(name), "f%u", (seed >> 16) % 300);
		ck_assert_int_eq(castfs_watchq_add(&q, "dir", name,
						   1u << (seed % 7)),
				 0);
		{
			char path[40];

			snprintf(path, sizeof(path), "dir/%s", name);
			model_add(&m, path, 1u << (seed % 7));
		}
		if (round % 3 != 2 && m.n - m.head > 1)
			pop_same(&q, &m);
		if (m.n > 3000) { /* keep the model small: same waiting set */
			size_t w = m.n - m.head;

			memmove(m.path, m.path + m.head, w * sizeof(m.path[0]));
			memmove(m.mask, m.mask + m.head, w * sizeof(m.mask[0]));
			m.head = 0;
			m.n = w;
		}
	}
	while (m.head < m.n)
		pop_same(&q, &m);
	pop_same(&q, &m);
	castfs_watchq_fini(&q);
}
END_TEST

START_TEST(test_watchq__full_queue_refuses_and_adds_nothing)
{
	struct castfs_watchq q = { 0 };
	char name[32];

	for (unsigned i = 0; i < CASTFS_WATCHQ_MAX; i++) {
		snprintf(name, sizeof(name), "%u", i);
		ck_assert_int_eq(castfs_watchq_add(&q, "", name, 1), 0);
	}
	ck_assert_int_eq(castfs_watchq_add(&q, "", "one more", 1), -ENOSPC);
	for (unsigned i = 0; i < CASTFS_WATCHQ_MAX; i++) {
		const struct castfs_watchq_item *it = castfs_watchq_pop(&q);

		snprintf(name, sizeof(name), "%u", i);
		ck_assert_str_eq(it->rel, name);
	}
	ck_assert_ptr_null(castfs_watchq_pop(&q));
	castfs_watchq_fini(&q);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("watchq");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_watchq__one_entry_per_path_in_arrival_order);
	tcase_add_test(tc, test_watchq__a_queue_that_never_empties_stays_exact);
	tcase_add_test(tc, test_watchq__full_queue_refuses_and_adds_nothing);
	suite_add_tcase(s, tc);
	return s;
}
