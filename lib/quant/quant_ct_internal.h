/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: the per-ISA tables of the scaled-fp8 loops
 * (quant_ct_avx2.c, quant_ct_avx512.c) that quant_ct.c chooses from.
 */
#ifndef CASTFS_QUANT_CT_INTERNAL_H
#define CASTFS_QUANT_CT_INTERNAL_H

#include "quant/quant_ct.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
extern const struct castfs_ct_kernels castfs_ct_avx2;
extern const struct castfs_ct_kernels castfs_ct_avx512;
#endif

#endif
