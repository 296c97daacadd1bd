/* SPDX-License-Identifier: MIT */
/*
 * Byte grouping of grouped packs: within a frame, the first bytes of every
 * element, then the second bytes, and so on (ZipNN's layout, which zstd
 * compresses far better than interleaved floats). For bf16 and fp32 the 8
 * exponent bits are first moved into one whole byte.
 */
#include <pthread.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/bytes.h"
#include "common/isa.h"
#include "source/zst_internal.h"

unsigned zst_group_width(enum castfs_zst_transform t)
{
	switch (t) {
	case CASTFS_ZST_PLANES2:
	case CASTFS_ZST_BF16:
	case CASTFS_ZST_BF16_TIERED:
	case CASTFS_ZST_PLANES2_TIERED:
		return 2;
	case CASTFS_ZST_PLANES4:
	case CASTFS_ZST_F32:
	case CASTFS_ZST_F32_TIERED:
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

		return zst_xform_bf16(t) ? bf16_align(v) : v;
	}
	uint32_t v = castfs_load_le32(src + 4 * i);

	return zst_xform_f32(t) ? f32_align(v) : v;
}

/* The reference grouping: any alignment, any width; elements [@from,
 * @n / width) of planes of @n / width bytes each. */
static void group_any(uint8_t *dst, const uint8_t *src, size_t n,
		      enum castfs_zst_transform t, size_t from)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

	if (w == 1) {
		memcpy(dst, src, n);
		return;
	}
	for (size_t i = from; i < count; i++) {
		uint32_t v = elem_load(src, i, w, t);

		for (unsigned p = 0; p < w; p++)
			dst[p * count + i] = (uint8_t)(v >> (8 * p));
	}
}

/* Any alignment, any width; plane p at @plane[p]. */
static void ungroup_any(uint8_t *dst, const uint8_t *const *plane, size_t n,
			enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

	if (w == 1) {
		memcpy(dst, plane[0], n);
		return;
	}
	for (size_t i = 0; i < count; i++) {
		uint32_t v = 0;

		for (unsigned p = 0; p < w; p++)
			v |= (uint32_t)plane[p][i] << (8 * p);
		if (w == 2)
			castfs_store_le16(dst + 2 * i,
					  zst_xform_bf16(t) ?
						  bf16_unalign((uint16_t)v) :
						  (uint16_t)v);
		else
			castfs_store_le32(dst + 4 * i, zst_xform_f32(t) ?
							       f32_unalign(v) :
							       v);
	}
}

#ifdef __SSE2__
/*
 * The hot path of every read of a grouped pack (29 % of the daemon's time
 * for an fp8 view of a bf16 pack with the scalar loops, which GCC -O2 does
 * not vectorise): 16 elements per step, interleaving the planes with
 * unpack (a transpose of bytes), then bf16_unalign()/f32_unalign() on
 * 16- or 32-bit lanes. SSE2 is in every x86-64 CPU.
 */
static __m128i unalign16(__m128i t)
{
	__m128i s = _mm_slli_epi16(_mm_and_si128(t, _mm_set1_epi16(0x80)), 8);
	__m128i e = _mm_and_si128(_mm_srli_epi16(t, 1), _mm_set1_epi16(0x7F80));

	return _mm_or_si128(_mm_or_si128(s, e),
			    _mm_and_si128(t, _mm_set1_epi16(0x7F)));
}

static __m128i unalign32(__m128i t)
{
	__m128i s =
		_mm_slli_epi32(_mm_and_si128(t, _mm_set1_epi32(0x800000)), 8);
	__m128i e =
		_mm_and_si128(_mm_srli_epi32(t, 1), _mm_set1_epi32(0x7F800000));

	return _mm_or_si128(_mm_or_si128(s, e),
			    _mm_and_si128(t, _mm_set1_epi32(0x7FFFFF)));
}

static __m128i load16(const uint8_t *p)
{
	return _mm_loadu_si128((const __m128i *)(const void *)p);
}

static void store16(void *p, __m128i v)
{
	_mm_storeu_si128((__m128i *)p, v);
}

