/* SPDX-License-Identifier: MIT */
/*
 * Namespace bounds, in process (no FUSE): a transient failure (EMFILE) is
 * never kept as a rejection, concurrent first lookups of one checkpoint
 * share one parse, a view that cannot be built is remembered (not
 * rebuilt per lookup) and no longer listed, the node table grows with
 * its nodes, the checkpoint cache keeps to its budget and lets go of
 * what the kernel forgot, and the set of held paths is exact at any size.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ns/ns.h"
#include "ns/ns_ckpt_internal.h" /* ns_ckpt_get: the parse, without a stat */
#include "ns/ns_internal.h" /* ns_node_intern: nodes without files */
#include "ns/stats.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

static char root[64];
static struct castfs_views vs;
static struct castfs_stats *st;
static struct castfs_ns *ns;
static int view_fail_logs; /* log lines about a view that failed */
static int root_listing_changed; /* castfs_ns_opts.listing_changed(root) */

static void count_listing(void *ctx, uint64_t dir)
{
	(void)ctx;
	if (dir == 1) /* FUSE_ROOT_ID */
		root_listing_changed++;
}

static void count_log(void *ctx, const char *msg)
{
	(void)ctx;
	if (strstr(msg, ": view nf4: "))
		view_fail_logs++;
}

/* A checkpoint of @n BF16 matrices [1, 64] of zeros, named
 * t000000.weight... (the name of a linear layer's weight: what
 * bitsandbytes views quantise), written here in one pass: the test
 * builder grows its arrays one element at a time, which a sanitizer
 * build makes quadratic at these sizes. */
static void write_checkpoint(const char *name, size_t n)
{
	size_t cap = 64 + n * 96, len = 8, pad;
	char *buf = malloc(cap + n * 128 + 8);
	uint64_t hlen;

	ck_assert_ptr_nonnull(buf);
	len += (size_t)sprintf(buf + len, "{");
	for (size_t i = 0; i < n; i++)
		len += (size_t)sprintf(buf + len,
				       "%s\"t%06zu.weight\":{\"dtype\":"
				       "\"BF16\",\"shape\":[1,64],"
				       "\"data_offsets\":[%zu,%zu]}",
				       i ? "," : "", i, i * 128, i * 128 + 128);
	len += (size_t)sprintf(buf + len, "}");
	for (pad = (8 - (len - 8) % 8) % 8; pad; pad--)
		buf[len++] = ' ';
	ck_assert_uint_le(len, cap);
	hlen = len - 8;
	for (int i = 0; i < 8; i++)
		buf[i] = (char)(hlen >> (8 * i));
	memset(buf + len, 0, n * 128);
	tu_write_file(root, name, buf, len + n * 128);
	free(buf);
}

static void setup(void)
{
	struct castfs_ns_opts o = { .source = root,
				    .views = &vs,
				    .log = count_log,
				    .listing_changed = count_listing };
	struct castfs_diag d = { { 0 } };

	strcpy(root, "/tmp/castfs-nsb-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
	ck_assert_int_eq(castfs_stats_new(vs.n, &st), 0);
	o.stats = st;
	write_checkpoint("a.safetensors", 4);
	ck_assert_int_eq(castfs_ns_new(&o, &ns, &d), 0);
}

static void teardown(void)
{
	char cmd[128];

	castfs_ns_free(ns);
	castfs_stats_free(st);
	castfs_views_fini(&vs);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

static int lookup(const char *name)
{
	struct stat s;
	uint64_t id;

	return castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID, name, &id, &s);
}

static bool listed(const char *name)
{
	struct castfs_dir *dir;
	bool found = false;

	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	for (size_t i = 0; i < dir->n; i++)
		found |= strcmp(dir->ents[i].name, name) == 0;
	castfs_dir_free(dir);
	return found;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

START_TEST(test_ns_bounds__emfile_is_retried_not_rejected)
{
	struct ns_ckpt *ck;
	struct stat s;
	char path[128];
	int fds[65536], n = 0;

	snprintf(path, sizeof(path), "%s/a.safetensors", root);
	ck_assert_int_eq(stat(path, &s), 0);
	/* Every descriptor taken: the parse cannot open the file. */
	while (n < 65536 && (fds[n] = dup(0)) >= 0)
		n++;
	ck_assert_int_eq(errno, EMFILE);
	ck_assert_int_eq(ns_ckpt_get(ns, "a.safetensors", &s, &ck), 0);
	ck_assert_ptr_null(ck->h);
	ck_assert_int_eq(ck->err, -EMFILE);
	ns_ckpt_put(ns, ck);
	while (n > 0)
		close(fds[--n]);
	/* The next lookup parses again, and the file is not rejected. */
	ck_assert_int_eq(ns_ckpt_get(ns, "a.safetensors", &s, &ck), 0);
	ck_assert_ptr_nonnull(ck->h);
	ns_ckpt_put(ns, ck);
	ck_assert_int_eq(lookup("a.bf16.safetensors"), 0);
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_HEADERS_REJECTED),
			  0);
}
END_TEST

