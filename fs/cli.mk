# SPDX-License-Identifier: MIT
fs_castfs_SOURCES += fs/cli_stub.c
