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
