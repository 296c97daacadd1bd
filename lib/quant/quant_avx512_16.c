/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 quantiser kernels that read BF16/F16 sources as they are and the
 * double quantisation of block absmax, bit-identical to quant_scalar.c:
 * the absmax of 16-bit floats is an integer max of their magnitude bits
 * (exact and monotonic for finite values), widening to float32 is exact,
 * and the codes come from the same float32 comparisons.
 */
#include "common/bytes.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include "quant/quant_avx512_util.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

/* Magnitude bits at and above this are Inf or NaN. */
static inline uint16_t nonfinite16(bool f16)
{
	return f16 ? 0x7c00 : 0x7f80;
}

/* The float32 value of the non-negative finite 16-bit float @h. */
static inline AVX512 float widen1(uint16_t h, bool f16)
{
	return f16 ? _cvtsh_ss(h) : castfs_f32_from_bits((uint32_t)h << 16);
}

/* The largest of the 32 unsigned 16-bit lanes of @acc. */
static inline AVX512 uint16_t hmax_epu16(__m512i acc)
{
	__m256i a2 = _mm256_max_epu16(_mm512_castsi512_si256(acc),
				      _mm512_extracti64x4_epi64(acc, 1));
	__m128i a1 = _mm_max_epu16(_mm256_castsi256_si128(a2),
				   _mm256_extracti128_si256(a2, 1));

	/* The max of eight as the min of their complements (phminposuw). */
	a1 = _mm_minpos_epu16(_mm_xor_si128(a1, _mm_set1_epi16(-1)));
	return (uint16_t)~_mm_extract_epi16(a1, 0);
}

/* Largest finite magnitude of @m 16-bit floats, as magnitude bits. */
static inline AVX512 uint16_t absmax16_bits(const uint8_t *x, size_t m,
					    bool f16)
{
	const __m512i lim = _mm512_set1_epi16((short)nonfinite16(f16));
	const __m512i mag = _mm512_set1_epi16(0x7fff);
	__m512i acc = _mm512_setzero_si512();
	size_t i;

	for (i = 0; i < m; i += 32) {
		__mmask32 k = m - i >= 32 ? ~(__mmask32)0 :
					    (__mmask32)((1u << (m - i)) - 1);
		__m512i v = _mm512_and_si512(
			_mm512_maskz_loadu_epi16(k, x + 2 * i), mag);

		k &= _mm512_cmplt_epu16_mask(v, lim);
		acc = _mm512_mask_max_epu16(acc, k, acc, v);
	}
	return hmax_epu16(acc);
}

AVX512 void castfs_absmax16_avx512(float *restrict amax, const void *restrict x,
				   size_t n, size_t bs, bool f16)
{
	const uint8_t *p = x;

	for (size_t b = 0; b < n; b += bs)
		*amax++ = widen1(absmax16_bits(p + 2 * b,
					       n - b < bs ? n - b : bs, f16),
				 f16);
}

/* Sixteen 16-bit floats widened exactly to float32. */
static inline AVX512 __m512 load16(const uint8_t *x, bool f16)
{
	__m256i h = _mm256_loadu_si256((const __m256i *)(const void *)x);

	if (f16)
		return _mm512_cvtph_ps(h);
	return _mm512_castsi512_ps(
		_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The search tables of one 4-bit code type. */
struct q4_tables {
	__m512 mid; /* mid[j] */
	__m512 mid1; /* mid[j + 1] */
	__m512 m3, m7, m11;
	__m512i order;
	bool identity; /* NF4: the code is the position */
};

static inline AVX512 void q4_tables_init(struct q4_tables *t,
					 enum castfs_qtype qt)
{
	const float *mid = castfs_q4_mids[qt].f;

	t->mid = _mm512_loadu_ps(mid);
	/* mid[16] would be past the table: lane 15 is never indexed. */
	t->mid1 = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7,
							  8, 9, 10, 11, 12, 13,
							  14, 15, 15),
					t->mid);
	t->m3 = _mm512_set1_ps(mid[3]);
	t->m7 = _mm512_set1_ps(mid[7]);
	t->m11 = _mm512_set1_ps(mid[11]);
	t->order = _mm512_cvtepu8_epi32(_mm_loadu_si128(
		(const __m128i *)(const void *)castfs_q4_order[qt]));
	t->identity = qt == CASTFS_Q_NF4;
}

