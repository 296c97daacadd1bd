/* SPDX-License-Identifier: MIT */
/*
 * CASTFS_OP_INTS: a list of integers as decimal text joined by ", ", made
 * per read range. A shape of a million dimensions is megabytes of text in
 * a .info or .npy header; its plan holds only a sparse index into it.
 */
#include <errno.h>
#include <string.h>

#include "common/ckd.h"
#include "common/compiler.h"
#include "plan/plan_internal.h"

/* Items per index entry: a read walks at most this many to its start. */
#define INTS_STRIDE 256u

/* What an INTS extent's mem points to (owned by the plan's arena). */
struct ints_desc {
	const uint64_t *v; /* borrowed: outlives the plan */
	uint64_t n;
	uint64_t *at; /* at[k]: text offset of item k * INTS_STRIDE */
	uint64_t nat;
};

static unsigned digits(uint64_t x)
{
	unsigned d = 1;

	while (x >= 10) {
		x /= 10;
		d++;
	}
	return d;
}

/* The bytes of item @i: its separator (none before the first) and digits. */
static unsigned item_len(const uint64_t *v, uint64_t i)
{
	return (i ? 2u : 0u) + digits(v[i]);
}

/* Item @i's text into @buf (24 bytes); its length. */
static unsigned item_text(const uint64_t *v, uint64_t i, char *buf)
{
	unsigned len = item_len(v, i), k = len;
	uint64_t x = v[i];

	do {
		buf[--k] = (char)('0' + x % 10);
		x /= 10;
	} while (x);
	if (i) {
		buf[0] = ',';
		buf[1] = ' ';
	}
	return len;
}

uint64_t castfs_ints_len(const uint64_t *v, uint64_t n)
{
	uint64_t len = 0;

	/* At most 22 bytes an item: no overflow below 2^59 items. */
	for (uint64_t i = 0; i < n; i++)
		len += item_len(v, i);
	return len;
}

int castfs_pb_append_ints(struct castfs_pb *pb, const uint64_t *v, uint64_t n)
{
	struct castfs_producer p = { .op = CASTFS_OP_INTS };
	struct ints_desc *d;
	uint64_t len = 0;

	if (n == 0)
		return 0;
	if (n > SIZE_MAX / sizeof(uint64_t) / 2)
		return -EOVERFLOW;
	d = castfs_pb_alloc(pb, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->nat = (n + INTS_STRIDE - 1) / INTS_STRIDE;
	d->at = castfs_pb_alloc(pb, (size_t)d->nat * sizeof(*d->at));
	if (!d->at)
		return -ENOMEM;
	d->v = v;
	d->n = n;
	for (uint64_t i = 0; i < n; i++) {
		if (i % INTS_STRIDE == 0)
			d->at[i / INTS_STRIDE] = len;
		len += item_len(v, i);
	}
	p.mem = d;
	return castfs_pb_append(pb, &p, len);
}

/* The item holding text offset @rel: its index, its start to *@start. */
static uint64_t ints_find(const struct ints_desc *d, uint64_t rel,
			  uint64_t *start)
{
	uint64_t lo = 0, hi = d->nat, i, pos;

	/* The last index entry at or before @rel. */
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (d->at[mid] <= rel)
			lo = mid;
		else
			hi = mid;
	}
	i = lo * INTS_STRIDE;
	pos = d->at[lo];
	while (pos + item_len(d->v, i) <= rel)
		pos += item_len(d->v, i++);
	*start = pos;
	return i;
}

int castfs_gen_ints(const struct castfs_read_env *env,
		    const struct castfs_extent *e, uint64_t first,
		    uint64_t count, uint8_t *dst)
{
	const void *mem = e->mem;
	const struct ints_desc *d = mem;
	uint64_t pos, i = ints_find(d, first, &pos);
	size_t skip = (size_t)(first - pos);
	char buf[24];

	(void)env;
	while (count) {
		unsigned len = item_text(d->v, i++, buf);
		size_t take = CASTFS_MIN((size_t)(len - skip), (size_t)count);

		memcpy(dst, buf + skip, take);
		dst += take;
		count -= take;
		skip = 0;
	}
	return 0;
}
