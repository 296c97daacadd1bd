#!/bin/sh
# SPDX-License-Identifier: MIT
# Run the kernel-dependent unit suites with the dispatch forced to one
# instruction set (STYLE R18): per_isa.sh ISA, or per_isa_<ISA>.sh, which
# automake runs. An ISA this CPU or build lacks makes every suite exit 77,
# and then so does this script: automake reports SKIP, never PASS.
set -eu
isa=${1:-}
if [ -z "$isa" ]; then
	isa=$(basename "$0" .sh)
	isa=${isa#per_isa_}
fi
case $isa in
scalar | avx2 | avx512) ;;
*)
	echo "per_isa.sh: unknown ISA '$isa'" >&2
	exit 1
	;;
esac
bin=${top_builddir:-.}/tests/unit
ran=0
skipped=0
for t in test_kernels test_plan test_quant test_quant_kernels \
	test_ct_kernels; do
	[ -x "$bin/$t" ] || { echo "FAIL: $bin/$t not built"; exit 1; }
	rc=0
	CASTFS_ISA=$isa CK_VERBOSITY=minimal "$bin/$t" || rc=$?
	case $rc in
	0) ran=$((ran + 1)) ;;
	77) skipped=$((skipped + 1)) ;;
	*)
		echo "FAIL: $t with CASTFS_ISA=$isa (exit $rc)"
		exit 1
		;;
	esac
done
if [ "$ran" = 0 ]; then
	echo "SKIP: CASTFS_ISA=$isa: not supported here ($skipped suites)"
	exit 77
fi
[ "$skipped" = 0 ] || { echo "FAIL: $skipped suites skipped $isa"; exit 1; }
echo "CASTFS_ISA=$isa: $ran suites passed"
