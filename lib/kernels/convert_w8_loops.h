/* SPDX-License-Identifier: MIT */
/*
 * The loops of the fp8 casts on 16-bit lanes (convert_w8.h), written once
 * for the ISAs that have them: included by convert_avx2.c and
 * convert_avx512.c after they define CVT_ISA (their target attribute),
 * WSTEP (16-bit lanes per vector) and, on their vectors, w8_signed(),
 * w8_planes(), w8_f16_planes(), w8_f32_planes(), store_w8() and
 * store_w8x2(); for the planes' two-vector steps W8_VEC (the vector type),
 * w8_load(), w8_unpack(), w8_signed_v(), w8_sm_ex(), w8_sticky() and
 * store_w8_lanes(). Each loop takes two vectors a step, then one, and
 * leaves the last elements to the scalar reference.
 */
#ifndef CASTFS_KERNELS_CONVERT_W8_LOOPS_H
#define CASTFS_KERNELS_CONVERT_W8_LOOPS_H

/* cvtw_<from>_<to>: bf16 or f16 elements to fp8 with the constants @F;
 * @S/@D/@sat the scalar table entry for the tail. One prefetch per
 * 64 bytes of source a step. */
#define W8_WORD_KERNEL(from, to, F, S, D, sat)                                \
	static CVT_ISA void cvtw_##from##_##to(                               \
		void *restrict dst, const void *restrict src, size_t n)       \
	{                                                                     \
		const uint8_t *s = src;                                       \
		uint8_t *d = dst;                                             \
		size_t i;                                                     \
                                                                              \
		for (i = 0; i + 2 * WSTEP <= n; i += 2 * WSTEP) {             \
			for (size_t pf = 0; pf < 4 * WSTEP; pf += 64)         \
				__builtin_prefetch(s + 2 * i + CVT_PF_DIST +  \
						   pf);                       \
			store_w8x2(d + i, w8_signed(s + 2 * i, F, sat),       \
				   w8_signed(s + 2 * i + 2 * WSTEP, F, sat)); \
		}                                                             \
		for (; i + WSTEP <= n; i += WSTEP)                            \
			store_w8(d + i, w8_signed(s + 2 * i, F, sat));        \
		if (i < n)                                                    \
			castfs_cvt_scalar.fn[CASTFS_CVT_##S][CASTFS_CVT_##D]  \
					    [sat](d + i, s + 2 * i, n - i);   \
	}

/* cvtp_bf16_<to>: a grouped bf16 frame's two planes, the un-grouping
 * fused into the cast (no bf16 buffer between them). */
#define W8_PLANES_KERNEL(to, sat)                                              \
	static CVT_ISA void cvtp_bf16_##to(void *restrict dst,                 \
					   const uint8_t *restrict sm,         \
					   const uint8_t *restrict ex,         \
					   size_t n)                           \
	{                                                                      \
		uint8_t *d = dst;                                              \
		size_t i;                                                      \
                                                                               \
		for (i = 0; i + 2 * WSTEP <= n; i += 2 * WSTEP) {              \
			W8_VEC a, b;                                           \
                                                                               \
			w8_unpack(w8_load(sm + i), w8_load(ex + i), &a, &b);   \
			store_w8_lanes(d + i, w8_sm_ex(a, sat),                \
				       w8_sm_ex(b, sat));                      \
		}                                                              \
		for (; i + WSTEP <= n; i += WSTEP)                             \
			store_w8(d + i, w8_planes(sm + i, ex + i, sat));       \
		if (i < n)                                                     \
			castfs_cvtp_scalar[sat](d + i, sm + i, ex + i, n - i); \
	}

/* cvtg_f16_<to>: a grouped fp16 frame's planes (low bytes, high bytes). */
#define W8_GROUPED_F16_KERNEL(to, sat)                                       \
	static CVT_ISA void cvtg_f16_##to(void *restrict dst,                \
					  const uint8_t *const *p, size_t n) \
	{                                                                    \
		const uint8_t *lo = p[0], *hi = p[1];                        \
		uint8_t *d = dst;                                            \
		size_t i;                                                    \
                                                                             \
		for (i = 0; i + 2 * WSTEP <= n; i += 2 * WSTEP) {            \
			W8_VEC a, b;                                         \
                                                                             \
			w8_unpack(w8_load(lo + i), w8_load(hi + i), &a, &b); \
			store_w8_lanes(d + i,                                \
				       w8_signed_v(a, W8_F16_E4M3, sat),     \
				       w8_signed_v(b, W8_F16_E4M3, sat));    \
		}                                                            \
		for (; i + WSTEP <= n; i += WSTEP)                           \
			store_w8(d + i, w8_f16_planes(lo + i, hi + i, sat)); \
		if (i < n)                                                   \
			castfs_cvtg_scalar[0][sat](                          \
				d + i,                                       \
				(const uint8_t *const[]){ lo + i, hi + i },  \
				n - i);                                      \
	}

/* cvtg_f32_<to>: a grouped fp32 frame's four planes. */
#define W8_GROUPED_F32_KERNEL(to, sat)                                         \
	static CVT_ISA void cvtg_f32_##to(void *restrict dst,                  \
					  const uint8_t *const *p, size_t n)   \
	{                                                                      \
		uint8_t *d = dst;                                              \
		size_t i;                                                      \
                                                                               \
		for (i = 0; i + 2 * WSTEP <= n; i += 2 * WSTEP) {              \
			W8_VEC a, b;                                           \
                                                                               \
			w8_unpack(w8_sticky(p, i), w8_load(p[3] + i), &a, &b); \
			store_w8_lanes(d + i, w8_sm_ex(a, sat),                \
				       w8_sm_ex(b, sat));                      \
		}                                                              \
		for (; i + WSTEP <= n; i += WSTEP)                             \
			store_w8(d + i, w8_f32_planes(p, i, sat));             \
		if (i < n)                                                     \
			castfs_cvtg_scalar[1][sat](                            \
				d + i,                                         \
				(const uint8_t *const[]){ p[0] + i, p[1] + i,  \
							  p[2] + i,            \
							  p[3] + i },          \
				n - i);                                        \
	}

#endif
