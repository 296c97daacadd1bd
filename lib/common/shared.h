/* SPDX-License-Identifier: MIT */
/*
 * Reference-counted immutable bytes: text built once and then read by many
 * owners (the __metadata__ object every view of one source writes, which
 * may be tens of MB). Thread-safe.
 */
#ifndef CASTFS_SHARED_H
#define CASTFS_SHARED_H

#include <stdatomic.h>
#include <stddef.h>

struct castfs_shared {
	atomic_size_t refs;
	size_t len;
	unsigned char bytes[];
};

/* castfs_shared_new - @len bytes copied from @src, one reference held by
 * the caller; NULL when out of memory. */
struct castfs_shared *castfs_shared_new(const void *src, size_t len);

/* castfs_shared_get - another reference to @s; returns @s. */
struct castfs_shared *castfs_shared_get(struct castfs_shared *s);

/* castfs_shared_put - drop a reference; the last frees. NULL: no-op. */
void castfs_shared_put(struct castfs_shared *s);

#endif
