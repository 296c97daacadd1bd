/* SPDX-License-Identifier: MIT */
/*
 * AVX2 Q8_0 / Q4_0 quantisers: one lane per element, the same float32
 * operations in the same order as quant_gguf.c, bit-identical to it. Only
 * the block's max is reordered (exact for values that are not NaN; a block
 * holding a NaN goes to the scalar code whole). 16-bit sources are widened
 * in registers, exactly.
 */
#include <stdint.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant_gguf.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include <immintrin.h>

#include "quant/quant_avx2_util.h"

/* No "fma": x * id + 8.5 must stay two roundings (and see keep()). */
#define AVX2 __attribute__((target("avx2,f16c")))

#define QK CASTFS_GGUF_QK

/* The rounded product itself, even where the build enables FMA (-march):
 * the empty asm hides it from contraction, as fl32() does in scalar. */
static inline AVX2 __m256 keep(__m256 v)
{
	__asm__("" : "+x"(v));
	return v;
}

static inline AVX2 __m256 vabs(__m256 x)
{
	return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/* The 32 values of a block, widened from BF16 / F16 when @w16. */
struct blk {
	__m256 v[4];
};

static inline AVX2 void load_f32(struct blk *b, const float *x)
{
	for (int k = 0; k < 4; k++)
		b->v[k] = _mm256_loadu_ps(x + 8 * k);
}

static inline AVX2 void load_16(struct blk *b, const uint8_t *p, bool f16)
{
	for (int k = 0; k < 4; k++) {
		__m128i h = _mm_loadu_si128((const __m128i *)(p + 16 * k));

		b->v[k] = f16 ? _mm256_cvtph_ps(h) :
				_mm256_castsi256_ps(_mm256_slli_epi32(
					_mm256_cvtepu16_epi32(h), 16));
	}
}

static inline AVX2 bool has_nan(const struct blk *b)
{
	__m256 u = _mm256_or_ps(_mm256_cmp_ps(b->v[0], b->v[1], _CMP_UNORD_Q),
				_mm256_cmp_ps(b->v[2], b->v[3], _CMP_UNORD_Q));

	return _mm256_movemask_ps(u) != 0;
}

/* Largest |x| of a block without NaN: max is exact in any order. */
static inline AVX2 float block_amax(const struct blk *b)
{
	__m256 m = _mm256_max_ps(_mm256_max_ps(vabs(b->v[0]), vabs(b->v[1])),
				 _mm256_max_ps(vabs(b->v[2]), vabs(b->v[3])));

	return castfs_q_hmax8(m);
}

/*
 * castfs_qr_roundf_i8() per lane, as int32 lanes whose low byte is the
 * code: cvttps gives INT_MIN (low byte 0) for NaN and |v| >= 2^31, as the
 * scalar range check does; below 2^23, t = trunc(v) and t +- 0.5 are
 * exact and the comparisons round half away from zero.
 */
static inline AVX2 __m256i roundf_lanes(__m256 v)
{
	const __m256 half = _mm256_set1_ps(0.5f);
	__m256i i = _mm256_cvttps_epi32(v);
	__m256 small =
		_mm256_cmp_ps(vabs(v), _mm256_set1_ps(8388608.0f), _CMP_LT_OQ);
	__m256 t = _mm256_cvtepi32_ps(i);
	__m256 up = _mm256_cmp_ps(v, _mm256_add_ps(t, half), _CMP_GE_OQ);
	__m256 dn = _mm256_cmp_ps(v, _mm256_sub_ps(t, half), _CMP_LE_OQ);

	/* a true mask is -1: subtracting it adds one */
	i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_and_ps(up, small)));
	return _mm256_add_epi32(i,
				_mm256_castps_si256(_mm256_and_ps(dn, small)));
}

/* The low bytes of 4 x 8 int32 lanes, in lane order, into @dst[0..32). */
static inline AVX2 void store_low_bytes32(uint8_t *dst, const __m256i r[4])
{
	const __m256i lo = _mm256_set1_epi32(0xff);
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i a = _mm256_packus_epi32(_mm256_and_si256(r[0], lo),
					_mm256_and_si256(r[1], lo));
	__m256i b = _mm256_packus_epi32(_mm256_and_si256(r[2], lo),
					_mm256_and_si256(r[3], lo));

	/* packs work per 128-bit half: put the dwords back in order */
	_mm256_storeu_si256(
		(__m256i *)dst,
		_mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order));
}