#define HERD 8

static pthread_barrier_t herd_start;

static void *herd_lookup(void *arg)
{
	pthread_barrier_wait(&herd_start);
	*(int *)arg = lookup("big.bf16.safetensors");
	return NULL;
}

START_TEST(test_ns_bounds__concurrent_first_lookups_share_one_parse)
{
	pthread_t t[HERD];
	int rc[HERD];
	uint64_t before;

	/* A header that takes a while to parse (about 2 MB of JSON), so
	 * that the lookups overlap. */
	write_checkpoint("big.safetensors", 30000);
	before = castfs_stats_get(st, CASTFS_SCTR_HEADERS_PARSED);
	pthread_barrier_init(&herd_start, NULL, HERD);
	for (int i = 0; i < HERD; i++)
		ck_assert_int_eq(
			pthread_create(&t[i], NULL, herd_lookup, &rc[i]), 0);
	for (int i = 0; i < HERD; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(rc[i], 0);
	}
	pthread_barrier_destroy(&herd_start);
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_HEADERS_PARSED),
			  before + 1);
}
END_TEST

START_TEST(test_ns_bounds__failed_view_kept_and_not_listed)
{
	double t0, first, second;

	/* 200,000 tensors: the nf4 view's header (about 545 bytes per
	 * tensor, 109 MB) passes the 100 MB cap (E2BIG); the source's own
	 * header (16 MB) does not. Its name then answers -ENOENT, like
	 * any name the listing does not show (issue 17), not -E2BIG. */
	write_checkpoint("huge.safetensors", 200000);
	ck_assert(listed("huge.nf4.safetensors"));
	root_listing_changed = 0;
	t0 = now_s();
	ck_assert_int_eq(lookup("huge.nf4.safetensors"), -ENOENT);
	first = now_s() - t0;
	/* The listing that showed it changed: a kernel-cached one must go. */
	ck_assert_int_eq(root_listing_changed, 1);
	t0 = now_s();
	ck_assert_int_eq(lookup("huge.nf4.safetensors"), -ENOENT);
	second = now_s() - t0;
	/* Remembered, not rebuilt: orders of magnitude faster. */
	ck_assert_msg(second < first / 10, "first %.3f s, again %.3f s", first,
		      second);
	ck_assert_int_eq(view_fail_logs, 1); /* logged once, when found */
	ck_assert_int_eq(root_listing_changed, 1); /* told once too */
	ck_assert(!listed("huge.nf4.safetensors"));
	ck_assert(listed("huge.bf16.safetensors"));
	ck_assert_int_eq(lookup("huge.fp8.safetensors"), 0);
}
END_TEST

/* The mount again, its checkpoint cache given @budget bytes. */
static void remount(size_t budget)
{
	struct castfs_ns_opts o = {
		.source = root, .views = &vs, .stats = st, .cache_bytes = budget
	};
	struct castfs_diag d = { { 0 } };

	castfs_ns_free(ns);
	ck_assert_int_eq(castfs_ns_new(&o, &ns, &d), 0);
}

