/* SPDX-License-Identifier: MIT */
/*
 * AVX2 quantiser kernels: 8 elements per step, bit-identical to
 * quant_scalar.c with the methods of quant_avx512.c (an exact, order-free
 * max; the code by a branch-free binary search over the same float32
 * midpoints; int8 rounding half to even as rintf does; 16-bit sources
 * widened exactly, their absmax an integer max of magnitude bits).
 */
#include <math.h>

#include "common/bytes.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include <immintrin.h>

#include "quant/quant_avx2_util.h"

#define AVX2 __attribute__((target("avx2,f16c,fma")))

/* ---- float32 sources ---- */

/* Largest finite |x| of 8 lanes folded into @acc; NaN and Inf skipped. */
static inline AVX2 __m256 absmax_step(__m256 acc, __m256 x)
{
	__m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
	__m256 finite = _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ);

	/* Non-finite lanes become +0.0, which never raises a max >= +0.0. */
	return _mm256_max_ps(acc, _mm256_and_ps(a, finite));
}

static AVX2 float absmax_block(const float *x, size_t m)
{
	__m256 acc = _mm256_setzero_ps();
	size_t i;

	for (i = 0; i + 8 <= m; i += 8)
		acc = absmax_step(acc, _mm256_loadu_ps(x + i));
	return fmaxf(castfs_q_hmax8(acc), castfs_q_absmax(x + i, m - i));
}

static AVX2 void absmax_avx2(float *restrict amax, const float *restrict x,
			     size_t n, size_t bs)
{
	for (size_t b = 0; b < n; b += bs)
		*amax++ = absmax_block(x + b, n - b < bs ? n - b : bs);
}

/* tbl[idx] for idx in [0, 16): two 8-entry permutes and a blend on bit 3. */
static inline AVX2 __m256i lookup16(__m256i lo, __m256i hi, __m256i idx)
{
	__m256 a = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(lo, idx));
	__m256 b = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(hi, idx));
	__m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));

	return _mm256_castps_si256(_mm256_blendv_ps(a, b, sel));
}

struct q4_tables {
	__m256i mid_lo, mid_hi; /* mid[j] */
	__m256i mid1_lo, mid1_hi; /* mid[j + 1] */
	__m256i ord_lo, ord_hi;
	__m256 m3, m7, m11;
	bool identity; /* NF4: the code is the position */
};

static inline AVX2 void q4_tables_init(struct q4_tables *t,
				       enum castfs_qtype qt)
{
	const float *mid = castfs_q4_mids[qt].f;
	const uint8_t *ord = castfs_q4_order[qt];

	t->mid_lo = _mm256_castps_si256(_mm256_loadu_ps(mid));
	t->mid_hi = _mm256_castps_si256(_mm256_loadu_ps(mid + 8));
	/* mid[16] would be past the table: that lane is never indexed. */
	t->mid1_lo = _mm256_castps_si256(_mm256_loadu_ps(mid + 1));
	t->mid1_hi = _mm256_permutevar8x32_epi32(
		t->mid_hi, _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7));
	t->ord_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)ord));
	t->ord_hi =
		_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(ord + 8)));
	t->m3 = _mm256_set1_ps(mid[3]);
	t->m7 = _mm256_set1_ps(mid[7]);
	t->m11 = _mm256_set1_ps(mid[11]);
	t->identity = qt == CASTFS_Q_NF4;
}

/* p + step where s > m: one step of the search. */
static inline AVX2 __m256i q4_up(__m256i p, __m256 s, __m256 m, int step)
{
	__m256i up = _mm256_castps_si256(_mm256_cmp_ps(s, m, _CMP_GT_OQ));

	return _mm256_add_epi32(p,
				_mm256_and_si256(up, _mm256_set1_epi32(step)));
}

/*
 * The 8 codes of @v scaled by @scale as 32-bit lanes: the search of
 * quant_scalar.c, its first two steps on broadcast midpoints.
 */
