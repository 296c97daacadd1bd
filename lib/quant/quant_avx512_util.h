/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: the preamble of the AVX-512 quantisers
 * (quant_avx512*.c, quant_ct_avx512.c, quant_gguf_avx512.c). Include only
 * where CASTFS_HAVE_X86_QUANT holds.
 */
#ifndef CASTFS_QUANT_AVX512_UTIL_H
#define CASTFS_QUANT_AVX512_UTIL_H

#include <immintrin.h>

/*
 * GCC 12's _mm512_undefined_*() initialise a variable with itself, which
 * -Winit-self reports as (maybe-)uninitialized (GCC PR 105593, fixed in 13).
 */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/* The loops that read BF16/F16 or share AVX2 helpers. No "fma": nothing
 * here may be contracted (quant_internal.h). */
#define CASTFS_Q_AVX512_WIDE \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

#endif
