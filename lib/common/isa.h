/* SPDX-License-Identifier: MIT */
/*
 * The instruction-set levels every run-time dispatch in lib/ chooses among,
 * and the one rule for the CASTFS_ISA override (tests, triage): a level it
 * names is the highest any variant may use.
 */
#ifndef CASTFS_ISA_H
#define CASTFS_ISA_H

#include <stdbool.h>

/* Lowest first: a CPU that runs a level runs every level below it. */
enum castfs_isa {
	CASTFS_ISA_SCALAR,
	CASTFS_ISA_AVX2, /* AVX2 + F16C + FMA */
	CASTFS_ISA_AVX512, /* AVX-512 F/BW/VL (+ BF16/FP16 where present) */
	CASTFS_ISA_COUNT,
};

/* castfs_isa_name - "scalar", "avx2", "avx512"; NULL for an invalid value. */
const char *castfs_isa_name(enum castfs_isa isa);

/* castfs_isa_from_name - the ISA spelled @name, or CASTFS_ISA_COUNT (also
 * for NULL). */
enum castfs_isa castfs_isa_from_name(const char *name);

/*
 * castfs_isa_forced - the level the environment variable CASTFS_ISA names,
 * read once per process; CASTFS_ISA_COUNT (no limit) when it is unset or
 * names no level. Thread-safe.
 */
enum castfs_isa castfs_isa_forced(void);

/*
 * castfs_isa_allows - whether CASTFS_ISA lets a variant of @level run: true
 * with no limit or when @level is at most the forced one. A variant that
 * needs less than AVX2 but is not the reference (SSE2, SSE4.2) counts as
 * CASTFS_ISA_AVX2, so that CASTFS_ISA=scalar always means the reference.
 * Whether the CPU runs it is the caller's question. Thread-safe.
 */
bool castfs_isa_allows(enum castfs_isa level);

#endif