/* Elements [0, count rounded down to 16): the number done. */
static size_t ungroup2_sse2(uint16_t *dst, const uint8_t *lo, const uint8_t *hi,
			    size_t count, bool bf16)
{
	size_t i = 0;

	for (; i + 16 <= count; i += 16) {
		__m128i l = load16(lo + i), h = load16(hi + i);
		__m128i a = _mm_unpacklo_epi8(l, h),
			b = _mm_unpackhi_epi8(l, h);

		store16(dst + i, bf16 ? unalign16(a) : a);
		store16(dst + i + 8, bf16 ? unalign16(b) : b);
	}
	return i;
}

static size_t ungroup4_sse2(uint32_t *dst, const uint8_t *const *b,
			    size_t count, bool f32)
{
	size_t i = 0;

	for (; i + 16 <= count; i += 16) {
		__m128i b0 = load16(b[0] + i), b1 = load16(b[1] + i);
		__m128i b2 = load16(b[2] + i), b3 = load16(b[3] + i);
		__m128i l01 = _mm_unpacklo_epi8(b0, b1);
		__m128i h01 = _mm_unpackhi_epi8(b0, b1);
		__m128i l23 = _mm_unpacklo_epi8(b2, b3);
		__m128i h23 = _mm_unpackhi_epi8(b2, b3);
		__m128i w[4] = { _mm_unpacklo_epi16(l01, l23),
				 _mm_unpackhi_epi16(l01, l23),
				 _mm_unpacklo_epi16(h01, h23),
				 _mm_unpackhi_epi16(h01, h23) };

		for (int k = 0; k < 4; k++)
			store16(dst + i + 4 * k, f32 ? unalign32(w[k]) : w[k]);
	}
	return i;
}

/* Grouping, the inverse (castfs pack: 12-14 % of a packing thread with
 * the scalar loop): bf16_align()/f32_align() on 16- or 32-bit lanes, then
 * each plane's bytes gathered by masks and saturating packs (a masked
 * lane never saturates). */
static __m128i align16(__m128i v)
{
	__m128i e = _mm_and_si128(_mm_slli_epi16(v, 1), _mm_set1_epi16(-256));
	__m128i s = _mm_and_si128(_mm_srli_epi16(v, 8), _mm_set1_epi16(0x80));

	return _mm_or_si128(_mm_or_si128(e, s),
			    _mm_and_si128(v, _mm_set1_epi16(0x7F)));
}

static __m128i align32(__m128i v)
{
	__m128i e = _mm_and_si128(_mm_slli_epi32(v, 1),
				  _mm_set1_epi32((int)0xFF000000u));
	__m128i s =
		_mm_and_si128(_mm_srli_epi32(v, 8), _mm_set1_epi32(0x800000));

	return _mm_or_si128(_mm_or_si128(e, s),
			    _mm_and_si128(v, _mm_set1_epi32(0x7FFFFF)));
}

static size_t group2_sse2(uint8_t *lo, uint8_t *hi, const uint8_t *src,
			  size_t count, bool bf16)
{
	const __m128i ff = _mm_set1_epi16(0xFF);
	size_t i = 0;

	for (; i + 16 <= count; i += 16) {
		__m128i a = load16(src + 2 * i), b = load16(src + 2 * i + 16);

		if (bf16) {
			a = align16(a);
			b = align16(b);
		}
		store16(lo + i, _mm_packus_epi16(_mm_and_si128(a, ff),
						 _mm_and_si128(b, ff)));
		store16(hi + i, _mm_packus_epi16(_mm_srli_epi16(a, 8),
						 _mm_srli_epi16(b, 8)));
	}
	return i;
}

static size_t group4_sse2(uint8_t *const *b, const uint8_t *src, size_t count,
			  bool f32)
{
	const __m128i ff = _mm_set1_epi32(0xFF);
	size_t i = 0;

	for (; i + 16 <= count; i += 16) {
		__m128i v[4];

		for (int k = 0; k < 4; k++) {
			v[k] = load16(src + 4 * i + 16 * k);
			if (f32)
				v[k] = align32(v[k]);
		}
		for (int p = 0; p < 4; p++) {
			__m128i x[4];

			for (int k = 0; k < 4; k++)
				x[k] = _mm_and_si128(
					_mm_srli_epi32(v[k], 8 * p), ff);
			store16(b[p] + i,
				_mm_packus_epi16(_mm_packs_epi32(x[0], x[1]),
						 _mm_packs_epi32(x[2], x[3])));
		}
	}
	return i;
}
#else
static size_t group2_sse2(uint8_t *lo, uint8_t *hi, const uint8_t *src,
			  size_t count, bool bf16)
{
	(void)lo, (void)hi, (void)src, (void)count, (void)bf16;
	return 0;
}

