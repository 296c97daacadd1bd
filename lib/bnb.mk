# SPDX-License-Identifier: MIT
# bitsandbytes views: the quantiser math (scalar reference + SIMD), the
# JSON of quant_state, and their tests. view_bnb.c and quant_ops.c are
# listed in lib/local.mk.
lib_libcastfs_a_SOURCES += \
	lib/quant.h lib/quant_internal.h lib/quant.c lib/quant_scalar.c \
	lib/quant_avx512.c lib/quant_json.c