static inline AVX2 __m256i q4_codes8(__m256 v, __m256 scale,
				     const struct q4_tables *t)
{
	__m256 ok = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
	__m256 s = _mm256_and_ps(_mm256_mul_ps(v, scale), ok); /* NaN: 0 */
	__m256 up = _mm256_cmp_ps(s, t->m7, _CMP_GT_OQ);
	__m256i p =
		_mm256_and_si256(_mm256_castps_si256(up), _mm256_set1_epi32(8));

	p = q4_up(p, s, _mm256_blendv_ps(t->m3, t->m11, up), 4);
	p = q4_up(p, s,
		  _mm256_castsi256_ps(lookup16(t->mid1_lo, t->mid1_hi, p)), 2);
	p = q4_up(p, s, _mm256_castsi256_ps(lookup16(t->mid_lo, t->mid_hi, p)),
		  1);
	return t->identity ? p : lookup16(t->ord_lo, t->ord_hi, p);
}

/* Eight 32-bit lanes holding bytes, stored as 8 bytes. */
static inline AVX2 void store8x8(uint8_t *dst, __m256i c)
{
	__m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c),
				     _mm256_extracti128_si256(c, 1));

	_mm_storel_epi64((__m128i *)(void *)dst, _mm_packus_epi16(w, w));
}

/* 8 contiguous elements, packed into 4 bytes (even lanes high nibble). */
static inline AVX2 void q4_8(uint8_t *dst, __m256 v, __m256 scale,
			     const struct q4_tables *t)
{
	__m256i c = q4_codes8(v, scale, t), pair;
	__m128i b;

	/* Byte 0 of each 64-bit lane: code 2j << 4 | code 2j + 1. */
	pair = _mm256_or_si256(_mm256_slli_epi64(c, 4),
			       _mm256_srli_epi64(c, 32));
	pair = _mm256_shuffle_epi8(
		pair, _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1,
				       -1, -1, -1, -1, -1, 0, 8, -1, -1, -1, -1,
				       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
	b = _mm_unpacklo_epi16(_mm256_castsi256_si128(pair),
			       _mm256_extracti128_si256(pair, 1));
	castfs_store_le32(dst, (uint32_t)_mm_cvtsi128_si32(b));
}

/* 16 BF16 elements: even ones in the low halves of the lanes, odd ones in
 * the high halves, so each lane gives one byte. */
static inline AVX2 void q4_16_bf16(uint8_t *dst, const uint8_t *x, __m256 scale,
				   const struct q4_tables *t)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)x);
	__m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
	__m256 odd = _mm256_castsi256_ps(
		_mm256_and_si256(h, _mm256_set1_epi32((int)0xffff0000u)));

	store8x8(dst, _mm256_or_si256(
			      _mm256_slli_epi32(q4_codes8(even, scale, t), 4),
			      q4_codes8(odd, scale, t)));
}

static AVX2 void q4_avx2(uint8_t *restrict dst, const float *restrict x,
			 size_t n, size_t bs, enum castfs_qtype qt)
{
	struct q4_tables t;

	q4_tables_init(&t, qt);
	for (size_t b = 0; b < n; b += bs) {
		size_t m = n - b < bs ? n - b : bs, i;
		float sc = castfs_q_scale(absmax_block(x + b, m));
		__m256 scale = _mm256_set1_ps(sc);

		for (i = 0; i + 8 <= m; i += 8)
			q4_8(dst + (b + i) / 2, _mm256_loadu_ps(x + b + i),
			     scale, &t);
		if (i < m)
			castfs_q4_encode_block(dst + (b + i) / 2, x + b + i,
					       m - i, sc, qt);
	}
}

/* castfs_i8_code on 8 lanes. */
static AVX2 void i8_avx2(int8_t *restrict dst, const float *restrict x,
			 size_t n, float scale)
{
	const __m256 lim = _mm256_set1_ps(127.0f),
		     nlim = _mm256_set1_ps(-127.0f);
	const __m256 vs = _mm256_set1_ps(scale);
	const __m256 inf = _mm256_set1_ps(INFINITY);
	size_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256 r = _mm256_round_ps(_mm256_mul_ps(v, vs),
					   _MM_FROUND_TO_NEAREST_INT |
						   _MM_FROUND_NO_EXC);
		__m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
		__m256 is_inf = _mm256_cmp_ps(a, inf, _CMP_EQ_OQ);
		__m256 signed_lim = _mm256_or_ps(
			lim, _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
		__m128i w;

		r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
		r = _mm256_blendv_ps(r, signed_lim, is_inf);
		r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
		w = _mm_packs_epi32(
			_mm256_castsi256_si128(_mm256_cvtps_epi32(r)),
			_mm256_extracti128_si256(_mm256_cvtps_epi32(r), 1));
		_mm_storel_epi64((__m128i *)(void *)(dst + i),
				 _mm_packs_epi16(w, w));
	}
	castfs_i8_scalar(dst + i, x + i, n - i, scale);
}

