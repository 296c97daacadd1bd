# SPDX-License-Identifier: MIT
lib_libcastfs_a_SOURCES += lib/ns_modeldir_stub.c
