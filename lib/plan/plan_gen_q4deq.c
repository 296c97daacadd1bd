/* SPDX-License-Identifier: MIT */
/*
 * The bitsandbytes 4-bit dequantizer of a pre-quantized source, exactly
 * as bnb's dequantize_4bit computes it on CPU: element k is the high
 * nibble of code byte k / 2 when k is even, the low nibble when odd; its
 * value is the nf4/fp4 table entry (bnb's built-in table: the stored
 * quant_map is not read, as bnb's kernels do not read it) times the absmax
 * of its flat block k / blocksize in one fp32 multiply (FP4 code 8 is
 * -0.0 in bnb's C kernel, +0.0 in its Python fallback for an odd last
 * dimension: fp4_negzero says which), rounded to the
 * quant_state dtype. With double quantisation the absmax is first
 * nested_quant_map[code] x nested_absmax[block / nested_blocksize] plus
 * nested_offset, all in fp32 (dequantize_blockwise, then "absmax +=
 * offset"). Then the view's cast. A range reads only its code bytes and
 * the absmax of its blocks.
 */
#include <errno.h>
#include <string.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"
#include "quant/quant_round.h"

/* The fp32 absmax of blocks [@b0, @b0 + @nb) into @am; @raw (@nb bytes)
 * and @nabs (their nested groups' absmax) are room. */
static int q4d_absmax(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, uint64_t b0, uint64_t nb,
		      float *am, uint8_t *raw, float *nabs)
{
	uint64_t g0, ng;
	float map[256];
	int rc;

	if (!q->nested) {
		rc = castfs_reader_read(src, raw, (size_t)nb * 4,
					q->scale_off + b0 * 4);
		for (uint64_t i = 0; !rc && i < nb; i++)
			am[i] = castfs_f32_from_bits(
				castfs_load_le32(raw + 4 * i));
		return rc;
	}
	g0 = b0 / q->nested_block;
	ng = (b0 + nb - 1) / q->nested_block + 1 - g0;
	rc = castfs_reader_read(src, raw, (size_t)nb, q->scale_off + b0);
	if (!rc)
		rc = castfs_reader_read(src, nabs, (size_t)ng * 4,
					q->nabs_off + g0 * 4);
	if (!rc)
		rc = castfs_reader_read(src, map, sizeof(map), q->nmap_off);
	for (uint64_t i = 0; !rc && i < nb; i++) {
		float m = castfs_f32_from_bits(castfs_load_le32(&map[raw[i]]));
		uint64_t g = (b0 + i) / q->nested_block - g0;
		float a = castfs_f32_from_bits(castfs_load_le32(&nabs[g]));
		float v = m * a; /* dequantize_blockwise: fp32 product */

		am[i] = v + q->noffset; /* then "absmax += offset" */
	}
	return rc;
}

/* Elements [@g, @end) of one block (absmax @a); @codes holds the bytes
 * from byte @c0 of the tensor. @rt: BF16, F16 or F32 (the quant_state
 * dtype). */
static void q4d_block(const float *tab, const uint8_t *codes, uint64_t c0,
		      float a, enum castfs_dtype rt, uint64_t g, uint64_t end,
		      float *f)
{
	for (; g < end; g++, f++) {
		uint8_t byte = codes[g / 2 - c0];
		float v = tab[g & 1 ? byte & 15 : byte >> 4] * a;

		*f = castfs_qr_round(v, rt);
	}
}

/* One round: the fp32 values of elements [@k, @k + @n) into @f. */
static int q4d_round(const struct castfs_reader *src,
		     const struct castfs_qtensor *q, uint64_t k, uint64_t n,
		     float *f, uint8_t *codes, float *am, uint8_t *raw,
		     float *nabs)
{
	float tab[16];
	uint64_t b0 = k / q->blocksize,
		 nb = (k + n - 1) / q->blocksize + 1 - b0;
	uint64_t c0 = k / 2;
	int rc = castfs_reader_read(src, codes,
				    (size_t)((k + n - 1) / 2 + 1 - c0),
				    q->src_off + c0);

	if (!rc)
		rc = q4d_absmax(src, q, b0, nb, am, raw, nabs);
	if (rc)
		return rc;
	memcpy(tab, castfs_q4_table((enum castfs_qtype)q->qtype), sizeof(tab));
	if (q->fp4_negzero)
		tab[8] = -0.0f;
	for (uint64_t g = k, b = 0; g < k + n; b++) {
		/* one block at a time: one absmax, no division */
		uint64_t end = CASTFS_MIN(k + n, (b0 + b + 1) * q->blocksize);

		q4d_block(tab, codes, c0, am[b],
			  (enum castfs_dtype)q->out_round, g, end, f + (g - k));
		g = end;
	}
	return 0;
}

/* Bytes of each region a round of elements [@k, @k + @n) uses, each a
 * multiple of 8 (keeps the floats aligned): codes, absmax, raw, nabs. */
static void q4d_need(const struct castfs_qtensor *q, uint64_t k, uint64_t n,
		     uint64_t need[4])
{
	uint64_t nb = (k + n - 1) / q->blocksize + 1 - k / q->blocksize;
	uint64_t ng = q->nested ? nb / q->nested_block + 2 : 0;

	need[0] = ((k + n - 1) / 2 + 1 - k / 2 + 7) / 8 * 8;
	need[1] = (nb * 4 + 7) / 8 * 8;
	need[2] = (nb + 7) / 8 * 8;
	need[3] = (ng * 4 + 7) / 8 * 8;
}

int castfs_q4_dequant(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, uint64_t k, size_t n,
		      float *f, uint8_t *work, size_t wlen)
{
	while (n) {
		uint64_t m = n, need[4];
		int rc;

		for (;;) { /* halve the round until its regions fit @work */
			q4d_need(q, k, m, need);
			if (need[0] + need[1] + need[2] + need[3] <= wlen)
				break;
			if (m == 1)
				return -ENOMEM;
			m /= 2;
		}
		rc = q4d_round(
			src, q, k, m, f, work,
			(float *)(void *)(work + need[0]),
			work + need[0] + need[1],
			(float *)(void *)(work + need[0] + need[1] + need[2]));
		if (rc)
			return rc;
		f += m;
		k += m;
		n -= (size_t)m;
	}
	return 0;
}