/* ---- 16-bit sources ---- */

static inline uint16_t nonfinite16(bool f16)
{
	return f16 ? 0x7c00 : 0x7f80;
}

static inline AVX2 float widen1(uint16_t h, bool f16)
{
	return f16 ? _cvtsh_ss(h) : castfs_f32_from_bits((uint32_t)h << 16);
}

/* Largest finite magnitude of @m 16-bit floats, as magnitude bits. */
static AVX2 uint16_t absmax16_bits(const uint8_t *x, size_t m, bool f16)
{
	uint16_t lim = nonfinite16(f16), best = 0;
	__m256i vlim = _mm256_set1_epi16((short)lim);
	__m256i mag = _mm256_set1_epi16(0x7fff);
	__m256i acc = _mm256_setzero_si256();
	__m128i a;
	size_t i;

	for (i = 0; i + 16 <= m; i += 16) {
		__m256i v = _mm256_and_si256(
			_mm256_loadu_si256(
				(const __m256i *)(const void *)(x + 2 * i)),
			mag);
		/* v < lim as unsigned: min(v, lim - 1) == v. */
		__m256i ok = _mm256_cmpeq_epi16(
			_mm256_min_epu16(
				v,
				_mm256_sub_epi16(vlim, _mm256_set1_epi16(1))),
			v);

		acc = _mm256_max_epu16(acc, _mm256_and_si256(v, ok));
	}
	a = _mm_max_epu16(_mm256_castsi256_si128(acc),
			  _mm256_extracti128_si256(acc, 1));
	a = _mm_minpos_epu16(_mm_xor_si128(a, _mm_set1_epi16(-1)));
	best = (uint16_t)~_mm_extract_epi16(a, 0);
	for (; i < m; i++) {
		uint16_t h = castfs_load_le16(x + 2 * i) & 0x7fff;

		if (h < lim && h > best)
			best = h;
	}
	return best;
}

/* Every 16-bit block; castfs_absmax16_avx2 (quant_avx2_16.c) has the
 * fast path and comes here for the rest. */
AVX2 void castfs_absmax16_avx2_any(float *restrict amax, const void *restrict x,
				   size_t n, size_t bs, bool f16)
{
	const uint8_t *p = x;

	for (size_t b = 0; b < n; b += bs)
		*amax++ = widen1(absmax16_bits(p + 2 * b,
					       n - b < bs ? n - b : bs, f16),
				 f16);
}

