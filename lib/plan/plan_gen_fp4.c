/* SPDX-License-Identifier: MIT */
/*
 * The compressed-tensors FP4 dequantizer, as its decompressor computes it
 * on CPU (NVFP4PackedCompressor / MXFP4PackedCompressor.decompress): the
 * low nibble of code byte b is element 2b, the high nibble element 2b + 1
 * (unpack_fp4_from_uint8); each E2M1 value times its group's scale in one
 * fp32 multiply, rounded to bf16, the dtype it decompresses to.
 *   NVFP4: scale = fl32(f32(weight_scale) / weight_global_scale), the
 *	bf16 scale divided by an F32 [1] tensor (torch promotes to fp32).
 *   MXFP4: scale = 2^(byte - 127) in bf16 (decompress_mx_scale); 0xFF is
 *	2^128, infinite in bf16.
 * The global scale is read with the codes, at read time: it is a value.
 */
#include <errno.h>
#include <math.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"

/* E2M1 by nibble: unpack_fp4_from_uint8's kE2M1ToFloat, sign bit 3. */
static const float fp4_lut[16] = {
	+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
	-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/*
 * @f rounded to bf16, to nearest even (torch's .to(bfloat16)). A NaN (a
 * NaN scale byte, or a zero code times an infinite MXFP4 scale) becomes
 * 0xFFFF, what torch's vectorised CPU rounding to bf16 writes for every
 * NaN, and so what the decompressor's tensors hold.
 */
static float fp4_bf16(float f)
{
	uint32_t u = castfs_f32_bits(f);

	if ((u & 0x7FFFFFFFu) > 0x7F800000u)
		return castfs_f32_from_bits(0xFFFF0000u);
	u += 0x7FFFu + ((u >> 16) & 1u);
	return castfs_f32_from_bits(u & 0xFFFF0000u);
}

/* The scale of group byte @b: NVFP4 divides by @gs, MXFP4 is 2^(b-127). */
static float fp4_scale(const struct castfs_qtensor *q, uint8_t b, float gs)
{
	float s;

	if (q->scale_dtype != CASTFS_DTYPE_F8_E4M3) {
		if (b == 0xFF)
			return INFINITY;
		if (b == 0)
			return castfs_f32_from_bits(0x00400000u); /* 2^-127 */
		return castfs_f32_from_bits((uint32_t)b << 23);
	}
	castfs_convert_get(CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F32, 0)(&s, &b,
								      1);
	return s / gs; /* one fp32 division, as torch's */
}

/* The values of elements [@k, @k + @n): codes from byte @k / 2 on in
 * @codes, scales from group @k / bcols on in @sc. */
static void fp4_fill(const struct castfs_qtensor *q, uint64_t k, size_t n,
		     const uint8_t *codes, const uint8_t *sc, float gs,
		     float *f)
{
	uint64_t g = q->bcols, b0 = k / 2, g0 = k / g;
	float s = fp4_scale(q, sc[0], gs);

	for (size_t i = 0; i < n; i++) {
		uint64_t e = k + i;
		uint8_t byte = codes[e / 2 - b0];

		if (i && e % g == 0)
			s = fp4_scale(q, sc[e / g - g0], gs);
		/* One fp32 multiply, then bf16: the product can round in
		 * fp32 first (NVFP4), as torch's does. */
		f[i] = fp4_bf16(fp4_lut[e & 1 ? byte >> 4 : byte & 15] * s);
	}
}

/* The F32 global scale of an NVFP4 @q (1 for MXFP4, which has none). */
static int fp4_gscale(const struct castfs_reader *src,
		      const struct castfs_qtensor *q, float *gs)
{
	uint8_t raw[4];
	int rc;

	*gs = 1.0f;
	if (q->scale_dtype != CASTFS_DTYPE_F8_E4M3)
		return 0;
	rc = castfs_reader_read(src, raw, sizeof(raw), q->gscale_off);
	if (!rc)
		*gs = castfs_f32_from_bits(castfs_load_le32(raw));
	return rc;
}

int castfs_fp4_dequant(const struct castfs_reader *src,
		       const struct castfs_qtensor *q, uint64_t k, size_t n,
		       float *f, uint8_t *codes, uint8_t *sbuf, size_t slen)
{
	/* Groups never straddle rows (cols % bcols == 0, checked when
	 * paired), so group index = element / bcols. */
	size_t per = (slen - 2) * q->bcols;
	float gs;
	int rc = fp4_gscale(src, q, &gs);

	while (!rc && n) {
		size_t m = CASTFS_MIN(n, per);
		uint64_t last = k + m - 1;

		rc = castfs_reader_read(src, codes,
					(size_t)(last / 2 - k / 2 + 1),
					q->src_off + k / 2);
		if (!rc)
			rc = castfs_reader_read(
				src, sbuf,
				(size_t)(last / q->bcols - k / q->bcols + 1),
				q->scale_off + k / q->bcols);
		if (rc)
			break;
		fp4_fill(q, k, m, codes, sbuf, gs, f);
		f += m;
		k += m;
		n -= m;
	}
	return rc;
}
