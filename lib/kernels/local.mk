# SPDX-License-Identifier: MIT
# kernels/: element-wise casts, the scalar reference and SIMD variants
# chosen once at run time.
lib_libcastfs_a_SOURCES += \
	lib/kernels/convert.h lib/kernels/convert_internal.h \
	lib/kernels/convert_table.h lib/kernels/convert_w8.h \
	lib/kernels/convert_w8_loops.h \
	lib/kernels/convert_scalar.c \
	lib/kernels/convert_avx2.c \
	lib/kernels/convert_avx512.c \
	lib/kernels/cpu.c \
	lib/kernels/dispatch.c
