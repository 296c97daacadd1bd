/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors scaled-FP8 math, scalar. Roundings go through the cast
 * kernels, which are bit-exact with torch's tensor.to(dtype).
 */
#include <math.h>
#include <stdint.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant_ct.h"

/* Elements rounded per kernel call: the stack buffers' size. */
#define CT_CHUNK 256u

bool castfs_ct_dtype_ok(enum castfs_dtype dt)
{
	return dt == CASTFS_DTYPE_BF16 || dt == CASTFS_DTYPE_F16 ||
	       dt == CASTFS_DTYPE_F32;
}

float castfs_ct_absmax_merge(float a, float b)
{
	if (isnan(a) || isnan(b))
		return NAN;
	return a > b ? a : b;
}

float castfs_ct_absmax(const float *x, size_t n)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);

		if (isnan(a))
			return NAN;
		m = a > m ? a : m;
	}
	return m;
}

/* @x[0..@n) rounded to @dt (RNE) and widened back, in place. */
static void ct_round(float *x, size_t n, enum castfs_dtype dt)
{
	uint16_t tmp[CT_CHUNK];
	castfs_convert_fn down, up;

	if (dt == CASTFS_DTYPE_F32)
		return;
	down = castfs_convert_get(CASTFS_DTYPE_F32, dt, 0);
	up = castfs_convert_get(dt, CASTFS_DTYPE_F32, 0);
	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		down(tmp, x + i, m);
		up(x + i, tmp, m);
	}
	/* torch's bfloat16 rounding makes every NaN +0x7FC0. */
	for (size_t i = 0; dt == CASTFS_DTYPE_BF16 && i < n; i++)
		if (isnan(x[i]))
			x[i] = NAN;
}

/* torch.finfo(dt).eps: what compressed-tensors puts for a zero scale. */
static float ct_eps(enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_BF16)
		return 0x1p-7f;
	if (dt == CASTFS_DTYPE_F16)
		return 0x1p-10f;
	return 0x1p-23f;
}

float castfs_ct_f8_scale(float absmax, enum castfs_dtype dt)
{
	float s = absmax / CASTFS_CT_F8_MAX;

	ct_round(&s, 1, dt);
	return s == 0.0f ? ct_eps(dt) : s;
}

void castfs_ct_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt)
{
	castfs_convert_fn to_f8 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, 0);
	float q[CT_CHUNK];

	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		for (size_t j = 0; j < m; j++)
			q[j] = x[i + j] / scale;
		ct_round(q, m, dt);
		/*
		 * compressed-tensors adds the (zero) zero point to x / scale in
		 * the weight's dtype: -0.0 becomes +0.0, nothing else changes.
		 */
		for (size_t j = 0; j < m; j++)
			q[j] += 0.0f;
		/* torch.clamp keeps NaN: no fminf/fmaxf here. */
		for (size_t j = 0; j < m; j++) {
			if (q[j] > CASTFS_CT_F8_MAX)
				q[j] = CASTFS_CT_F8_MAX;
			else if (q[j] < -CASTFS_CT_F8_MAX)
				q[j] = -CASTFS_CT_F8_MAX;
		}
		to_f8(dst + i, q, m);
	}
}

float castfs_ct_i4_scale(float absmax, enum castfs_dtype dt)
{
	float s = absmax / CASTFS_CT_I4_HALF_RANGE;

	ct_round(&s, 1, dt);
	return s == 0.0f ? ct_eps(dt) : s;
}

void castfs_ct_i4_codes(int8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt)
{
	float q[CT_CHUNK];

	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		for (size_t j = 0; j < m; j++)
			q[j] = x[i + j] / scale;
		ct_round(q, m, dt);
		for (size_t j = 0; j < m; j++) {
			float v = q[j];

			if (isnan(v))
				v = 0.0f;
			v = v > 7.0f ? 7.0f : v < -8.0f ? -8.0f : v;
			/* rintf: round half to even in the default mode. */
			dst[i + j] = (int8_t)rintf(v);
		}
	}
}

float castfs_ct_nvfp4_gscale(float absmax, enum castfs_dtype dt)
{
	/*
	 * generate_gparam's 2688 / absmax is torch's __rtruediv__: the
	 * reciprocal in @dt, then a product in @dt. absmax is clamped to
	 * finfo(dt).tiny first; for 0 (or below) the product overflows.
	 */
	float g = 1.0f / absmax;

	if (absmax < 0x1p-14f && dt == CASTFS_DTYPE_F16)
		return 1.0f; /* 2688 / f16 tiny overflows f16 */
	ct_round(&g, 1, dt);
	g *= CASTFS_CT_F8_MAX * CASTFS_CT_FP4_MAX;
	ct_round(&g, 1, dt);
	return isfinite(g) ? g : 1.0f;
}

