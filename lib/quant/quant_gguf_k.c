/* SPDX-License-Identifier: MIT */
/*
 * ggml's reference quantisers for Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1
 * (ggml-quants.c quantize_row_*_ref with make_qx_quants, make_qkx2_quants,
 * nearest_int), statement for statement: the K-quants search for scales by
 * comparing float32 error sums, so a single rounding done differently
 * changes a code. Every expression keeps the reference's order of
 * evaluation; nothing here may be fused into an FMA (the reference in the
 * generic x86-64 build llama.cpp is checked against has none), hence the
 * pragma and no target attribute in this file.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "quant/quant.h"
#include "quant/quant_gguf.h"
#include "quant/quant_gguf_k.h"

/* ggml's MAX / MIN, NaN behaviour included. */
#define GMAX(a, b) ((a) > (b) ? (a) : (b))
#define GMIN(a, b) ((a) < (b) ? (a) : (b))

/* ggml's GROUP_MAX_EPS: a group whose largest |x| is below is all zero. */
#define GROUP_MAX_EPS 1e-15f

/* nearest_int: round half to even through the 1.5 * 2^23 magic number,
 * bit for bit (NaN and huge values give what the bits give). */
static int nearest_int(float fval)
{
	float val = fval + 12582912.f;
	int32_t i;

	memcpy(&i, &val, sizeof(i));
	return (i & 0x007fffff) - 0x00400000;
}

/* GGML_FP16_TO_FP32: exact. */
static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
	float f;

	if (exp == 0x1f) {
		u = sign | 0x7f800000u | (mant << 13);
	} else if (exp) {
		u = sign | ((exp + 112u) << 23) | (mant << 13);
	} else {
		/* zero or subnormal: mant * 2^-24, exact in float32 */
		f = (float)mant * 0x1p-24f;
		return sign ? -f : f;
	}
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* fp32 -> fp16 -> fp32, the value the block stores. */
static float stored_half(uint16_t *bits, float f)
{
	*bits = castfs_gguf_fp16(f);
	return half_to_float(*bits);
}

/* (T)(float) as x86 compiles it: cvttss2si, INT_MIN for NaN and out of
 * int32 range, then the low bits. */
static int32_t trunc_i32(float f)
{
	if (!(f > -2147483648.0f && f < 2147483648.0f))
		return INT32_MIN;
	return (int32_t)f;
}

/* ---- make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL) ---- */

/* One pass at @iscale: sums of w*x*l and w*l*l, w = x*x. */
static void qx_sums(int n, int nmax, const float *x, float iscale, float *sumlx,
		    float *suml2)
{
	*sumlx = 0;
	*suml2 = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * x[i]);
		float w = x[i] * x[i];

		l = GMAX(-nmax, GMIN(nmax - 1, l));
		*sumlx += w * x[i] * (float)l;
		*suml2 += w * (float)l * (float)l;
	}
}

static void qx_codes(int n, int nmax, const float *x, float iscale, int8_t *L)
{
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * x[i]);

		L[i] = (int8_t)(nmax + GMAX(-nmax, GMIN(nmax - 1, l)));
	}
}

static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0, iscale, sumlx, suml2, scale, best;

	for (int i = 0; i < n; ++i) {
		float ax = fabsf(x[i]);

		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	iscale = (float)-nmax / max;
	qx_codes(n, nmax, x, iscale, L);
	qx_sums(n, nmax, x, iscale, &sumlx, &suml2);
	scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
	best = scale * sumlx;
	for (int is = -9; is <= 9; ++is) {
		if (is == 0)
			continue;
		iscale = -((float)nmax + 0.1f * (float)is) / max;
		qx_sums(n, nmax, x, iscale, &sumlx, &suml2);
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			qx_codes(n, nmax, x, iscale, L);
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/* ---- make_qkx2_quants(n, nmax, x, weights, L, the_min, Laux, rmin,
 * rdelta, nstep, use_mad = false) ---- */

struct qkx2 {
	int nmax;
	float rmin, rdelta;
	int nstep;
};

static float qkx2_error(int n, const float *x, const float *w, const uint8_t *L,
			float scale, float min)
{
	float err = 0;

	for (int i = 0; i < n; ++i) {
		float diff = scale * (float)L[i] + min - x[i];

		diff = diff * diff;
		err += w[i] * diff;
	}
	return err;
}

static float make_qkx2_quants(int n, const struct qkx2 *p, const float *x,
			      const float *weights, uint8_t *L, float *the_min,
			      uint8_t *Laux)
{
	const int nmax = p->nmax;
	float min = x[0], max = x[0];
	float sum_w = weights[0];
	float sum_x = sum_w * x[0];
	float iscale, scale, best_error;

	for (int i = 1; i < n; ++i) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		sum_w += weights[i];
		sum_x += weights[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0.f;
	}
	iscale = (float)nmax / (max - min);
	scale = 1 / iscale;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * (x[i] - min));

		L[i] = (uint8_t)GMAX(0, GMIN(nmax, l));
	}
	best_error = qkx2_error(n, x, weights, L, scale, min);
	for (int is = 0; is <= p->nstep; ++is) {
		float sum_l = 0, sum_l2 = 0, sum_xl = 0, D;

		iscale = (p->rmin + p->rdelta * (float)is + (float)nmax) /
			 (max - min);
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * (x[i] - min));
			float w = weights[i], fl;

			l = GMAX(0, GMIN(nmax, l));
			Laux[i] = (uint8_t)l;
			fl = (float)l;
			sum_l += w * fl;
			sum_l2 += w * fl * fl;
			sum_xl += w * fl * x[i];
		}
		D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			float cur;

			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			cur = qkx2_error(n, x, weights, Laux, this_scale,
					 this_min);
			if (cur < best_error) {
				memcpy(L, Laux, (size_t)n);
				best_error = cur;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/* ---- Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins ---- */

/* get_scale_min_k4 */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
	}
}

