#!/bin/sh
# SPDX-License-Identifier: MIT
# Run the kernel-dependent unit suites once per instruction set this CPU
# has (STYLE R18): CASTFS_ISA forces the dispatch. An ISA the CPU lacks is
# skipped (the suite exits 77), so this runs everywhere.
set -eu
bin=${top_builddir:-.}/tests/unit
ran=0
for isa in scalar avx2 avx512; do
	for t in test_kernels test_plan test_quant; do
		[ -x "$bin/$t" ] || continue
		rc=0
		CASTFS_ISA=$isa CK_VERBOSITY=minimal "$bin/$t" || rc=$?
		if [ "$rc" = 77 ]; then
			echo "$t: $isa not supported here, skipped"
			continue
		fi
		[ "$rc" = 0 ] || { echo "FAIL: $t with CASTFS_ISA=$isa"; exit 1; }
		ran=$((ran + 1))
	done
done
echo "per-ISA runs passed: $ran"
[ "$ran" -gt 0 ]
