/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 Q8_0 / Q4_0 quantisers: quant_gguf_avx2.c's lanes, a block of 32
 * in two registers and the scales of 16 blocks at once; the same float32
 * operations in the same order as quant_gguf.c, bit-identical to it (a
 * block holding a NaN goes to the scalar code whole). AVX-512 F/BW/VL.
 */
#include <stdint.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant_gguf.h"
#include "quant/quant_gguf_internal.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
#include "quant/quant_avx512_util.h"

/* No "fma": x * id + 8.5 must stay two roundings (and see keep()). */
#define AVX512 CASTFS_Q_AVX512_WIDE

#define QK CASTFS_GGUF_QK
#define GROUP 16 /* blocks whose scales are computed together */

/* The rounded product itself, even where the build enables FMA. */
static inline AVX512 __m512 keep(__m512 v)
{
	__asm__("" : "+v"(v));
	return v;
}

static inline AVX512 __m512 vabs(__m512 x)
{
	return _mm512_abs_ps(x);
}

/* The 32 values of a block, widened from BF16 / F16 where they are. */
struct blk {
	__m512 v[2];
};

enum src { SRC_F32, SRC_BF16, SRC_F16 };

static inline AVX512 void load_any(struct blk *b, const void *x, size_t i,
				   enum src src)
{
	const uint8_t *p = (const uint8_t *)x + i * QK * 2;

	for (int k = 0; k < 2; k++) {
		__m256i h;

		if (src == SRC_F32) {
			b->v[k] = _mm512_loadu_ps((const float *)x + i * QK +
						  16 * k);
			continue;
		}
		h = _mm256_loadu_si256(
			(const __m256i *)(const void *)(p + 32 * k));
		b->v[k] = src == SRC_F16 ?
				  _mm512_cvtph_ps(h) :
				  _mm512_castsi512_ps(_mm512_slli_epi32(
					  _mm512_cvtepu16_epi32(h), 16));
	}
}

static inline AVX512 bool has_nan(const struct blk *b)
{
	return _mm512_cmp_ps_mask(b->v[0], b->v[1], _CMP_UNORD_Q) != 0;
}

/* The lane-wise max of |x| of a block without NaN. */
static inline AVX512 __m512 block_max16(const struct blk *b)
{
	return _mm512_max_ps(vabs(b->v[0]), vabs(b->v[1]));
}

/*
 * castfs_qr_roundf_i8() per lane, as int32 lanes whose low byte is the
 * code, as roundf_lanes() in quant_gguf_avx2.c: cvttps gives INT_MIN for
 * NaN and |v| >= 2^31; below 2^23 the comparisons with t +- 0.5 round
 * half away from zero.
 */
static inline AVX512 __m512i roundf_lanes(__m512 v)
{
	const __m512 half = _mm512_set1_ps(0.5f);
	const __m512i one = _mm512_set1_epi32(1);
	__m512i i = _mm512_cvttps_epi32(v);
	__mmask16 small = _mm512_cmp_ps_mask(
		vabs(v), _mm512_set1_ps(8388608.0f), _CMP_LT_OQ);
	__m512 t = _mm512_cvtepi32_ps(i);
	__mmask16 up = _mm512_mask_cmp_ps_mask(small, v, _mm512_add_ps(t, half),
					       _CMP_GE_OQ);
	__mmask16 dn = _mm512_mask_cmp_ps_mask(small, v, _mm512_sub_ps(t, half),
					       _CMP_LE_OQ);

	i = _mm512_mask_add_epi32(i, up, i, one);
	return _mm512_mask_sub_epi32(i, dn, i, one);
}

/* The 32 Q8_0 codes of block @b at @dst: round(x * id), id in every lane
 * of @vid; vpmovdb keeps each lane's low byte. */
static inline AVX512 void q8_codes(uint8_t *dst, const struct blk *b,
				   __m512 vid)
{
	for (int k = 0; k < 2; k++)
		_mm_storeu_si128((__m128i *)(void *)(dst + 16 * k),
				 _mm512_cvtepi32_epi8(roundf_lanes(
					 _mm512_mul_ps(b->v[k], vid))));
}

/* q8_0_block() of a block without NaN. */
static AVX512 void q8_0_vec(uint8_t *dst, const struct blk *b)
{
	float amax = _mm512_reduce_max_ps(block_max16(b));
	float d = amax / 127.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	castfs_store_le16(dst, castfs_gguf_fp16(d));
	q8_codes(dst + 2, b, _mm512_set1_ps(id));
}

/* q4_code() per lane, as q4_lanes() in quant_gguf_avx2.c. */
static inline AVX512 __m512i q4_lanes(__m512 x, __m512 vid)
{
	__m512 v = keep(_mm512_mul_ps(x, vid));
	__m512i i = _mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_set1_ps(8.5f)));

	i = _mm512_srai_epi32(_mm512_slli_epi32(i, 24), 24);
	return _mm512_min_epi32(i, _mm512_set1_epi32(15));
}

/* The value of the first element of largest |x| in a block without NaN;
 * +0.0 when all are zero (see first_max() in quant_gguf_avx2.c). */
static inline AVX512 float first_max(const struct blk *b, float amax)
{
	__m512 m = _mm512_set1_ps(amax);
	uint32_t hit;
	float v[QK];

	if (amax == 0.0f)
		return 0.0f;
	hit = (uint32_t)_mm512_cmp_ps_mask(vabs(b->v[0]), m, _CMP_EQ_OQ) |
	      (uint32_t)_mm512_cmp_ps_mask(vabs(b->v[1]), m, _CMP_EQ_OQ) << 16;
	_mm512_storeu_ps(v, b->v[0]);
	_mm512_storeu_ps(v + 16, b->v[1]);
	return v[__builtin_ctz(hit)];
}