/*
 * The 16 codes of @v scaled by @scale, as 32-bit lanes: the branch-free
 * binary search of quant_scalar.c, its first two steps as blends of
 * broadcast midpoints and the last two as permutes.
 */
static inline AVX512 __m512i q4_codes16(__m512 v, __m512 scale,
					const struct q4_tables *t)
{
	__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
	__m512 s = _mm512_maskz_mul_ps((__mmask16)~nan, v, scale);
	__mmask16 up = _mm512_cmp_ps_mask(s, t->m7, _CMP_GT_OQ);
	__m512i p = _mm512_maskz_mov_epi32(up, _mm512_set1_epi32(8));
	__m512 m = _mm512_mask_blend_ps(up, t->m3, t->m11);

	up = _mm512_cmp_ps_mask(s, m, _CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(4));
	up = _mm512_cmp_ps_mask(s, _mm512_permutexvar_ps(p, t->mid1),
				_CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(2));
	up = _mm512_cmp_ps_mask(s, _mm512_permutexvar_ps(p, t->mid),
				_CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(1));
	return t->identity ? p : _mm512_permutexvar_epi32(p, t->order);
}

/*
 * 32 BF16 elements: the low halves of the 32-bit lanes are the even
 * elements, the high halves the odd ones, so each lane gives one byte
 * (even code << 4 | odd code) and no shuffle is needed.
 */
static inline AVX512 void q4_32_bf16(uint8_t *dst, const uint8_t *x,
				     __m512 scale, const struct q4_tables *t)
{
	__m512i h = _mm512_loadu_si512(x);
	__m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
	__m512 odd = _mm512_castsi512_ps(
		_mm512_and_si512(h, _mm512_set1_epi32((int)0xffff0000u)));
	__m512i c = _mm512_or_si512(
		_mm512_slli_epi32(q4_codes16(even, scale, t), 4),
		q4_codes16(odd, scale, t));

	_mm_storeu_si128((__m128i *)(void *)dst, _mm512_cvtepi32_epi8(c));
}

/* 16 contiguous elements, packed into 8 bytes (even lanes high nibble). */
static inline AVX512 void q4_16(uint8_t *dst, __m512 v, __m512 scale,
				const struct q4_tables *t)
{
	__m512i c = q4_codes16(v, scale, t);
	__m512i pair = _mm512_or_si512(_mm512_slli_epi64(c, 4),
				       _mm512_srli_epi64(c, 32));

	_mm_storel_epi64((__m128i *)(void *)dst, _mm512_cvtepi64_epi8(pair));
}

/* Elements [@i, @m) of a block at @x: the part past whole 16s. */
static AVX512 void q4_tail(uint8_t *dst, const uint8_t *x, size_t i, size_t m,
			   float sc, enum castfs_qtype qt, bool f16)
{
	float t[16];

	for (size_t j = i; j < m; j++)
		t[j - i] = widen1(castfs_load_le16(x + 2 * j), f16);
	castfs_q4_encode_block(dst + i / 2, t, m - i, sc, qt);
}

/*
 * The threshold path of BF16 blocks (castfs_q4_thresh in quant_table.h):
 * a block absmax whose exponent field lies in [Q4T_EMIN, Q4T_EMAX] keeps
 * 1 / absmax, the thresholds and their neighbours normal floats, so the
 * table row of its 7 mantissa bits, shifted by its exponent, gives exact
 * thresholds. The upper bound also keeps FP4's zero midpoint at +0: below
 * 2^17 the smallest positive BF16 times 1 / absmax does not round to 0.
 * test_quant_kernels checks every absmax at both sides of every threshold.
 */
#define Q4T_EMIN 16
#define Q4T_EMAX 143

/* A BF16 pattern as a signed 16-bit key in the order of its value
 * (-0 just below +0): negative patterns reversed by flipping the
 * magnitude bits. */
