/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors scaled-FP8 quantiser math (llm-compressor's FP8_DYNAMIC
 * and FP8_BLOCK presets): the weight scale of a channel or block and the
 * F8_E4M3 codes, evaluated in the order and the dtypes torch does
 * (docs/FORMATS.md, "compressed-tensors views"). Pure functions.
 */
#ifndef CASTFS_QUANT_CT_H
#define CASTFS_QUANT_CT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/dtype.h"
#include "kernels/convert.h"

/* The largest finite F8_E4M3 value: the range a scale maps absmax onto. */
#define CASTFS_CT_F8_MAX 448.0f

/*
 * castfs_ct_dtype_ok - true for the weight dtypes the scales are computed
 * in (BF16, F16, F32): llm-compressor keeps the scale in the weight's dtype.
 * Pure function.
 */
bool castfs_ct_dtype_ok(enum castfs_dtype dt);

/*
 * castfs_ct_absmax - max |x| over @x[0..@n) as torch's amin/amax give it:
 * NaN when any element is NaN (+Inf counts as a value). 0.0 for @n == 0.
 */
float castfs_ct_absmax(const float *x, size_t n);

/*
 * castfs_ct_absmax16 - castfs_ct_absmax() of @n little-endian BF16 (F16
 * when @f16) values at @x (any alignment), read as they are: the same
 * value as castfs_ct_absmax() of their float32 widening, which is exact
 * and orders the magnitudes as their bits do. Thread-safe.
 */
float castfs_ct_absmax16(const void *x, size_t n, bool f16);

/* castfs_ct_absmax_merge - the absmax of two parts (NaN-propagating). */
float castfs_ct_absmax_merge(float a, float b);

/*
 * castfs_ct_f8_scale - the scale of a channel or block whose absmax is
 * @absmax, for weights of dtype @dt: rnd_dt(fl32(@absmax / 448)), and
 * torch.finfo(@dt).eps where that is 0 (compressed-tensors
 * calculate_qparams). The value is exactly representable in @dt.
 */
float castfs_ct_f8_scale(float absmax, enum castfs_dtype dt);

/*
 * castfs_ct_f8_codes - F8_E4M3 codes of @x[0..@n) with @scale for weights
 * of dtype @dt: e4m3(clamp(rnd_dt(fl32(x / scale)) + 0.0, -448, 448)), NaN
 * kept, as compressed-tensors' _quantize does in the weight's dtype (the
 * + 0.0 is its zero point: a -0.0 quotient gives code 0x00, not 0x80).
 * Thread-safe; no allocation.
 */
void castfs_ct_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt);

/*
 * castfs_ct_f8_codes16 - castfs_ct_f8_codes() of @n little-endian values
 * of @dt (CASTFS_DTYPE_BF16 or CASTFS_DTYPE_F16, the weight's own dtype)
 * at @x, any alignment: the same bytes as widening them to float32 first,
 * without the float32 buffer. Thread-safe; no allocation.
 */
void castfs_ct_f8_codes16(uint8_t *dst, const void *x, size_t n, float scale,
			  enum castfs_dtype dt);

/* The int4 range [-8, 7] a symmetric scale maps absmax onto (15 / 2). */
#define CASTFS_CT_I4_HALF_RANGE 7.5f

/*
 * castfs_ct_i4_scale - the scale of an int4 group whose absmax is
 * @absmax, for weights of dtype @dt: rnd_dt(fl32(@absmax / 7.5)), and
 * torch.finfo(@dt).eps where that is 0.
 */
float castfs_ct_i4_scale(float absmax, enum castfs_dtype dt);

/*
 * castfs_ct_i4_codes - int4 values in [-8, 7] of @x[0..@n) with @scale:
 * round_half_even(clamp(rnd_dt(fl32(x / scale)), -8, 7)), as
 * compressed-tensors' _quantize does for int weights. NaN gives 0
 * (undefined in torch). Thread-safe; no allocation.
 */
void castfs_ct_i4_codes(int8_t *dst, const float *x, size_t n, float scale,
			enum castfs_dtype dt);

/* NVFP4: elements per F8_E4M3 group scale, and the E2M1 maximum. */
#define CASTFS_CT_FP4_GROUP 16u
#define CASTFS_CT_FP4_MAX 6.0f

/*
 * castfs_ct_nvfp4_gscale - the tensor-wide weight_global_scale of an NVFP4
 * tensor (or fused group: q/k/v, gate/up) whose absmax is @absmax, for
 * weights of dtype @dt: rnd_dt(fl32(rnd_dt(fl32(1 / @absmax)) * 2688)) (torch
 * evaluates 2688 / t as t.reciprocal() * 2688), 1.0 where that is NaN or
 * infinite (compressed-tensors generate_gparam). Pure function.
 */
