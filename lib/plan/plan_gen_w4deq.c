/* SPDX-License-Identifier: MIT */
/*
 * The compressed-tensors pack-quantized int4 dequantizer, as its
 * decompressor computes it: element (r, c) is bits 4(c % 8) of word
 * c / 8 of row r's I32 words (rows padded to whole words), minus 8; its
 * value is that integer times the scale of its group, in the scale's dtype
 * (torch: the exact fp32 product rounded once to the scale's dtype), then
 * the view's cast. An asymmetric weight subtracts its group's zero point
 * (a 4-bit code of the same +8 offset, packed along the rows) instead of
 * 8: `(x_q - zp) * scale` in the scale's dtype, the difference exact. A
 * range reads only the code words, scales and zero points of its
 * elements.
 */
#include <errno.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"
#include "quant/quant_round.h"

/* Geometry of a weight: bytes of codes and of scales per row. */
static uint64_t w4_rb(const struct castfs_qtensor *q)
{
	return (q->cols / 8 + (q->cols % 8 != 0)) * 4;
}

static uint64_t w4_ss(const struct castfs_qtensor *q)
{
	return castfs_dtype_bits((enum castfs_dtype)q->scale_dtype) / 8;
}

/* Byte offsets (from the tensors' starts) of element @k's word and scale. */
static uint64_t w4_word(const struct castfs_qtensor *q, uint64_t k)
{
	return k / q->cols * w4_rb(q) + k % q->cols / 8 * 4;
}

static uint64_t w4_scale(const struct castfs_qtensor *q, uint64_t k)
{
	return (k / q->cols * q->scols + k % q->cols / q->bcols) * w4_ss(q);
}

static float w4_scale_value(const struct castfs_qtensor *q, const uint8_t *p)
{
	/* BF16, F16 or F32: the scan accepts no other */
	if (q->scale_dtype == CASTFS_DTYPE_BF16)
		return castfs_f32_from_bits((uint32_t)castfs_load_le16(p)
					    << 16);
	if (q->scale_dtype == CASTFS_DTYPE_F16)
		return castfs_qr_f16_value(castfs_load_le16(p));
	return castfs_f32_from_bits(castfs_load_le32(p));
}

/* Byte offset (from the zero points' start) of element @k's block of 8
 * rows: its zero points are that block's word of its group. */
static uint64_t w4_zpo(const struct castfs_qtensor *q, uint64_t k)
{
	return k / q->cols / 8 * q->scols * 4;
}

/* Bytes of zero points elements [@k, @last] need (0: symmetric). */
static uint64_t w4_zp_len(const struct castfs_qtensor *q, uint64_t k,
			  uint64_t last)
{
	return q->w4_zp ? w4_zpo(q, last) + q->scols * 4 - w4_zpo(q, k) : 0;
}

/* The stored zero point (code + 8) of element @e's group; 8 when
 * symmetric. @zps holds the zero points from byte @z0 on. */
static int w4_zero(const struct castfs_qtensor *q, const uint8_t *zps,
		   uint64_t z0, uint64_t e)
{
	uint64_t r = e / q->cols, g = e % q->cols / q->bcols;

	if (!q->w4_zp)
		return 8;
	return (int)(castfs_load_le32(zps + (r / 8 * q->scols + g) * 4 - z0) >>
		     (4 * (r % 8))) &
	       15;
}

/* @n elements of one group from nibble @nib of the word at @w, zero
 * point @z (stored, with the codes' +8). */
static void w4_group(const struct castfs_qtensor *q, const uint8_t *w,
		     uint64_t nib, float s, int z, uint64_t n, float *f)
{
	enum castfs_dtype rt = (enum castfs_dtype)q->out_round;
	uint32_t word = castfs_load_le32(w);

	for (uint64_t i = 0; i < n; i++) {
		int v = (int)((word >> (4 * nib)) & 15) - z;

		f[i] = castfs_qr_round((float)v * s, rt);
		if (++nib == 8 && i + 1 < n) {
			nib = 0;
			w += 4;
			word = castfs_load_le32(w);
		}
	}
}

/* One round: the fp32 values of elements [@k, @k + @n) into @f. */
static int w4_round(const struct castfs_reader *src,
		    const struct castfs_qtensor *q, uint64_t k, uint64_t n,
		    float *f, uint8_t *codes, uint8_t *scales, uint8_t *zps)
{
	uint64_t c0 = w4_word(q, k), s0 = w4_scale(q, k), z0 = w4_zpo(q, k);
	uint64_t last = k + n - 1;
	int rc = castfs_reader_read(src, codes,
				    (size_t)(w4_word(q, last) + 4 - c0),
				    q->src_off + c0);

	if (!rc)
		rc = castfs_reader_read(
			src, scales,
			(size_t)(w4_scale(q, last) + w4_ss(q) - s0),
			q->scale_off + s0);
	if (!rc && q->w4_zp)
		rc = castfs_reader_read(src, zps, (size_t)w4_zp_len(q, k, last),
					q->zp_off + z0);
	if (rc)
		return rc;
	for (uint64_t e = k; e <= last;) {
		/* one group of one row at a time: one scale, no division */
		uint64_t c = e % q->cols;
		uint64_t stop =
			CASTFS_MIN(last + 1 - e, q->bcols - c % q->bcols);

		w4_group(q, codes + w4_word(q, e) - c0, c % 8,
			 w4_scale_value(q, scales + w4_scale(q, e) - s0),
			 w4_zero(q, zps, z0, e), stop, f + (e - k));
		e += stop;
	}
	return 0;
}

uint64_t castfs_w4_src_off(const struct castfs_qtensor *q, uint64_t k)
{
	return q->src_off + w4_word(q, CASTFS_MIN(k, q->nelems - 1));
}

int castfs_w4_dequant(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, uint64_t k, size_t n,
		      float *f, uint8_t *work, size_t wlen)
{
	while (n) {
		uint64_t m = n, nc, ns;
		int rc;

		for (;;) { /* halve the round until its spans fit @work */
			nc = (w4_word(q, k + m - 1) + 4 - w4_word(q, k) + 7) /
			     8 * 8;
			ns = (w4_scale(q, k + m - 1) + w4_ss(q) -
			      w4_scale(q, k) + 7) /
			     8 * 8;
			if (nc + ns + w4_zp_len(q, k, k + m - 1) <= wlen)
				break;
			if (m == 1)
				return -ENOMEM;
			m /= 2;
		}
		rc = w4_round(src, q, k, m, f, work, work + nc, work + nc + ns);
		if (rc)
			return rc;
		f += m;
		k += m;
		n -= (size_t)m;
	}
	return 0;
}