static uint64_t parsed(void)
{
	return castfs_stats_get(st, CASTFS_SCTR_HEADERS_PARSED);
}

START_TEST(test_ns_bounds__cache_budget_and_forget)
{
	struct stat s;
	uint64_t id, p;

	write_checkpoint("b.safetensors", 4);
	remount(1); /* every entry is past a budget of one byte */
	p = parsed();
	ck_assert(listed("a.bf16.safetensors"));
	ck_assert_uint_eq(parsed(), p + 2);
	/* Used by nothing, only the most recent entry is kept: a second
	 * listing parses again. */
	ck_assert(listed("b.bf16.safetensors"));
	ck_assert_uint_gt(parsed(), p + 2);
	/* A node the kernel holds keeps its entry, whatever the budget. */
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
					  "a.bf16.safetensors", &id, &s),
			 0);
	ck_assert(listed("b.bf16.safetensors"));
	p = parsed();
	ck_assert_int_eq(lookup("a.bf16.safetensors"), 0); /* nlookup 2 */
	ck_assert_uint_eq(parsed(), p);
	/* Forgotten: evicted at once, and parsed again when looked up. */
	castfs_ns_forget(ns, id, 2);
	ck_assert_int_eq(lookup("a.bf16.safetensors"), 0);
	ck_assert_uint_eq(parsed(), p + 1);
	/* A budget the cache fits in: nothing parsed twice. */
	remount(0);
	p = parsed();
	ck_assert(listed("a.bf16.safetensors"));
	ck_assert(listed("b.bf16.safetensors"));
	ck_assert_int_eq(lookup("b.bf16.safetensors"), 0);
	ck_assert_uint_eq(parsed(), p + 2);
}
END_TEST

/* Entries in the checkpoint cache. */
static size_t cached(void)
{
	size_t n, bytes;

	ns_ckpt_usage(ns, &n, &bytes);
	return n;
}

/*
 * The kernel sends a file's RELEASE in the background and reads FORGETs
 * first: the forget of a source's last node often finds its entry still
 * held by the file. The release then evicts it, unless a lookup showed
 * the source again meanwhile (before, the entry stayed until another came
 * along: a CI failure of test_packed_memory).
 */
START_TEST(test_ns_bounds__forget_before_release)
{
	struct ns_ckpt *ck;
	struct stat s, src;
	uint64_t id;
	char path[128];

	remount(0); /* a budget it fits in: only the forget evicts */
	snprintf(path, sizeof(path), "%s/a.safetensors", root);
	ck_assert_int_eq(stat(path, &src), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
					  "a.bf16.safetensors", &id, &s),
			 0);
	/* What an open file of the view holds. */
	ck_assert_int_eq(ns_ckpt_get(ns, "a.safetensors", &src, &ck), 0);
	castfs_ns_forget(ns, id, 1);
	ck_assert_uint_eq(cached(), 1);
	ns_ckpt_put(ns, ck); /* the release */
	ck_assert_uint_eq(cached(), 0);
	/* Looked up again between the forget and the release: kept. */
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
					  "a.bf16.safetensors", &id, &s),
			 0);
	ck_assert_int_eq(ns_ckpt_get(ns, "a.safetensors", &src, &ck), 0);
	castfs_ns_forget(ns, id, 1);
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
					  "a.bf16.safetensors", &id, &s),
			 0);
	ns_ckpt_put(ns, ck);
	ck_assert_uint_eq(cached(), 1);
	/* Its mark gone with the lookup: the next forget evicts at once. */
	castfs_ns_forget(ns, id, 1);
	ck_assert_uint_eq(cached(), 0);
}
END_TEST

/* Look up view @view of checkpoints c0000..c@n, each held (nlookup). */
static void lookup_views(int n, const char *view)
{
	char name[48];

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "c%04d.%s.safetensors", i, view);
		ck_assert_int_eq(lookup(name), 0);
	}
}