static inline AVX512 __m512i bf16_key(__m512i h)
{
	return _mm512_ternarylogic_epi32(h, _mm512_srai_epi16(h, 15),
					 _mm512_set1_epi16(0x7fff), 0x78);
}

/* One block's thresholds as keys, t[k] in lane k (low 16 lanes), and the
 * search levels' operands taken from them. */
struct q4t_block {
	__m512i t, t1, t3, t7, t11;
};

static inline AVX512 void q4t_block_init(struct q4t_block *b, uint16_t amax,
					 enum castfs_qtype qt)
{
	__m256i row = _mm256_loadu_si256((
		const __m256i *)(const void *)castfs_q4_thresh[qt][amax & 0x7f]);
	__m256i sh = _mm256_set1_epi16((short)((amax & 0x7f80) - 0x3f80));
	/* A zero threshold (FP4's midpoint 0) does not scale. */
	__mmask16 nz = _mm256_test_epi16_mask(row, _mm256_set1_epi16(0x7fff));
	__m256i tb = _mm256_mask_add_epi16(row, nz, row, sh);
	__m256i t = _mm256_ternarylogic_epi32(tb, _mm256_srai_epi16(tb, 15),
					      _mm256_set1_epi16(0x7fff), 0x78);

	b->t = _mm512_zextsi256_si512(t);
	b->t1 = _mm512_permutexvar_epi16(
		_mm512_setr_epi32(0x00020001, 0x00040003, 0x00060005,
				  0x00080007, 0x000a0009, 0x000c000b,
				  0x000e000d, 0x000e000e, 0, 0, 0, 0, 0, 0, 0,
				  0),
		b->t);
	b->t3 = _mm512_permutexvar_epi16(_mm512_set1_epi16(3), b->t);
	b->t7 = _mm512_permutexvar_epi16(_mm512_set1_epi16(7), b->t);
	b->t11 = _mm512_permutexvar_epi16(_mm512_set1_epi16(11), b->t);
}

/*
 * The codes of the 32 BF16 elements @h, one byte per 32-bit lane (even
 * element in the high nibble): quant_scalar.c's binary search over the key
 * compared with the block's thresholds, 32 lanes at a time.
 */
static inline AVX512 __m512i q4t_codes32(__m512i h, const struct q4t_block *b,
					 __m512i order, bool identity)
{
	__m512i k = bf16_key(h);
	__mmask32 up = _mm512_cmpgt_epi16_mask(k, b->t7);
	__m512i p = _mm512_maskz_mov_epi16(up, _mm512_set1_epi16(8));
	__m512i m = _mm512_mask_blend_epi16(up, b->t3, b->t11);

	up = _mm512_cmpgt_epi16_mask(k, m);
	p = _mm512_mask_add_epi16(p, up, p, _mm512_set1_epi16(4));
	up = _mm512_cmpgt_epi16_mask(k, _mm512_permutexvar_epi16(p, b->t1));
	p = _mm512_mask_add_epi16(p, up, p, _mm512_set1_epi16(2));
	up = _mm512_cmpgt_epi16_mask(k, _mm512_permutexvar_epi16(p, b->t));
	p = _mm512_mask_add_epi16(p, up, p, _mm512_set1_epi16(1));
	if (!identity)
		p = _mm512_permutexvar_epi16(p, order);
	/* Each 32-bit lane: even code * 16 + odd code. */
	return _mm512_madd_epi16(p, _mm512_set1_epi32(0x00010010));
}

/* The 32 code bytes of the 32 BF16 elements @h at @dst. */
static inline AVX512 void q4t_32(uint8_t *dst, __m512i h,
				 const struct q4t_block *b, __m512i order,
				 bool identity)
{
	_mm_storeu_si128(
		(__m128i *)(void *)dst,
		_mm512_cvtepi32_epi8(q4t_codes32(h, b, order, identity)));
}

/*
 * The bytes of four q4t_codes32() results @c0..@c3, in that order, as one
 * vector: two packing steps leave 128-bit lane k holding dwords k of c0..c3,
 * one dword permute puts them back in order. Three shuffles and a permute
 * for 64 bytes, where vpmovdb takes two uops for every 16.
 */
