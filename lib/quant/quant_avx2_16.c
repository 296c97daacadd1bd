/* SPDX-License-Identifier: MIT */
/*
 * The AVX2 absmax16 and q4_16 entries (castfs_quant_avx2): a fast path
 * for the blocks that real weights are made of, BF16 blocks of a multiple
 * of 64 elements with no NaN or Inf, and the general kernels of
 * quant_avx2.c for every other block. Bit-identical to quant_scalar.c.
 *
 * Why a fast path: in an nf4 read, absmax and code search took ~6.8
 * instructions per element (callgrind, docs/BENCHMARKS.md). A block
 * without NaN or Inf needs no finiteness mask in its absmax (a plain max
 * of the magnitude bits, checked once against the non-finite bound) nor a
 * NaN mask on its scaled values; the last two search levels index
 * 8-entry tables of the odd and even midpoints with one permute each
 * (instead of two permutes and a blend); and a block's 32 code bytes are
 * packed with one permute.
 */
#include "common/bytes.h"
#include "common/compiler.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c,fma")))
/* Inlined, so that the NF4 and FP4 instances of q4f_blocks are two. */
#define AVX2_INLINE inline __attribute__((always_inline)) AVX2

/*
 * Per 16-bit lane of the result, the largest magnitude bits of @m (a
 * multiple of 16) 16-bit floats at @x.
 */
static AVX2_INLINE __m128i max16_acc(const uint8_t *x, size_t m)
{
	const __m256i mag = _mm256_set1_epi16(0x7fff);
	__m256i acc = _mm256_setzero_si256();

	for (size_t i = 0; i < m; i += 16)
		acc = _mm256_max_epu16(
			acc,
			_mm256_and_si256(
				_mm256_loadu_si256(
					(const __m256i *)(const void *)(x +
									2 * i)),
				mag));
	return _mm_max_epu16(_mm256_castsi256_si128(acc),
			     _mm256_extracti128_si256(acc, 1));
}

/*
 * Magnitude bits of the largest |x| of @m (a multiple of 16) 16-bit
 * floats, NaN and Inf included: below the non-finite bound it is the
 * block's finite absmax, at or above it the block needs the general path.
 */
static inline AVX2 uint16_t max16_bits(const uint8_t *x, size_t m)
{
	__m128i a = max16_acc(x, m);

	a = _mm_minpos_epu16(_mm_xor_si128(a, _mm_set1_epi16(-1)));
	return (uint16_t)~_mm_extract_epi16(a, 0);
}

static inline uint16_t nonfinite_bits(bool f16)
{
	return f16 ? 0x7c00 : 0x7f80;
}

static inline AVX2 float widen_bits(uint16_t h, bool f16)
{
	return f16 ? _cvtsh_ss(h) : castfs_f32_from_bits((uint32_t)h << 16);
}

AVX2 void castfs_absmax16_avx2(float *restrict amax, const void *restrict x,
			       size_t n, size_t bs, bool f16)
{
	const uint8_t *p = x;
	uint16_t lim = nonfinite_bits(f16);

	for (size_t b = 0; b < n; b += bs, amax++) {
		size_t m = n - b < bs ? n - b : bs;
		uint16_t bits = 0;

		if (m % 16 == 0 && (bits = max16_bits(p + 2 * b, m)) < lim)
			*amax = widen_bits(bits, f16);
		else
			castfs_absmax16_avx2_any(amax, p + 2 * b, m, m, f16);
	}
}

struct q4f_tables {
	__m256 m3, m7, m11;
	__m256 odd; /* mid[2r + 1], r < 8 (mid[15] is the +Inf sentinel) */
	__m256 even; /* mid[2r] */
	__m256i ord_lo, ord_hi;
};

static AVX2 void q4f_tables_init(struct q4f_tables *t, enum castfs_qtype qt)
{
	const float *mid = castfs_q4_mids[qt].f;
	const uint8_t *ord = castfs_q4_order[qt];
	float odd[8], even[8];

	for (int r = 0; r < 8; r++) {
		odd[r] = mid[2 * r + 1];
		even[r] = mid[2 * r];
	}
	t->m3 = _mm256_set1_ps(mid[3]);
	t->m7 = _mm256_set1_ps(mid[7]);
	t->m11 = _mm256_set1_ps(mid[11]);
	t->odd = _mm256_loadu_ps(odd);
	t->even = _mm256_loadu_ps(even);
	t->ord_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)ord));
	t->ord_hi =
		_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(ord + 8)));
}

