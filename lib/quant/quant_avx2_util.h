/* SPDX-License-Identifier: MIT */
/*
 * Private to quant/: AVX2 helpers shared by the AVX2 quantisers
 * (quant_avx2.c, quant_gguf_avx2.c). Include only where
 * CASTFS_HAVE_X86_QUANT holds. Each helper is "avx2" alone, so that it
 * inlines into callers built with more (f16c, fma) or without fma.
 */
#ifndef CASTFS_QUANT_AVX2_UTIL_H
#define CASTFS_QUANT_AVX2_UTIL_H

#include <immintrin.h>

/* castfs_q_hmax8 - the max of @v's 8 lanes (_mm_max_ps: exact in any
 * order for values that are not NaN; callers keep NaN out). */
static inline __attribute__((target("avx2"))) float castfs_q_hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));

	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
	return _mm_cvtss_f32(m);
}

#endif
