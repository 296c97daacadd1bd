/* SPDX-License-Identifier: MIT */
/*
 * Kernel selection: one const table per instruction set, the best one the CPU
 * runs chosen once per process (CASTFS_ISA caps it: common/isa.h).
 */
#include <pthread.h>

#include "kernels/convert_internal.h"

static const struct castfs_cvt_table *const isa_tables[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = &castfs_cvt_scalar,
#if CASTFS_HAVE_X86_KERNELS
	[CASTFS_ISA_AVX2] = &castfs_cvt_avx2,
	[CASTFS_ISA_AVX512] = &castfs_cvt_avx512,
#endif
};

/* The CASTFS_CPU_* bits each ISA needs. */
static const unsigned isa_needs[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = 0,
	[CASTFS_ISA_AVX2] = CASTFS_CPU_AVX2,
	[CASTFS_ISA_AVX512] = CASTFS_CPU_AVX2 | CASTFS_CPU_AVX512,
};

/* Written once, under isa_once, then only read. */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static unsigned cpu_features;
static enum castfs_isa isa_chosen;

static bool isa_runs(enum castfs_isa isa)
{
	return isa_tables[isa] &&
	       (cpu_features & isa_needs[isa]) == isa_needs[isa];
}

static void isa_init(void)
{
	cpu_features = castfs_cpu_detect();
	/* An override this CPU cannot honour gets the best below it. */
	isa_chosen = CASTFS_ISA_SCALAR;
	for (int i = CASTFS_ISA_COUNT - 1; i > CASTFS_ISA_SCALAR; i--) {
		if (castfs_isa_allows((enum castfs_isa)i) &&
		    isa_runs((enum castfs_isa)i)) {
			isa_chosen = (enum castfs_isa)i;
			break;
		}
	}
}

static void isa_ensure_init(void)
{
	pthread_once(&isa_once, isa_init);
}

static const enum castfs_dtype cvt_dtypes[CASTFS_CVT_NTYPES] = {
	[CASTFS_CVT_F64] = CASTFS_DTYPE_F64,
	[CASTFS_CVT_F32] = CASTFS_DTYPE_F32,
	[CASTFS_CVT_F16] = CASTFS_DTYPE_F16,
	[CASTFS_CVT_BF16] = CASTFS_DTYPE_BF16,
	[CASTFS_CVT_E4M3] = CASTFS_DTYPE_F8_E4M3,
	[CASTFS_CVT_E5M2] = CASTFS_DTYPE_F8_E5M2,
};

/* The dense table index of @dt, or CASTFS_CVT_NTYPES. */
static enum castfs_cvt_type cvt_type(enum castfs_dtype dt)
{
	for (int i = 0; i < CASTFS_CVT_NTYPES; i++) {
		if (cvt_dtypes[i] == dt)
			return (enum castfs_cvt_type)i;
	}
	return CASTFS_CVT_NTYPES;
}

castfs_convert_fn castfs_convert_get_isa(enum castfs_isa isa,
					 enum castfs_dtype from,
					 enum castfs_dtype to, unsigned flags)
{
	enum castfs_cvt_type s = cvt_type(from), d = cvt_type(to);
	unsigned sat = (flags & CASTFS_CVT_SATURATE) ? 1 : 0;
	castfs_convert_fn fn;

	if (flags == CASTFS_CVT_ONE_ROUNDING)
		return castfs_isa_available(isa) && from == CASTFS_DTYPE_F64 &&
				       to == CASTFS_DTYPE_F16 ?
			       castfs_cvt_f64_f16_once :
			       NULL;
	if (!castfs_isa_available(isa) || (flags & ~CASTFS_CVT_SATURATE) ||
	    s == CASTFS_CVT_NTYPES || d == CASTFS_CVT_NTYPES)
		return NULL;
	/* The scalar table is the list of supported pairs. */
	if (!castfs_cvt_scalar.fn[s][d][sat])
		return NULL;
	fn = isa_tables[isa]->fn[s][d][sat];
	return fn ? fn : castfs_cvt_scalar.fn[s][d][sat];
}

