/* SPDX-License-Identifier: MIT */
/*
 * The rescan after lost change events (castfs_ns_rescan), in process: a
 * listed directory is compared with its snapshot and only new names and
 * names whose identity moved are reported; a snapshot too recent for the
 * loss, or none, reports every entry. The oracle is the test's own record
 * of what it changed on disk.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ns/ns.h"
#include "ns/stats.h"
#include "source/zst.h"
#include "testutil.h"
#include "unit_membuf.h"
#include "view/view.h"
#include "unit.h"

static char root[64];
static struct castfs_views vs;
static struct castfs_stats *st;
static struct castfs_ns *ns;
static char *seen[4096];
static size_t nseen;
static int listings_changed;

static void record(void *ctx, uint64_t parent, const char *name)
{
	(void)ctx;
	(void)parent;
	if (nseen < 4096)
		seen[nseen++] = strdup(name);
}

static void listing(void *ctx, uint64_t dir)
{
	(void)ctx;
	listings_changed += dir == CASTFS_NS_ROOT_ID;
}

static bool reported(const char *name)
{
	for (size_t i = 0; i < nseen; i++) {
		if (strcmp(seen[i], name) == 0)
			return true;
	}
	return false;
}

static void forget_reports(void)
{
	for (size_t i = 0; i < nseen; i++)
		free(seen[i]);
	nseen = 0;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void put(const char *name, const char *text)
{
	tu_write_file(root, name, text, strlen(text));
}

/* A one-tensor checkpoint packed (seekable zstd) as @name, its values
 * all @tag: another tag, another pack of the same size. */
static void put_pack(const char *name, uint8_t tag)
{
	struct tu_st *b = tu_st_new();
	uint64_t shape[] = { 4 };
	uint8_t data[16];
	struct castfs_mem_reader mr;
	struct membuf m = { 0 };
	struct castfs_writer w = { mem_write, &m };
	struct castfs_zst_pack_opts o = { .frame_size = 4096, .level = 1 };
	uint8_t *file;
	size_t len;

	memset(data, tag, sizeof(data));
	tu_st_add(b, "w", "F32", 1, shape, data);
	file = tu_st_build(b, &len);
	castfs_mem_reader_init(&mr, file, len);
	ck_assert_int_eq(castfs_zst_pack(&mr.r, len, &o, &w, NULL), 0);
	tu_write_file(root, name, m.p, m.n);
	free(m.p);
	free(file);
	tu_st_free(b);
}

/* Look @name up in the root, so that a node holds it. */
static void hold(const char *name)
{
	struct stat sb;
	uint64_t id;

	ck_assert_int_eq(
		castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID, name, &id, &sb), 0);
}

static void setup(void)
{
	/* A successor reports every name: nothing here is looked up. */
	struct castfs_ns_opts o = { .views = &vs,
				    .successor = true,
				    .listing_changed = listing };
	struct castfs_diag d = { { 0 } };
	char path[128];

	strcpy(root, "/tmp/castfs-rescan-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	put("a.txt", "aaaa");
	put("b.txt", "bbbb");
	put("c.txt", "cccc");
	snprintf(path, sizeof(path), "%s/d", root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
	ck_assert_int_eq(castfs_stats_new(vs.n, &st), 0);
	o.source = root;
	o.stats = st;
	ck_assert_int_eq(castfs_ns_new(&o, &ns, &d), 0);
	nseen = 0;
	listings_changed = 0;
}

static void teardown(void)
{
	char cmd[128];

	castfs_ns_free(ns);
	castfs_stats_free(st);
	castfs_views_fini(&vs);
	forget_reports();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

static void list_root(void)
{
	struct castfs_dir *dir;

	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	castfs_dir_free(dir);
	listings_changed = 0;
}

static void rescan(int64_t since)
{
	char top[] = "";
	char *dirs[] = { top, NULL };
	atomic_bool stop = false;

	castfs_ns_rescan(ns, dirs, 2, since, &stop, record, NULL);
}

START_TEST(test_ns_rescan__reports_only_what_changed)
{
	char path[128];
	struct stat old;

	list_root();
	/* b: same size, mtime put back: only its ctime moves. */
	snprintf(path, sizeof(path), "%s/b.txt", root);
	ck_assert_int_eq(stat(path, &old), 0);
	usleep(20000);
	put("b.txt", "BBBB");
	ck_assert_int_eq(
		utimensat(AT_FDCWD, path,
			  (struct timespec[]){ old.st_atim, old.st_mtim }, 0),
		0);
	put("e.txt", "new");
	snprintf(path, sizeof(path), "%s/c.txt", root);
	ck_assert_int_eq(unlink(path), 0);
	/* d's own mtime moves with its entries: not a change of d. */
	put("d/x", "x");
	rescan(now_ns());
	ck_assert(reported("b.txt"));
	ck_assert(reported("e.txt"));
	ck_assert(!reported("a.txt"));
	ck_assert(!reported("d"));
	ck_assert(!reported("c.txt")); /* gone, and no node held it */
	ck_assert_int_ge(listings_changed, 1); /* c.txt left the listing */
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_REPORTED), 2);
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_COMPARED), 4);
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_WHOLE), 0);
	/* The rescan's snapshot is the next one's. */
	forget_reports();
	rescan(now_ns());
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_REPORTED), 2);
}
END_TEST