float castfs_ct_nvfp4_gscale(float absmax, enum castfs_dtype dt);

/*
 * castfs_ct_nvfp4_scale - the F8_E4M3 weight_scale (as its float value) of
 * a group of 16 whose absmax is @absmax, with global scale @gs:
 * e4m3(clamp(fl32(@gs * rnd_dt(@absmax / 6)), -448, 448)), 0.125 where
 * that is 0 (compressed-tensors calculate_qparams). Pure function.
 */
float castfs_ct_nvfp4_scale(float absmax, float gs, enum castfs_dtype dt);

/*
 * castfs_ct_fp4_pack - the packed E2M1 codes of @x[0..@n) (@n even) into
 * @dst[0..@n / 2): element 2k in the low nibble of byte k, sign in bit 3.
 * Each is cast_to_fp4(clamp(fl32(x / fl32(@scale / @gs)) + 0.0, -6, 6))
 * with compressed-tensors' thresholds (round half to even on the E2M1
 * grid); a negative value rounded to zero keeps its sign (code 0x8), a NaN
 * gives code 0. Thread-safe; no allocation.
 */
void castfs_ct_fp4_pack(uint8_t *dst, const float *x, size_t n, float scale,
			float gs);

/*
 * castfs_comfy_f8_scale - ComfyUI's per-tensor F32 weight_scale of a
 * weight of dtype @dt whose absmax is @absmax, as its converter writes it
 * (comfy/quant_ops.py _TensorCoreFP8LayoutBase.quantize, scale=
 * "recalculate"): fl32(@absmax / 448); for F16 weights 1 / clamp(1 / s,
 * ±65504) ("Prevent scale from being too small"). A zero scale (an
 * all-zero weight, where ComfyUI's own writer produces NaN codes) is 1.0:
 * castfs's one deviation, documented in docs/FORMATS.md. Pure function.
 */
float castfs_comfy_f8_scale(float absmax, enum castfs_dtype dt);

/*
 * castfs_comfy_f8_codes - F8_E4M3 codes of @x[0..@n) (values of dtype @dt)
 * with scale @scale, as comfy-kitchen's quantize_per_tensor_fp8 computes
 * them: e4m3(clamp(rnd_dt(x * rnd_dt(fl32(1 / @scale))), -448, 448)), NaN
 * kept. Thread-safe; no allocation.
 */
void castfs_comfy_f8_codes(uint8_t *dst, const float *x, size_t n, float scale,
			   enum castfs_dtype dt);

/*
 * castfs_ct_store - @v (exactly representable in @dt, a dtype for which
 * castfs_ct_dtype_ok()) as the little-endian bytes of @dt into @dst.
 */
void castfs_ct_store(uint8_t *dst, float v, enum castfs_dtype dt);

/*
 * struct castfs_ct_kernels - the loops of the scaled-fp8 views of one
 * instruction set, each bit-identical to the scalar reference (every
 * element the same float32 operations in the same order; NaN, Inf, -0.0,
 * subnormals and saturation included): castfs_ct_f8_codes(),
 * castfs_ct_f8_codes16(), the loop of
 * castfs_comfy_f8_codes() given its inverse scale @inv,
 * castfs_ct_absmax() and castfs_ct_absmax16(). The public functions use the table chosen once for
 * this CPU (CASTFS_ISA overrides it, as for the cast kernels). Thread-safe;
 * no allocation; pointers of any alignment.
 */
struct castfs_ct_kernels {
	void (*f8_codes)(uint8_t *dst, const float *x, size_t n, float scale,
			 enum castfs_dtype dt);
	void (*f8_codes16)(uint8_t *dst, const void *x, size_t n, float scale,
			   enum castfs_dtype dt);
	void (*comfy_codes)(uint8_t *dst, const float *x, size_t n, float inv,
			    enum castfs_dtype dt);
	float (*absmax)(const float *x, size_t n);
	float (*absmax16)(const void *x, size_t n, bool f16);
};

/*
 * castfs_ct_kernels_isa - the loops of @isa, or NULL when @isa is not built
 * in or this CPU cannot run it; CASTFS_ISA_SCALAR gives the reference. For
 * tests and benchmarks. The table is static: never freed.
 */
const struct castfs_ct_kernels *castfs_ct_kernels_isa(enum castfs_isa isa);

/*
 * castfs_ct_kernels_avx512bf16 - castfs_ct_kernels_isa(CASTFS_ISA_AVX512)
 * with f8_codes16's BF16 loop rounding by vcvtne2ps2bf16, or NULL where the
 * CPU lacks AVX512_BF16. The public functions use it when the AVX-512 ISA is
 * the one chosen. For tests and benchmarks; static.
 */
const struct castfs_ct_kernels *castfs_ct_kernels_avx512bf16(void);

#endif
