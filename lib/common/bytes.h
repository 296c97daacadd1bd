/* SPDX-License-Identifier: MIT */
/* Little-endian loads and stores that accept unaligned pointers. */
#ifndef CASTFS_BYTES_H
#define CASTFS_BYTES_H

#include <stdint.h>
#include <string.h>

static inline uint16_t castfs_load_le16(const void *p)
{
	const uint8_t *b = p;
	return (uint16_t)(b[0] | (unsigned)b[1] << 8);
}

static inline uint32_t castfs_load_le32(const void *p)
{
	const uint8_t *b = p;
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static inline uint64_t castfs_load_le64(const void *p)
{
	return castfs_load_le32(p) |
	       (uint64_t)castfs_load_le32((const uint8_t *)p + 4) << 32;
}

static inline void castfs_store_le16(void *p, uint16_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}

static inline void castfs_store_le32(void *p, uint32_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
}

static inline void castfs_store_le64(void *p, uint64_t v)
{
	castfs_store_le32(p, (uint32_t)v);
	castfs_store_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* Bit casts between floats and their encodings. */
static inline uint32_t castfs_f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float castfs_f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint64_t castfs_f64_bits(double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof(u));
	return u;
}

static inline double castfs_f64_from_bits(uint64_t u)
{
	double d;
	memcpy(&d, &u, sizeof(d));
	return d;
}

#endif