START_TEST(test_ns_rescan__untrusted_or_missing_snapshot_reports_all)
{
	int64_t before = now_ns();

	rescan(now_ns()); /* never listed */
	ck_assert(reported("a.txt") && reported("b.txt") && reported("d"));
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_WHOLE), 1);
	forget_reports();
	list_root();
	rescan(before); /* listed after the loss began */
	ck_assert(reported("a.txt") && reported("c.txt"));
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_WHOLE), 2);
}
END_TEST

START_TEST(test_ns_rescan__every_held_name_gone_is_reported)
{
	char name[32], path[128], *want[1024];
	size_t nwant;

	/* Three held files, ~77 candidate names each, tested against the
	 * seen-name set 128 at a time: the last batch must go out too. The
	 * names a change event of each file reports are the ones to go. */
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "h%d.safetensors", i);
		put(name, "hhhh");
	}
	list_root();
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "h%d.safetensors", i);
		hold(name);
		castfs_ns_invalidate(ns, name, record, NULL);
	}
	ck_assert_uint_gt(nseen, 128);
	ck_assert_uint_le(nseen, 1024);
	for (nwant = 0; nwant < nseen; nwant++)
		want[nwant] = strdup(seen[nwant]);
	forget_reports();
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/h%d.safetensors", root, i);
		ck_assert_int_eq(unlink(path), 0);
	}
	rescan(now_ns());
	for (size_t i = 0; i < nwant; i++) {
		ck_assert_msg(reported(want[i]), "%s", want[i]);
		free(want[i]);
	}
}
END_TEST

START_TEST(test_ns_rescan__pack_vouches_for_its_shown_name)
{
	put_pack("p.safetensors.zst", 1);
	put_pack("q.safetensors.zst", 2);
	list_root();
	hold("p.safetensors"); /* the name a pack is looked up by */
	hold("q.safetensors");
	usleep(20000);
	put_pack("q.safetensors.zst", 3);
	rescan(now_ns());
	ck_assert(!reported("p.safetensors")); /* unchanged */
	ck_assert(!reported("p.safetensors.zst"));
	ck_assert(reported("q.safetensors")); /* through its pack */
	/* q's pack once: its shown name rides on it. */
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_REPORTED), 1);
}
END_TEST

START_TEST(test_ns_rescan__shown_name_moves_to_another_pack)
{
	char path[128];

	/* A standard pack is looked up before a grouped one of the same
	 * checkpoint; with it gone, the name shows the grouped one, whose
	 * own entry did not change. */
	put_pack("p.safetensors.zst", 1);
	put_pack("p.safetensors.zstg", 1);
	list_root();
	hold("p.safetensors");
	snprintf(path, sizeof(path), "%s/p.safetensors.zst", root);
	ck_assert_int_eq(unlink(path), 0);
	rescan(now_ns());
	ck_assert(reported("p.safetensors"));
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_RESCAN_REPORTED), 1);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("ns_rescan");
	TCase *tc = tcase_create("rescan");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_ns_rescan__reports_only_what_changed);
	tcase_add_test(
		tc, test_ns_rescan__untrusted_or_missing_snapshot_reports_all);
	tcase_add_test(tc, test_ns_rescan__every_held_name_gone_is_reported);
	tcase_add_test(tc, test_ns_rescan__pack_vouches_for_its_shown_name);
	tcase_add_test(tc, test_ns_rescan__shown_name_moves_to_another_pack);
	suite_add_tcase(s, tc);
	return s;
}
