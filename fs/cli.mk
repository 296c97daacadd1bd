# SPDX-License-Identifier: MIT
# The sub-commands (castfs info, castfs convert).
fs_castfs_SOURCES += fs/cli_common.c fs/cli_info.c fs/cli_convert.c