/* The 16 bytes of Q4_0 codes of block @b at @dst (element j in the low
 * nibble, j + 16 in the high one), id in every lane of @vid. */
static inline AVX512 void q4_codes(uint8_t *dst, const struct blk *b,
				   __m512 vid)
{
	__m512i lo = q4_lanes(b->v[0], vid), hi = q4_lanes(b->v[1], vid);

	_mm_storeu_si128((__m128i *)(void *)dst,
			 _mm512_cvtepi32_epi8(_mm512_or_si512(
				 lo, _mm512_slli_epi32(hi, 4))));
}

/* q4_0_block() of a block without NaN. */
static AVX512 void q4_0_vec(uint8_t *dst, const struct blk *b)
{
	volatile float d =
		first_max(b, _mm512_reduce_max_ps(block_max16(b))) / -8.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;

	castfs_store_le16(dst, castfs_gguf_fp16(d));
	q4_codes(dst + 2, b, _mm512_set1_ps(id));
}

/* max(A, B) of two registers' pairs of 128-bit lanes: [a0|a2, a1|a3,
 * b0|b2, b1|b3] with imm 0x44 / 0xee, [a0|a1, a2|a3, ...] with 0x88 /
 * 0xdd. */
#define MAX_X4(a, b, lo, hi)                                \
	_mm512_max_ps(_mm512_shuffle_f32x4((a), (b), (lo)), \
		      _mm512_shuffle_f32x4((a), (b), (hi)))

/* Lane k: the max of the 16 lanes of m[k] (values without NaN). */
static inline AVX512 __m512 hmax16(const __m512 m[GROUP])
{
	__m512 a[8], b[4];

	for (int k = 0; k < 8; k++)
		a[k] = _mm512_max_ps(_mm512_unpacklo_ps(m[2 * k], m[2 * k + 1]),
				     _mm512_unpackhi_ps(m[2 * k],
							m[2 * k + 1]));
	/* each 128-bit lane of b[k]: its part of blocks 4k..4k+3 */
	for (int k = 0; k < 4; k++)
		b[k] = _mm512_max_ps(
			_mm512_shuffle_ps(a[2 * k], a[2 * k + 1], 0x44),
			_mm512_shuffle_ps(a[2 * k], a[2 * k + 1], 0xee));
	a[0] = MAX_X4(b[0], b[1], 0x44, 0xee);
	a[1] = MAX_X4(b[2], b[3], 0x44, 0xee);
	return MAX_X4(a[0], a[1], 0x88, 0xdd);
}

/*
 * d = @num / @div, id = 1 / d (0 when d is 0) per lane, and fp16(d) into
 * @h by vcvtps2ph (the same bits as castfs_gguf_fp16() for every value
 * but NaN; d is never NaN here). Returns id.
 */
static inline AVX512 __m512 scales_x16(__m512 num, float div, uint16_t h[GROUP])
{
	__m512 d = _mm512_div_ps(num, _mm512_set1_ps(div));

	_mm256_storeu_si256((__m256i *)(void *)h,
			    _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT |
						       _MM_FROUND_NO_EXC));
	return _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(),
						      _CMP_NEQ_OQ),
				   _mm512_set1_ps(1.0f), d);
}

/* Lane @k of @v in every lane. */
static inline AVX512 __m512 lane(__m512 v, int k)
{
	return _mm512_permutexvar_ps(_mm512_set1_epi32(k), v);
}

/* q8_0_vec() of 16 blocks without NaN at once. */
static AVX512 void q8_0_x16(uint8_t *dst, const struct blk b[GROUP])
{
	__m512 m[GROUP], id;
	uint16_t h[GROUP];

	for (int k = 0; k < GROUP; k++)
		m[k] = block_max16(&b[k]);
	id = scales_x16(hmax16(m), 127.0f, h);
	for (int k = 0; k < GROUP; k++) {
		uint8_t *db = dst + k * CASTFS_GGUF_Q8_0_BYTES;

		castfs_store_le16(db, h[k]);
		q8_codes(db + 2, &b[k], lane(id, k));
	}
}

/* q4_0_vec() of 16 blocks without NaN at once. */
static AVX512 void q4_0_x16(uint8_t *dst, const struct blk b[GROUP])
{
	float mx[GROUP];
	uint16_t h[GROUP];
	__m512 id;

	for (int k = 0; k < GROUP; k++)
		mx[k] = first_max(&b[k],
				  _mm512_reduce_max_ps(block_max16(&b[k])));
	id = scales_x16(_mm512_loadu_ps(mx), -8.0f, h);
	for (int k = 0; k < GROUP; k++) {
		uint8_t *db = dst + k * CASTFS_GGUF_Q4_0_BYTES;

		castfs_store_le16(db, h[k]);
		q4_codes(db + 2, &b[k], lane(id, k));
	}
}

/* The block's 32 values as float32, for the scalar code. */
static inline AVX512 void spill(float *f, const struct blk *b)
{
	_mm512_storeu_ps(f, b->v[0]);
	_mm512_storeu_ps(f + 16, b->v[1]);
}

#define GQD_ISA AVX512
#define GQD_GROUP GROUP
#define GQD_Q8_N q8_0_x16
#define GQD_Q4_N q4_0_x16
#define GQD_FN(name) name##_avx512
#define GQD_KERNELS castfs_gguf_avx512
#include "quant/quant_gguf_driver.h"

#endif