/* The low bytes of 2 x 8 int32 lanes, in lane order, into @dst[0..16). */
static inline AVX2 void store_low_bytes16(uint8_t *dst, __m256i r0, __m256i r1)
{
	const __m256i lo = _mm256_set1_epi32(0xff);
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i a = _mm256_packus_epi32(_mm256_and_si256(r0, lo),
					_mm256_and_si256(r1, lo));
	__m256i p =
		_mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, a), order);

	_mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* The 32 Q8_0 codes of block @b at @dst: round(x * id), id in every lane
 * of @vid. */
static inline AVX2 void q8_codes(uint8_t *dst, const struct blk *b, __m256 vid)
{
	__m256i r[4];

	for (int k = 0; k < 4; k++)
		r[k] = roundf_lanes(_mm256_mul_ps(b->v[k], vid));
	store_low_bytes32(dst, r);
}

/* q8_0_block() of a block without NaN. */
static AVX2 void q8_0_vec(uint8_t *dst, const struct blk *b)
{
	float amax = block_amax(b);
	float d = amax / 127.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	castfs_store_le16(dst, castfs_gguf_fp16(d));
	q8_codes(dst + 2, b, _mm256_set1_ps(id));
}

/*
 * q4_code() per lane: trunc(fl32(fl32(x * id) + 8.5)) (INT_MIN, low byte
 * 0, where the scalar range check gives 0), its low byte as int8, then
 * min(15, that).
 */
static inline AVX2 __m256i q4_lanes(__m256 x, __m256 vid)
{
	__m256 v = keep(_mm256_mul_ps(x, vid));
	__m256i i = _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_set1_ps(8.5f)));

	i = _mm256_srai_epi32(_mm256_slli_epi32(i, 24), 24);
	return _mm256_min_epi32(i, _mm256_set1_epi32(15));
}

/*
 * The value of the first element of largest |x| in a block without NaN
 * (q4_0_block()'s strict '<' keeps the first); +0.0 when all are zero, as
 * the scalar loop never takes one then.
 */
static inline AVX2 float first_max(const struct blk *b, float amax)
{
	__m256 m = _mm256_set1_ps(amax);
	uint32_t hit = 0;
	float v[QK];

	if (amax == 0.0f)
		return 0.0f;
	for (int k = 0; k < 4; k++)
		hit |= (uint32_t)_mm256_movemask_ps(
			       _mm256_cmp_ps(vabs(b->v[k]), m, _CMP_EQ_OQ))
		       << (8 * k);
	for (int k = 0; k < 4; k++)
		_mm256_storeu_ps(v + 8 * k, b->v[k]);
	return v[__builtin_ctz(hit)];
}

/* The 16 bytes of Q4_0 codes of block @b at @dst (element j in the low
 * nibble, j + 16 in the high one), id in every lane of @vid. */
static inline AVX2 void q4_codes(uint8_t *dst, const struct blk *b, __m256 vid)
{
	__m256i lo0 = q4_lanes(b->v[0], vid), lo1 = q4_lanes(b->v[1], vid);
	__m256i hi0 = q4_lanes(b->v[2], vid), hi1 = q4_lanes(b->v[3], vid);

	store_low_bytes16(dst, _mm256_or_si256(lo0, _mm256_slli_epi32(hi0, 4)),
			  _mm256_or_si256(lo1, _mm256_slli_epi32(hi1, 4)));
}

/* q4_0_block() of a block without NaN. */
static AVX2 void q4_0_vec(uint8_t *dst, const struct blk *b)
{
	volatile float d = first_max(b, block_amax(b)) / -8.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	castfs_store_le16(dst, castfs_gguf_fp16(d));
	q4_codes(dst + 2, b, _mm256_set1_ps(id));
}

/* Where a block's values come from. */
enum src { SRC_F32, SRC_BF16, SRC_F16 };

static inline AVX2 void load_any(struct blk *b, const void *x, size_t i,
				 enum src src)
{
	if (src == SRC_F32)
		load_f32(b, (const float *)x + i * QK);
	else
		load_16(b, (const uint8_t *)x + i * QK * 2, src == SRC_F16);
}

/* The widened block, stored for the scalar code (blocks with a NaN). */
static inline AVX2 void spill(float *f, const struct blk *b)
{
	for (int k = 0; k < 4; k++)
		_mm256_storeu_ps(f + 8 * k, b->v[k]);
}

