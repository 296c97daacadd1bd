/* SPDX-License-Identifier: MIT */
/*
 * The scalar reference of the quantiser rules: every SIMD kernel must give
 * the same bytes. The rules follow bitsandbytes' default (CPU) backend; NaN
 * and Inf, which bnb lets propagate, get the policy of docs/FORMATS.md.
 */
#include <math.h>

#include "quant/quant_internal.h"

/* bnb clamps absmax to this before taking the reciprocal. */
#define Q_TINY 1e-38f

float castfs_q_absmax(const float *x, size_t n)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);

		/* False for NaN; the second test drops +-Inf. */
		if (a > m && a <= FLT_MAX)
			m = a;
	}
	return m;
}

float castfs_q_scale(float absmax)
{
	return 1.0f / (absmax > Q_TINY ? absmax : Q_TINY);
}

/*
 * The position of @s among the 16 sorted values: the number of the 15
 * ascending midpoints it exceeds, found by a branch-free binary search.
 */
static inline unsigned q4_position(float s, const float *mid)
{
	unsigned p = 0;

	p += (unsigned)(s > mid[p + 7]) << 3;
	p += (unsigned)(s > mid[p + 3]) << 2;
	p += (unsigned)(s > mid[p + 1]) << 1;
	p += (unsigned)(s > mid[p]);
	return p;
}

static inline unsigned q4_code(float x, float scale, const float *mid,
			       const uint8_t *order)
{
	float s = x * scale;

	/* NaN counts as 0.0 (s != s only for NaN: scale is finite). */
	s = s == s ? s : 0.0f;
	return order[q4_position(s, mid)];
}

uint8_t castfs_q4_code(float x, float scale, enum castfs_qtype qt)
{
	return (uint8_t)q4_code(x, scale, castfs_q4_mids[qt].f,
				castfs_q4_order[qt]);
}

void castfs_q4_encode_block(uint8_t *dst, const float *x, size_t m, float scale,
			    enum castfs_qtype qt)
{
	const float *mid = castfs_q4_mids[qt].f;
	const uint8_t *order = castfs_q4_order[qt];
	size_t i;

	for (i = 0; i + 1 < m; i += 2)
		dst[i / 2] = (uint8_t)(q4_code(x[i], scale, mid, order) << 4 |
				       q4_code(x[i + 1], scale, mid, order));
	/* An odd count: bnb pads the scaled values with a zero. */
	if (i < m)
		dst[i / 2] = (uint8_t)(q4_code(x[i], scale, mid, order) << 4 |
				       q4_code(0.0f, scale, mid, order));
}

/* The midpoint of dynamic-map entries @k and @k + 1, as bnb's bounds. */
static inline float q8_mid(const float *c, unsigned k)
{
	return (c[k] + c[k + 1]) * 0.5f;
}

uint8_t castfs_q8_code(float v, float scale)
{
	const float *c = castfs_q_dynmap();
	float s = isnan(v) ? 0.0f : v * scale;
	unsigned lo = 0, hi = 255;

	/* The number of the 255 ascending midpoints that s exceeds. */
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (s > q8_mid(c, mid))
			lo = mid + 1;
		else
			hi = mid;
	}
	return (uint8_t)lo;
}

/* torch evaluates bnb's 127.0 / row_stats as reciprocal(row_stats) * 127. */
float castfs_i8_scale(float absmax)
{
	return absmax > 0.0f ? (1.0f / absmax) * 127.0f : 0.0f;
}

int8_t castfs_i8_code(float x, float scale)
{
	float r;

	if (isnan(x))
		return 0;
	if (isinf(x))
		return x > 0.0f ? 127 : -127;
	/* rintf: round half to even in the default rounding mode. */
	r = rintf(x * scale);
	if (r > 127.0f)
		r = 127.0f;
	if (r < -127.0f)
		r = -127.0f;
	return (int8_t)r;
}

void castfs_absmax_scalar(float *restrict amax, const float *restrict x,
			  size_t n, size_t bs)
{
	for (size_t b = 0; b < n; b += bs)
		*amax++ = castfs_q_absmax(x + b, n - b < bs ? n - b : bs);
}

static void q4_scalar(uint8_t *restrict dst, const float *restrict x, size_t n,
		      size_t bs, enum castfs_qtype qt)
{
	for (size_t b = 0; b < n; b += bs) {
		size_t m = n - b < bs ? n - b : bs;
		float scale = castfs_q_scale(castfs_q_absmax(x + b, m));

		castfs_q4_encode_block(dst + b / 2, x + b, m, scale, qt);
	}
}

void castfs_i8_scalar(int8_t *restrict dst, const float *restrict x, size_t n,
		      float scale)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = castfs_i8_code(x[i], scale);
}

/* Elements staged as float32 at a time by the 16-bit references. */
#define WIDEN_CHUNK 256

/* @n (<= WIDEN_CHUNK) 16-bit floats at @x widened exactly into @f. */
static void widen16(float *f, const uint8_t *x, size_t n, bool f16)
{
	castfs_convert_fn cvt = castfs_convert_get_isa(
		CASTFS_ISA_SCALAR, f16 ? CASTFS_DTYPE_F16 : CASTFS_DTYPE_BF16,
		CASTFS_DTYPE_F32, 0);

	cvt(f, x, n);
}

/* castfs_q_absmax of @m 16-bit floats, a chunk at a time. */
static float absmax16_block(const uint8_t *x, size_t m, bool f16)
{
	float f[WIDEN_CHUNK], a = 0.0f;

	for (size_t i = 0; i < m; i += WIDEN_CHUNK) {
		size_t k = m - i < WIDEN_CHUNK ? m - i : WIDEN_CHUNK;

		widen16(f, x + 2 * i, k, f16);
		a = fmaxf(a, castfs_q_absmax(f, k)); /* both are >= +0.0 */
	}
	return a;
}

void castfs_absmax16_scalar(float *restrict amax, const void *restrict x,
			    size_t n, size_t bs, bool f16)
{
	const uint8_t *p = x;

	for (size_t b = 0; b < n; b += bs)
		*amax++ =
			absmax16_block(p + 2 * b, n - b < bs ? n - b : bs, f16);
}

void castfs_q4_16_scalar(uint8_t *restrict dst, float *restrict amax,
			 const void *restrict x, size_t n, size_t bs,
			 enum castfs_qtype qt, bool f16)
{
	const uint8_t *p = x;
	float f[WIDEN_CHUNK];

	for (size_t b = 0; b < n; b += bs) {
		size_t m = n - b < bs ? n - b : bs;
		float a = absmax16_block(p + 2 * b, m, f16);
		float scale = castfs_q_scale(a);

		if (amax)
			*amax++ = a;

		/* Chunks are even, so only a block's last one can be odd. */
		for (size_t i = 0; i < m; i += WIDEN_CHUNK) {
			size_t k = m - i < WIDEN_CHUNK ? m - i : WIDEN_CHUNK;

			widen16(f, p + 2 * (b + i), k, f16);
			castfs_q4_encode_block(dst + (b + i) / 2, f, k, scale,
					       qt);
		}
	}
}

void castfs_q8_scalar(uint8_t *restrict dst, const float *restrict amax,
		      size_t n, float offset, float scale)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = castfs_q8_code(amax[i] - offset, scale);
}

const struct castfs_quant_kernels castfs_quant_scalar = {
	.absmax = castfs_absmax_scalar,
	.q4 = q4_scalar,
	.i8 = castfs_i8_scalar,
	.absmax16 = castfs_absmax16_scalar,
	.q4_16 = castfs_q4_16_scalar,
	.q8 = castfs_q8_scalar,
};
