# SPDX-License-Identifier: MIT
# Fuzz targets (tests/fuzz/).
#
# With --enable-fuzzing (clang) the targets link libFuzzer and are built by
# `make`; run them by hand (docs/FUZZING.md). Otherwise each links a replay
# main that runs every file of tests/fuzz/<name>.in/ and runs in
# `make check`.

FUZZ_TARGETS = tests/fuzz/fuzz_st_header tests/fuzz/fuzz_recipe \
	tests/fuzz/fuzz_plan_read tests/fuzz/fuzz_convert tests/fuzz/fuzz_zst \
	tests/fuzz/fuzz_gguf_read tests/fuzz/fuzz_gguf_quant \
	tests/fuzz/fuzz_zst_code
FUZZ_COMMON = tests/fuzz/fuzz.h
FUZZ_LIBS = $(LIBCASTFS_LIBS)
if FUZZING
noinst_PROGRAMS = $(FUZZ_TARGETS)
FUZZ_DRIVER =
FUZZ_ENGINE_FLAGS = $(LIB_FUZZING_ENGINE)
else
check_PROGRAMS += $(FUZZ_TARGETS)
TESTS += $(FUZZ_TARGETS)
FUZZ_DRIVER = tests/fuzz/replay.c
FUZZ_ENGINE_FLAGS =
endif

tests_fuzz_fuzz_st_header_SOURCES = tests/fuzz/fuzz_st_header.c \
	$(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_st_header_CFLAGS = $(AM_CFLAGS) -DFUZZ_NAME='"fuzz_st_header"'
tests_fuzz_fuzz_st_header_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_st_header_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_recipe_SOURCES = tests/fuzz/fuzz_recipe.c \
	tests/fuzz/fuzz_util.c tests/fuzz/fuzz_util.h \
	tests/fuzz/ieee_ref.c tests/fuzz/ieee_ref.h \
	$(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_recipe_CFLAGS = $(AM_CFLAGS) -DFUZZ_NAME='"fuzz_recipe"'
tests_fuzz_fuzz_recipe_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_recipe_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_plan_read_SOURCES = tests/fuzz/fuzz_plan_read.c \
	tests/fuzz/fuzz_util.c tests/fuzz/fuzz_util.h \
	tests/fuzz/ieee_ref.c tests/fuzz/ieee_ref.h \
	tests/fuzz/bytes_fuzz.h $(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_plan_read_CFLAGS = $(AM_CFLAGS) \
	-DFUZZ_NAME='"fuzz_plan_read"'
tests_fuzz_fuzz_plan_read_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_plan_read_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_convert_SOURCES = tests/fuzz/fuzz_convert.c \
	tests/fuzz/ieee_ref.c tests/fuzz/ieee_ref.h $(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_convert_CFLAGS = $(AM_CFLAGS) -DFUZZ_NAME='"fuzz_convert"'
tests_fuzz_fuzz_convert_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_convert_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_zst_SOURCES = tests/fuzz/fuzz_zst.c $(FUZZ_COMMON) \
	$(FUZZ_DRIVER)
tests_fuzz_fuzz_zst_CFLAGS = $(AM_CFLAGS) $(ZSTD_CFLAGS) \
	-DFUZZ_NAME='"fuzz_zst"'
tests_fuzz_fuzz_zst_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_zst_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_zst_code_SOURCES = tests/fuzz/fuzz_zst_code.c $(FUZZ_COMMON) \
	$(FUZZ_DRIVER)
tests_fuzz_fuzz_zst_code_CFLAGS = $(AM_CFLAGS) -DFUZZ_NAME='"fuzz_zst_code"'
tests_fuzz_fuzz_zst_code_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_zst_code_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_gguf_read_SOURCES = tests/fuzz/fuzz_gguf_read.c \
	$(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_gguf_read_CFLAGS = $(AM_CFLAGS) \
	-DFUZZ_NAME='"fuzz_gguf_read"'
tests_fuzz_fuzz_gguf_read_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_gguf_read_LDADD = $(FUZZ_LIBS)

tests_fuzz_fuzz_gguf_quant_SOURCES = tests/fuzz/fuzz_gguf_quant.c \
	$(FUZZ_COMMON) $(FUZZ_DRIVER)
tests_fuzz_fuzz_gguf_quant_CFLAGS = $(AM_CFLAGS) \
	-DFUZZ_NAME='"fuzz_gguf_quant"'
tests_fuzz_fuzz_gguf_quant_LDFLAGS = $(FUZZ_ENGINE_FLAGS)
tests_fuzz_fuzz_gguf_quant_LDADD = $(FUZZ_LIBS)

EXTRA_DIST += tests/fuzz/replay.c tests/fuzz/gen-seeds.py \
	tests/fuzz/gen-zst-seeds.py tests/fuzz/fuzz_zst.in \
	tests/fuzz/fuzz_st_header.in tests/fuzz/fuzz_recipe.in \
	tests/fuzz/fuzz_plan_read.in tests/fuzz/fuzz_convert.in \
	tests/fuzz/fuzz_gguf_read.in tests/fuzz/fuzz_gguf_quant.in \
	tests/fuzz/fuzz_zst_code.in
