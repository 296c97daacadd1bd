/* SPDX-License-Identifier: MIT */
/*
 * Differential fuzzing of the conversion kernels: every SIMD variant this
 * CPU runs (and the one castfs_convert_get() selects) must produce exactly
 * the scalar reference's bytes, for every conversion pair and flag, at
 * any length and alignment. Input: [from][to][flags] then elements.
 * The scalar reference itself must equal ieee_ref.c, a cast written in
 * the test from the IEEE rules: a rounding bug shared by every kernel
 * fails here. fp16 and fp32 to E4M3 also run every grouped kernel
 * (castfs_convert_grouped_fn) on the same elements split into planes.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ieee_ref.h"
#include "kernels/convert.h"

static const enum castfs_dtype types[] = {
	CASTFS_DTYPE_F64,  CASTFS_DTYPE_F32,	 CASTFS_DTYPE_F16,
	CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F8_E5M2,
	CASTFS_DTYPE_I32, /* not castable: every ISA must say NULL */
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

/* Run @fn over @n elements at byte offsets @so/@do into exact-size
 * buffers (so that ASan sees any overrun); the result is malloc'ed. */
static uint8_t *run(castfs_convert_fn fn, const uint8_t *src, size_t n,
		    unsigned ssz, unsigned dsz, unsigned so, unsigned dof)
{
	uint8_t *s = malloc(n * ssz + so + 1), *d = malloc(n * dsz + dof + 1);
	uint8_t *out = malloc(n * dsz + 1);

	FUZZ_CHECK(s && d && out);
	memcpy(s + so, src, n * ssz);
	memset(d, 0xa5, n * dsz + dof);
	fn(d + dof, s + so, n);
	memcpy(out, d + dof, n * dsz);
	free(s);
	free(d);
	return out;
}

/* The scalar reference's @want against the outside oracle. */
static void check_outside(enum castfs_dtype from, enum castfs_dtype to,
			  unsigned flags, const uint8_t *src, size_t n,
			  const uint8_t *want)
{
	size_t dsz = castfs_dtype_bits(to) / 8;
	uint8_t *ref = malloc(n * dsz + 1);

	FUZZ_CHECK(ref);
	FUZZ_CHECK(ieee_ref_cast(from, to, flags & CASTFS_CVT_SATURATE, ref,
				 src, n));
	FUZZ_CHECK(memcmp(ref, want, n * dsz) == 0);
	free(ref);
}

/* Element k's byte planes as a grouped frame holds them (convert.h):
 * fp16 low and high byte; fp32 with its exponent made a byte. Each
 * plane malloc'ed at its exact size, at offset @so. */
static void split_planes(const uint8_t *src, size_t n, unsigned ssz,
			 unsigned so, uint8_t **pl)
{
	for (unsigned k = 0; k < ssz; k++) {
		pl[k] = malloc(n + so + 1);
		FUZZ_CHECK(pl[k]);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t v = 0;

		for (unsigned b = 0; b < ssz; b++) /* little-endian elements */
			v |= (uint32_t)src[i * ssz + b] << (8 * b);
		pl[0][so + i] = (uint8_t)v;
		pl[1][so + i] = (uint8_t)(v >> 8);
		if (ssz == 4) {
			pl[2][so + i] = (uint8_t)(((v >> 24) & 0x80u) |
						  ((v >> 16) & 0x7Fu));
			pl[3][so + i] = (uint8_t)(v >> 23);
		}
	}
}

/* Every grouped kernel of @from -> @to against the scalar cast's @want. */
static void check_grouped(enum castfs_dtype from, enum castfs_dtype to,
			  unsigned flags, const uint8_t *src, size_t n,
			  unsigned so, unsigned dof, const uint8_t *want)
{
	unsigned ssz = castfs_dtype_bits(from) / 8;
	uint8_t *pl[4] = { NULL }, *d = malloc(n + dof + 1);
	const uint8_t *at[4] = { NULL };

	FUZZ_CHECK(d);
	split_planes(src, n, ssz, so, pl);
	for (unsigned k = 0; k < ssz; k++)
		at[k] = pl[k] + so;
	for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
		castfs_convert_grouped_fn fn = castfs_convert_grouped_get_isa(
			(enum castfs_isa)isa, from, to, flags);

		if (!fn)
			continue;
		memset(d, 0xa5, n + dof);
		fn(d + dof, at, n);
		FUZZ_CHECK(memcmp(d + dof, want, n) == 0);
	}
	for (unsigned k = 0; k < ssz; k++)
		free(pl[k]);
	free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum castfs_dtype from, to;
	unsigned flags, ssz, dsz, so, dof;
	castfs_convert_fn ref, fn;
	uint8_t *want, *got;
	size_t n;

	if (size < 3)
		return 0;
	from = types[data[0] % NTYPES];
	to = types[data[1] % NTYPES];
	flags = data[2] & 1u;
	so = (data[2] >> 1) & 7u;
	dof = (data[2] >> 4) & 7u;
	ssz = castfs_dtype_bits(from) / 8;
	dsz = castfs_dtype_bits(to) / 8;
	n = (size - 3) / ssz;
	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, from, to, flags);
	for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
		fn = castfs_convert_get_isa((enum castfs_isa)isa, from, to,
					    flags);
		FUZZ_CHECK(!ref ? !fn : (!fn || castfs_isa_available(isa)));
	}
	FUZZ_CHECK(!ref == !castfs_convert_get(from, to, flags));
	if (!ref)
		return 0;
	want = run(ref, data + 3, n, ssz, dsz, 0, 0);
	check_outside(from, to, flags, data + 3, n, want);
	for (int isa = 0; isa <= CASTFS_ISA_COUNT; isa++) {
		fn = isa == CASTFS_ISA_COUNT ?
			     castfs_convert_get(from, to, flags) :
			     castfs_convert_get_isa((enum castfs_isa)isa, from,
						    to, flags);
		if (!fn)
			continue;
		got = run(fn, data + 3, n, ssz, dsz, so, dof);
		FUZZ_CHECK(memcmp(got, want, n * dsz) == 0);
		free(got);
	}
	if ((from == CASTFS_DTYPE_F16 || from == CASTFS_DTYPE_F32) &&
	    to == CASTFS_DTYPE_F8_E4M3)
		check_grouped(from, to, flags, data + 3, n, so, dof, want);
	free(want);
	return 0;
}