static inline AVX512 __m512i q4t_pack4(__m512i c0, __m512i c1, __m512i c2,
				       __m512i c3)
{
	__m512i w = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1),
					_mm512_packus_epi32(c2, c3));

	return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9,
							  13, 2, 6, 10, 14, 3,
							  7, 11, 15),
					w);
}

/*
 * How far ahead of a block the source is prefetched, in bytes: read from a
 * mapping it is a run of 4 KiB pages, and the hardware prefetcher stops at
 * each page's end (the cast kernels' CVT_PF_DIST, measured the same way).
 */
#define Q4_PF_DIST 1024

/* The largest magnitude bits of @m (a multiple of 32) BF16 elements,
 * Inf and NaN included. */
static inline AVX512 uint16_t maxmag_bf16(const uint8_t *x, size_t m)
{
	const __m512i mag = _mm512_set1_epi16(0x7fff);
	__m512i acc = _mm512_setzero_si512();

	for (size_t i = 0; i < m; i += 32) {
		__builtin_prefetch(x + 2 * i + Q4_PF_DIST);
		acc = _mm512_max_epu16(
			acc,
			_mm512_and_si512(_mm512_loadu_si512(x + 2 * i), mag));
	}
	return hmax_epu16(acc);
}

/*
 * The codes of the BF16 block of @m elements at @x (bs a multiple of 32) by
 * the threshold path, and its absmax at *@amax (when not NULL); false, and
 * nothing written, when its absmax is outside that path's range (zero,
 * tiny, huge, Inf or NaN in the block).
 */
static inline __attribute__((always_inline)) AVX512 bool
q4t_block(uint8_t *dst, float *amax, const uint8_t *x, size_t m,
	  enum castfs_qtype qt, __m512i order)
{
	uint16_t a = maxmag_bf16(x, m);
	unsigned e = (unsigned)a >> 7;
	struct q4t_block b;

	if (e < Q4T_EMIN || e > Q4T_EMAX)
		return false;
	if (amax)
		*amax = widen1(a, false);
	q4t_block_init(&b, a, qt);
	for (size_t i = 0; i < m; i += 32)
		q4t_32(dst + i / 2, _mm512_loadu_si512(x + 2 * i), &b, order,
		       qt == CASTFS_Q_NF4);
	return true;
}

/* One block by the float32 search: any source, length and absmax. */
static AVX512 void q4_block_f32(uint8_t *dst, float *amax, const uint8_t *p,
				size_t m, const struct q4_tables *t,
				enum castfs_qtype qt, bool f16)
{
	float a = widen1(absmax16_bits(p, m, f16), f16);
	float sc = castfs_q_scale(a);
	__m512 scale = _mm512_set1_ps(sc);
	size_t i = 0;

	if (amax)
		*amax = a;
	for (; !f16 && i + 32 <= m; i += 32)
		q4_32_bf16(dst + i / 2, p + 2 * i, scale, t);
	for (; i + 16 <= m; i += 16)
		q4_16(dst + i / 2, load16(p + 2 * i, f16), scale, t);
	if (i < m)
		q4_tail(dst, p, i, m, sc, qt, f16);
}

/*
 * The magnitude maxima (Inf and NaN included) of the four 64-element blocks
 * in @v0..@v7, one per 128-bit lane in its lowest word: maxima of pairs of
 * lanes across the blocks first, so the four reductions share their steps.
 */