/*
 * Past its budget with every entry held by a node the kernel keeps (what
 * `ls -l` of a big directory leaves), a trim that finds nothing to evict
 * holds the next ones off until the cache grows by a sixteenth of its
 * budget: requests do not each walk 64 held entries (they did, three
 * times per view looked up).
 */
START_TEST(test_ns_bounds__held_cache_not_walked_per_request)
{
	char name[32];
	uint64_t before, walked, p;
	int n = 400;

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "c%04d.safetensors", i);
		write_checkpoint(name, 1);
	}
	remount((size_t)64 << 10);
	p = parsed();
	lookup_views(n, "bf16");
	ck_assert_uint_gt(atomic_load(&ns->ck_bytes), ns->ck_budget);
	/* The same names again: plans cached, the cache no larger, two
	 * puts per lookup over the budget. */
	before = castfs_stats_get(st, CASTFS_SCTR_CACHE_TRIM_SCANNED);
	lookup_views(n, "bf16");
	walked = castfs_stats_get(st, CASTFS_SCTR_CACHE_TRIM_SCANNED) - before;
	ck_assert_uint_le(walked, 2 * 64);
	/* Held entries are never evicted: each was parsed once. */
	ck_assert_uint_eq(parsed(), p + (uint64_t)n);
}
END_TEST

START_TEST(test_ns_bounds__node_table_grows)
{
	struct castfs_dir *dir;
	uint64_t *ids;
	char name[32];
	size_t n = 0;

	/* 1,500 checkpoints and their views: about 15,000 nodes, past the
	 * point where the table doubles its 4,096 buckets. */
	for (int i = 0; i < 1500; i++) {
		snprintf(name, sizeof(name), "c%04d.safetensors", i);
		write_checkpoint(name, 1);
	}
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	ck_assert_uint_gt(dir->n, 10000);
	ids = calloc(dir->n, sizeof(*ids));
	ck_assert_ptr_nonnull(ids);
	for (size_t i = 2; i < dir->n; i++) {
		struct stat s;

		ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
						  dir->ents[i].name, &ids[i],
						  &s),
				 0);
		ck_assert_uint_eq(ids[i], dir->ents[i].ino);
		n++;
	}
	/* Every node is still found after the table grew under them. */
	for (size_t i = 2; i < dir->n; i++) {
		struct stat s;

		ck_assert_int_eq(castfs_ns_getattr(ns, ids[i], &s), 0);
		ck_assert_uint_eq(s.st_ino, ids[i]);
	}
	ck_assert_uint_gt(n, 2 * 4096);
	free(ids);
	castfs_dir_free(dir);
}
END_TEST

START_TEST(test_ns_bounds__checkpoint_cache_grows)
{
	struct castfs_dir *dir;
	char name[32];
	uint64_t p;
	int n = 9000;

	/* 9,000 checkpoints listed: 9,000 entries, past twice the 4,096
	 * buckets each chain (by identity, by path) starts with. */
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "c%04d.safetensors", i);
		write_checkpoint(name, 1);
	}
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	castfs_dir_free(dir);
	ck_assert_uint_ge(ns->ck_count, (size_t)n);
	ck_assert_uint_ge(ns->ck_nbuckets, ns->ck_count / 2);
	/* Every entry is found again by identity after the rehash (a cache
	 * hit, no parse) and dropped by path. */
	p = parsed();
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "c%04d.safetensors", i);
		ck_assert_int_eq(lookup(name), 0);
	}
	ck_assert_uint_eq(parsed(), p);
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "c%04d.safetensors", i);
		ns_ckpt_drop_path(ns, name);
	}
	ck_assert_uint_le(ns->ck_count, 1); /* a.safetensors */
}
END_TEST

/* Node @i of a path of its own, held by the kernel (nlookup 1); no file
 * behind it: the set of held paths is fed by the node table alone. */
static uint64_t hold_node(size_t i, ino_t ino)
{
	struct ns_node d = { .kind = NS_FILE, .parent = CASTFS_NS_ROOT_ID };
	char p[32];
	uint64_t id;

	snprintf(p, sizeof(p), "held/p%06zu", i);
	d.path = strdup(p);
	ck_assert_ptr_nonnull(d.path);
	d.st.st_mode = S_IFREG | 0644;
	d.st.st_ino = ino;
	ck_assert_int_eq(ns_node_intern(ns, &d, &id), 0);
	return id;
}

