# SPDX-License-Identifier: MIT
noinst_LIBRARIES += lib/libcastfs.a
lib_libcastfs_a_CFLAGS = $(AM_CFLAGS) $(CJSON_CFLAGS) $(ZSTD_CFLAGS)
lib_libcastfs_a_SOURCES = \
	lib/common/bytes.h lib/common/ckd.h lib/common/compiler.h \
	lib/common/err.c lib/common/err.h \
	lib/common/strbuf.c lib/common/strbuf.h lib/common/hash.h \
	lib/dtype.c lib/dtype.h \
	lib/reader.c lib/reader.h \
	lib/st_header.c lib/st_header.h lib/st_emit.c lib/st_lex.c \
	lib/st_internal.h \
	lib/plan.c lib/plan.h lib/plan_internal.h lib/plan_read.c \
	lib/quant_ops.c \
	lib/ns.c lib/ns.h lib/ns_internal.h lib/ns_ckpt.c lib/ns_ctl.c \
	lib/ns_file.c lib/ns_resolve.c lib/ns_src.c lib/stats.c lib/stats.h \
	lib/recipe.c lib/view.c lib/view.h lib/view_bnb.c lib/view_cast.c lib/view_internal.h