/* The shared part of quantize_row_q4_K_ref and _q5_K_ref: codes @L (0..
 * @p->nmax) of 256 values and the 16-byte head (d, dmin, scales). */
static void kx_block(uint8_t *head, const float *x, const struct qkx2 *p,
		     uint8_t *L)
{
	uint8_t Laux[32], *sc12 = head + 4;
	float weights[32], mins[8], scales[8];
	float max_scale = 0, max_min = 0, inv_scale, inv_min, d, dmin;
	uint16_t bits;

	for (int j = 0; j < 8; ++j) {
		float sum_x2 = 0, av_x;

		for (int l = 0; l < 32; ++l)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; ++l)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = make_qkx2_quants(32, p, x + 32 * j, weights,
					     L + 32 * j, &mins[j], Laux);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	for (int j = 0; j < 8; ++j) {
		uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
		uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);

		ls = GMIN(63, ls);
		lm = GMIN(63, lm);
		if (j < 4) {
			sc12[j] = ls;
			sc12[j + 4] = lm;
		} else {
			sc12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
			sc12[j - 4] |= (uint8_t)((ls >> 4) << 6);
			sc12[j - 0] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	d = stored_half(&bits, max_scale / 63.f);
	castfs_store_le16(head, bits);
	dmin = stored_half(&bits, max_min / 63.f);
	castfs_store_le16(head + 2, bits);
	for (int j = 0; j < 8; ++j) {
		uint8_t sc, m;
		float dj, dm;

		scale_min_k4(j, sc12, &sc, &m);
		dj = d * (float)sc;
		if (dj == 0)
			continue;
		dm = dmin * (float)m;
		for (int ii = 0; ii < 32; ++ii) {
			int l = nearest_int((x[32 * j + ii] + dm) / dj);

			L[32 * j + ii] = (uint8_t)GMAX(0, GMIN(p->nmax, l));
		}
	}
}

static void q4_k_block(uint8_t *y, const float *x)
{
	static const struct qkx2 p = { 15, -1.f, 0.1f, 20 };
	uint8_t L[256], *q = y + 16;

	kx_block(y, x, &p, L);
	for (int j = 0; j < 256; j += 64) {
		for (int l = 0; l < 32; ++l)
			q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
		q += 32;
	}
}

static void q5_k_block(uint8_t *y, const float *x)
{
	static const struct qkx2 p = { 31, -0.5f, 0.1f, 15 };
	uint8_t L[256], *qh = y + 16, *ql = y + 48;
	uint8_t m1 = 1, m2 = 2;

	kx_block(y, x, &p, L);
	memset(qh, 0, 32);
	for (int n = 0; n < 256; n += 64) {
		for (int j = 0; j < 32; ++j) {
			int l1 = L[n + j], l2 = L[n + j + 32];

			if (l1 > 15) {
				l1 -= 16;
				qh[j] |= m1;
			}
			if (l2 > 15) {
				l2 -= 16;
				qh[j] |= m2;
			}
			ql[j] = (uint8_t)(l1 | (l2 << 4));
		}
		m1 = (uint8_t)(m1 << 2);
		m2 = (uint8_t)(m2 << 2);
		ql += 32;
	}
}

/* ---- Q6_K: 16 sub-blocks of 16, int8 scales ---- */

static void q6_k_pack(uint8_t *y, const int8_t *L)
{
	uint8_t *ql = y, *qh = y + 128;

	for (int j = 0; j < 256; j += 128) {
		for (int l = 0; l < 32; ++l) {
			uint8_t q1 = L[j + l + 0] & 0xF;
			uint8_t q2 = L[j + l + 32] & 0xF;
			uint8_t q3 = L[j + l + 64] & 0xF;
			uint8_t q4 = L[j + l + 96] & 0xF;

			ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
			ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
			qh[l] = (uint8_t)((L[j + l] >> 4) |
					  ((L[j + l + 32] >> 4) << 2) |
					  ((L[j + l + 64] >> 4) << 4) |
					  ((L[j + l + 96] >> 4) << 6));
		}
		ql += 64;
		qh += 32;
	}
}

static void q6_k_block(uint8_t *y, const float *x)
{
	int8_t L[256], *sc = (int8_t *)(void *)(y + 192);
	float scales[16], max_scale = 0, max_abs_scale = 0, iscale, d;
	uint16_t bits;

	for (int ib = 0; ib < 16; ++ib) {
		float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);

		scales[ib] = scale;
		if (fabsf(scale) > max_abs_scale) {
			max_abs_scale = fabsf(scale);
			max_scale = scale;
		}
	}
	if (max_abs_scale < GROUP_MAX_EPS) {
		memset(y, 0, CASTFS_GGUF_Q6_K_BYTES); /* d = fp16(0) = 0 */
		return;
	}
	iscale = -128.f / max_scale;
	d = stored_half(&bits, 1 / iscale);
	castfs_store_le16(y + 208, bits);
	for (int ib = 0; ib < 16; ++ib)
		sc[ib] = (int8_t)GMIN(127, nearest_int(iscale * scales[ib]));
	for (int j = 0; j < 16; ++j) {
		float dj = d * (float)sc[j];

		if (dj == 0)
			continue;
		for (int ii = 0; ii < 16; ++ii) {
			int l = nearest_int(x[16 * j + ii] / dj);

			L[16 * j + ii] = (int8_t)(GMAX(-32, GMIN(31, l)) + 32);
		}
	}
	q6_k_pack(y, L);
}