static inline AVX512 __m512i maxmag4_64(__m512i v0, __m512i v1, __m512i v2,
					__m512i v3, __m512i v4, __m512i v5,
					__m512i v6, __m512i v7)
{
	const __m512i mag = _mm512_set1_epi16(0x7fff);
	__m512i m[4], a, c, d;

	m[0] = _mm512_max_epu16(_mm512_and_si512(v0, mag),
				_mm512_and_si512(v1, mag));
	m[1] = _mm512_max_epu16(_mm512_and_si512(v2, mag),
				_mm512_and_si512(v3, mag));
	m[2] = _mm512_max_epu16(_mm512_and_si512(v4, mag),
				_mm512_and_si512(v5, mag));
	m[3] = _mm512_max_epu16(_mm512_and_si512(v6, mag),
				_mm512_and_si512(v7, mag));
	/* Lanes 0-1: block 0 (or 2), lanes 2-3: block 1 (or 3). */
	a = _mm512_max_epu16(_mm512_shuffle_i64x2(m[0], m[1], 0x44),
			     _mm512_shuffle_i64x2(m[0], m[1], 0xee));
	c = _mm512_max_epu16(_mm512_shuffle_i64x2(m[2], m[3], 0x44),
			     _mm512_shuffle_i64x2(m[2], m[3], 0xee));
	/* Lane i: block i. */
	d = _mm512_max_epu16(_mm512_shuffle_i64x2(a, c, 0x88),
			     _mm512_shuffle_i64x2(a, c, 0xdd));
	d = _mm512_max_epu16(d, _mm512_shuffle_epi32(d, 0x4e));
	d = _mm512_max_epu16(d, _mm512_shuffle_epi32(d, 0xb1));
	return _mm512_max_epu16(d, _mm512_srli_epi32(d, 16));
}

/* Whether each lowest word of the four lanes of @a lies in the threshold
 * path's range. */
static inline AVX512 bool q4t_range4(__m512i a)
{
	__m512i e = _mm512_srli_epi32(
		_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), 7);
	__mmask16 ok = _mm512_cmp_epu32_mask(
		_mm512_sub_epi32(e, _mm512_set1_epi32(Q4T_EMIN)),
		_mm512_set1_epi32(Q4T_EMAX - Q4T_EMIN), _MM_CMPINT_LE);

	return (ok & 0x1111) == 0x1111;
}

/* The block absmax in the lowest word of 128-bit lane @i of @a. */
#define Q4T_LANE_WORD(a, i) \
	((uint16_t)_mm_cvtsi128_si32(_mm512_extracti32x4_epi32((a), (i))))

/* The 64 code bytes of the two blocks of 64 in @v0..@v3 (absmax words @a0,
 * @a1). */
static inline __attribute__((always_inline)) AVX512 __m512i
q4t_two64(__m512i v0, __m512i v1, __m512i v2, __m512i v3, uint16_t a0,
	  uint16_t a1, enum castfs_qtype qt, __m512i order)
{
	const bool id = qt == CASTFS_Q_NF4;
	struct q4t_block b0, b1;

	q4t_block_init(&b0, a0, qt);
	q4t_block_init(&b1, a1, qt);
	return q4t_pack4(q4t_codes32(v0, &b0, order, id),
			 q4t_codes32(v1, &b0, order, id),
			 q4t_codes32(v2, &b1, order, id),
			 q4t_codes32(v3, &b1, order, id));
}

/*
 * Four 64-element BF16 blocks at @x by the threshold path, their absmax at
 * @amax (when not NULL); false, and nothing written, when one of them is
 * outside its range. Each element is loaded once for the absmax and the
 * codes, the four absmax reductions are one, and the eight vectors stay in
 * registers (named, not an array: GCC kept the array on the stack and
 * copied the source through it).
 */
