# SPDX-License-Identifier: MIT
# view/: view recipes and rules, and the builders that turn a checkpoint
# and a view into a plan.
lib_libcastfs_a_SOURCES += \
	lib/view/recipe.c lib/view/view.c lib/view/view.h \
	lib/view/view_bnb.c lib/view/view_cast.c lib/view/view_internal.h \
	lib/view/qsrc.c lib/view/qsrc.h lib/view/qsrc_comfy.c \
	lib/view/qsrc_bnb.c lib/view/qsrc_internal.h lib/view/view_deq.c \
	lib/view/view_ct.c lib/view/view_gguf.c lib/view/view_gguf.h lib/view/view_gguf_deq.c \
	lib/view/qsrc_mx.c \
	lib/view/qsrc_bnb4.c lib/view/view_q4deq.c lib/view/qsrc_ctw4.c \
	lib/view/view_w4deq.c \
	lib/view/view_mx.c lib/view/qsrc_ct.c \
	lib/view/qsrc_ct4.c lib/view/qsrc_xshard.c lib/view/qsrc_xshard.h