static uint64_t hold_path(size_t i)
{
	return hold_node(i, (ino_t)(1000000 + i));
}

static bool path_held(size_t i)
{
	char p[32];

	snprintf(p, sizeof(p), "held/p%06zu", i);
	return ns_node_path_live(ns, p, strlen(p));
}

/*
 * 100,000 held paths, past the 65,536 counters main kept per hash slot
 * (where ~78 % of released paths still looked held, so their checkpoint
 * entries were never evicted): a released path is told apart from every
 * held one, and its forget hands it back for eviction.
 */
START_TEST(test_ns_bounds__held_paths_exact_past_65536)
{
	enum { N = 100000 };
	uint64_t *ids = calloc(N, sizeof(*ids)), other;
	size_t idle = 0;
	char *path;

	ck_assert_ptr_nonnull(ids);
	for (size_t i = 0; i < N; i++)
		ids[i] = hold_path(i);
	for (size_t i = 0; i < N; i += 4) {
		path = ns_node_forget(ns, ids[i], 1);
		idle += path != NULL;
		free(path);
	}
	ck_assert_uint_eq(idle, N / 4);
	for (size_t i = 0; i < N; i++)
		ck_assert_msg(path_held(i) == (i % 4 != 0), "path %zu", i);
	/* Held twice, released once: still held. */
	ck_assert_uint_eq(hold_path(1), ids[1]);
	free(ns_node_forget(ns, ids[1], 1));
	ck_assert(path_held(1));
	/* Two nodes of one path (a view beside its file, another identity
	 * after a rename): idle only when the second goes. */
	other = hold_node(1, 1);
	ck_assert_ptr_null(ns_node_forget(ns, other, 1));
	ck_assert(path_held(1));
	other = hold_node(1, 1);
	ck_assert_ptr_null(ns_node_forget(ns, ids[1], 1));
	path = ns_node_forget(ns, other, 1);
	ck_assert_str_eq(path, "held/p000001");
	free(path);
	ck_assert(!path_held(1));
	ids[1] = hold_path(1);
	/* All released (the set shrinks), then one held again. */
	for (size_t i = 0; i < N; i++)
		free(ns_node_forget(ns, ids[i], 1));
	for (size_t i = 0; i < N; i++)
		ck_assert(!path_held(i));
	hold_path(7);
	ck_assert(path_held(7) && !path_held(8));
	/* A prefix is asked by length (a pack's shown name): exactly. */
	ck_assert(ns_node_path_live(ns, "held/p000007.zst", 12));
	ck_assert(!ns_node_path_live(ns, "held/p000007.zst", 11));
	ck_assert(!ns_node_path_live(ns, "held/p000007.zst", 13));
	free(ids);
}
END_TEST

/*
 * The node table's buckets tag their chains (a bit per node's hash) so
 * that a new id is found missing without a walk: past a sweep of
 * forgotten nodes, which takes nodes out of chains and tags them again,
 * every held node is still found (held, and interned again as itself,
 * not as a second node), every forgotten one is not.
 */
START_TEST(test_ns_bounds__node_tags_after_sweep)
{
	enum { N = 50000 };
	uint64_t *ids = calloc(N, sizeof(*ids));
	size_t n, forgotten, n2, forgotten2;

	ck_assert_ptr_nonnull(ids);
	for (size_t i = 0; i < N; i++)
		ids[i] = hold_path(i);
	/* 37,500 forgets: past NS_FORGOTTEN_MAX, so a sweep frees them. */
	for (size_t i = 0; i < N; i++) {
		if (i % 4)
			free(ns_node_forget(ns, ids[i], 1));
	}
	ns_node_count(ns, &n, &forgotten);
	ck_assert_uint_lt(n, N); /* swept */
	ck_assert_uint_eq(n - forgotten, N / 4 + 1); /* and the root */
	for (size_t i = 0; i < N; i++)
		ck_assert_msg(castfs_ns_held(ns, ids[i]) == (i % 4 == 0),
			      "node %zu", i);
	for (size_t i = 0; i < N; i += 4)
		ck_assert_uint_eq(hold_path(i), ids[i]);
	ns_node_count(ns, &n2, &forgotten2);
	ck_assert_uint_eq(n2, n);
	ck_assert_uint_eq(forgotten2, forgotten);
	free(ids);
}
END_TEST

