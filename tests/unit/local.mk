# SPDX-License-Identifier: MIT
# Unit tests (Check): one binary per lib module. Each links the shared
# runner (check_main.c) and defines unit_suite().

UNIT_MAIN = tests/unit/check_main.c tests/unit/unit.h tests/unit/unit_membuf.h
TESTUTIL_SOURCES = tests/unit/testutil.c tests/unit/testutil.h
ST_TESTUTIL_SOURCES = tests/unit/st_testutil.c tests/unit/st_testutil.h \
	$(TESTUTIL_SOURCES)
FP8_SLOW_SOURCES = tests/unit/fp8_slow.c tests/unit/fp8_slow.h
UNIT_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
UNIT_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)

UNIT_TESTS = tests/unit/test_dtype tests/unit/test_st_header \
	tests/unit/test_st_valid tests/unit/test_st_emit \
	tests/unit/test_kernels tests/unit/test_quant \
	tests/unit/test_quant_kernels tests/unit/test_plan \
	tests/unit/test_ct_plan tests/unit/test_quant_round \
	tests/unit/test_recipe tests/unit/test_tensor_tree \
	tests/unit/test_modeldir tests/unit/test_ns tests/unit/test_zst \
	tests/unit/test_zst_planes tests/unit/test_zst_tier \
	tests/unit/test_zst_pack \
	tests/unit/test_qsrc tests/unit/test_ns_bounds tests/unit/test_escape \
	tests/unit/test_qsrc_ct4 tests/unit/test_qsrc_xshard \
	tests/unit/test_gguf tests/unit/test_reader \
	tests/unit/test_md_gguf_shards tests/unit/test_st_side \
	tests/unit/test_gguf_deq tests/unit/test_gguf_kernels \
	tests/unit/test_watchq tests/unit/test_ct_kernels \
	tests/unit/test_ns_rescan
check_PROGRAMS += $(UNIT_TESTS)
TESTS += $(UNIT_TESTS)