/* tbl[idx] for idx in [0, 16): two 8-entry permutes and a blend on bit 3. */
static AVX2_INLINE __m256i lookup16(__m256i lo, __m256i hi, __m256i idx)
{
	__m256 a = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(lo, idx));
	__m256 b = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(hi, idx));
	__m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));

	return _mm256_castps_si256(_mm256_blendv_ps(a, b, sel));
}

/*
 * The codes of 8 finite values @v of a block of scale @scale, as 32-bit
 * lanes: the binary search of quant_avx2.c (position p = 8 b1 + 4 b2 +
 * 2 b3 + b4, bit k set when s exceeds that level's midpoint), with
 * r = 4 b1 + 2 b2 (+ b3) as the index of the odd (even) midpoints.
 */
static AVX2_INLINE __m256i q4f_codes8(__m256 v, __m256 scale,
				      const struct q4f_tables *t, bool identity)
{
	__m256 s = _mm256_mul_ps(v, scale);
	__m256 up1 = _mm256_cmp_ps(s, t->m7, _CMP_GT_OQ);
	__m256 up2 = _mm256_cmp_ps(s, _mm256_blendv_ps(t->m3, t->m11, up1),
				   _CMP_GT_OQ);
	__m256i r = _mm256_or_si256(_mm256_and_si256(_mm256_castps_si256(up1),
						     _mm256_set1_epi32(4)),
				    _mm256_and_si256(_mm256_castps_si256(up2),
						     _mm256_set1_epi32(2)));
	__m256 up3 = _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(t->odd, r),
				   _CMP_GT_OQ);
	__m256 up4;

	r = _mm256_sub_epi32(r, _mm256_castps_si256(up3)); /* up3: 0 or -1 */
	up4 = _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(t->even, r),
			    _CMP_GT_OQ);
	r = _mm256_sub_epi32(_mm256_add_epi32(r, r), _mm256_castps_si256(up4));
	return identity ? r : lookup16(t->ord_lo, t->ord_hi, r);
}

/*
 * 16 BF16 elements as 8 bytes in 32-bit lanes (code of the even element
 * in the high nibble): even elements are the low halves of the lanes.
 */
static AVX2_INLINE __m256i q4f_pairs16(const uint8_t *x, __m256 scale,
				       const struct q4f_tables *t,
				       bool identity)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)x);
	__m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
	__m256 odd = _mm256_castsi256_ps(
		_mm256_and_si256(h, _mm256_set1_epi32((int)0xffff0000u)));

	return _mm256_or_si256(
		_mm256_slli_epi32(q4f_codes8(even, scale, t, identity), 4),
		q4f_codes8(odd, scale, t, identity));
}

/* 64 finite BF16 elements into 32 bytes. */
static AVX2_INLINE void q4f_block64(uint8_t *dst, const uint8_t *x,
				    __m256 scale, const struct q4f_tables *t,
				    bool identity)
{
	__m256i a = q4f_pairs16(x, scale, t, identity);
	__m256i b = q4f_pairs16(x + 32, scale, t, identity);
	__m256i c = q4f_pairs16(x + 64, scale, t, identity);
	__m256i d = q4f_pairs16(x + 96, scale, t, identity);
	/* Per 128-bit half: the low 4 bytes of a, b, c, d, then the high. */
	__m256i w = _mm256_packus_epi16(_mm256_packus_epi32(a, b),
					_mm256_packus_epi32(c, d));

	w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6,
							     3, 7));
	_mm256_storeu_si256((__m256i *)(void *)dst, w);
}

/*
 * Blocks per group: their scales come from one vdivps. One division per
 * block put its latency in front of each block's search (perf annotate:
 * the broadcast of the scale was the hottest instruction).
 */
#define Q4F_GROUP 8

/* Lane-wise max of the interleaved halves of @x and @y (one level). */
#define Q4F_FOLD(unpack_lo, unpack_hi, x, y) \
	_mm_max_epu16(unpack_lo(x, y), unpack_hi(x, y))

/*
 * The largest of each of 8 vectors of 8 u16, in lane g for vector g: a
 * transposing reduction, 21 operations for 8 blocks instead of a
 * minpos and two extracts per block.
 */
static AVX2_INLINE __m128i max8x8(const __m128i x[8])
{
	__m128i t0 =
		Q4F_FOLD(_mm_unpacklo_epi16, _mm_unpackhi_epi16, x[0], x[1]);
	__m128i t1 =
		Q4F_FOLD(_mm_unpacklo_epi16, _mm_unpackhi_epi16, x[2], x[3]);
	__m128i t2 =
		Q4F_FOLD(_mm_unpacklo_epi16, _mm_unpackhi_epi16, x[4], x[5]);
	__m128i t3 =
		Q4F_FOLD(_mm_unpacklo_epi16, _mm_unpackhi_epi16, x[6], x[7]);

	t0 = Q4F_FOLD(_mm_unpacklo_epi32, _mm_unpackhi_epi32, t0, t1);
	t2 = Q4F_FOLD(_mm_unpacklo_epi32, _mm_unpackhi_epi32, t2, t3);
	return Q4F_FOLD(_mm_unpacklo_epi64, _mm_unpackhi_epi64, t0, t2);
}

