/* SPDX-License-Identifier: MIT */
/*
 * The daemon's read path without FUSE (not a test): castfs_plan_read() over
 * a whole view in 1 MiB requests, as one worker thread serves them, beside
 * plain pread of the source. What this reaches is the most the daemon can
 * give FUSE; scripts/bench compares it with the mount. Rates are per CPU
 * second of the reading thread.
 *
 *   bench_plan_read [-b BYTES] [-r REPEATS] [-c CACHE_MB] [-m] FILE [VIEW...]
 *
 * -m reads the file through mappings, as the daemon does under a lease
 * (castfs_fd_reader_map; nothing guards against the file shrinking).
 *
 * VIEW "-" is the file itself (pread). Default views: - fp8 nf4. A FILE
 * ending in .zst or .zstg is a pack, read through its seek table and a
 * frame cache of CACHE_MB (default: the daemon's), as the mount reads it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plan/plan.h"
#include "format/st_header.h"
#include "source/zst.h"
#include "view/view.h"

/*
 * CPU time of this thread: on a shared machine, wall time measures the
 * neighbours as much as castfs; CPU seconds per byte do not.
 */
static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Seconds to read all of @plan (or the source when NULL) once. */
static double pass(const struct castfs_plan *plan,
		   const struct castfs_reader *src, uint64_t size,
		   struct castfs_scratch *s, void *buf, size_t req)
{
	double t0 = now();

	for (uint64_t off = 0; off < size; off += req) {
		size_t n = size - off < req ? (size_t)(size - off) : req;
		ssize_t got;

		if (plan)
			got = castfs_plan_read(plan, src, s, buf, n, off);
		else
			got = castfs_reader_read(src, buf, n, off) ?:
								     (ssize_t)n;

		if (got < 0) {
			fprintf(stderr, "read at %llu: %s\n",
				(unsigned long long)off, strerror((int)-got));
			return -1;
		}
	}
	return now() - t0;
}

static int bench_view(const char *name, const struct castfs_views *vs,
		      const struct castfs_header *h,
		      const struct castfs_reader *src, uint64_t src_size,
		      size_t req, int repeats)
{
	const struct castfs_view *v = NULL;
	struct castfs_plan *plan = NULL;
	struct castfs_diag d = { { 0 } };
	struct castfs_scratch s = { 0 };
	double t[64];
	uint64_t size = src_size;
	void *buf = malloc(req);
	int rc = -1;

	if (strcmp(name, "-") != 0) {
		v = castfs_views_find(vs, name, strlen(name));
		if (!v || castfs_view_plan(v, h, &plan, &d)) {
			printf("%-8s n/a (%s)\n", name,
			       d.msg[0] ? d.msg : "no such view");
			free(buf);
			return 0;
		}
		size = plan->size;
	}
	if (!buf || castfs_scratch_init(&s))
		goto out;
	if (repeats > 64)
		repeats = 64;
	for (int i = 0; i < repeats; i++) {
		t[i] = pass(plan, src, size, &s, buf, req);
		if (t[i] < 0)
			goto out;
	}
	qsort(t, (size_t)repeats, sizeof(t[0]), cmp_double);
	printf("%-8s %8.2f GB/s out %8.2f GB/s source per CPU second "
	       "(%.2f GB, median of %d)\n",
	       name, (double)size / t[repeats / 2] / 1e9,
	       (double)src_size / t[repeats / 2] / 1e9, (double)size / 1e9,
	       repeats);
	rc = 0;
out:
	castfs_scratch_fini(&s);
	castfs_plan_free(plan);
	free(buf);
	return rc;
}

/* A pack read as the mount reads it: seek table, frame cache, zst reader. */
struct packed {
	size_t cache;
	struct castfs_zcache *zc;
	struct castfs_zst_index *zix;
	struct castfs_zst_reader zr;
};

static bool is_pack(const char *path)
{
	size_t n = strlen(path);

	return (n > 4 && !strcmp(path + n - 4, ".zst")) ||
	       (n > 5 && !strcmp(path + n - 5, ".zstg"));
}

static int packed_open(struct packed *pk, const struct castfs_reader *raw,
		       const struct castfs_reader **src, uint64_t *size,
		       struct castfs_diag *d)
{
	int rc = castfs_zcache_new(pk->cache, &pk->zc);

	if (!rc)
		rc = castfs_zst_index_read(raw, *size, pk->zc, &pk->zix, d);
	if (rc)
		return rc;
	castfs_zst_reader_init(&pk->zr, pk->zix, raw);
	*src = &pk->zr.r;
	*size = castfs_zst_index_size(pk->zix);
	return 0;
}

static void packed_report(const struct packed *pk)
{
	struct castfs_zcache_stats st;

	castfs_zcache_stats_get(pk->zc, &st);
	printf("frame cache %zu MiB: %llu hits, %llu frames decoded, "
	       "%.2f GB decoded\n",
	       pk->cache >> 20, (unsigned long long)st.hits,
	       (unsigned long long)st.misses, (double)st.bytes_decoded / 1e9);
}

int main(int argc, char **argv)
{
	static const char *const defaults[] = { "-", "fp8", "nf4" };
	struct castfs_views vs = { 0 };
	struct castfs_header *h = NULL;
	struct castfs_diag d = { { 0 } };
	struct castfs_fd_reader fr;
	struct packed pk = { .cache = CASTFS_ZCACHE_DEFAULT };
	const struct castfs_reader *src;
	size_t req = 1u << 20;
	int repeats = 5, c, fd, rc = 1;
	bool map = false;
	uint64_t size;
	struct stat st;

	while ((c = getopt(argc, argv, "b:r:c:m")) != -1) {
		if (c == 'm')
			map = true;
		else if (c == 'b')
			req = strtoul(optarg, NULL, 0);
		else if (c == 'r')
			repeats = atoi(optarg);
		else if (c == 'c')
			pk.cache = strtoul(optarg, NULL, 0) << 20;
		else
			goto usage;
	}
	if (optind >= argc || req == 0 || repeats < 1)
		goto usage;
	fd = open(argv[optind], O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		perror(argv[optind]);
		return 1;
	}
	castfs_fd_reader_init(&fr, fd);
	if (map)
		castfs_fd_reader_map(&fr);
	src = &fr.r;
	size = (uint64_t)st.st_size;
	if (is_pack(argv[optind]) &&
	    packed_open(&pk, &fr.r, &src, &size, &d) != 0) {
		fprintf(stderr, "%s: %s\n", argv[optind], d.msg);
		goto out;
	}
	if (castfs_views_builtin(&vs) ||
	    castfs_header_read(src, size, &h, &d)) {
		fprintf(stderr, "%s: %s\n", argv[optind], d.msg);
		goto out;
	}
	rc = 0;
	if (optind + 1 == argc) {
		for (size_t i = 0; i < 3 && !rc; i++)
			rc = bench_view(defaults[i], &vs, h, src, size, req,
					repeats);
	}
	for (int i = optind + 1; i < argc && !rc; i++)
		rc = bench_view(argv[i], &vs, h, src, size, req, repeats);
	if (pk.zc)
		packed_report(&pk);
out:
	castfs_header_free(h);
	castfs_zst_index_free(pk.zix);
	castfs_zcache_free(pk.zc);
	castfs_views_fini(&vs);
	close(fd);
	return rc ? 1 : 0;
usage:
	fprintf(stderr,
		"usage: %s [-b BYTES] [-r REPEATS] [-c CACHE_MB] [-m] FILE "
		"[VIEW...]\n",
		argv[0]);
	return 2;
}
