/* SPDX-License-Identifier: MIT */
/*
 * The constant tables every quantiser kernel reads (quant_tables.c),
 * written once: the per-ISA files include this and never the file that
 * chooses between them (quant_dispatch.c), as kernels/convert_table.h does
 * for casts.
 */
#ifndef CASTFS_QUANT_TABLE_H
#define CASTFS_QUANT_TABLE_H

#include <stdint.h>

/* Float tables given by their bits (exact, whatever the compiler). */
union castfs_q_f32x16 {
	uint32_t u[16];
	float f[16];
};

union castfs_q_f32x256 {
	uint32_t u[256];
	float f[256];
};

/* The midpoints of the 8-bit dynamic map (quant.c), entry 255 +Inf. */
extern const union castfs_q_f32x256 castfs_q8_mids;

/*
 * The same 256 values by search level, m = castfs_q8_mids.f: [0, 16)
 * m[16j + 15] (the bounds of 16 buckets of 16 codes), [16, 32) m[16b + 7],
 * [32, 64) m[16b + 8c + 3], [64, 128) m[16b + 4c + 1], [128, 256)
 * m[16b + 2c], entry (level start + b * width + c).
 */
extern const union castfs_q_f32x256 castfs_q8_tree;

/* Offsets of the levels in castfs_q8_tree. */
enum {
	CASTFS_Q8_T16 = 0,
	CASTFS_Q8_T8 = 16,
	CASTFS_Q8_T4 = 32,
	CASTFS_Q8_T2 = 64,
	CASTFS_Q8_T1 = 128,
};

/* Indexed by enum castfs_qtype (NF4, FP4). */
extern const union castfs_q_f32x16 castfs_q4_values[2];

/*
 * castfs_q4_mids[qt].f[k] is the float32 midpoint between the k-th and
 * (k+1)-th smallest code values (k < 15; entry 15 is +Inf, a sentinel),
 * computed as bitsandbytes computes its bucketize bounds.
 */
extern const union castfs_q_f32x16 castfs_q4_mids[2];

/* castfs_q4_order[qt][p]: the code of the p-th smallest value. */
extern const uint8_t castfs_q4_order[2][16];

#endif