static inline __attribute__((always_inline)) AVX512 bool
q4t_four64(uint8_t *dst, float *amax, const uint8_t *x, enum castfs_qtype qt,
	   __m512i order)
{
	__m512i v0, v1, v2, v3, v4, v5, v6, v7, a;
	uint16_t w0, w1, w2, w3;

	__builtin_prefetch(x + Q4_PF_DIST);
	__builtin_prefetch(x + 64 + Q4_PF_DIST);
	__builtin_prefetch(x + 128 + Q4_PF_DIST);
	__builtin_prefetch(x + 192 + Q4_PF_DIST);
	__builtin_prefetch(x + 256 + Q4_PF_DIST);
	__builtin_prefetch(x + 320 + Q4_PF_DIST);
	__builtin_prefetch(x + 384 + Q4_PF_DIST);
	__builtin_prefetch(x + 448 + Q4_PF_DIST);
	v0 = _mm512_loadu_si512(x);
	v1 = _mm512_loadu_si512(x + 64);
	v2 = _mm512_loadu_si512(x + 128);
	v3 = _mm512_loadu_si512(x + 192);
	v4 = _mm512_loadu_si512(x + 256);
	v5 = _mm512_loadu_si512(x + 320);
	v6 = _mm512_loadu_si512(x + 384);
	v7 = _mm512_loadu_si512(x + 448);
	a = maxmag4_64(v0, v1, v2, v3, v4, v5, v6, v7);
	if (!q4t_range4(a))
		return false;
	w0 = (uint16_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(a));
	w1 = Q4T_LANE_WORD(a, 1);
	w2 = Q4T_LANE_WORD(a, 2);
	w3 = Q4T_LANE_WORD(a, 3);
	if (amax) {
		amax[0] = widen1(w0, false);
		amax[1] = widen1(w1, false);
		amax[2] = widen1(w2, false);
		amax[3] = widen1(w3, false);
	}
	_mm512_storeu_si512(dst, q4t_two64(v0, v1, v2, v3, w0, w1, qt, order));
	_mm512_storeu_si512(dst + 64,
			    q4t_two64(v4, v5, v6, v7, w2, w3, qt, order));
	return true;
}

/*
 * Whole blocks of BF16 from the start of @x (@n elements) by the threshold
 * path, until a block that path cannot take; returns the number of
 * elements done. Instanced per code type (q4t_run_nf4, q4t_run_fp4), not
 * inlined into the caller, so that its loop holds no call: a call (the
 * float32 path) clobbers every vector register, and the compiler then
 * reloaded the constants and the tables in every block.
 */
static inline __attribute__((always_inline)) AVX512 size_t
q4t_run(uint8_t *dst, float *amax, const uint8_t *x, size_t n, size_t bs,
	enum castfs_qtype qt, __m512i order)
{
	size_t b = 0;

	/* Blocks of 64 (bitsandbytes' default) four at a time. */
	for (; bs == 64 && n - b >= 256; b += 256, x += 512, dst += 128) {
		if (!q4t_four64(dst, amax, x, qt, order))
			break;
		if (amax)
			amax += 4;
	}
	for (; b < n; b += bs, x += 2 * bs, dst += bs / 2) {
		size_t m = n - b < bs ? n - b : bs;

		if (m % 32 != 0 || !q4t_block(dst, amax, x, m, qt, order))
			break;
		if (amax)
			amax++;
	}
	return b < n ? b : n;
}

static __attribute__((noinline)) AVX512 size_t q4t_run_nf4(uint8_t *dst,
							   float *amax,
							   const uint8_t *x,
							   size_t n, size_t bs,
							   __m512i order)
{
	return q4t_run(dst, amax, x, n, bs, CASTFS_Q_NF4, order);
}

static __attribute__((noinline)) AVX512 size_t q4t_run_fp4(uint8_t *dst,
							   float *amax,
							   const uint8_t *x,
							   size_t n, size_t bs,
							   __m512i order)
{
	return q4t_run(dst, amax, x, n, bs, CASTFS_Q_FP4, order);
}

/* q4t_run for @qt. */
static inline AVX512 size_t q4t_run_qt(uint8_t *dst, float *amax,
				       const uint8_t *x, size_t n, size_t bs,
				       enum castfs_qtype qt, __m512i order)
{
	if (qt == CASTFS_Q_NF4)
		return q4t_run_nf4(dst, amax, x, n, bs, order);
	return q4t_run_fp4(dst, amax, x, n, bs, order);
}

AVX512 void castfs_q4_16_avx512(uint8_t *restrict dst, float *restrict amax,
				const void *restrict x, size_t n, size_t bs,
				enum castfs_qtype qt, bool f16)
{
	const uint8_t *p = x;
	const __m512i order =
		_mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128(
			(const __m128i *)(const void *)castfs_q4_order[qt])));
	struct q4_tables t;
	size_t b = 0;

	q4_tables_init(&t, qt);
	while (b < n) {
		size_t d = f16 ? 0 :
				 q4t_run_qt(dst, amax, p, n - b, bs, qt, order);
		size_t m;

		b += d, p += 2 * d, dst += d / 2;
		if (amax)
			amax += d / bs;
		if (b >= n)
			break;
		m = n - b < bs ? n - b : bs;
		q4_block_f32(dst, amax, p, m, &t, qt, f16);
		b += m, p += 2 * m, dst += m / 2;
		if (amax)
			amax++;
	}
}

