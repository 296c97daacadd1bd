# SPDX-License-Identifier: MIT
lib_libcastfs_a_SOURCES += \
	lib/kernels/convert.h
