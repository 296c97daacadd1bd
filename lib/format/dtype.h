/* SPDX-License-Identifier: MIT */
/* The safetensors dtype table: names, bit sizes, and what castfs can convert. */
#ifndef CASTFS_DTYPE_H
#define CASTFS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Values follow the order of safetensors' Rust enum: the official writer
 * sorts tensors by this order (descending), which is what makes every tensor
 * naturally aligned in the data buffer. Do not reorder.
 */
enum castfs_dtype {
	CASTFS_DTYPE_BOOL,
	CASTFS_DTYPE_F4,
	CASTFS_DTYPE_F6_E2M3,
	CASTFS_DTYPE_F6_E3M2,
	CASTFS_DTYPE_U8,
	CASTFS_DTYPE_I8,
	CASTFS_DTYPE_F8_E5M2,
	CASTFS_DTYPE_F8_E4M3,
	CASTFS_DTYPE_F8_E8M0,
	CASTFS_DTYPE_F8_E4M3FNUZ,
	CASTFS_DTYPE_F8_E5M2FNUZ,
	CASTFS_DTYPE_I16,
	CASTFS_DTYPE_U16,
	CASTFS_DTYPE_F16,
	CASTFS_DTYPE_BF16,
	CASTFS_DTYPE_I32,
	CASTFS_DTYPE_U32,
	CASTFS_DTYPE_F32,
	CASTFS_DTYPE_C64,
	CASTFS_DTYPE_F64,
	CASTFS_DTYPE_I64,
	CASTFS_DTYPE_U64,
	CASTFS_DTYPE_COUNT,
	CASTFS_DTYPE_INVALID = CASTFS_DTYPE_COUNT,
};

/* castfs_dtype_from_name - the dtype spelled exactly @name (@len bytes), or
 * CASTFS_DTYPE_INVALID. Case-sensitive, as in safetensors. */
enum castfs_dtype castfs_dtype_from_name(const char *name, size_t len);

/* castfs_dtype_name - the safetensors spelling ("BF16"); "?" if out of range. */
const char *castfs_dtype_name(enum castfs_dtype dt);

/* castfs_dtype_bits - bits per element (4, 6, 8, 16, 32 or 64); 0 if invalid. */
unsigned castfs_dtype_bits(enum castfs_dtype dt);

/* castfs_dtype_is_castable - true for the IEEE-like floating types castfs can
 * cast (F64, F32, F16, BF16, F8_E4M3, F8_E5M2). Other float formats (F4, F6,
 * E8M0, FNUZ) are carried byte for byte. */
bool castfs_dtype_is_castable(enum castfs_dtype dt);

/* castfs_dtype_numpy - the numpy dtype descriptor ("<f4", "|u1") a .npy file
 * uses for @dt, or NULL when numpy has no such type (bf16, fp8, F4, ...). */
const char *castfs_dtype_numpy(enum castfs_dtype dt);

/* castfs_dtype_torch - torch's name without "torch." ("bfloat16"), or NULL. */
const char *castfs_dtype_torch(enum castfs_dtype dt);

#endif
