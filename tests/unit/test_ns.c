/* SPDX-License-Identifier: MIT */
/*
 * Namespace tests, in process (no FUSE): what a directory lists, what names
 * resolve, stable ids across instances, symlinks never followed, and what
 * happens when a source file changes under a lookup or an open file.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ns/ns.h"
#include "plan/plan.h"
#include "ns/stats.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

static char root[64];
static struct castfs_views vs;
static struct castfs_stats *st;
static struct castfs_ns *ns;
static struct castfs_scratch scr;

static void write_file(const char *name, const void *data, size_t len)
{
	tu_write_file(root, name, data, len);
}

static void write_checkpoint(const char *name, const char *dtype)
{
	static const uint64_t shape[] = { 16, 7 };
	struct tu_st *b = tu_st_new();
	uint8_t *buf;
	size_t len;

	tu_st_add(b, "w", dtype, 2, shape, NULL);
	buf = tu_st_build(b, &len);
	write_file(name, buf, len);
	free(buf);
	tu_st_free(b);
}

static struct castfs_ns *new_ns(void)
{
	struct castfs_ns_opts o = { .source = root, .views = &vs, .stats = st };
	struct castfs_diag d = { { 0 } };
	struct castfs_ns *n;

	ck_assert_int_eq(castfs_ns_new(&o, &n, &d), 0);
	return n;
}

static void setup(void)
{
	char path[256];

	strcpy(root, "/tmp/castfs-ns-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	write_checkpoint("a.safetensors", "BF16");
	write_file("bad.safetensors", "not a checkpoint", 16);
	write_file("notes.txt", "hello\n", 6);
	snprintf(path, sizeof(path), "%s/sub", root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	write_checkpoint("sub/c.safetensors", "F32");
	snprintf(path, sizeof(path), "%s/out", root);
	ck_assert_int_eq(symlink("/etc", path), 0);
	snprintf(path, sizeof(path), "%s/fifo", root);
	ck_assert_int_eq(mkfifo(path, 0644), 0);
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
	ck_assert_int_eq(castfs_stats_new(vs.n, &st), 0);
	ck_assert_int_eq(castfs_scratch_init(&scr), 0);
	ns = new_ns();
}

static void teardown(void)
{
	char cmd[128];

	castfs_ns_free(ns);
	castfs_scratch_fini(&scr);
	castfs_stats_free(st);
	castfs_views_fini(&vs);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

static bool listed(uint64_t dir_id, const char *name)
{
	struct castfs_dir *dir;
	bool found = false;

	ck_assert_int_eq(castfs_ns_opendir(ns, dir_id, &dir), 0);
	for (size_t i = 0; i < dir->n; i++)
		found |= strcmp(dir->ents[i].name, name) == 0;
	castfs_dir_free(dir);
	return found;
}

static int lookup(const char *name, uint64_t *id, struct stat *s)
{
	struct stat tmp;

	return castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID, name, id, s ? s : &tmp);
}

START_TEST(test_ns__root_lists_sources_views_and_control_dir)
{
	ck_assert(listed(CASTFS_NS_ROOT_ID, "a.safetensors"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "a.fp8.safetensors"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "a.bf16.safetensors"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "bad.safetensors"));
	ck_assert(!listed(CASTFS_NS_ROOT_ID, "bad.fp8.safetensors"));
	ck_assert(!listed(CASTFS_NS_ROOT_ID, "a.fp8_nan.safetensors"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "notes.txt"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "sub"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, "out"));
	ck_assert(!listed(CASTFS_NS_ROOT_ID, "fifo"));
	ck_assert(listed(CASTFS_NS_ROOT_ID, ".castfs"));
}
END_TEST

START_TEST(test_ns__listed_inode_is_the_lookup_id)
{
	struct castfs_dir *dir;
	size_t checked = 0;

	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	for (size_t i = 2; i < dir->n; i++) {
		uint64_t id;

		ck_assert_int_eq(lookup(dir->ents[i].name, &id, NULL), 0);
		ck_assert_msg(id == dir->ents[i].ino, "%s", dir->ents[i].name);
		checked++;
	}
	castfs_dir_free(dir);
	ck_assert_uint_ge(checked, 8);
}
END_TEST

START_TEST(test_ns__view_reads_equal_the_plan)
{
	struct castfs_file *f;
	struct stat s;
	uint64_t id;
	uint8_t buf[4096];
	ssize_t n;

	ck_assert_int_eq(lookup("a.fp8.safetensors", &id, &s), 0);
	ck_assert(S_ISREG(s.st_mode));
	ck_assert_uint_eq(s.st_mode & 0222, 0);
	ck_assert_int_eq(castfs_ns_open(ns, id, &f), 0);
	ck_assert(castfs_file_is_view(f));
	ck_assert(!castfs_file_direct_io(f));
	n = castfs_file_read(f, &scr, buf, sizeof(buf), 0);
	ck_assert_int_eq(n, s.st_size);
	/* 16 x 7 bf16 become 112 fp8 bytes at the end of the file. */
	ck_assert_int_gt(n, 112);
	ck_assert_int_eq(castfs_file_read(f, &scr, buf, 10, (uint64_t)n), 0);
	castfs_file_close(f);
}
END_TEST