castfs_convert_fn castfs_convert_get(enum castfs_dtype from,
				     enum castfs_dtype to, unsigned flags)
{
	return castfs_convert_get_isa(castfs_isa_selected(), from, to, flags);
}

enum castfs_isa castfs_isa_selected(void)
{
	isa_ensure_init();
	return isa_chosen;
}

bool castfs_isa_available(enum castfs_isa isa)
{
	if ((unsigned)isa >= CASTFS_ISA_COUNT)
		return false;
	isa_ensure_init();
	return isa_runs(isa);
}

bool castfs_cpu_has_avx512_bf16(void)
{
	isa_ensure_init();
	return isa_runs(CASTFS_ISA_AVX512) &&
	       (cpu_features & CASTFS_CPU_AVX512_BF16);
}

/* The planes kernels per ISA (NULL: none of its own). */
static const castfs_convert_planes_fn *const isa_planes[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = castfs_cvtp_scalar,
#if CASTFS_HAVE_X86_KERNELS
	[CASTFS_ISA_AVX2] = castfs_cvtp_avx2,
	[CASTFS_ISA_AVX512] = castfs_cvtp_avx512,
#endif
};

castfs_convert_planes_fn castfs_convert_planes_get_isa(enum castfs_isa isa,
						       enum castfs_dtype to,
						       unsigned flags)
{
	unsigned sat = (flags & CASTFS_CVT_SATURATE) ? 1 : 0;

	if (!castfs_isa_available(isa) || to != CASTFS_DTYPE_F8_E4M3 ||
	    (flags & ~CASTFS_CVT_SATURATE) || !isa_planes[isa])
		return NULL;
	return isa_planes[isa][sat];
}

castfs_convert_planes_fn castfs_convert_planes_get(enum castfs_dtype to,
						   unsigned flags)
{
	castfs_convert_planes_fn fn = NULL;

	/* An ISA without planes kernels of its own uses the best below it. */
	for (int isa = (int)castfs_isa_selected(); isa >= 0 && !fn; isa--)
		fn = castfs_convert_planes_get_isa((enum castfs_isa)isa, to,
						   flags);
	return fn;
}

/* The grouped kernels per ISA (NULL: none of its own). */
static const castfs_convert_grouped_fn (
		*const isa_grouped[CASTFS_ISA_COUNT])[2] = {
	[CASTFS_ISA_SCALAR] = castfs_cvtg_scalar,
#if CASTFS_HAVE_X86_KERNELS
	[CASTFS_ISA_AVX2] = castfs_cvtg_avx2,
	[CASTFS_ISA_AVX512] = castfs_cvtg_avx512,
#endif
};

castfs_convert_grouped_fn castfs_convert_grouped_get_isa(enum castfs_isa isa,
							 enum castfs_dtype from,
							 enum castfs_dtype to,
							 unsigned flags)
{
	unsigned sat = (flags & CASTFS_CVT_SATURATE) ? 1 : 0;
	int k = from == CASTFS_DTYPE_F16 ? 0 :
		from == CASTFS_DTYPE_F32 ? 1 :
					   -1;

	if (!castfs_isa_available(isa) || k < 0 || to != CASTFS_DTYPE_F8_E4M3 ||
	    (flags & ~CASTFS_CVT_SATURATE) || !isa_grouped[isa])
		return NULL;
	return isa_grouped[isa][k][sat];
}

castfs_convert_grouped_fn castfs_convert_grouped_get(enum castfs_dtype from,
						     enum castfs_dtype to,
						     unsigned flags)
{
	enum castfs_isa isa = castfs_isa_selected();

	/* The scalar reference is slower than un-grouping and casting. */
	if (isa == CASTFS_ISA_SCALAR)
		return NULL;
	return castfs_convert_grouped_get_isa(isa, from, to, flags);
}
