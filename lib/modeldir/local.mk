# SPDX-License-Identifier: MIT
# modeldir/: model-directory views as text in, text out: config.json
# patches and index.json rewrites.
lib_libcastfs_a_SOURCES += \
	lib/modeldir/modeldir.c lib/modeldir/modeldir.h \
	lib/modeldir/modeldir_internal.h lib/modeldir/modeldir_json.c \
	lib/modeldir/modeldir_index.c \
	lib/modeldir/modeldir_quant.c lib/modeldir/modeldir_ct.c \
	lib/modeldir/modeldir_gguf.c lib/modeldir/modeldir_gguf_mix.c \
	lib/modeldir/modeldir_gguf_shards.c lib/modeldir/modeldir_gguf_deq.c \
	lib/modeldir/modeldir_gguf_mix.h lib/modeldir/modeldir_ct4.c \
	lib/modeldir/modeldir_gguf_tok.c lib/modeldir/modeldir_gguf_tok.h \
	lib/modeldir/modeldir_gguf_spec.c