static size_t group4_sse2(uint8_t *const *b, const uint8_t *src, size_t count,
			  bool f32)
{
	(void)b, (void)src, (void)count, (void)f32;
	return 0;
}

static size_t ungroup2_sse2(uint16_t *dst, const uint8_t *lo, const uint8_t *hi,
			    size_t count, bool bf16)
{
	(void)dst, (void)lo, (void)hi, (void)count, (void)bf16;
	return 0;
}

static size_t ungroup4_sse2(uint32_t *dst, const uint8_t *const *b,
			    size_t count, bool f32)
{
	(void)dst, (void)b, (void)count, (void)f32;
	return 0;
}
#endif

/* The leading elements @isa's vector loop un-groups (none for scalar). */
static size_t ungroup2_vec(enum zst_isa isa, uint16_t *dst, const uint8_t *lo,
			   const uint8_t *hi, size_t count, bool bf16)
{
#if ZST_HAVE_X86
	if (isa == ZST_ISA_AVX2)
		return zst_ungroup2_avx2(dst, lo, hi, count, bf16);
#endif
	if (isa == ZST_ISA_SSE2)
		return ungroup2_sse2(dst, lo, hi, count, bf16);
	return 0;
}

static size_t ungroup4_vec(enum zst_isa isa, uint32_t *dst,
			   const uint8_t *const *b, size_t count, bool f32)
{
#if ZST_HAVE_X86
	if (isa == ZST_ISA_AVX2)
		return zst_ungroup4_avx2(dst, b, count, f32);
#endif
	if (isa == ZST_ISA_SSE2)
		return ungroup4_sse2(dst, b, count, f32);
	return 0;
}

/* The leading elements @isa's vector loop groups (none for scalar). */
static size_t group_vec(enum zst_isa isa, uint8_t *dst, const uint8_t *src,
			size_t n, enum castfs_zst_transform t)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;
	uint8_t *b[ZST_MAX_PLANES] = { dst, dst + count, dst + 2 * count,
				       dst + 3 * count };

	if (isa == ZST_ISA_SCALAR || (w != 2 && w != 4))
		return 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		/* Elements are stored little-endian, as this host's words are. */
#if ZST_HAVE_X86
	if (isa == ZST_ISA_AVX2)
		return w == 2 ?
			       zst_group2_avx2(b[0], b[1], src, count,
					       zst_xform_bf16(t)) :
			       zst_group4_avx2(b, src, count, zst_xform_f32(t));
#endif
	return w == 2 ? group2_sse2(b[0], b[1], src, count, zst_xform_bf16(t)) :
			group4_sse2(b, src, count, zst_xform_f32(t));
#else
	return 0;
#endif
}

void zst_group_isa(uint8_t *dst, const uint8_t *src, size_t n,
		   enum castfs_zst_transform t, enum zst_isa isa)
{
	group_any(dst, src, n, t, group_vec(isa, dst, src, n, t));
}

/* One loop per width: the vector steps, then the scalar tail. */
static void ungroup2(enum zst_isa isa, uint16_t *restrict dst,
		     const uint8_t *restrict lo, const uint8_t *restrict hi,
		     size_t count, bool bf16)
{
	for (size_t i = ungroup2_vec(isa, dst, lo, hi, count, bf16); i < count;
	     i++) {
		uint16_t v = (uint16_t)(lo[i] | (uint16_t)(hi[i] << 8));

		dst[i] = bf16 ? bf16_unalign(v) : v;
	}
}

static void ungroup4(enum zst_isa isa, uint32_t *restrict dst,
		     const uint8_t *const *b, size_t count, bool f32)
{
	const uint8_t *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];

	for (size_t i = ungroup4_vec(isa, dst, b, count, f32); i < count; i++) {
		uint32_t v = b0[i] | (uint32_t)b1[i] << 8 |
			     (uint32_t)b2[i] << 16 | (uint32_t)b3[i] << 24;

		dst[i] = f32 ? f32_unalign(v) : v;
	}
}

