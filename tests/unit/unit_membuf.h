/* SPDX-License-Identifier: MIT */
/*
 * A growing memory buffer behind a struct castfs_writer, for tests that
 * write a pack (or any output) and read it back without a file.
 */
#ifndef CASTFS_TESTS_UNIT_MEMBUF_H
#define CASTFS_TESTS_UNIT_MEMBUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

struct membuf {
	uint8_t *p;
	size_t n, cap;
};

/* A castfs_writer's write callback appending to the struct membuf @ctx;
 * fails the test when memory runs out. */
static inline int mem_write(void *ctx, const void *buf, size_t n)
{
	struct membuf *m = ctx;

	if (m->n + n > m->cap) {
		m->cap = (m->n + n) * 2;
		m->p = realloc(m->p, m->cap);
		ck_assert_ptr_nonnull(m->p);
	}
	memcpy(m->p + m->n, buf, n);
	m->n += n;
	return 0;
}

#endif