/*
 * The absmax @a of the (up to) Q4F_GROUP blocks at @p that start at block
 * @b; bit g of the result set when block g takes the fast path (64 k
 * finite elements), its a[g] then the block's absmax.
 */
static AVX2_INLINE unsigned q4f_group_absmax(float a[Q4F_GROUP],
					     const uint8_t *p, size_t b,
					     size_t n, size_t bs)
{
	__m128i x[Q4F_GROUP], bits, fin;
	unsigned full = 0;

	for (size_t g = 0; g < Q4F_GROUP; g++, b += bs) {
		size_t m = b < n ? CASTFS_MIN(n - b, bs) : 0;

		x[g] = _mm_setzero_si128();
		if (m == 0 || m % 64)
			continue;
		x[g] = max16_acc(p + 2 * b, m);
		full |= 1u << g;
	}
	bits = max8x8(x);
	/* Magnitude bits are <= 0x7fff: a signed compare is exact. */
	fin = _mm_cmpgt_epi16(_mm_set1_epi16((short)nonfinite_bits(false)),
			      bits);
	_mm256_storeu_ps(a, _mm256_castsi256_ps(_mm256_slli_epi32(
				    _mm256_cvtepu16_epi32(bits), 16)));
	return full & (unsigned)_mm_movemask_epi8(
			      _mm_packs_epi16(fin, _mm_setzero_si128()));
}

/*
 * castfs_q_scale's rule, 1 / (a > 1e-38 ? a : 1e-38), for 8 finite a >= 0
 * at once: max_ps gives the ternary's operand for such a, and vdivps
 * rounds as the scalar division does (the unit tests compare the codes).
 * Lanes of blocks off the fast path (Inf, NaN) get unused values.
 */
static AVX2_INLINE void q4f_group_scale(float sc[Q4F_GROUP],
					const float a[Q4F_GROUP])
{
	__m256 d = _mm256_max_ps(_mm256_loadu_ps(a), _mm256_set1_ps(1e-38f));

	_mm256_storeu_ps(sc, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
}

/* The blocks of castfs_q4_16_avx2 for BF16 and blocksize % 64 == 0. */
static AVX2_INLINE void q4f_blocks(uint8_t *restrict dst, float *restrict amax,
				   const uint8_t *p, size_t n, size_t bs,
				   enum castfs_qtype qt,
				   const struct q4f_tables *t, bool identity)
{
	float a[Q4F_GROUP], sc[Q4F_GROUP];

	for (size_t b = 0; b < n;) {
		unsigned fast = q4f_group_absmax(a, p, b, n, bs);

		q4f_group_scale(sc, a);
		for (size_t g = 0; g < Q4F_GROUP && b < n; g++, b += bs) {
			size_t m = CASTFS_MIN(n - b, bs);
			__m256 scale = _mm256_set1_ps(sc[g]);

			if (!(fast & (1u << g))) {
				/* NaN, Inf or a short last block: one block. */
				castfs_q4_16_avx2_any(dst + b / 2, amax,
						      p + 2 * b, m, m, qt,
						      false);
				if (amax)
					amax++;
				continue;
			}
			if (amax)
				*amax++ = a[g];
			for (size_t i = 0; i < m; i += 64)
				q4f_block64(dst + (b + i) / 2, p + 2 * (b + i),
					    scale, t, identity);
		}
	}
}

AVX2 void castfs_q4_16_avx2(uint8_t *restrict dst, float *restrict amax,
			    const void *restrict x, size_t n, size_t bs,
			    enum castfs_qtype qt, bool f16)
{
	struct q4f_tables t;

	if (f16 || bs % 64) {
		castfs_q4_16_avx2_any(dst, amax, x, n, bs, qt, f16);
		return;
	}
	q4f_tables_init(&t, qt);
	/* Two instances: NF4 codes are positions, FP4 ones a lookup. */
	if (qt == CASTFS_Q_NF4)
		q4f_blocks(dst, amax, x, n, bs, qt, &t, true);
	else
		q4f_blocks(dst, amax, x, n, bs, qt, &t, false);
}

#endif