bool zst_isa_runs(enum zst_isa isa)
{
	switch (isa) {
	case ZST_ISA_SCALAR:
		return true;
	case ZST_ISA_SSE2:
#ifdef __SSE2__
		return true;
#else
		return false;
#endif
	case ZST_ISA_AVX2:
#if ZST_HAVE_X86
		return __builtin_cpu_supports("avx2");
#else
		return false;
#endif
	case ZST_ISA_COUNT:
		break;
	}
	return false;
}

/* zst_ungroup_planes() with variant @isa. */
static void ungroup_planes_isa(uint8_t *dst, const uint8_t *const *plane,
			       size_t n, enum castfs_zst_transform t,
			       enum zst_isa isa)
{
	unsigned w = zst_group_width(t);
	size_t count = n / w;

	if (isa == ZST_ISA_SCALAR) {
		ungroup_any(dst, plane, n, t);
		return;
	}
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* Elements are stored little-endian, as this host's words are. */
	if (w == 2 && ((uintptr_t)dst & 1) == 0)
		ungroup2(isa, (uint16_t *)(void *)dst, plane[0], plane[1],
			 count, zst_xform_bf16(t));
	else if (w == 4 && ((uintptr_t)dst & 3) == 0)
		ungroup4(isa, (uint32_t *)(void *)dst, plane, count,
			 zst_xform_f32(t));
	else
#endif
		ungroup_any(dst, plane, n, t);
}

/* The planes of @n grouped bytes at @src, one after the other. */
static void planes_of(const uint8_t *src, size_t n, unsigned w,
		      const uint8_t **plane)
{
	for (unsigned p = 0; p < w; p++)
		plane[p] = src + p * (n / w);
}

void zst_ungroup_isa(uint8_t *dst, const uint8_t *src, size_t n,
		     enum castfs_zst_transform t, enum zst_isa isa)
{
	const uint8_t *plane[ZST_MAX_PLANES];

	planes_of(src, n, zst_group_width(t), plane);
	ungroup_planes_isa(dst, plane, n, t, isa);
}

void zst_ungroup_planes_isa(uint8_t *dst, const uint8_t *const *plane, size_t n,
			    enum castfs_zst_transform t, enum zst_isa isa)
{
	ungroup_planes_isa(dst, plane, n, t, isa);
}

/* The variant zst_group() and zst_ungroup() run, chosen once per
 * process: the widest this CPU has that CASTFS_ISA allows (common/isa.h). */
static enum zst_isa ungroup_isa = ZST_ISA_SCALAR;
static pthread_once_t ungroup_once = PTHREAD_ONCE_INIT;

/* The CASTFS_ISA level of each variant. */
static const enum castfs_isa ungroup_level[ZST_ISA_COUNT] = {
	[ZST_ISA_SCALAR] = CASTFS_ISA_SCALAR,
	[ZST_ISA_SSE2] = CASTFS_ISA_AVX2,
	[ZST_ISA_AVX2] = CASTFS_ISA_AVX2,
};

static void ungroup_choose(void)
{
	for (int i = ZST_ISA_COUNT - 1; i > ZST_ISA_SCALAR; i--) {
		if (castfs_isa_allows(ungroup_level[i]) &&
		    zst_isa_runs((enum zst_isa)i)) {
			ungroup_isa = (enum zst_isa)i;
			return;
		}
	}
}

void zst_group(uint8_t *dst, const uint8_t *src, size_t n,
	       enum castfs_zst_transform t)
{
	pthread_once(&ungroup_once, ungroup_choose);
	zst_group_isa(dst, src, n, t, ungroup_isa);
}

void zst_ungroup(uint8_t *dst, const uint8_t *src, size_t n,
		 enum castfs_zst_transform t)
{
	pthread_once(&ungroup_once, ungroup_choose);
	zst_ungroup_isa(dst, src, n, t, ungroup_isa);
}

void zst_ungroup_planes(uint8_t *dst, const uint8_t *const *plane, size_t n,
			enum castfs_zst_transform t)
{
	pthread_once(&ungroup_once, ungroup_choose);
	ungroup_planes_isa(dst, plane, n, t, ungroup_isa);
}
