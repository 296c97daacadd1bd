/* SPDX-License-Identifier: MIT */
/* dtype names and sizes (safetensors tensor.rs `Dtype`, `bitsize()`). */
#include <string.h>

#include "common/compiler.h"
#include "format/dtype.h"

struct dtype_info {
	const char *name;
	unsigned bits;
	bool castable;
	const char *numpy;
	const char *torch;
};

static const struct dtype_info dtype_table[CASTFS_DTYPE_COUNT] = {
	[CASTFS_DTYPE_BOOL] = { "BOOL", 8, false, "|b1", "bool" },
	[CASTFS_DTYPE_F4] = { "F4", 4, false, NULL, "float4_e2m1fn_x2" },
	[CASTFS_DTYPE_F6_E2M3] = { "F6_E2M3", 6, false, NULL, NULL },
	[CASTFS_DTYPE_F6_E3M2] = { "F6_E3M2", 6, false, NULL, NULL },
	[CASTFS_DTYPE_U8] = { "U8", 8, false, "|u1", "uint8" },
	[CASTFS_DTYPE_I8] = { "I8", 8, false, "|i1", "int8" },
	[CASTFS_DTYPE_F8_E5M2] = { "F8_E5M2", 8, true, NULL, "float8_e5m2" },
	[CASTFS_DTYPE_F8_E4M3] = { "F8_E4M3", 8, true, NULL, "float8_e4m3fn" },
	[CASTFS_DTYPE_F8_E8M0] = { "F8_E8M0", 8, false, NULL,
				   "float8_e8m0fnu" },
	[CASTFS_DTYPE_F8_E4M3FNUZ] = { "F8_E4M3FNUZ", 8, false, NULL,
				       "float8_e4m3fnuz" },
	[CASTFS_DTYPE_F8_E5M2FNUZ] = { "F8_E5M2FNUZ", 8, false, NULL,
				       "float8_e5m2fnuz" },
	[CASTFS_DTYPE_I16] = { "I16", 16, false, "<i2", "int16" },
	[CASTFS_DTYPE_U16] = { "U16", 16, false, "<u2", "uint16" },
	[CASTFS_DTYPE_F16] = { "F16", 16, true, "<f2", "float16" },
	[CASTFS_DTYPE_BF16] = { "BF16", 16, true, NULL, "bfloat16" },
	[CASTFS_DTYPE_I32] = { "I32", 32, false, "<i4", "int32" },
	[CASTFS_DTYPE_U32] = { "U32", 32, false, "<u4", "uint32" },
	[CASTFS_DTYPE_F32] = { "F32", 32, true, "<f4", "float32" },
	[CASTFS_DTYPE_C64] = { "C64", 64, false, "<c8", "complex64" },
	[CASTFS_DTYPE_F64] = { "F64", 64, true, "<f8", "float64" },
	[CASTFS_DTYPE_I64] = { "I64", 64, false, "<i8", "int64" },
	[CASTFS_DTYPE_U64] = { "U64", 64, false, "<u8", "uint64" },
};

enum castfs_dtype castfs_dtype_from_name(const char *name, size_t len)
{
	for (int i = 0; i < CASTFS_DTYPE_COUNT; i++) {
		const char *n = dtype_table[i].name;

		if (strlen(n) == len && memcmp(n, name, len) == 0)
			return (enum castfs_dtype)i;
	}
	return CASTFS_DTYPE_INVALID;
}

static const struct dtype_info *dtype_get(enum castfs_dtype dt)
{
	if ((unsigned)dt >= CASTFS_DTYPE_COUNT)
		return NULL;
	return &dtype_table[dt];
}

const char *castfs_dtype_name(enum castfs_dtype dt)
{
	const struct dtype_info *d = dtype_get(dt);

	return d ? d->name : "?";
}

unsigned castfs_dtype_bits(enum castfs_dtype dt)
{
	const struct dtype_info *d = dtype_get(dt);

	return d ? d->bits : 0;
}

bool castfs_dtype_is_castable(enum castfs_dtype dt)
{
	const struct dtype_info *d = dtype_get(dt);

	return d && d->castable;
}

const char *castfs_dtype_numpy(enum castfs_dtype dt)
{
	const struct dtype_info *d = dtype_get(dt);

	return d ? d->numpy : NULL;
}

const char *castfs_dtype_torch(enum castfs_dtype dt)
{
	const struct dtype_info *d = dtype_get(dt);

	return d ? d->torch : NULL;
}
