# SPDX-License-Identifier: MIT
# Compatibility tests: a real mount read by the real Python loaders.
TESTS += tests/compat/test_casts.py tests/compat/test_hf_cache.py
EXTRA_DIST += tests/compat/castfs_testlib.py tests/compat/test_casts.py \
	tests/compat/test_hf_cache.py
TESTS += tests/compat/test_nfs.py
EXTRA_DIST += tests/compat/test_nfs.py