/* castfs_q8_tree in 16 registers. */
struct q8_regs {
	__m512 t[16];
};

/* Entry @i (0 <= i < 32) of the 32 floats in @lo, @hi. */
static inline AVX512 __m512 pick32(__m512 lo, __m512 hi, __m512i i)
{
	return _mm512_permutex2var_ps(lo, i, hi);
}

/*
 * The number of the 255 ascending midpoints each lane of @s exceeds: the
 * binary search of castfs_q8_code(), level by level, each level's bounds
 * looked up in registers (no gathers): first the bucket of 16 codes (a
 * 4-step search over 15 bounds), then one bound per level within it.
 */
static inline AVX512 __m512i q8_search(__m512 s, const struct q8_regs *r)
{
	const __m512i one = _mm512_set1_epi32(1);
	__m512i b = _mm512_setzero_si512(), p, i;
	__mmask16 up, hi;
	__m512 m;

	for (int step = 8; step; step >>= 1) {
		i = _mm512_add_epi32(b, _mm512_set1_epi32(step - 1));
		up = _mm512_cmp_ps_mask(s, _mm512_permutexvar_ps(i, r->t[0]),
					_CMP_GT_OQ);
		b = _mm512_mask_add_epi32(b, up, b, _mm512_set1_epi32(step));
	}
	p = _mm512_slli_epi32(b, 4);
	up = _mm512_cmp_ps_mask(s, _mm512_permutexvar_ps(b, r->t[1]),
				_CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(8));
	i = _mm512_srli_epi32(p, 3); /* 0..31 */
	up = _mm512_cmp_ps_mask(s, pick32(r->t[2], r->t[3], i), _CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(4));
	i = _mm512_srli_epi32(p, 2); /* 0..63 */
	hi = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32));
	m = _mm512_mask_blend_ps(hi, pick32(r->t[4], r->t[5], i),
				 pick32(r->t[6], r->t[7], i));
	up = _mm512_cmp_ps_mask(s, m, _CMP_GT_OQ);
	p = _mm512_mask_add_epi32(p, up, p, _mm512_set1_epi32(2));
	i = _mm512_srli_epi32(p, 1); /* 0..127 */
	hi = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32));
	m = _mm512_mask_blend_ps(
		_mm512_test_epi32_mask(i, _mm512_set1_epi32(64)),
		_mm512_mask_blend_ps(hi, pick32(r->t[8], r->t[9], i),
				     pick32(r->t[10], r->t[11], i)),
		_mm512_mask_blend_ps(hi, pick32(r->t[12], r->t[13], i),
				     pick32(r->t[14], r->t[15], i)));
	up = _mm512_cmp_ps_mask(s, m, _CMP_GT_OQ);
	return _mm512_mask_add_epi32(p, up, p, one);
}

AVX512 void castfs_q8_avx512(uint8_t *restrict dst, const float *restrict amax,
			     size_t n, float offset, float scale)
{
	const __m512 off = _mm512_set1_ps(offset), sc = _mm512_set1_ps(scale);
	struct q8_regs r;

	for (int j = 0; j < 16; j++)
		r.t[j] = _mm512_loadu_ps(castfs_q8_tree.f + 16 * j);

	for (size_t i = 0; i < n; i += 16) {
		__mmask16 k = n - i >= 16 ? (__mmask16)0xffff :
					    (__mmask16)((1u << (n - i)) - 1);
		__m512 v =
			_mm512_sub_ps(_mm512_maskz_loadu_ps(k, amax + i), off);
		__mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
		__m512 s = _mm512_maskz_mul_ps((__mmask16)~nan, v, sc);

		_mm512_mask_cvtepi32_storeu_epi8(dst + i, k, q8_search(s, &r));
	}
}

#endif
