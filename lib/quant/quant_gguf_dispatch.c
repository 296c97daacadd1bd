// SPDX-License-Identifier: MIT
/*
 * The GGUF Q8_0 / Q4_0 quantiser table of each ISA, chosen once the CPU is
 * known (castfs_isa_selected(), CASTFS_ISA): the only file that names
 * every per-ISA GGUF table.
 */
#include "quant/quant_gguf_internal.h"

/* NULL: no kernels of that ISA; the scalar ones are used instead. */
static const struct castfs_gguf_kernels *const gguf_tables[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = &castfs_gguf_scalar,
#if CASTFS_HAVE_X86_QUANT
	[CASTFS_ISA_AVX2] = &castfs_gguf_avx2,
	[CASTFS_ISA_AVX512] = &castfs_gguf_avx512,
#endif
};

const struct castfs_gguf_kernels *castfs_gguf_kernels_isa(enum castfs_isa isa)
{
	if (!castfs_isa_available(isa))
		return NULL;
	return gguf_tables[isa];
}

const struct castfs_gguf_kernels *castfs_gguf_kernels_get(void)
{
	const struct castfs_gguf_kernels *k =
		castfs_gguf_kernels_isa(castfs_isa_selected());

	return k ? k : &castfs_gguf_scalar;
}