static bool dir_has(const struct castfs_dir *d, const char *name)
{
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->ents[i].name, name) == 0)
			return true;
	return false;
}

/* Open handles share one listing of a source directory; once the
 * directory's times move (a change no watcher reported: none runs here)
 * the next open lists again, and the old handles keep theirs. */
START_TEST(test_ns_bounds__listing_shared_until_the_directory_changes)
{
	struct castfs_dir *a, *b, *c;
	struct timespec ts = { 0, 20000000 }; /* past a coarse ctime tick */

	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &a), 0);
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &b), 0);
	ck_assert_ptr_eq(a, b);
	ck_assert(!dir_has(a, "b.safetensors"));
	nanosleep(&ts, NULL);
	write_checkpoint("b.safetensors", 1);
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &c), 0);
	ck_assert_ptr_ne(c, a);
	ck_assert(dir_has(c, "b.safetensors"));
	ck_assert(!dir_has(a, "b.safetensors"));
	castfs_dir_free(a);
	castfs_dir_free(b);
	castfs_dir_free(c);
	/* The last handle gone, the next open lists again. */
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &a), 0);
	ck_assert(dir_has(a, "b.safetensors"));
	castfs_dir_free(a);
}
END_TEST

/*
 * READDIRPLUS looks up a listing's entries through
 * castfs_ns_lookup_listed(): the same node and attributes as a lookup
 * by name, but a name the listing derived (a view, a tensor tree) is not
 * looked for among the source's entries, where the listing found none:
 * a real file of that name made since is the next listing's. A real file
 * listed under a view's name stays the real file.
 */
START_TEST(test_ns_bounds__listed_lookups_as_lookups)
{
	static const char *derived[] = { "a.fp8.safetensors",
					 "a.nf4.safetensors",
					 "a.safetensors.tensors", ".castfs" };
	static const char junk[] = "not a view";
	struct castfs_dir *dir;
	struct stat s1, s2;
	uint64_t id1, id2;
	size_t nderived = 0;

	tu_write_file(root, "a.fp16.safetensors", junk, sizeof(junk));
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	for (size_t i = 2; i < dir->n; i++) {
		const struct castfs_dirent *de = &dir->ents[i];

		ck_assert_int_eq(castfs_ns_lookup_listed(ns, CASTFS_NS_ROOT_ID,
							 de, &id1, &s1),
				 0);
		ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
						  de->name, &id2, &s2),
				 0);
		ck_assert_uint_eq(id1, id2);
		ck_assert_uint_eq(id1, de->ino);
		ck_assert_int_eq(s1.st_size, s2.st_size);
		ck_assert_int_eq(s1.st_mode, s2.st_mode);
		nderived += de->derived;
		for (size_t k = 0; k < CASTFS_ARRAY_SIZE(derived); k++) {
			if (!strcmp(de->name, derived[k]))
				ck_assert_msg(de->derived, "%s", de->name);
		}
		if (!strcmp(de->name, "a.safetensors") ||
		    !strcmp(de->name, "a.fp16.safetensors")) {
			ck_assert_msg(!de->derived, "%s", de->name);
			ck_assert(S_ISREG(s1.st_mode));
		}
		if (!strcmp(de->name, "a.fp16.safetensors"))
			ck_assert_int_eq(s1.st_size, sizeof(junk));
	}
	ck_assert_uint_ge(nderived, CASTFS_ARRAY_SIZE(derived));
	/* A real file now has a listed view's name: the listing's entry is
	 * still the view, a lookup by name finds the file. */
	tu_write_file(root, "a.nf4.safetensors", junk, sizeof(junk));
	for (size_t i = 2; i < dir->n; i++) {
		const struct castfs_dirent *de = &dir->ents[i];

		if (strcmp(de->name, "a.nf4.safetensors"))
			continue;
		ck_assert_int_eq(castfs_ns_lookup_listed(ns, CASTFS_NS_ROOT_ID,
							 de, &id1, &s1),
				 0);
		ck_assert_uint_eq(id1, de->ino);
		ck_assert_int_ne(s1.st_size, sizeof(junk));
	}
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
					  "a.nf4.safetensors", &id2, &s2),
			 0);
	ck_assert_int_eq(s2.st_size, sizeof(junk));
	castfs_dir_free(dir);
}
END_TEST

