# SPDX-License-Identifier: MIT
# source/: how source bytes are read when they are not plain: seekable-zstd
# packs (seek table, decoded-frame cache, decoder pool) and their writer.
# Depends on common/ only.
lib_libcastfs_a_SOURCES += \
	lib/source/zst.c lib/source/zst.h lib/source/zst_internal.h \
	lib/source/zst_index.c lib/source/zst_cache.c lib/source/zst_pack.c \
	lib/source/zst_verify.c lib/source/zst_unpack.c \
	lib/source/zst_threads.c \
	lib/source/zst_group.c lib/source/zst_group_avx2.c \
	lib/source/zst_tier.c lib/source/zst_tier_pack.c \
	lib/source/zst_tier_avx2.c lib/source/zst_tier_avx512.c \
	lib/source/zst_tier_pack_avx2.c lib/source/zst_tier_pack_avx512.c \
	lib/source/zst_crc.c lib/source/zst_crc_sse42.c \
	lib/source/zst_crc_avx512.c
