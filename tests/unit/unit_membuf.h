/* SPDX-License-Identifier: MIT */
/*
 * A growing memory buffer behind a struct castfs_writer, for tests that
 * write a pack (or any output) and read it back without a file; the
 * input bytes and grouped packs the lib/source tests share.
 */
#ifndef CASTFS_TESTS_UNIT_MEMBUF_H
#define CASTFS_TESTS_UNIT_MEMBUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "common/reader.h"
#include "source/zst.h"

struct membuf {
	uint8_t *p;
	size_t n, cap;
};

/*
 * Elements drawn from N(0, 0.02) (four uniform draws summed, scaled to
 * that spread), fp16 or fp32, over [@at, @at + @n) of @p, from generator
 * state *@s: weights as a checkpoint has them, whose grouped frames castfs
 * pack codes in tiers.
 */
static inline void membuf_fill_weights(uint8_t *p, size_t at, size_t n,
				       bool fp16, uint32_t *s)
{
	unsigned w = fp16 ? 2 : 4;

	for (size_t i = at; i + w <= at + n; i += w) {
		float x = -2.0f;

		for (int k = 0; k < 4; k++) {
			*s = *s * 1664525u + 1013904223u;
			x += (float)(*s >> 8) / (float)(1u << 24);
		}
		x *= 0.02f * 1.7320508f;
		if (fp16) {
			_Float16 h = (_Float16)x;

			memcpy(p + i, &h, 2);
		} else {
			memcpy(p + i, &x, 4);
		}
	}
}

/* @n weight-like bytes (malloc'ed): a smooth ramp with noise, so that
 * frames compress a bit. */
static inline uint8_t *membuf_input(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n);

	ck_assert_ptr_nonnull(p);
	srand(seed);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i / 7) ^ (rand() & 3));
	return p;
}

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

/* Pack the @n bytes at @in into @m (emptied first) with options @o. */
static inline void membuf_pack(struct membuf *m, const uint8_t *in, size_t n,
			       const struct castfs_zst_pack_opts *o)
{
	struct castfs_mem_reader mr;
	struct castfs_writer w = { mem_write, m };

	memset(m, 0, sizeof(*m));
	castfs_mem_reader_init(&mr, in, n);
	ck_assert_int_eq(castfs_zst_pack(&mr.r, n, o, &w, NULL), 0);
}

/* Pack the @n bytes at @in into @m grouped, as castfs pack --grouped
 * does: @frame-byte frames, checksums on, level 1, the @ncuts cuts and
 * the transforms of the pieces after them. */
static inline void membuf_pack_grouped(struct membuf *m, const uint8_t *in,
				       size_t n, size_t frame,
				       const uint64_t *cuts,
				       const uint8_t *transforms, size_t ncuts)
{
	struct castfs_zst_pack_opts o = { .frame_size = frame,
					  .level = 1,
					  .checksums = true,
					  .cuts = cuts,
					  .ncuts = ncuts,
					  .cut_transforms = transforms };

	membuf_pack(m, in, n, &o);
}

/* The bf16 checkpoint the tests pack most: a 64-byte header, then one
 * bf16 tensor, in 256 KiB frames. */
static inline void membuf_pack_bf16(struct membuf *m, const uint8_t *in,
				    size_t n)
{
	static const uint64_t cuts[] = { 64 };
	static const uint8_t tr[] = { CASTFS_ZST_BF16 };

	membuf_pack_grouped(m, in, n, 256u << 10, cuts, tr, 1);
}

#endif
