/* SPDX-License-Identifier: MIT */
/* The 64-bit hash behind node ids and cache buckets: FNV-1a + a finaliser. */
#ifndef CASTFS_HASH_H
#define CASTFS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CASTFS_FNV_SEED 0xcbf29ce484222325ull

/* castfs_fnv1a - fold @len bytes of @data into @h. Never change it: node
 * ids are built from it and must be the same in every release. */
static inline uint64_t castfs_fnv1a(uint64_t h, const void *data, size_t len)
{
	const uint8_t *p = data;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* castfs_mix64 - splitmix64's finaliser: spreads FNV's weak high bits. */
static inline uint64_t castfs_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

#endif