# source/
tests_unit_test_zst_SOURCES = tests/unit/test_zst.c $(UNIT_MAIN)
tests_unit_test_zst_CFLAGS = $(UNIT_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zst_LDADD = $(UNIT_LDADD)
tests_unit_test_zst_planes_SOURCES = tests/unit/test_zst_planes.c $(UNIT_MAIN)
tests_unit_test_zst_planes_CFLAGS = $(UNIT_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zst_planes_LDADD = $(UNIT_LDADD)
tests_unit_test_zst_tier_SOURCES = tests/unit/test_zst_tier.c $(UNIT_MAIN)
tests_unit_test_zst_tier_CFLAGS = $(UNIT_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zst_tier_LDADD = $(UNIT_LDADD)
tests_unit_test_zst_pack_SOURCES = tests/unit/test_zst_pack.c $(UNIT_MAIN)
tests_unit_test_zst_pack_CFLAGS = $(UNIT_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zst_pack_LDADD = $(UNIT_LDADD)

# common/
# fs/ (the daemon's own, FUSE-free helpers)
tests_unit_test_watchq_SOURCES = tests/unit/test_watchq.c fs/fs_watchq.c \
	fs/fs_watchq.h $(UNIT_MAIN)
tests_unit_test_watchq_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_watchq_LDADD = $(UNIT_LDADD)
tests_unit_test_escape_SOURCES = tests/unit/test_escape.c $(UNIT_MAIN)
tests_unit_test_escape_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_escape_LDADD = $(UNIT_LDADD)
tests_unit_test_reader_SOURCES = tests/unit/test_reader.c $(UNIT_MAIN)
tests_unit_test_reader_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_reader_LDADD = $(UNIT_LDADD)

# format/
tests_unit_test_dtype_SOURCES = tests/unit/test_dtype.c $(UNIT_MAIN)
tests_unit_test_dtype_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_dtype_LDADD = $(UNIT_LDADD)
tests_unit_test_st_header_SOURCES = tests/unit/test_st_header.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_st_header_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_header_LDADD = $(UNIT_LDADD)
tests_unit_test_st_valid_SOURCES = tests/unit/test_st_valid.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_st_valid_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_valid_LDADD = $(UNIT_LDADD)
tests_unit_test_st_emit_SOURCES = tests/unit/test_st_emit.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_st_emit_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_emit_LDADD = $(UNIT_LDADD)

# kernels/, quant/
tests_unit_test_kernels_SOURCES = tests/unit/test_kernels.c $(UNIT_MAIN)
tests_unit_test_kernels_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_kernels_LDADD = $(UNIT_LDADD)
tests_unit_test_quant_SOURCES = tests/unit/test_quant.c \
	tests/unit/test_quant_plan.c $(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_quant_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_quant_LDADD = $(UNIT_LDADD)
tests_unit_test_ct_plan_SOURCES = tests/unit/test_ct_plan.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_ct_plan_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ct_plan_LDADD = $(UNIT_LDADD)
tests_unit_test_quant_kernels_SOURCES = tests/unit/test_quant_kernels.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_quant_round_SOURCES = tests/unit/test_quant_round.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_quant_round_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_quant_round_LDADD = $(UNIT_LDADD)
tests_unit_test_ct_kernels_SOURCES = tests/unit/test_ct_kernels.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_ct_kernels_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ct_kernels_LDADD = $(UNIT_LDADD)
tests_unit_test_gguf_SOURCES = tests/unit/test_gguf.c $(UNIT_MAIN)
tests_unit_test_gguf_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_gguf_LDADD = $(UNIT_LDADD)
tests_unit_test_gguf_kernels_SOURCES = tests/unit/test_gguf_kernels.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_gguf_kernels_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_gguf_kernels_LDADD = $(UNIT_LDADD)
tests_unit_test_quant_kernels_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_quant_kernels_LDADD = $(UNIT_LDADD)

# plan/, view/, tensors/, modeldir/, ns/
tests_unit_test_plan_SOURCES = tests/unit/test_plan.c $(TESTUTIL_SOURCES) \
	tests/fuzz/ieee_ref.c tests/fuzz/ieee_ref.h $(UNIT_MAIN)
tests_unit_test_plan_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_plan_LDADD = $(UNIT_LDADD)
tests_unit_test_recipe_SOURCES = tests/unit/test_recipe.c $(UNIT_MAIN)
tests_unit_test_recipe_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_recipe_LDADD = $(UNIT_LDADD)
tests_unit_test_st_side_SOURCES = tests/unit/test_st_side.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_st_side_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_side_LDADD = $(UNIT_LDADD)
tests_unit_test_qsrc_SOURCES = tests/unit/test_qsrc.c \
	$(ST_TESTUTIL_SOURCES) $(FP8_SLOW_SOURCES) $(UNIT_MAIN)
tests_unit_test_qsrc_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_qsrc_LDADD = $(UNIT_LDADD)
tests_unit_test_gguf_deq_SOURCES = tests/unit/test_gguf_deq.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_gguf_deq_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_gguf_deq_LDADD = $(UNIT_LDADD)
tests_unit_test_qsrc_ct4_SOURCES = tests/unit/test_qsrc_ct4.c \
	$(ST_TESTUTIL_SOURCES) $(FP8_SLOW_SOURCES) $(UNIT_MAIN)
tests_unit_test_qsrc_ct4_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_qsrc_ct4_LDADD = $(UNIT_LDADD)
tests_unit_test_qsrc_xshard_SOURCES = tests/unit/test_qsrc_xshard.c \
	$(ST_TESTUTIL_SOURCES) $(FP8_SLOW_SOURCES) $(UNIT_MAIN)
tests_unit_test_qsrc_xshard_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_qsrc_xshard_LDADD = $(UNIT_LDADD)
tests_unit_test_tensor_tree_SOURCES = tests/unit/test_tensor_tree.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_tensor_tree_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_tensor_tree_LDADD = $(UNIT_LDADD)
tests_unit_test_modeldir_SOURCES = tests/unit/test_modeldir.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_modeldir_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_modeldir_LDADD = $(UNIT_LDADD)
tests_unit_test_md_gguf_shards_SOURCES = tests/unit/test_md_gguf_shards.c \
	$(ST_TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_md_gguf_shards_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_md_gguf_shards_LDADD = $(UNIT_LDADD)
tests_unit_test_ns_SOURCES = tests/unit/test_ns.c $(TESTUTIL_SOURCES) \
	$(UNIT_MAIN)
tests_unit_test_ns_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ns_LDADD = $(UNIT_LDADD)
tests_unit_test_ns_bounds_SOURCES = tests/unit/test_ns_bounds.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_ns_bounds_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ns_bounds_LDADD = $(UNIT_LDADD)
tests_unit_test_ns_rescan_SOURCES = tests/unit/test_ns_rescan.c \
	$(TESTUTIL_SOURCES) $(UNIT_MAIN)
tests_unit_test_ns_rescan_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_ns_rescan_LDADD = $(UNIT_LDADD)

# The kernel-dependent suites again, once per ISA: each program passes, or
# exits 77 (SKIP) where the CPU or build lacks its ISA.
PER_ISA_TESTS = tests/unit/per_isa_scalar.sh tests/unit/per_isa_avx2.sh \
	tests/unit/per_isa_avx512.sh
TESTS += $(PER_ISA_TESTS)
EXTRA_DIST += tests/unit/per_isa.sh $(PER_ISA_TESTS)

# The malformed-checkpoint corpus (replayed by test_st_header) and the
# script that regenerates it.
EXTRA_DIST += scripts/gen-malformed.py tests/data/malformed

# STYLE R1/R2 and the layer rules made mechanical, and the checker's own
# test (a planted upward include must fail it).
TESTS += scripts/check-layering.sh tests/unit/test_layering.sh
EXTRA_DIST += scripts/check-layering.sh scripts/format.sh .clang-format \
	tests/unit/test_layering.sh

# The bf16 planes of grouped packs: the fused cast kernels (kernels/) and
# the zst reader's visit op (source/).
UNIT_TESTS += tests/unit/test_kernels_planes tests/unit/test_zst_visit
tests_unit_test_kernels_planes_SOURCES = tests/unit/test_kernels_planes.c \
	$(UNIT_MAIN)
tests_unit_test_kernels_planes_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_kernels_planes_LDADD = $(UNIT_LDADD)
tests_unit_test_zst_visit_SOURCES = tests/unit/test_zst_visit.c $(UNIT_MAIN)
tests_unit_test_zst_visit_CFLAGS = $(UNIT_CFLAGS) $(ZSTD_CFLAGS)
tests_unit_test_zst_visit_LDADD = $(UNIT_LDADD)
