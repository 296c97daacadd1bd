// SPDX-License-Identifier: MIT
/*
 * The quantiser kernel table of each ISA, chosen once the CPU is known:
 * the only file that names every per-ISA table.
 */
#include "quant/quant_internal.h"

/* NULL: no kernels of that ISA yet; the scalar ones are used instead. */
static const struct castfs_quant_kernels *const quant_tables[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = &castfs_quant_scalar,
#if CASTFS_HAVE_X86_QUANT
	[CASTFS_ISA_AVX2] = &castfs_quant_avx2,
	[CASTFS_ISA_AVX512] = &castfs_quant_avx512,
#endif
};

const struct castfs_quant_kernels *castfs_quant_kernels_isa(enum castfs_isa isa)
{
	if (!castfs_isa_available(isa))
		return NULL;
	return quant_tables[isa];
}

const struct castfs_quant_kernels *castfs_quant_kernels_get(void)
{
	const struct castfs_quant_kernels *k =
		castfs_quant_kernels_isa(castfs_isa_selected());

	return k ? k : &castfs_quant_scalar;
}