/* ---- Q5_0 / Q5_1 ---- */

static void q5_pack(uint8_t *qh4, uint8_t *qs, const uint8_t *xi)
{
	uint32_t qh = 0;

	for (int j = 0; j < 16; ++j) {
		uint8_t a = xi[j], b = xi[j + 16];

		qs[j] = (uint8_t)((a & 0x0F) | ((b & 0x0F) << 4));
		qh |= ((a & 0x10u) >> 4) << (j + 0);
		qh |= ((b & 0x10u) >> 4) << (j + 16);
	}
	castfs_store_le32(qh4, qh);
}

static void q5_0_block(uint8_t *y, const float *x)
{
	float amax = 0.0f, max = 0.0f, d, id;
	uint8_t xi[32];

	for (int j = 0; j < 32; j++) {
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	d = max / -16;
	id = d != 0 ? 1.0f / d : 0.0f;
	castfs_store_le16(y, castfs_gguf_fp16(d));
	for (int j = 0; j < 32; ++j) {
		int8_t v = (int8_t)trunc_i32(x[j] * id + 16.5f);

		xi[j] = (uint8_t)GMIN(31, v);
	}
	q5_pack(y + 2, y + 6, xi);
}

/* The block's least and greatest values, as the _1 reference types find
 * them (a NaN never replaces either). */
static void block_min_max(const float *x, float *min, float *max)
{
	*min = FLT_MAX;
	*max = -FLT_MAX;
	for (int j = 0; j < 32; j++) {
		if (x[j] < *min)
			*min = x[j];
		if (x[j] > *max)
			*max = x[j];
	}
}

static void q5_1_block(uint8_t *y, const float *x)
{
	float min, max, d, id;
	uint8_t xi[32];

	block_min_max(x, &min, &max);
	d = (max - min) / ((1 << 5) - 1);
	id = d != 0 ? 1.0f / d : 0.0f;
	castfs_store_le16(y, castfs_gguf_fp16(d));
	castfs_store_le16(y + 2, castfs_gguf_fp16(min));
	for (int j = 0; j < 32; ++j)
		xi[j] = (uint8_t)trunc_i32((x[j] - min) * id + 0.5f);
	q5_pack(y + 4, y + 8, xi);
}

/* ---- Q4_1 ---- */

static void q4_1_block(uint8_t *y, const float *x)
{
	float min, max, d, id;

	block_min_max(x, &min, &max);
	d = (max - min) / ((1 << 4) - 1);
	id = d != 0 ? 1.0f / d : 0.0f;
	castfs_store_le16(y, castfs_gguf_fp16(d));
	castfs_store_le16(y + 2, castfs_gguf_fp16(min));
	for (int j = 0; j < 16; ++j) {
		/* MIN(15, (int8_t)(v + 0.5f)) stored in a uint8_t, then the
		 * two ORed into one byte, as the reference does */
		int8_t a = (int8_t)trunc_i32((x[j] - min) * id + 0.5f);
		int8_t b = (int8_t)trunc_i32((x[j + 16] - min) * id + 0.5f);
		uint8_t lo = (uint8_t)GMIN(15, a), hi = (uint8_t)GMIN(15, b);

		y[4 + j] = (uint8_t)(lo | hi << 4);
	}
}

#define ROWS(fn, blk, per, bytes)                               \
	void fn(uint8_t *restrict dst, const float *restrict x, \
		size_t nblocks)                                 \
	{                                                       \
		for (size_t b = 0; b < nblocks; b++)            \
			blk(dst + b * (bytes), x + b * (per));  \
	}

ROWS(castfs_gguf_q4_k, q4_k_block, CASTFS_GGUF_QK_K, CASTFS_GGUF_Q4_K_BYTES)
ROWS(castfs_gguf_q5_k, q5_k_block, CASTFS_GGUF_QK_K, CASTFS_GGUF_Q5_K_BYTES)
ROWS(castfs_gguf_q6_k, q6_k_block, CASTFS_GGUF_QK_K, CASTFS_GGUF_Q6_K_BYTES)
ROWS(castfs_gguf_q5_0, q5_0_block, CASTFS_GGUF_QK, CASTFS_GGUF_Q5_0_BYTES)
ROWS(castfs_gguf_q5_1, q5_1_block, CASTFS_GGUF_QK, CASTFS_GGUF_Q5_1_BYTES)
ROWS(castfs_gguf_q4_1, q4_1_block, CASTFS_GGUF_QK, CASTFS_GGUF_Q4_1_BYTES)

int castfs_gguf_block_qtype(enum castfs_ggml_type t)
{
	switch (t) {
	case CASTFS_GGML_Q8_0:
		return CASTFS_Q_GGUF_Q8_0;
	case CASTFS_GGML_Q4_0:
		return CASTFS_Q_GGUF_Q4_0;
	case CASTFS_GGML_Q4_1:
		return CASTFS_Q_GGUF_Q4_1;
	case CASTFS_GGML_Q5_0:
		return CASTFS_Q_GGUF_Q5_0;
	case CASTFS_GGML_Q5_1:
		return CASTFS_Q_GGUF_Q5_1;
	case CASTFS_GGML_Q4_K:
		return CASTFS_Q_GGUF_Q4_K;
	case CASTFS_GGML_Q5_K:
		return CASTFS_Q_GGUF_Q5_K;
	case CASTFS_GGML_Q6_K:
		return CASTFS_Q_GGUF_Q6_K;
	case CASTFS_GGML_F32:
	case CASTFS_GGML_F16:
	case CASTFS_GGML_BF16:
		break;
	}
	return -1;
}

int castfs_gguf_quantize(unsigned qt, uint8_t *restrict dst,
			 const float *restrict x, size_t nblocks)
{
	switch (qt) {
	case CASTFS_Q_GGUF_Q8_0:
		castfs_gguf_kernels_get()->q8_0(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q4_0:
		castfs_gguf_kernels_get()->q4_0(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q5_0:
		castfs_gguf_q5_0(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q5_1:
		castfs_gguf_q5_1(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q4_1:
		castfs_gguf_q4_1(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q4_K:
		castfs_gguf_q4_k(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q5_K:
		castfs_gguf_q5_k(dst, x, nblocks);
		return 0;
	case CASTFS_Q_GGUF_Q6_K:
		castfs_gguf_q6_k(dst, x, nblocks);
		return 0;
	default:
		return -EINVAL;
	}
}

int castfs_gguf_quantize16(unsigned qt, uint8_t *restrict dst,
			   const void *restrict x, size_t nblocks, bool f16)
{
	const struct castfs_gguf_kernels *k = castfs_gguf_kernels_get();

	switch (qt) {
	case CASTFS_Q_GGUF_Q8_0:
		k->q8_0_16(dst, x, nblocks, f16);
		return 0;
	case CASTFS_Q_GGUF_Q4_0:
		k->q4_0_16(dst, x, nblocks, f16);
		return 0;
	default:
		return -ENOTSUP;
	}
}