/*
 * castfs_ns_lookup_ahead() builds what the lookups of a listing's entries
 * will need (each view's plan) and makes no node: the lookups that follow
 * build nothing more and answer as lookups without it do.
 */
START_TEST(test_ns_bounds__lookup_ahead_builds_no_node)
{
	struct castfs_dir *dir;
	size_t n0, f0, n1, f1, views = 0;
	uint64_t built;

	for (int i = 0; i < 20; i++) {
		char name[32];

		snprintf(name, sizeof(name), "c%02d.safetensors", i);
		write_checkpoint(name, 1);
	}
	ck_assert_int_eq(castfs_ns_opendir(ns, CASTFS_NS_ROOT_ID, &dir), 0);
	ns_node_count(ns, &n0, &f0);
	built = castfs_stats_get(st, CASTFS_SCTR_PLANS_BUILT);
	castfs_ns_lookup_ahead(ns, CASTFS_NS_ROOT_ID, dir->ents, dir->n);
	ns_node_count(ns, &n1, &f1);
	ck_assert_uint_eq(n1, n0);
	ck_assert_uint_eq(f1, f0);
	for (size_t i = 0; i < dir->n; i++) {
		const char *dot = strchr(dir->ents[i].name, '.');

		/* c00.fp8.safetensors: a single-file view */
		views += dot && strchr(dot + 1, '.') &&
			 dir->ents[i].name[0] == 'c' &&
			 strstr(dot, ".safetensors") &&
			 !strstr(dot, "tensors.");
	}
	ck_assert_uint_ge(views, 20 * 5);
	ck_assert_uint_ge(castfs_stats_get(st, CASTFS_SCTR_PLANS_BUILT),
			  built + views);
	built = castfs_stats_get(st, CASTFS_SCTR_PLANS_BUILT);
	for (size_t i = 2; i < dir->n; i++) {
		struct stat s;
		uint64_t id;

		ck_assert_int_eq(castfs_ns_lookup_listed(ns, CASTFS_NS_ROOT_ID,
							 &dir->ents[i], &id,
							 &s),
				 0);
		ck_assert_uint_eq(id, dir->ents[i].ino);
	}
	ck_assert_uint_eq(castfs_stats_get(st, CASTFS_SCTR_PLANS_BUILT), built);
	ns_node_count(ns, &n1, &f1);
	ck_assert_uint_eq(n1, n0 + dir->n - 2);
	castfs_dir_free(dir);
}
END_TEST

/* The text of a new handle of /.castfs/rejected, and the handle. */
static char *ctl_rejected(struct castfs_file **out)
{
	struct castfs_scratch scr;
	uint64_t dir, id;
	struct stat s;
	char *buf = calloc(1, 1 << 16);
	ssize_t n;

	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(castfs_scratch_init(&scr), 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID, ".castfs",
					  &dir, &s),
			 0);
	ck_assert_int_eq(castfs_ns_lookup(ns, dir, "rejected", &id, &s), 0);
	ck_assert_int_eq(castfs_ns_open(ns, id, out), 0);
	n = castfs_file_read(*out, &scr, buf, (1 << 16) - 1, 0);
	ck_assert_int_gt(n, 0);
	castfs_scratch_fini(&scr);
	return buf;
}