START_TEST(test_ns__unlisted_views_resolve_unknown_do_not)
{
	uint64_t id;

	ck_assert_int_eq(lookup("a.fp8_nan.safetensors", &id, NULL), 0);
	ck_assert_int_eq(lookup("a.fp9.safetensors", &id, NULL), -ENOENT);
	ck_assert_int_eq(lookup("bad.fp8.safetensors", &id, NULL), -ENOENT);
	ck_assert_int_eq(lookup("nothere.fp8.safetensors", &id, NULL), -ENOENT);
	ck_assert_int_eq(lookup("fifo", &id, NULL), -ENOENT);
	ck_assert_int_eq(lookup(".safetensors", &id, NULL), -ENOENT);
}
END_TEST

START_TEST(test_ns__ids_stable_across_instances)
{
	static const char *const names[] = { "a.safetensors",
					     "a.fp8.safetensors", "sub",
					     "notes.txt", ".castfs" };
	struct castfs_ns *other = new_ns();

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		uint64_t a, b;
		struct stat s;

		ck_assert_int_eq(lookup(names[i], &a, NULL), 0);
		ck_assert_int_eq(castfs_ns_lookup(other, CASTFS_NS_ROOT_ID,
						  names[i], &b, &s),
				 0);
		ck_assert_uint_eq(a, b);
		ck_assert_uint_gt(a, CASTFS_NS_ROOT_ID);
	}
	castfs_ns_free(other);
}
END_TEST

START_TEST(test_ns__dot_and_dotdot)
{
	uint64_t sub, id;
	struct stat s;

	ck_assert_int_eq(lookup("sub", &sub, NULL), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, sub, ".", &id, &s), 0);
	ck_assert_uint_eq(id, sub);
	ck_assert_int_eq(castfs_ns_lookup(ns, sub, "..", &id, &s), 0);
	ck_assert_uint_eq(id, CASTFS_NS_ROOT_ID);
	ck_assert_int_eq(
		castfs_ns_lookup(ns, sub, "c.fp8.safetensors", &id, &s), 0);
	/* "." of a file is the file (the kernel asks it for NFS handles);
	 * ".." of a file and any other name in it are not. */
	ck_assert_int_eq(castfs_ns_lookup(ns, id, ".", &sub, &s), 0);
	ck_assert_uint_eq(sub, id);
	ck_assert_int_eq(castfs_ns_lookup(ns, id, "..", &sub, &s), -ENOTDIR);
	ck_assert_int_eq(castfs_ns_lookup(ns, id, "x", &sub, &s), -ENOTDIR);
}
END_TEST

START_TEST(test_ns__symlinks_shown_never_followed)
{
	char target[64];
	struct castfs_file *f;
	struct stat s;
	uint64_t id;

	ck_assert_int_eq(lookup("out", &id, &s), 0);
	ck_assert(S_ISLNK(s.st_mode));
	ck_assert_int_eq(castfs_ns_readlink(ns, id, target, sizeof(target)), 0);
	ck_assert_str_eq(target, "/etc");
	ck_assert_int_ne(castfs_ns_open(ns, id, &f), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, id, "passwd", &id, &s), -ENOTDIR);
}
END_TEST

static void rewrite_a(void)
{
	/* A different size: the identity changes whatever the clock. */
	static const uint64_t shape[] = { 8, 3 };
	struct tu_st *b = tu_st_new();
	uint8_t *buf;
	size_t len;

	tu_st_add(b, "w", "F32", 2, shape, NULL);
	buf = tu_st_build(b, &len);
	write_file("a.safetensors", buf, len);
	free(buf);
	tu_st_free(b);
}

START_TEST(test_ns__rewritten_source_goes_stale)
{
	uint64_t old_id, new_id;
	struct castfs_file *f;
	struct stat s;
	uint8_t buf[64];

	ck_assert_int_eq(lookup("a.fp8.safetensors", &old_id, NULL), 0);
	ck_assert_int_eq(castfs_ns_open(ns, old_id, &f), 0);
	rewrite_a();
	/* The open file never mixes versions: its reads fail. */
	ck_assert_int_eq(castfs_file_read(f, &scr, buf, sizeof(buf), 0), -EIO);
	castfs_file_close(f);
	ck_assert_int_eq(castfs_ns_getattr(ns, old_id, &s), -ESTALE);
	ck_assert_int_eq(castfs_ns_open(ns, old_id, &f), -ESTALE);
	ck_assert_int_eq(lookup("a.fp8.safetensors", &new_id, &s), 0);
	ck_assert_uint_ne(new_id, old_id);
	ck_assert_int_eq(castfs_ns_open(ns, new_id, &f), 0);
	ck_assert_int_gt(castfs_file_read(f, &scr, buf, sizeof(buf), 0), 0);
	castfs_file_close(f);
}
END_TEST

