/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: the per-ISA GGUF quantiser tables that
 * quant_gguf_dispatch.c chooses from.
 */
#ifndef CASTFS_QUANT_GGUF_INTERNAL_H
#define CASTFS_QUANT_GGUF_INTERNAL_H

#include "quant/quant_gguf.h"
#include "quant/quant_internal.h"

#if CASTFS_HAVE_X86_QUANT
extern const struct castfs_gguf_kernels castfs_gguf_avx2;
extern const struct castfs_gguf_kernels castfs_gguf_avx512;
#endif

#endif
