# SPDX-License-Identifier: MIT
# Unit tests (Check): one binary per lib module, plus the shared builder.

TESTUTIL_SOURCES = tests/unit/testutil.c tests/unit/testutil.h
UNIT_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
UNIT_LDADD = $(LIBCASTFS_LIBS) $(CHECK_LIBS)

check_PROGRAMS += tests/unit/test_st_header tests/unit/test_st_valid \
	tests/unit/test_st_emit tests/unit/test_dtype
TESTS += tests/unit/test_st_header tests/unit/test_st_valid \
	tests/unit/test_st_emit tests/unit/test_dtype
ST_TESTUTIL_SOURCES = tests/unit/st_testutil.c tests/unit/st_testutil.h \
	$(TESTUTIL_SOURCES)

tests_unit_test_st_header_SOURCES = tests/unit/test_st_header.c \
	$(ST_TESTUTIL_SOURCES)
tests_unit_test_st_header_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_header_LDADD = $(UNIT_LDADD)

tests_unit_test_st_valid_SOURCES = tests/unit/test_st_valid.c \
	$(ST_TESTUTIL_SOURCES)
tests_unit_test_st_valid_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_valid_LDADD = $(UNIT_LDADD)

tests_unit_test_st_emit_SOURCES = tests/unit/test_st_emit.c \
	$(ST_TESTUTIL_SOURCES)
tests_unit_test_st_emit_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_st_emit_LDADD = $(UNIT_LDADD)

tests_unit_test_dtype_SOURCES = tests/unit/test_dtype.c
tests_unit_test_dtype_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_dtype_LDADD = $(UNIT_LDADD)

# The malformed-checkpoint corpus (replayed by test_st_header) and the
# script that regenerates it.
EXTRA_DIST += scripts/gen-malformed.py tests/data/malformed
