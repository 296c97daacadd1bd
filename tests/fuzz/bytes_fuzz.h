/* SPDX-License-Identifier: MIT */
/* Little-endian loads for fuzz inputs (any alignment). */
#ifndef CASTFS_BYTES_FUZZ_H
#define CASTFS_BYTES_FUZZ_H

#include <stdint.h>

static inline uint32_t fz_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

#endif
