# SPDX-License-Identifier: MIT
# Tensor trees (X.safetensors.tensors/): names as paths, the per-tensor
# files, plans read through a view, and their place in the namespace.
lib_libcastfs_a_SOURCES += lib/ns_tensors.c \
	lib/tensor_tree.c lib/tensor_tree.h \
	lib/tensor_files.c lib/tensor_files.h \
	lib/tensor_layer.c lib/tensor_layer.h

# Mount tests of the tensor trees (numpy, ml_dtypes, torch, safetensors).
TESTS += tests/compat/test_tensors.py
EXTRA_DIST += tests/compat/test_tensors.py docs/TENSOR_TREE.md

# Unit tests (Check) of names as paths, the index, .npy and layering.
check_PROGRAMS += tests/unit/test_tensor_tree
TESTS += tests/unit/test_tensor_tree
tests_unit_test_tensor_tree_SOURCES = tests/unit/test_tensor_tree.c \
	$(TESTUTIL_SOURCES)
tests_unit_test_tensor_tree_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_tensor_tree_LDADD = $(UNIT_LDADD)
