/* SPDX-License-Identifier: MIT */
/*
 * Element-wise dtype conversion kernels: a scalar reference and SIMD variants
 * selected once at run time. Every variant is bit-identical to the scalar
 * reference, and the reference is bit-exact with torch's tensor.to(dtype)
 * for every non-NaN input (docs/FORMATS.md, "Casts"). A NaN input gives a
 * NaN of the same sign; payload bits are documented in convert_scalar.c.
 */
#ifndef CASTFS_CONVERT_H
#define CASTFS_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/isa.h"
#include "format/dtype.h"

/*
 * A conversion of @n elements from @src to @dst. Pointers may be unaligned;
 * the buffers must not overlap. Kernels cannot fail.
 */
typedef void (*castfs_convert_fn)(void *restrict dst, const void *restrict src,
				  size_t n);

/* Flags for castfs_convert_get(). */
enum {
	/*
	 * fp8 targets only: clamp finite overflow and +-Inf to the largest
	 * finite value (+-448 for E4M3, +-57344 for E5M2) instead of the
	 * NaN (E4M3) / Inf (E5M2) of the default. NaN stays NaN.
	 * torch changed its CPU E4M3 cast to saturate (pytorch PR #178817;
	 * torch 2.15 does): E4M3 with this flag is bit-exact with that torch,
	 * E4M3 without it with the torch releases before.
	 */
	CASTFS_CVT_SATURATE = 1u << 0,
	/*
	 * F64 -> F16 only: round once, as numpy's astype(float16) does
	 * (npy_doublebits_to_halfbits), not through float32 as torch does;
	 * the two differ on about 1 element in 20,000. GGUF views follow
	 * convert.py, which casts with numpy.
	 */
	CASTFS_CVT_ONE_ROUNDING = 1u << 1,
};

/*
 * castfs_convert_get - the kernel converting @from to @to on the ISA chosen
 * for this process (see castfs_isa_selected()).
 *
 * Sources: F64, F32, F16, BF16, F8_E4M3, F8_E5M2. Targets: F32, F16, BF16,
 * F8_E4M3, F8_E5M2. @from == @to returns a copying kernel.
 * Returns NULL for any other pair or unknown flag. Thread-safe.
 */
castfs_convert_fn castfs_convert_get(enum castfs_dtype from,
				     enum castfs_dtype to, unsigned flags);

/*
 * castfs_convert_get_isa - the same for an explicit @isa; NULL when that ISA
 * is not built in, not supported by this CPU, or the pair is unsupported.
 * For tests and benchmarks.
 */
castfs_convert_fn castfs_convert_get_isa(enum castfs_isa isa,
					 enum castfs_dtype from,
					 enum castfs_dtype to, unsigned flags);

/*
 * A cast of bf16 elements stored as a grouped pack's two byte planes
 * (struct castfs_piece): @sm[k] holds element k's sign and 7 mantissa
 * bits, @ex[k] its exponent. Writes exactly what the castfs_convert_fn of
 * the same pair writes for the un-grouped bf16 elements. Cannot fail;
 * accepts unaligned pointers; thread-safe.
 */
typedef void (*castfs_convert_planes_fn)(void *restrict dst,
					 const uint8_t *restrict sm,
					 const uint8_t *restrict ex, size_t n);

/*
 * castfs_convert_planes_get - the planes kernel bf16 -> @to with @flags, of
 * the ISA castfs_convert_get() uses (or the best one below it that has
 * one); NULL for pairs without one (only F8_E4M3 has one, with or without
 * CASTFS_CVT_SATURATE). Thread-safe.
 */
castfs_convert_planes_fn castfs_convert_planes_get(enum castfs_dtype to,
						   unsigned flags);

/*
 * castfs_convert_planes_get_isa - the same for an explicit @isa; NULL also
 * when that ISA has no planes kernel of its own or does not run here. For
 * tests that hold each variant to the scalar reference.
 */
castfs_convert_planes_fn castfs_convert_planes_get_isa(enum castfs_isa isa,
						       enum castfs_dtype to,
						       unsigned flags);

/*
 * A cast of fp16 or fp32 elements stored as a grouped pack's byte planes
 * (struct castfs_piece's @planes, lib/source/zst_group.c): fp16 as two,
 * @plane[0][k] element k's low byte and @plane[1][k] its high byte; fp32
 * as four, its exponent first made a byte: @plane[3][k] the exponent,
 * @plane[2][k] the sign and the 7 high mantissa bits, @plane[1][k] and
 * @plane[0][k] the other 16 mantissa bits. Writes exactly what the
 * castfs_convert_fn of the same pair writes for the un-grouped elements.
 * Cannot fail; accepts unaligned pointers; thread-safe.
 */
typedef void (*castfs_convert_grouped_fn)(void *restrict dst,
					  const uint8_t *const *plane,
					  size_t n);

/*
 * castfs_convert_grouped_get - the grouped kernel @from (F16 or F32) ->
 * @to with @flags of the ISA castfs_convert_get() uses; NULL when that
 * ISA has none (then un-group and cast: there is no slower fallback) or
 * for other pairs (only F8_E4M3 has one, with or without
 * CASTFS_CVT_SATURATE). Thread-safe.
 */
castfs_convert_grouped_fn castfs_convert_grouped_get(enum castfs_dtype from,
						     enum castfs_dtype to,
						     unsigned flags);

/*
 * castfs_convert_grouped_get_isa - the same for an explicit @isa (the
 * scalar one is the reference); NULL also when that ISA has none or does
 * not run here. For tests.
 */
castfs_convert_grouped_fn castfs_convert_grouped_get_isa(enum castfs_isa isa,
							 enum castfs_dtype from,
							 enum castfs_dtype to,
							 unsigned flags);

/*
 * castfs_isa_selected - the ISA used by castfs_convert_get(): the best one
 * this CPU supports that CASTFS_ISA allows (common/isa.h). Chosen once.
 */
enum castfs_isa castfs_isa_selected(void);

/* castfs_isa_available - true if @isa is built in and this CPU runs it. */
bool castfs_isa_available(enum castfs_isa isa);

/*
 * castfs_cpu_has_avx512_bf16 - true if the AVX-512 ISA runs here and the CPU
 * has AVX512_BF16 too (vcvtne2ps2bf16): the loops that use it are variants
 * inside the AVX-512 ISA, not an ISA of their own.
 */
bool castfs_cpu_has_avx512_bf16(void);

#endif
