# SPDX-License-Identifier: MIT
# quant/: quantiser math (code tables, selection rules) as pure functions,
# the scalar reference and per-ISA kernels, and the quant_state JSON.
lib_libcastfs_a_SOURCES += \
	lib/quant/quant.h lib/quant/quant_internal.h lib/quant/quant_table.h \
	lib/quant/quant_tables.c lib/quant/quant_q4_thresh.c \
	lib/quant/quant_dispatch.c \
	lib/quant/quant_scalar.c lib/quant/quant_avx512.c \
	lib/quant/quant_avx512_16.c lib/quant/quant_avx2.c \
	lib/quant/quant_avx2_16.c \
	lib/quant/quant_json.c lib/quant/quant_ct.h lib/quant/quant_ct.c \
	lib/quant/quant_ct_internal.h lib/quant/quant_ct_avx2.c \
	lib/quant/quant_ct_avx512.c \
	lib/quant/quant_round.h lib/quant/quant_avx2_util.h \
	lib/quant/quant_avx512_util.h \
	lib/quant/quant_gguf.c lib/quant/quant_gguf.h \
	lib/quant/quant_gguf_internal.h lib/quant/quant_gguf_dispatch.c \
	lib/quant/quant_gguf_avx2.c lib/quant/quant_gguf_avx512.c \
	lib/quant/quant_gguf_driver.h \
	lib/quant/quant_gguf_k.c lib/quant/quant_gguf_k.h
