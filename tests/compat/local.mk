# SPDX-License-Identifier: MIT
# Compatibility tests: a real mount read by the real Python loaders, file
# handles across a restart, and NFS through nfs-ganesha.
COMPAT_TESTS = tests/compat/test_casts.py tests/compat/test_hf_cache.py \
	tests/compat/test_handles.py tests/compat/test_nfs.py
TESTS += $(COMPAT_TESTS)
EXTRA_DIST += tests/compat/castfs_testlib.py $(COMPAT_TESTS)
