# SPDX-License-Identifier: MIT
# format/: the safetensors dtype table and the header lexer, parser and
# writer.
lib_libcastfs_a_SOURCES += \
	lib/format/dtype.c lib/format/dtype.h \
	lib/format/st_header.c lib/format/st_header.h lib/format/st_emit.c \
	lib/format/st_lex.c lib/format/st_tree.c lib/format/st_internal.h \
	lib/format/st_side.c lib/format/st_side.h \
	lib/format/gguf.c lib/format/gguf.h \
	lib/format/gguf_read.c lib/format/gguf_read.h
