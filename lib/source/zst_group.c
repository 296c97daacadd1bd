/* SPDX-License-Identifier: MIT */
/*
 * Byte grouping of grouped packs: within a frame, the first bytes of every
 * element, then the second bytes, and so on (ZipNN's layout, which zstd
 * compresses far better than interleaved floats). For bf16 and fp32 the 8
 * exponent bits are first moved into one whole byte.
 */
#include <string.h>

#include "common/bytes.h"
#include "source/zst_internal.h"

unsigned zst_group_width(enum castfs_zst_transform t)
{
	switch (t) {
	case CASTFS_ZST_PLANES2:
	case CASTFS_ZST_BF16:
		return 2;
	case CASTFS_ZST_PLANES4:
	case CASTFS_ZST_F32:
		return 4;
	case CASTFS_ZST_NONE:
	case CASTFS_ZST_TRANSFORM_COUNT:
		break;
	}
	return 1;
}

/* bf16 s|eeeeeeee|mmmmmmm -> eeeeeeee|s|mmmmmmm (the exponent a byte). */
static uint16_t bf16_align(uint16_t v)
{
	return (uint16_t)(((v << 1) & 0xFF00u) | ((v >> 8) & 0x80u) |
			  (v & 0x7Fu));
}

static uint16_t bf16_unalign(uint16_t t)
{
	return (uint16_t)(((t & 0x80u) << 8) | ((t >> 1) & 0x7F80u) |
			  (t & 0x7Fu));
}

/* fp32 s|e(8)|m(23) -> e(8)|s|m(23). */
static uint32_t f32_align(uint32_t v)
{
	return ((v << 1) & 0xFF000000u) | ((v >> 8) & 0x800000u) |
	       (v & 0x7FFFFFu);
}

static uint32_t f32_unalign(uint32_t t)
{
	return ((t & 0x800000u) << 8) | ((t >> 1) & 0x7F800000u) |
	       (t & 0x7FFFFFu);
}

/* Element @i of @src (width @w), exponent-aligned when @t says so. */
static uint32_t elem_load(const uint8_t *src, size_t i, unsigned w,
			  enum castfs_zst_transform t)
{
	if (w == 2) {
		uint16_t v = castfs_load_le16(src + 2 * i);

		return t == CASTFS_ZST_BF16 ? bf16_align(v) : v;
	}
	uint32_t v = castfs_load_le32(src + 4 * i);

	return t == CASTFS_ZST_F32 ? f32_align(v) : v;
}

void zst_group(uint8_t *dst, const uint8_t *src, size_t n,
	       enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

	if (w == 1) {
		memcpy(dst, src, n);
		return;
	}
	for (size_t i = 0; i < count; i++) {
		uint32_t v = elem_load(src, i, w, t);

		for (unsigned p = 0; p < w; p++)
			dst[p * count + i] = (uint8_t)(v >> (8 * p));
	}
}

/* Any alignment, any width. */
static void ungroup_any(uint8_t *dst, const uint8_t *src, size_t n,
			enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

	if (w == 1) {
		memcpy(dst, src, n);
		return;
	}
	for (size_t i = 0; i < count; i++) {
		uint32_t v = 0;

		for (unsigned p = 0; p < w; p++)
			v |= (uint32_t)src[p * count + i] << (8 * p);
		if (w == 2)
			castfs_store_le16(dst + 2 * i,
					  t == CASTFS_ZST_BF16 ?
						  bf16_unalign((uint16_t)v) :
						  (uint16_t)v);
		else
			castfs_store_le32(dst + 4 * i, t == CASTFS_ZST_F32 ?
							       f32_unalign(v) :
							       v);
	}
}

/* The hot path of every read of a grouped pack: one simple loop per width
 * and transform, which the compiler vectorises. */
static void ungroup2(uint16_t *restrict dst, const uint8_t *restrict lo,
		     const uint8_t *restrict hi, size_t count, bool bf16)
{
	if (bf16) {
		for (size_t i = 0; i < count; i++)
			dst[i] = bf16_unalign(
				(uint16_t)(lo[i] | (uint16_t)(hi[i] << 8)));
		return;
	}
	for (size_t i = 0; i < count; i++)
		dst[i] = (uint16_t)(lo[i] | (uint16_t)(hi[i] << 8));
}

static void ungroup4(uint32_t *restrict dst, const uint8_t *restrict b,
		     size_t count, bool f32)
{
	const uint8_t *b0 = b, *b1 = b + count, *b2 = b + 2 * count,
		      *b3 = b + 3 * count;

	for (size_t i = 0; i < count; i++) {
		uint32_t v = b0[i] | (uint32_t)b1[i] << 8 |
			     (uint32_t)b2[i] << 16 | (uint32_t)b3[i] << 24;

		dst[i] = f32 ? f32_unalign(v) : v;
	}
}

void zst_ungroup(uint8_t *dst, const uint8_t *src, size_t n,
		 enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* Elements are stored little-endian, as this host's words are. */
	if (w == 2 && ((uintptr_t)dst & 1) == 0)
		ungroup2((uint16_t *)(void *)dst, src, src + count, count,
			 t == CASTFS_ZST_BF16);
	else if (w == 4 && ((uintptr_t)dst & 3) == 0)
		ungroup4((uint32_t *)(void *)dst, src, count,
			 t == CASTFS_ZST_F32);
	else
#endif
		ungroup_any(dst, src, n, t);
}
