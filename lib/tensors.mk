# SPDX-License-Identifier: MIT
lib_libcastfs_a_SOURCES += lib/ns_tensors_stub.c
