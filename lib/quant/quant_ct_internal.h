/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: the per-ISA tables of the scaled-fp8 loops
 * (quant_ct_avx2.c, quant_ct_avx512.c) that quant_ct.c chooses from.
 */
#ifndef CASTFS_QUANT_CT_INTERNAL_H
#define CASTFS_QUANT_CT_INTERNAL_H

#include <math.h>

#include "common/bytes.h"
#include "quant/quant_ct.h"
#include "quant/quant_internal.h"
#include "quant/quant_round.h"

#if CASTFS_HAVE_X86_QUANT
extern const struct castfs_ct_kernels castfs_ct_avx2;
extern const struct castfs_ct_kernels castfs_ct_avx512;
/* castfs_ct_avx512 with f8_codes16's BF16 loop for AVX512_BF16 CPUs. */
extern const struct castfs_ct_kernels castfs_ct_avx512bf16;
#endif

/*
 * The absmax of 16-bit values whose largest magnitude bits are @m: NaN
 * above the Inf pattern, else the value widened (castfs_ct_absmax16).
 */
static inline float castfs_ct_from16(uint32_t m, bool f16)
{
	if (m > (f16 ? 0x7c00u : 0x7f80u))
		return NAN;
	return f16 ? castfs_qr_f16_value((uint16_t)m) :
		     castfs_f32_from_bits(m << 16);
}

#endif