static uint64_t walks(void)
{
	return castfs_stats_get(st, CASTFS_SCTR_CTL_WALKS);
}

static void no_inval(void *ctx, uint64_t parent, const char *name)
{
	(void)ctx;
	(void)parent;
	(void)name;
}

/* /.castfs/rejected walks the tree once for every open until the tree
 * changes: a name added where the walk read (no watcher runs here: by
 * the directory's times), or a change the watcher reports (an in-place
 * rewrite, which moves no directory's times). Old handles keep theirs. */
START_TEST(test_ns_bounds__rejected_shared_until_the_tree_changes)
{
	/* A header whose tensor is not an object. */
	static const char bad[] = "\x08\0\0\0\0\0\0\0{\"w\":1} ";
	struct timespec ts = { 0, 20000000 }; /* past a coarse ctime tick */
	struct castfs_file *f[4];
	char *t[4];
	uint64_t w0 = walks();
	char sub[96];

	snprintf(sub, sizeof(sub), "%s/d", root);
	ck_assert_int_eq(mkdir(sub, 0755), 0);
	t[0] = ctl_rejected(&f[0]);
	t[1] = ctl_rejected(&f[1]);
	ck_assert_uint_eq(walks() - w0, 1);
	ck_assert_str_eq(t[0], t[1]);
	ck_assert_ptr_null(strstr(t[0], "bad"));
	nanosleep(&ts, NULL);
	tu_write_file(root, "d/bad.safetensors", bad, sizeof(bad) - 1);
	t[2] = ctl_rejected(&f[2]);
	ck_assert_ptr_nonnull(strstr(t[2], "d/bad.safetensors"));
	/* Rewritten in place: the directory's times stay, the watcher
	 * reports it. */
	tu_write_file(root, "a.safetensors", bad, sizeof(bad) - 1);
	castfs_file_close(f[0]);
	free(t[0]);
	t[0] = ctl_rejected(&f[0]);
	ck_assert_str_eq(t[0], t[2]);
	castfs_ns_invalidate(ns, "a.safetensors", no_inval, NULL);
	t[3] = ctl_rejected(&f[3]);
	ck_assert_ptr_nonnull(strstr(t[3], "\"a.safetensors\""));
	ck_assert_ptr_nonnull(strstr(t[3], "d/bad.safetensors"));
	ck_assert_uint_eq(walks() - w0, 3);
	for (int i = 0; i < 4; i++) {
		castfs_file_close(f[i]);
		free(t[i]);
	}
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("ns_bounds");
	TCase *tc = tcase_create("bounds");

	tcase_add_checked_fixture(tc, setup, teardown);
	/* Sanitizer builds on a loaded 2-core machine need the room. */
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_ns_bounds__emfile_is_retried_not_rejected);
	tcase_add_test(
		tc, test_ns_bounds__concurrent_first_lookups_share_one_parse);
	tcase_add_test(tc, test_ns_bounds__failed_view_kept_and_not_listed);
	tcase_add_test(tc, test_ns_bounds__node_table_grows);
	tcase_add_test(tc, test_ns_bounds__checkpoint_cache_grows);
	tcase_add_test(tc, test_ns_bounds__cache_budget_and_forget);
	tcase_add_test(tc, test_ns_bounds__forget_before_release);
	tcase_add_test(tc, test_ns_bounds__held_cache_not_walked_per_request);
	tcase_add_test(tc, test_ns_bounds__held_paths_exact_past_65536);
	tcase_add_test(tc, test_ns_bounds__node_tags_after_sweep);
	tcase_add_test(tc, test_ns_bounds__listed_lookups_as_lookups);
	tcase_add_test(tc, test_ns_bounds__lookup_ahead_builds_no_node);
	tcase_add_test(
		tc, test_ns_bounds__listing_shared_until_the_directory_changes);
	tcase_add_test(tc,
		       test_ns_bounds__rejected_shared_until_the_tree_changes);
	suite_add_tcase(s, tc);
	return s;
}
