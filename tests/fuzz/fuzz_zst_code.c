/* SPDX-License-Identifier: MIT */
/*
 * Fuzz castfs pack's own coders on any element bytes: the grouping and
 * the tier coder. The first byte picks a transform, the rest are the
 * elements. Every grouping variant this CPU runs equals the scalar
 * reference and un-groups back to the input; every tier coder variant
 * writes the scalar coder's frame byte for byte, and that frame decodes
 * back to the planes.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "source/zst_internal.h"

static const enum castfs_zst_transform tiers[3] = { CASTFS_ZST_BF16_TIERED,
						    CASTFS_ZST_F32_TIERED,
						    CASTFS_ZST_PLANES2_TIERED };

/* The grouping of @n bytes as @t: every variant against the scalar one,
 * and back. The scalar grouping into @ref. */
static void check_group(const uint8_t *in, size_t n,
			enum castfs_zst_transform t, uint8_t *ref)
{
	uint8_t *got = malloc(n + 1), *back = malloc(n + 1);

	FUZZ_CHECK(got && back);
	zst_group_isa(ref, in, n, t, ZST_ISA_SCALAR);
	for (int isa = ZST_ISA_SSE2; isa < ZST_ISA_COUNT; isa++) {
		if (!zst_isa_runs((enum zst_isa)isa))
			continue;
		zst_group_isa(got, in, n, t, (enum zst_isa)isa);
		FUZZ_CHECK(memcmp(got, ref, n) == 0);
	}
	zst_ungroup(back, ref, n, t);
	FUZZ_CHECK(memcmp(back, in, n) == 0);
	free(got);
	free(back);
}

/* The tiered frame of the @count elements whose planes are at @planes:
 * every coder variant against the scalar one, and decoded back. */
static void check_tier(const uint8_t *planes, size_t count,
		       enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t cap = 8 * count + 512, n;
	uint8_t *ref = malloc(cap), *got = malloc(cap),
		*dst = malloc(w * count);
	const uint8_t *plane[ZST_MAX_PLANES];

	FUZZ_CHECK(ref && got && dst);
	n = zst_tier_encode_isa(ref, cap, planes, count, t, ZST_TIER_SCALAR);
	FUZZ_CHECK(n > 0);
	for (int isa = ZST_TIER_AVX2; isa <= ZST_TIER_AVX512; isa++) {
		if (!zst_tier_isa_runs((enum zst_tier_isa)isa))
			continue;
		FUZZ_CHECK(zst_tier_encode_isa(got, cap, planes, count, t,
					       (enum zst_tier_isa)isa) == n);
		FUZZ_CHECK(memcmp(got, ref, n) == 0);
	}
	FUZZ_CHECK(zst_tier_decode(dst, w * count, ref, n, t, plane) == 0);
	for (unsigned k = 0; k < w; k++)
		FUZZ_CHECK(memcmp(plane[k], planes + k * count, count) == 0);
	free(ref);
	free(got);
	free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum castfs_zst_transform t;
	unsigned w;
	size_t count, n;
	uint8_t *planes;

	if (size < 2)
		return 0;
	t = tiers[data[0] % 3];
	w = zst_group_width(t);
	count = (size - 1) / w;
	n = count * w;
	if (!count)
		return 0;
	planes = malloc(n);
	FUZZ_CHECK(planes);
	/* The grouping a tiered frame's planes come from. */
	check_group(data + 1, n, t, planes);
	check_tier(planes, count, t);
	free(planes);
	return 0;
}
