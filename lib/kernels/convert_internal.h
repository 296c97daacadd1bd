/* SPDX-License-Identifier: MIT */
/*
 * Private to lib/kernels: the per-ISA kernel tables that dispatch.c chooses
 * from, and the CPU feature probe that tells which of them may run.
 */
#ifndef CASTFS_CONVERT_INTERNAL_H
#define CASTFS_CONVERT_INTERNAL_H

#include "kernels/convert.h"

#if defined(__x86_64__) || defined(__i386__)
#define CASTFS_HAVE_X86_KERNELS 1
#else
#define CASTFS_HAVE_X86_KERNELS 0
#endif

/* Bytes of source the SIMD loops prefetch ahead of the element they read. */
#define CVT_PF_DIST 1024

/* The castable dtypes, as a dense index into the kernel tables. */
enum castfs_cvt_type {
	CASTFS_CVT_F64,
	CASTFS_CVT_F32,
	CASTFS_CVT_F16,
	CASTFS_CVT_BF16,
	CASTFS_CVT_E4M3,
	CASTFS_CVT_E5M2,
	CASTFS_CVT_NTYPES,
};

/*
 * fn[from][to][sat]: sat is 1 for CASTFS_CVT_SATURATE. In the scalar table a
 * NULL entry means "unsupported pair"; in a SIMD table it means "no vector
 * version, use the scalar kernel".
 */
struct castfs_cvt_table {
	castfs_convert_fn fn[CASTFS_CVT_NTYPES][CASTFS_CVT_NTYPES][2];
};

extern const struct castfs_cvt_table castfs_cvt_scalar;

/* F64 -> F16 rounded once (CASTFS_CVT_ONE_ROUNDING); every ISA's. */
void castfs_cvt_f64_f16_once(void *restrict dst, const void *restrict src,
			     size_t n);
#if CASTFS_HAVE_X86_KERNELS
extern const struct castfs_cvt_table castfs_cvt_avx2;
extern const struct castfs_cvt_table castfs_cvt_avx512;
#endif

/* The planes kernels (bf16 -> E4M3), indexed by saturation; the scalar
 * one is the reference. */
extern const castfs_convert_planes_fn castfs_cvtp_scalar[2];
#if CASTFS_HAVE_X86_KERNELS
extern const castfs_convert_planes_fn castfs_cvtp_avx2[2];
extern const castfs_convert_planes_fn castfs_cvtp_avx512[2];
#endif

/* The grouped kernels (fp16, fp32 -> E4M3), indexed by source (0 fp16,
 * 1 fp32) and saturation; the scalar one is the reference. */
extern const castfs_convert_grouped_fn castfs_cvtg_scalar[2][2];
#if CASTFS_HAVE_X86_KERNELS
extern const castfs_convert_grouped_fn castfs_cvtg_avx2[2][2];
extern const castfs_convert_grouped_fn castfs_cvtg_avx512[2][2];
#endif

/* Bits of castfs_cpu_detect(). */
enum {
	CASTFS_CPU_AVX2 = 1u << 0, /* AVX2, F16C, FMA, OS saves ymm */
	CASTFS_CPU_AVX512 = 1u << 1, /* AVX-512 F/BW/VL, OS saves zmm */
	CASTFS_CPU_AVX512_BF16 = 1u << 2,
	CASTFS_CPU_AVX512_FP16 = 1u << 3,
};

/*
 * castfs_cpu_detect - the CASTFS_CPU_* features this CPU has and the OS has
 * enabled (XCR0); 0 on non-x86 builds. Runs cpuid each call: cache it.
 */
unsigned castfs_cpu_detect(void);

#endif
