# SPDX-License-Identifier: MIT
# common/: errors and diagnostics, LE bytes, checked math, hashing, the
# growing text buffer, shared immutable bytes, the source-reading vtable
# and the CASTFS_ISA rule.
# Depends on nothing.
noinst_LIBRARIES += lib/libcastfs.a
lib_libcastfs_a_CFLAGS = $(AM_CFLAGS) $(CJSON_CFLAGS) $(ZSTD_CFLAGS) \
	$(XXHASH_CFLAGS)
lib_libcastfs_a_SOURCES = \
	lib/common/bytes.h lib/common/ckd.h lib/common/compiler.h \
	lib/common/err.c lib/common/err.h lib/common/escape.c \
	lib/common/escape.h lib/common/hash.h \
	lib/common/strbuf.c lib/common/strbuf.h \
	lib/common/reader.c lib/common/reader.h \
	lib/common/fault.c lib/common/fault.h \
	lib/common/isa.c lib/common/isa.h \
	lib/common/shared.c lib/common/shared.h
