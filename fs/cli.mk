# SPDX-License-Identifier: MIT
# The sub-commands (castfs info, castfs convert), the man pages, and the
# tests and documentation of the command line and the control directory.
fs_castfs_SOURCES += fs/cli_common.c fs/cli_info.c fs/cli_convert.c

dist_man_MANS += docs/castfs.1 docs/castfs-info.1 docs/castfs-convert.1

TESTS += tests/compat/test_cli.py tests/compat/test_ctl.py \
	tests/fuse/fstab.sh
EXTRA_DIST += tests/compat/test_cli.py tests/compat/test_ctl.py \
	tests/fuse/fstab.sh docs/MOUNTING.md docs/castfs@.service