static inline AVX2 __m256 load8(const uint8_t *x, bool f16)
{
	__m128i h = _mm_loadu_si128((const __m128i *)(const void *)x);

	if (f16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(
		_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Every 16-bit block; castfs_q4_16_avx2 (quant_avx2_16.c) has the fast
 * path and comes here for the rest. */
AVX2 void castfs_q4_16_avx2_any(uint8_t *restrict dst, float *restrict amax,
				const void *restrict x, size_t n, size_t bs,
				enum castfs_qtype qt, bool f16)
{
	const uint8_t *p = x;
	struct q4_tables t;

	q4_tables_init(&t, qt);
	for (size_t b = 0; b < n; b += bs) {
		size_t m = n - b < bs ? n - b : bs, i;
		float a = widen1(absmax16_bits(p + 2 * b, m, f16), f16);
		float sc = castfs_q_scale(a);
		__m256 scale = _mm256_set1_ps(sc);

		if (amax)
			*amax++ = a;

		for (i = 0; !f16 && i + 16 <= m; i += 16)
			q4_16_bf16(dst + (b + i) / 2, p + 2 * (b + i), scale,
				   &t);
		for (; i + 8 <= m; i += 8)
			q4_8(dst + (b + i) / 2, load8(p + 2 * (b + i), f16),
			     scale, &t);
		if (i < m) {
			float tail[8];

			for (size_t j = i; j < m; j++)
				tail[j - i] = widen1(
					castfs_load_le16(p + 2 * (b + j)), f16);
			castfs_q4_encode_block(dst + (b + i) / 2, tail, m - i,
					       sc, qt);
		}
	}
}

/* ---- double quantisation ---- */

/*
 * The first five levels of the search over the 255 ascending dynmap
 * midpoints, by in-register lookups: the first of the 8 codes each lane
 * of @s falls in (a multiple of 8).
 */
static inline AVX2 __m256i q8_group(__m256 s, const __m256i t16[2],
				    const __m256i t8[2])
{
	__m256i b = _mm256_setzero_si256(), i, up;
	__m256 m;

	for (int step = 8; step; step >>= 1) {
		i = _mm256_add_epi32(b, _mm256_set1_epi32(step - 1));
		m = _mm256_castsi256_ps(lookup16(t16[0], t16[1], i));
		up = _mm256_castps_si256(_mm256_cmp_ps(s, m, _CMP_GT_OQ));
		b = _mm256_add_epi32(
			b, _mm256_and_si256(up, _mm256_set1_epi32(step)));
	}
	m = _mm256_castsi256_ps(lookup16(t8[0], t8[1], b));
	up = _mm256_castps_si256(_mm256_cmp_ps(s, m, _CMP_GT_OQ));
	return _mm256_add_epi32(_mm256_slli_epi32(b, 4),
				_mm256_and_si256(up, _mm256_set1_epi32(8)));
}

/*
 * The codes of 8 values @s into @dst: per lane, its group's first code
 * plus how many of the group's 7 inner midpoints (ascending, so the
 * count is what the binary search finds) it exceeds. Why not the last
 * three levels by gathers: three dependent vgatherdps were ~45 % of this
 * kernel on an AMD host (perf annotate), an 8-float load per lane is not.
 */
static inline AVX2 void q8_codes8(uint8_t *dst, __m256 s, const __m256i t16[2],
				  const __m256i t8[2])
{
	const float *mids = castfs_q8_mids.f;
	uint32_t p[8];
	float v[8];

	_mm256_storeu_si256((__m256i *)(void *)p, q8_group(s, t16, t8));
	_mm256_storeu_ps(v, s);
	for (int l = 0; l < 8; l++) {
		/* p[l] <= 248: the load ends at mids[255], the sentinel. */
		__m256 up = _mm256_cmp_ps(_mm256_set1_ps(v[l]),
					  _mm256_loadu_ps(mids + p[l]),
					  _CMP_GT_OQ);

		dst[l] = (uint8_t)(p[l] +
				   (unsigned)__builtin_popcount(
					   (unsigned)_mm256_movemask_ps(up) &
					   0x7fu));
	}
}

static AVX2 void q8_avx2(uint8_t *restrict dst, const float *restrict amax,
			 size_t n, float offset, float scale)
{
	const float *tree = castfs_q8_tree.f;
	const __m256 off = _mm256_set1_ps(offset), sc = _mm256_set1_ps(scale);
	const __m256i t16[2] = {
		_mm256_castps_si256(_mm256_loadu_ps(tree + CASTFS_Q8_T16)),
		_mm256_castps_si256(_mm256_loadu_ps(tree + CASTFS_Q8_T16 + 8)),
	};
	const __m256i t8[2] = {
		_mm256_castps_si256(_mm256_loadu_ps(tree + CASTFS_Q8_T8)),
		_mm256_castps_si256(_mm256_loadu_ps(tree + CASTFS_Q8_T8 + 8)),
	};
	size_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_sub_ps(_mm256_loadu_ps(amax + i), off);
		__m256 s = _mm256_and_ps(_mm256_mul_ps(v, sc),
					 _mm256_cmp_ps(v, v, _CMP_ORD_Q));

		q8_codes8(dst + i, s, t16, t8);
	}
	castfs_q8_scalar(dst + i, amax + i, n - i, offset, scale);
}

const struct castfs_quant_kernels castfs_quant_avx2 = {
	.absmax = absmax_avx2,
	.q4 = q4_avx2,
	.i8 = i8_avx2,
	.absmax16 = castfs_absmax16_avx2,
	.q4_16 = castfs_q4_16_avx2,
	.q8 = q8_avx2,
};

#endif
