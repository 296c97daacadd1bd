# SPDX-License-Identifier: MIT
# Shell mount tests, and a passthrough FUSE source that fails reads with
# EIO (test_rel_faults).
TESTS += tests/fuse/fstab.sh
EXTRA_DIST += tests/fuse/fstab.sh tests/fuse/fstab-reap.py

check_PROGRAMS += tests/fuse/faultfs
tests_fuse_faultfs_SOURCES = tests/fuse/faultfs.c
tests_fuse_faultfs_CFLAGS = $(AM_CFLAGS) $(FUSE_CFLAGS)
tests_fuse_faultfs_LDADD = $(FUSE_LIBS)
