# SPDX-License-Identifier: MIT
# bitsandbytes views: the quantiser math (scalar reference + SIMD), the
# JSON of quant_state, and their tests. view_bnb.c and quant_ops.c are
# listed in lib/local.mk.
lib_libcastfs_a_SOURCES += \
	lib/quant.h lib/quant_internal.h lib/quant.c lib/quant_scalar.c \
	lib/quant_avx512.c lib/quant_avx512_16.c lib/quant_avx2.c \
	lib/quant_json.c

check_PROGRAMS += tests/unit/test_quant
TESTS += tests/unit/test_quant
tests_unit_test_quant_SOURCES = tests/unit/test_quant.c \
	tests/unit/test_quant_plan.c tests/unit/testutil.c tests/unit/testutil.h
tests_unit_test_quant_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_quant_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)

TESTS += tests/compat/test_bnb.py
EXTRA_DIST += tests/compat/test_bnb.py tests/compat/bnb_ref.py

# The quantiser kernels of 16-bit sources and double quantisation, every
# ISA against scalar.
check_PROGRAMS += tests/unit/test_quant_kernels
TESTS += tests/unit/test_quant_kernels
tests_unit_test_quant_kernels_SOURCES = tests/unit/test_quant_kernels.c \
	tests/unit/testutil.c tests/unit/testutil.h
tests_unit_test_quant_kernels_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_quant_kernels_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)
