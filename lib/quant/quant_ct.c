/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors scaled-FP8 math: the scalar reference, and the choice
 * of its per-ISA loops (quant_ct_avx2.c, quant_ct_avx512.c). Roundings are
 * the cast kernels' algorithms inlined (quant/quant_round.h), bit-exact with
 * torch's tensor.to(dtype); the scalar E4M3 narrowing of a chunk of codes
 * stays with the SIMD cast kernel.
 */
#include <math.h>
#include <stdint.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "quant/quant_ct.h"
#include "quant/quant_ct_internal.h"
#include "quant/quant_round.h"

/* Elements per E4M3 kernel call: the stack buffer's size. */
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

static float ct_absmax_scalar(const float *x, size_t n)
{
	int32_t lane[8] = { 0 }, m = 0;
	size_t i = 0;

	/*
	 * On the bits: |x| as a (non-negative) integer orders like the float
	 * for every non-NaN value, and every NaN is above +Inf (0x7F800000).
	 * An integer max has no NaN rule to keep; eight lanes of fixed count
	 * let the compiler vectorise it.
	 */
	for (; i + 8 <= n; i += 8)
		for (size_t k = 0; k < 8; k++) {
			int32_t a = (int32_t)(castfs_f32_bits(x[i + k]) &
					      0x7fffffffu);

			lane[k] = a > lane[k] ? a : lane[k];
		}
	for (; i < n; i++) {
		int32_t a = (int32_t)(castfs_f32_bits(x[i]) & 0x7fffffffu);

		m = a > m ? a : m;
	}
	for (size_t k = 0; k < 8; k++)
		m = lane[k] > m ? lane[k] : m;
	return m > 0x7f800000 ? NAN : castfs_f32_from_bits((uint32_t)m);
}

/* The same max over the 16-bit magnitudes; eight lanes, as above. */
static float ct_absmax16_scalar(const void *x, size_t n, bool f16)
{
	const uint8_t *p = x;
	uint32_t lane[8] = { 0 }, m = 0;
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		for (size_t k = 0; k < 8; k++) {
			uint32_t a = castfs_load_le16(p + 2 * (i + k)) &
				     0x7fffu;

			lane[k] = a > lane[k] ? a : lane[k];
		}
	for (; i < n; i++) {
		uint32_t a = castfs_load_le16(p + 2 * i) & 0x7fffu;

		m = a > m ? a : m;
	}
	for (size_t k = 0; k < 8; k++)
		m = lane[k] > m ? lane[k] : m;
	return castfs_ct_from16(m, f16);
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
	float s = castfs_qr_round(absmax / CASTFS_CT_F8_MAX, dt);

	return s == 0.0f ? ct_eps(dt) : s;
}

/* torch.clamp to the E4M3 range: NaN stays NaN (no fminf/fmaxf). */
static inline float ct_clamp_f8(float q)
{
	return q > CASTFS_CT_F8_MAX  ? CASTFS_CT_F8_MAX :
	       q < -CASTFS_CT_F8_MAX ? -CASTFS_CT_F8_MAX :
				       q;
}

/*
 * One value of castfs_ct_f8_codes() before its E4M3 rounding:
 * compressed-tensors adds the (zero)
 * zero point to x / scale in the weight's dtype, so -0.0 becomes +0.0 and
 * nothing else changes. Inlined with a constant @dt in each loop below.
 */
static inline float ct_f8_q(float x, float scale, enum castfs_dtype dt)
{
	return ct_clamp_f8(castfs_qr_round(x / scale, dt) + 0.0f);
}

/*
 * The codes in chunks: the rounding to @dt, zero point and clamp inline per
 * element, then the E4M3 narrowing of the chunk by the SIMD cast kernel
 * (non-saturating; nothing left is out of range but NaN).
 */
static void ct_f8_codes_scalar(uint8_t *dst, const float *x, size_t n,
			       float scale, enum castfs_dtype dt)
{
	castfs_convert_fn to_f8 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, 0);
	float q[CT_CHUNK];

	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		/* One loop per dtype: the rounding's branch leaves the loop. */
		if (dt == CASTFS_DTYPE_BF16)
			for (size_t j = 0; j < m; j++)
				q[j] = ct_f8_q(x[i + j], scale,
					       CASTFS_DTYPE_BF16);
		else if (dt == CASTFS_DTYPE_F16)
			for (size_t j = 0; j < m; j++)
				q[j] = ct_f8_q(x[i + j], scale,
					       CASTFS_DTYPE_F16);
		else
			for (size_t j = 0; j < m; j++)
				q[j] = ct_f8_q(x[i + j], scale,
					       CASTFS_DTYPE_F32);
		to_f8(dst + i, q, m);
	}
}