float castfs_ct_nvfp4_scale(float absmax, float gs, enum castfs_dtype dt)
{
	castfs_convert_fn to_f8 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, 0);
	castfs_convert_fn from_f8 =
		castfs_convert_get(CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F32, 0);
	float s = absmax / CASTFS_CT_FP4_MAX;
	uint8_t code;

	ct_round(&s, 1, dt);
	s = gs * s;
	if (s > CASTFS_CT_F8_MAX) /* torch.clamp keeps NaN */
		s = CASTFS_CT_F8_MAX;
	else if (s < -CASTFS_CT_F8_MAX)
		s = -CASTFS_CT_F8_MAX;
	to_f8(&code, &s, 1);
	from_f8(&s, &code, 1);
	return s == 0.0f ? 0.125f : s;
}

/* The E2M1 magnitude code of |q| <= 6 (fp4_utils.py cast_to_fp4). */
static uint8_t fp4_mag(float a)
{
	if (a <= 0.25f)
		return 0;
	if (a < 0.75f)
		return 1;
	if (a <= 1.25f)
		return 2;
	if (a < 1.75f)
		return 3;
	if (a <= 2.5f)
		return 4;
	if (a < 3.5f)
		return 5;
	if (a <= 5.0f)
		return 6;
	return 7;
}

/* One E2M1 code: sign(q) * magnitude, with torch.signbit of the product. */
static uint8_t fp4_code(float q)
{
	if (isnan(q))
		return 0; /* (NaN * 2).to(int8) is 0 on x86 */
	q += 0.0f; /* the zero point: -0.0 becomes +0.0 */
	if (q > CASTFS_CT_FP4_MAX)
		q = CASTFS_CT_FP4_MAX;
	else if (q < -CASTFS_CT_FP4_MAX)
		q = -CASTFS_CT_FP4_MAX;
	/* torch.sign(+0.0) is 0: 0 * 0 is +0.0; any q < 0 keeps bit 3. */
	return (uint8_t)(fp4_mag(fabsf(q)) | (q < 0.0f ? 8u : 0u));
}

void castfs_ct_fp4_pack(uint8_t *dst, const float *x, size_t n, float scale,
			float gs)
{
	float eff = scale / gs;

	for (size_t i = 0; i + 1 < n; i += 2)
		dst[i / 2] = (uint8_t)(fp4_code(x[i] / eff) |
				       fp4_code(x[i + 1] / eff) << 4);
}

float castfs_comfy_f8_scale(float absmax, enum castfs_dtype dt)
{
	float s = absmax / CASTFS_CT_F8_MAX;

	if (dt == CASTFS_DTYPE_F16) {
		float inv = 1.0f / s;

		inv = inv > 65504.0f  ? 65504.0f :
		      inv < -65504.0f ? -65504.0f :
					inv;
		s = 1.0f / inv;
	}
	return s == 0.0f ? 1.0f : s;
}

void castfs_comfy_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			   enum castfs_dtype dt)
{
	castfs_convert_fn to_f8 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, 0);
	float inv = 1.0f / scale, q[CT_CHUNK];

	ct_round(&inv, 1, dt);
	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		for (size_t j = 0; j < m; j++)
			q[j] = x[i + j] * inv;
		ct_round(q, m, dt);
		for (size_t j = 0; j < m; j++) { /* NaN stays NaN */
			if (q[j] > CASTFS_CT_F8_MAX)
				q[j] = CASTFS_CT_F8_MAX;
			else if (q[j] < -CASTFS_CT_F8_MAX)
				q[j] = -CASTFS_CT_F8_MAX;
		}
		to_f8(dst + i, q, m);
	}
}

void castfs_ct_store(uint8_t *dst, float v, enum castfs_dtype dt)
{
	uint16_t h;

	if (dt == CASTFS_DTYPE_F32) {
		castfs_store_le32(dst, castfs_f32_bits(v));
		return;
	}
	castfs_convert_get(CASTFS_DTYPE_F32, dt, 0)(&h, &v, 1);
	castfs_store_le16(dst, h);
}
