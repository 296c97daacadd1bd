# SPDX-License-Identifier: MIT
lib_libcastfs_a_SOURCES += \
	lib/kernels/convert.h lib/kernels/convert_internal.h \
	lib/kernels/convert_table.h \
	lib/kernels/convert_scalar.c \
	lib/kernels/convert_avx2.c \
	lib/kernels/convert_avx512.c \
	lib/kernels/cpu.c \
	lib/kernels/dispatch.c

check_PROGRAMS += tests/unit/test_kernels
TESTS += tests/unit/test_kernels
tests_unit_test_kernels_SOURCES = tests/unit/test_kernels.c
tests_unit_test_kernels_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_kernels_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)