float castfs_ct_i4_scale(float absmax, enum castfs_dtype dt)
{
	float s = castfs_qr_round(absmax / CASTFS_CT_I4_HALF_RANGE, dt);

	return s == 0.0f ? ct_eps(dt) : s;
}

/* One int4 value of castfs_ct_i4_codes(). */
static inline int8_t ct_i4_code(float x, float scale, enum castfs_dtype dt)
{
	float v = castfs_qr_round(x / scale, dt);

	if (isnan(v))
		v = 0.0f;
	v = v > 7.0f ? 7.0f : v < -8.0f ? -8.0f : v;
	/* rintf: round half to even in the default mode. */
	return (int8_t)rintf(v);
}

void castfs_ct_i4_codes(int8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_BF16)
		for (size_t i = 0; i < n; i++)
			dst[i] = ct_i4_code(x[i], scale, CASTFS_DTYPE_BF16);
	else if (dt == CASTFS_DTYPE_F16)
		for (size_t i = 0; i < n; i++)
			dst[i] = ct_i4_code(x[i], scale, CASTFS_DTYPE_F16);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = ct_i4_code(x[i], scale, CASTFS_DTYPE_F32);
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
	g = castfs_qr_round(g, dt);
	g = castfs_qr_round(g * (CASTFS_CT_F8_MAX * CASTFS_CT_FP4_MAX), dt);
	return isfinite(g) ? g : 1.0f;
}

float castfs_ct_nvfp4_scale(float absmax, float gs, enum castfs_dtype dt)
{
	float s = gs * castfs_qr_round(absmax / CASTFS_CT_FP4_MAX, dt);

	/* torch.clamp keeps NaN; the E4M3 code's value is the scale. */
	s = castfs_qr_e4m3_value(castfs_qr_e4m3(ct_clamp_f8(s)));
	return s == 0.0f ? 0.125f : s;
}

/*
 * The E2M1 magnitude code of |q| <= 6 (fp4_utils.py cast_to_fp4): its
 * thresholds (<= at the ties that round down to an even code, < at those
 * that round up) rise with the code, so the code is the number passed.
 * Counted without branches: the codes of random weights mispredict.
 */
