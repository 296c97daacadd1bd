# SPDX-License-Identifier: MIT
# tensors/: tensor names as paths and the per-tensor files (.info, .npy,
# raw bytes) as plans.
lib_libcastfs_a_SOURCES += \
	lib/tensors/tensor_tree.c lib/tensors/tensor_tree.h \
	lib/tensors/tensor_files.c lib/tensors/tensor_files.h
