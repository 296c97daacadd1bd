# SPDX-License-Identifier: MIT
# plan/: the immutable virtual-file layout, its builder, the stateless read
# and the generators each extent op names.
lib_libcastfs_a_SOURCES += \
	lib/plan/plan.c lib/plan/plan.h lib/plan/plan_internal.h \
	lib/plan/plan_read.c lib/plan/plan_gen_bnb.c lib/plan/plan_build.h \
	lib/plan/plan_simple.c lib/plan/plan_qcache.c lib/plan/plan_gen_fp8.c \
	lib/plan/plan_gen_f8.c lib/plan/plan_gen_gguf.c lib/plan/plan_gen_mx.c \
	lib/plan/plan_layer.c lib/plan/plan_layer.h lib/plan/plan_gen_q4deq.c \
	lib/plan/plan_gen_w4deq.c lib/plan/plan_gen_fp4.c \
	lib/plan/plan_deq.c lib/plan/plan_ints.c
