/* SPDX-License-Identifier: MIT */
/*
 * CPU feature detection for the kernel dispatcher: cpuid for what the CPU
 * implements, xgetbv for which register state the OS saves on a switch.
 */
#include <stdint.h>

#include "kernels/convert_internal.h"

#if CASTFS_HAVE_X86_KERNELS
#include <cpuid.h>

/* XCR0 bits: SSE and AVX (ymm) state; opmask, zmm0-15 high, zmm16-31. */
#define XCR0_YMM 0x06u
#define XCR0_ZMM 0xe6u

struct cpuid_regs {
	unsigned a, b, c, d;
};

static struct cpuid_regs cpuid(unsigned leaf, unsigned sub)
{
	struct cpuid_regs r = { 0, 0, 0, 0 };

	if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d))
		r.a = r.b = r.c = r.d = 0;
	return r;
}

/* Only called once OSXSAVE says the instruction exists. */
static uint64_t xgetbv0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

static bool bit(unsigned reg, unsigned n)
{
	return (reg >> n) & 1;
}

static unsigned avx512_features(struct cpuid_regs l7, struct cpuid_regs l71)
{
	unsigned f = 0;

	/* F (b16), BW (b30), VL (b31) */
	if (!bit(l7.b, 16) || !bit(l7.b, 30) || !bit(l7.b, 31))
		return 0;
	f |= CASTFS_CPU_AVX512;
	if (bit(l71.a, 5))
		f |= CASTFS_CPU_AVX512_BF16;
	if (bit(l7.d, 23))
		f |= CASTFS_CPU_AVX512_FP16;
	return f;
}

unsigned castfs_cpu_detect(void)
{
	struct cpuid_regs l0 = cpuid(0, 0), l1, l7, l71;
	uint64_t xcr0;
	unsigned f = 0;

	if (l0.a < 7)
		return 0;
	l1 = cpuid(1, 0);
	/* OSXSAVE (c27), AVX (c28), F16C (c29), FMA (c12) */
	if (!bit(l1.c, 27) || !bit(l1.c, 28))
		return 0;
	xcr0 = xgetbv0();
	if ((xcr0 & XCR0_YMM) != XCR0_YMM)
		return 0;
	l7 = cpuid(7, 0);
	l71 = cpuid(7, 1);
	if (!bit(l1.c, 29) || !bit(l1.c, 12) || !bit(l7.b, 5))
		return 0;
	f |= CASTFS_CPU_AVX2;
	if ((xcr0 & XCR0_ZMM) == XCR0_ZMM)
		f |= avx512_features(l7, l71);
	return f;
}

#else

unsigned castfs_cpu_detect(void)
{
	return 0;
}

#endif
