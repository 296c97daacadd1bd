# SPDX-License-Identifier: MIT
# Benchmarks (not tests): built by `make check` so they keep compiling, run
# by scripts/bench. Results and commands: docs/BENCHMARKS.md.
check_PROGRAMS += tests/bench/bench_kernels tests/bench/bench_plan_read
tests_bench_bench_kernels_SOURCES = tests/bench/bench_kernels.c
tests_bench_bench_kernels_LDADD = $(LIBCASTFS_LIBS)
tests_bench_bench_plan_read_SOURCES = tests/bench/bench_plan_read.c
tests_bench_bench_plan_read_LDADD = $(LIBCASTFS_LIBS)
EXTRA_DIST += scripts/bench scripts/bench-loader scripts/gpu-check