/* Listing offsets name the entry to go on after: in the listing that
 * handed them out, in one made again with an entry gone before it or
 * added, and for a gone entry (its position); 0 and old bare positions
 * (no hash) are positions. */
static struct castfs_dir *names_dir(char (*names)[3], size_t n,
				    struct castfs_dirent *ents)
{
	static struct castfs_dir d;

	for (size_t i = 0; i < n; i++)
		ents[i] = (struct castfs_dirent){ .name = names[i] };
	d = (struct castfs_dir){ .n = n, .ents = ents };
	return &d;
}

START_TEST(test_ns__dir_offsets_follow_names)
{
	static char was[][3] = { ".", "..", "a", "b", "c", "d", "e" };
	static char gone[][3] = { ".", "..", "b", "c", "d", "e" };
	static char added[][3] = { ".", "..", "z", "a", "b", "c", "d", "e" };
	struct castfs_dirent e1[8], e2[8];
	struct castfs_dir *d = names_dir(was, 7, e1), old = *d, *now;
	uint64_t off_c = castfs_dir_off(&old, 4),
		 off_a = castfs_dir_off(&old, 2);

	ck_assert_uint_gt(off_c, 0);
	ck_assert_uint_lt(off_c, (uint64_t)INT64_MAX);
	ck_assert_uint_eq(castfs_dir_seek(&old, 0), 0);
	ck_assert_uint_eq(castfs_dir_seek(&old, off_c), 5); /* then "d" */
	ck_assert_uint_eq(castfs_dir_seek(&old, castfs_dir_off(&old, 6)), 7);
	now = names_dir(gone, 6, e2);
	ck_assert_str_eq(now->ents[castfs_dir_seek(now, off_c)].name, "d");
	/* "a" gone: one before its position, so "b" is not skipped */
	ck_assert_str_eq(now->ents[castfs_dir_seek(now, off_a)].name, "b");
	now = names_dir(added, 8, e2);
	ck_assert_str_eq(now->ents[castfs_dir_seek(now, off_c)].name, "d");
	ck_assert_uint_eq(castfs_dir_seek(now, 3), 3); /* a bare position */
}
END_TEST

START_TEST(test_ns__rejected_listed_with_reason)
{
	struct castfs_file *f;
	uint64_t ctl, id;
	struct stat s;
	char buf[4096];
	ssize_t n;

	ck_assert(listed(CASTFS_NS_ROOT_ID, "a.safetensors")); /* scans */
	ck_assert_int_eq(lookup(".castfs", &ctl, NULL), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, ctl, "rejected", &id, &s), 0);
	ck_assert_int_eq(castfs_ns_open(ns, id, &f), 0);
	ck_assert(castfs_file_direct_io(f));
	n = castfs_file_read(f, &scr, buf, sizeof(buf) - 1, 0);
	ck_assert_int_gt(n, 0);
	buf[n] = '\0';
	ck_assert_msg(strstr(buf, "bad.safetensors"), "%s", buf);
	ck_assert_msg(!strstr(buf, "\"a.safetensors"), "%s", buf);
	castfs_file_close(f);
	ck_assert_uint_ge(castfs_stats_get(st, CASTFS_SCTR_HEADERS_REJECTED),
			  1);
}
END_TEST

START_TEST(test_ns__headers_parsed_once)
{
	uint64_t id;
	uint64_t before;

	ck_assert_int_eq(lookup("a.fp8.safetensors", &id, NULL), 0);
	before = castfs_stats_get(st, CASTFS_SCTR_HEADERS_PARSED);
	ck_assert(listed(CASTFS_NS_ROOT_ID, "a.bf16.safetensors"));
	ck_assert_int_eq(lookup("a.bf16.safetensors", &id, NULL), 0);
	ck_assert_int_eq(lookup("a.fp8.safetensors", &id, NULL), 0);
	/* Only bad.safetensors was new to the listing. */
	ck_assert_uint_le(castfs_stats_get(st, CASTFS_SCTR_HEADERS_PARSED),
			  before + 1);
}
END_TEST

/* ls -l stops probing a device after EOPNOTSUPP, not after ENODATA
 * (docs/MOUNTING.md, "Extended attributes"). */
