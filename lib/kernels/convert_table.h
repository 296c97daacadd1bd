/* SPDX-License-Identifier: MIT */
/*
 * The SIMD kernel table, written once for every ISA: included by each
 * convert_<isa>.c after it defines CVT_ISA (its target attribute),
 * CVT_TABLE (the table's name), STEP (elements per vector) and the
 * widen_<type>() / narrow_<type>() functions of that ISA.
 */
#define T(x) CASTFS_CVT_##x

/*
 * cvt_<from>_<to>: @sb/@db are element sizes in bits, @S/@D/@sat the scalar
 * table entry that finishes the last n % STEP elements.
 */
#define KERNEL(from, S, sb, to, D, db, sat)                                 \
	static CASTFS_UNUSED CVT_ISA void cvt_##from##_##to(                \
		void *restrict dst, const void *restrict src, size_t n)     \
	{                                                                   \
		const uint8_t *s = src;                                     \
		uint8_t *d = dst;                                           \
		size_t i;                                                   \
                                                                            \
		for (i = 0; i + STEP <= n; i += STEP) {                     \
			__builtin_prefetch(s + i * (sb / 8) + CVT_PF_DIST); \
			narrow_##to(d + i * (db / 8),                       \
				    widen_##from(s + i * (sb / 8)));        \
		}                                                           \
		if (i < n)                                                  \
			castfs_cvt_scalar.fn[T(S)][T(D)][sat](              \
				d + i * (db / 8), s + i * (sb / 8), n - i); \
	}

#define KERNELS_TO_FP8(from, S, sb)               \
	KERNEL(from, S, sb, e4m3, E4M3, 8, 0)     \
	KERNEL(from, S, sb, e4m3_sat, E4M3, 8, 1) \
	KERNEL(from, S, sb, e5m2, E5M2, 8, 0)     \
	KERNEL(from, S, sb, e5m2_sat, E5M2, 8, 1)

KERNELS_TO_FP8(f32, F32, 32)
#ifdef CVT_WORD_KERNELS /* the ISA's cvtw_* make the rest (table below) */
KERNEL(f16, F16, 16, e5m2, E5M2, 8, 0)
KERNEL(f16, F16, 16, e5m2_sat, E5M2, 8, 1)
#else
KERNELS_TO_FP8(f16, F16, 16)
KERNELS_TO_FP8(bf16, BF16, 16)
#endif
KERNELS_TO_FP8(e4m3, E4M3, 8)
KERNELS_TO_FP8(e5m2, E5M2, 8)

KERNEL(f32, F32, 32, f16, F16, 16, 0)
KERNEL(f32, F32, 32, bf16, BF16, 16, 0)
KERNEL(f16, F16, 16, f32, F32, 32, 0)
KERNEL(f16, F16, 16, bf16, BF16, 16, 0)
KERNEL(bf16, BF16, 16, f32, F32, 32, 0)
KERNEL(bf16, BF16, 16, f16, F16, 16, 0)
KERNEL(e4m3, E4M3, 8, f32, F32, 32, 0)
KERNEL(e4m3, E4M3, 8, f16, F16, 16, 0)
KERNEL(e4m3, E4M3, 8, bf16, BF16, 16, 0)
KERNEL(e5m2, E5M2, 8, f32, F32, 32, 0)
KERNEL(e5m2, E5M2, 8, f16, F16, 16, 0)
KERNEL(e5m2, E5M2, 8, bf16, BF16, 16, 0)

/*
 * An ISA with kernels on 16-bit lanes for the 16-bit sources' fp8 pairs
 * (cvtw_<from>_<to>) defines CVT_WORD_KERNELS; they replace these.
 */
#ifdef CVT_WORD_KERNELS
#define W16(from, to) cvtw_##from##_##to
#else
#define W16(from, to) cvt_##from##_##to
#endif

/* NULL (identity copies, F64 sources): dispatch uses the scalar kernel. */
const struct castfs_cvt_table CVT_TABLE = {
	.fn = {
		[T(F32)] = {
			[T(F16)] = { cvt_f32_f16, NULL },
			[T(BF16)] = { cvt_f32_bf16, NULL },
			[T(E4M3)] = { cvt_f32_e4m3, cvt_f32_e4m3_sat },
			[T(E5M2)] = { cvt_f32_e5m2, cvt_f32_e5m2_sat },
		},
		[T(F16)] = {
			[T(F32)] = { cvt_f16_f32, NULL },
			[T(BF16)] = { cvt_f16_bf16, NULL },
			[T(E4M3)] = { W16(f16, e4m3), W16(f16, e4m3_sat) },
			[T(E5M2)] = { cvt_f16_e5m2, cvt_f16_e5m2_sat },
		},
		[T(BF16)] = {
			[T(F32)] = { cvt_bf16_f32, NULL },
			[T(F16)] = { cvt_bf16_f16, NULL },
			[T(E4M3)] = { W16(bf16, e4m3), W16(bf16, e4m3_sat) },
			[T(E5M2)] = { W16(bf16, e5m2), W16(bf16, e5m2_sat) },
		},
		[T(E4M3)] = {
			[T(F32)] = { cvt_e4m3_f32, NULL },
			[T(F16)] = { cvt_e4m3_f16, NULL },
			[T(BF16)] = { cvt_e4m3_bf16, NULL },
			[T(E4M3)] = { NULL, cvt_e4m3_e4m3_sat },
			[T(E5M2)] = { cvt_e4m3_e5m2, cvt_e4m3_e5m2_sat },
		},
		[T(E5M2)] = {
			[T(F32)] = { cvt_e5m2_f32, NULL },
			[T(F16)] = { cvt_e5m2_f16, NULL },
			[T(BF16)] = { cvt_e5m2_bf16, NULL },
			[T(E4M3)] = { cvt_e5m2_e4m3, cvt_e5m2_e4m3_sat },
			[T(E5M2)] = { NULL, cvt_e5m2_e5m2_sat },
		},
	},
};