static inline uint8_t fp4_mag(float a)
{
	return (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) +
			 (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
}

/*
 * One E2M1 code: sign(q) * magnitude, with torch.signbit of the product,
 * without branches. The steps of compressed-tensors drop out: a NaN fails
 * every threshold and q < 0, so it gives code 0 (as (NaN * 2).to(int8) is
 * 0 on x86); the zero point's -0.0 -> +0.0 changes nothing, since -0.0 is
 * not < 0 (torch.sign(-0.0) is 0 too); the clamp to [-6, 6] keeps the
 * sign, and any |q| > 5 already has magnitude 7.
 */
static inline uint8_t fp4_code(float q)
{
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

/*
 * One value of castfs_comfy_f8_codes() before its E4M3 rounding (NaN
 * stays NaN). A NaN @inv (a weight holding a NaN) gives its own NaN even
 * where @x is a NaN too: IEEE 754 leaves open which of two NaNs a product
 * returns and a compiler may swap x * inv's operands; torch's product
 * (F32, F16 on x86) returns the scale's.
 */
static inline float comfy_f8_q(float x, float inv, enum castfs_dtype dt)
{
	return ct_clamp_f8(castfs_qr_round(isnan(inv) ? inv : x * inv, dt));
}

static void comfy_codes_scalar(uint8_t *dst, const float *x, size_t n,
			       float inv, enum castfs_dtype dt)
{
	castfs_convert_fn to_f8 =
		castfs_convert_get(CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, 0);
	float q[CT_CHUNK];

	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		if (dt == CASTFS_DTYPE_BF16)
			for (size_t j = 0; j < m; j++)
				q[j] = comfy_f8_q(x[i + j], inv,
						  CASTFS_DTYPE_BF16);
		else if (dt == CASTFS_DTYPE_F16)
			for (size_t j = 0; j < m; j++)
				q[j] = comfy_f8_q(x[i + j], inv,
						  CASTFS_DTYPE_F16);
		else
			for (size_t j = 0; j < m; j++)
				q[j] = comfy_f8_q(x[i + j], inv,
						  CASTFS_DTYPE_F32);
		to_f8(dst + i, q, m);
	}
}

/*
 * castfs_ct_f8_codes16() by its definition: each chunk widened exactly
 * into a buffer (BF16 by a shift, F16 by its value), then the float32
 * loop above. The reference the SIMD loops are held to.
 */
static void ct_f8_codes16_scalar(uint8_t *dst, const void *x, size_t n,
				 float scale, enum castfs_dtype dt)
{
	const uint8_t *p = x;
	float f[CT_CHUNK];

	for (size_t i = 0; i < n; i += CT_CHUNK) {
		size_t m = n - i < CT_CHUNK ? n - i : CT_CHUNK;

		for (size_t j = 0; j < m; j++) {
			uint16_t v = castfs_load_le16(p + 2 * (i + j));

			f[j] = dt == CASTFS_DTYPE_F16 ?
				       castfs_qr_f16_value(v) :
				       castfs_f32_from_bits((uint32_t)v << 16);
		}
		ct_f8_codes_scalar(dst + i, f, m, scale, dt);
	}
}

static const struct castfs_ct_kernels ct_scalar = {
	.f8_codes = ct_f8_codes_scalar,
	.f8_codes16 = ct_f8_codes16_scalar,
	.comfy_codes = comfy_codes_scalar,
	.absmax = ct_absmax_scalar,
	.absmax16 = ct_absmax16_scalar,
};

/* NULL: not built for this architecture. */
static const struct castfs_ct_kernels *const ct_tables[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = &ct_scalar,
#if CASTFS_HAVE_X86_QUANT
	[CASTFS_ISA_AVX2] = &castfs_ct_avx2,
	[CASTFS_ISA_AVX512] = &castfs_ct_avx512,
#endif
};

const struct castfs_ct_kernels *castfs_ct_kernels_isa(enum castfs_isa isa)
{
	if (!castfs_isa_available(isa))
		return NULL;
	return ct_tables[isa];
}

const struct castfs_ct_kernels *castfs_ct_kernels_avx512bf16(void)
{
#if CASTFS_HAVE_X86_QUANT
	if (castfs_cpu_has_avx512_bf16())
		return &castfs_ct_avx512bf16;
#endif
	return NULL;
}

/* The loops of the ISA castfs_isa_selected() chose once (its AVX512_BF16
 * variant where the CPU has one). */
static const struct castfs_ct_kernels *ct_kernels(void)
{
	enum castfs_isa isa = castfs_isa_selected();
	const struct castfs_ct_kernels *k = castfs_ct_kernels_isa(isa);

	if (isa == CASTFS_ISA_AVX512 && castfs_ct_kernels_avx512bf16())
		return castfs_ct_kernels_avx512bf16();
	return k ? k : &ct_scalar;
}

float castfs_ct_absmax(const float *x, size_t n)
{
	return ct_kernels()->absmax(x, n);
}

float castfs_ct_absmax16(const void *x, size_t n, bool f16)
{
	return ct_kernels()->absmax16(x, n, f16);
}

void castfs_ct_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt)
{
	ct_kernels()->f8_codes(dst, x, n, scale, dt);
}

void castfs_ct_f8_codes16(uint8_t *dst, const void *x, size_t n, float scale,
			  enum castfs_dtype dt)
{
	ct_kernels()->f8_codes16(dst, x, n, scale, dt);
}

void castfs_comfy_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			   enum castfs_dtype dt)
{
	ct_kernels()->comfy_codes(dst, x, n, castfs_qr_round(1.0f / scale, dt),
				  dt);
}

void castfs_ct_store(uint8_t *dst, float v, enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_F32)
		castfs_store_le32(dst, castfs_f32_bits(v));
	else
		castfs_store_le16(dst, dt == CASTFS_DTYPE_BF16 ?
					       castfs_qr_bf16_bits(v) :
					       castfs_qr_f16_bits(v));
}