START_TEST(test_ns__xattr_outside_user_is_not_supported)
{
	static const char *const others[] = { "security.selinux",
					      "system.posix_acl_access",
					      "system.posix_acl_default",
					      "trusted.x", "castfs.view" };
	char buf[64];
	uint64_t id;

	ck_assert_int_eq(lookup("a.fp8.safetensors", &id, NULL), 0);
	ck_assert_int_eq(castfs_ns_getxattr(ns, id, "user.castfs.view", buf,
					    sizeof(buf)),
			 3);
	ck_assert_mem_eq(buf, "fp8", 3);
	ck_assert_int_eq(castfs_ns_getxattr(ns, id, "user.nope", buf,
					    sizeof(buf)),
			 -ENODATA);
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
		ck_assert_int_eq(castfs_ns_getxattr(ns, id, others[i], buf,
						    sizeof(buf)),
				 -EOPNOTSUPP);
		ck_assert_int_eq(castfs_ns_getxattr(ns, CASTFS_NS_ROOT_ID,
						    others[i], NULL, 0),
				 -EOPNOTSUPP);
	}
}
END_TEST

START_TEST(test_ns__stats_histogram_of_read_sizes)
{
	static const size_t lens[] = { 1,      4096,	 4097,
				       131072, 1u << 20, (1u << 20) + 1 };
	char *json;

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		castfs_stats_read_size(st, lens[i]);
	json = castfs_stats_json(st, &vs);
	ck_assert_ptr_nonnull(json);
	ck_assert_ptr_nonnull(strstr(json, "\"4K\":\t2"));
	ck_assert_ptr_nonnull(strstr(json, "\"8K\":\t1"));
	ck_assert_ptr_nonnull(strstr(json, "\"128K\":\t1"));
	ck_assert_ptr_nonnull(strstr(json, "\"1M\":\t1"));
	ck_assert_ptr_nonnull(strstr(json, "\">1M\":\t1"));
	free(json);
}
END_TEST

/* NFS handles: the kernel asks LOOKUP(id, ".") for nodes it dropped. */
START_TEST(test_ns__forgotten_and_unknown_ids_resolve)
{
	static const char *const names[] = { "a.safetensors",
					     "a.fp8.safetensors", "notes.txt" };
	struct castfs_ns *other = new_ns();
	uint64_t id, sub, got, c;
	struct stat s;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		ck_assert_int_eq(lookup(names[i], &id, NULL), 0);
		castfs_ns_forget(ns, id, 1);
		/* Forgotten but kept: "." of a file works. */
		ck_assert_int_eq(castfs_ns_lookup(ns, id, ".", &got, &s), 0);
		ck_assert_uint_eq(got, id);
		ck_assert_uint_eq(s.st_ino, id);
		/* A daemon that never saw it finds it by searching. */
		ck_assert_int_eq(castfs_ns_lookup(other, id, ".", &got, &s), 0);
		ck_assert_uint_eq(got, id);
	}
	ck_assert_int_eq(lookup("sub", &sub, NULL), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, sub, "c.fp8.safetensors", &c, &s),
			 0);
	ck_assert_int_eq(castfs_ns_lookup(other, c, ".", &got, &s), 0);
	ck_assert_int_eq(castfs_ns_lookup(other, sub, "..", &got, &s), 0);
	ck_assert_uint_eq(got, CASTFS_NS_ROOT_ID);
	ck_assert_int_eq(castfs_ns_lookup(other, 0x1234567, ".", &got, &s),
			 -ESTALE);
	ck_assert_int_eq(castfs_ns_lookup(other, 0x1234567, "x", &got, &s),
			 -ESTALE);
	castfs_ns_free(other);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("ns");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_ns__root_lists_sources_views_and_control_dir);
	tcase_add_test(tc, test_ns__listed_inode_is_the_lookup_id);
	tcase_add_test(tc, test_ns__view_reads_equal_the_plan);
	tcase_add_test(tc, test_ns__unlisted_views_resolve_unknown_do_not);
	tcase_add_test(tc, test_ns__ids_stable_across_instances);
	tcase_add_test(tc, test_ns__dot_and_dotdot);
	tcase_add_test(tc, test_ns__symlinks_shown_never_followed);
	tcase_add_test(tc, test_ns__rewritten_source_goes_stale);
	tcase_add_test(tc, test_ns__dir_offsets_follow_names);
	tcase_add_test(tc, test_ns__rejected_listed_with_reason);
	tcase_add_test(tc, test_ns__headers_parsed_once);
	tcase_add_test(tc, test_ns__forgotten_and_unknown_ids_resolve);
	tcase_add_test(tc, test_ns__xattr_outside_user_is_not_supported);
	tcase_add_test(tc, test_ns__stats_histogram_of_read_sizes);
	suite_add_tcase(s, tc);
	return s;
}
