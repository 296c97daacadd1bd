# SPDX-License-Identifier: MIT
# Model-directory views (DIR.<view>/, X.safetensors.index.<view>.json):
# the JSON work (modeldir*.c) and their place in the namespace (ns_md*.c).
lib_libcastfs_a_SOURCES += lib/modeldir.c lib/modeldir.h \
	lib/modeldir_internal.h lib/modeldir_json.c lib/modeldir_index.c \
	lib/ns_modeldir.c lib/ns_mdjson.c lib/ns_mdplan.c \
	lib/ns_modeldir_internal.h

check_PROGRAMS += tests/unit/test_modeldir
TESTS += tests/unit/test_modeldir
tests_unit_test_modeldir_SOURCES = tests/unit/test_modeldir.c \
	tests/unit/testutil.c tests/unit/testutil.h
tests_unit_test_modeldir_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_unit_test_modeldir_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)

# Mount tests with the real loaders (transformers, diffusers, bitsandbytes).
TESTS += tests/compat/test_modeldir.py
EXTRA_DIST += tests/compat/test_modeldir.py
TESTS += tests/compat/test_single_file.py
EXTRA_DIST += tests/compat/test_single_file.py tests/compat/ldm_unet.py
EXTRA_DIST += scripts/bench-loader
EXTRA_DIST += docs/MODELDIR.md