/* Lane k: the max of the 8 lanes of m[k] (values without NaN). */
static inline AVX2 __m256 hmax8(const __m256 m[8])
{
	__m256 s01 = _mm256_max_ps(_mm256_unpacklo_ps(m[0], m[1]),
				   _mm256_unpackhi_ps(m[0], m[1]));
	__m256 s23 = _mm256_max_ps(_mm256_unpacklo_ps(m[2], m[3]),
				   _mm256_unpackhi_ps(m[2], m[3]));
	__m256 s45 = _mm256_max_ps(_mm256_unpacklo_ps(m[4], m[5]),
				   _mm256_unpackhi_ps(m[4], m[5]));
	__m256 s67 = _mm256_max_ps(_mm256_unpacklo_ps(m[6], m[7]),
				   _mm256_unpackhi_ps(m[6], m[7]));
	__m256 a = _mm256_max_ps(_mm256_shuffle_ps(s01, s23, 0x44),
				 _mm256_shuffle_ps(s01, s23, 0xee));
	__m256 b = _mm256_max_ps(_mm256_shuffle_ps(s45, s67, 0x44),
				 _mm256_shuffle_ps(s45, s67, 0xee));

	/* a, b: blocks 0-3, 4-7, one partial max per 128-bit half */
	return _mm256_max_ps(_mm256_permute2f128_ps(a, b, 0x20),
			     _mm256_permute2f128_ps(a, b, 0x31));
}

/*
 * d = @num / @div, id = 1 / d (0 when d is 0) per lane, and fp16(d) into
 * @h by vcvtps2ph, which rounds to nearest even exactly as
 * castfs_gguf_fp16() for every value but NaN (test_gguf checks it; d is
 * never NaN here). Returns id.
 */
static inline AVX2 __m256 scales_x8(__m256 num, float div, uint16_t h[8])
{
	__m256 d = _mm256_div_ps(num, _mm256_set1_ps(div));

	_mm_storeu_si128((__m128i *)h,
			 _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT |
						    _MM_FROUND_NO_EXC));
	return _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
			     _mm256_cmp_ps(d, _mm256_setzero_ps(),
					   _CMP_NEQ_OQ));
}

/* Lane @k of @v in every lane. */
static inline AVX2 __m256 lane(__m256 v, int k)
{
	return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k));
}

/*
 * q8_0_vec() of 8 blocks without NaN at once: the same d = amax / 127
 * and id = 1 / d (0 when d is 0) per lane, and fp16(d) by vcvtps2ph, which
 * rounds to nearest even exactly as castfs_gguf_fp16() for every value but
 * NaN (test_gguf checks it; d is never NaN here).
 */
static AVX2 void q8_0_x8(uint8_t *dst, const struct blk b[8])
{
	__m256 m[8], id;
	uint16_t h[8];

	for (int k = 0; k < 8; k++)
		m[k] = _mm256_max_ps(
			_mm256_max_ps(vabs(b[k].v[0]), vabs(b[k].v[1])),
			_mm256_max_ps(vabs(b[k].v[2]), vabs(b[k].v[3])));
	id = scales_x8(hmax8(m), 127.0f, h);
	for (int k = 0; k < 8; k++) {
		uint8_t *db = dst + k * CASTFS_GGUF_Q8_0_BYTES;

		castfs_store_le16(db, h[k]);
		q8_codes(db + 2, &b[k], lane(id, k));
	}
}

/* q4_0_vec() of 8 blocks without NaN: d = max / -8 and id = 1 / d (0 when
 * d is 0) per lane, fp16(d) by vcvtps2ph (see q8_0_x8()). */
static AVX2 void q4_0_x8(uint8_t *dst, const struct blk b[8])
{
	float mx[8];
	uint16_t h[8];
	__m256 id;

	for (int k = 0; k < 8; k++)
		mx[k] = first_max(&b[k], block_amax(&b[k]));
	id = scales_x8(_mm256_loadu_ps(mx), -8.0f, h);
	for (int k = 0; k < 8; k++) {
		uint8_t *db = dst + k * CASTFS_GGUF_Q4_0_BYTES;

		castfs_store_le16(db, h[k]);
		q4_codes(db + 2, &b[k], lane(id, k));
	}
}

#define GQD_ISA AVX2
#define GQD_GROUP 8
#define GQD_Q8_N q8_0_x8
#define GQD_Q4_N q4_0_x8
#define GQD_FN(name) name##_avx2
#define GQD_KERNELS castfs_gguf_avx2
#include "quant/quant_gguf_driver.h"

#endif
