/* SPDX-License-Identifier: MIT */
/*
 * Kernel micro-benchmark (not a test): GB/s of every conversion kernel on
 * every ISA this CPU runs, next to memcpy of the same source buffer.
 *
 *   bench_kernels [-s BYTES] [-t SECONDS] [-r REPEATS] [-a] [PAIR...]
 *
 * BYTES is the source bytes per call (default 2 MiB, the read scratch);
 * each figure is the median of REPEATS runs of SECONDS each. PAIR is
 * "BF16>F8_E4M3" (add ":sat" for the saturating kernel); without -a and
 * PAIRs only the pairs views use are measured.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/convert.h"

struct opts {
	size_t bytes;
	double seconds;
	int repeats;
	int all;
};

struct pair {
	enum castfs_dtype from, to;
	unsigned flags;
};

/* The casts the built-in views use, bf16/f32/f16 sources first. */
static const struct pair view_pairs[] = {
	{ CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, CASTFS_CVT_SATURATE },
	{ CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, 0 },
	{ CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E5M2, 0 },
	{ CASTFS_DTYPE_BF16, CASTFS_DTYPE_F16, 0 },
	{ CASTFS_DTYPE_BF16, CASTFS_DTYPE_F32, 0 },
	{ CASTFS_DTYPE_F32, CASTFS_DTYPE_F8_E4M3, CASTFS_CVT_SATURATE },
	{ CASTFS_DTYPE_F32, CASTFS_DTYPE_BF16, 0 },
	{ CASTFS_DTYPE_F32, CASTFS_DTYPE_F16, 0 },
	{ CASTFS_DTYPE_F16, CASTFS_DTYPE_F8_E4M3, CASTFS_CVT_SATURATE },
	{ CASTFS_DTYPE_F16, CASTFS_DTYPE_BF16, 0 },
	{ CASTFS_DTYPE_F16, CASTFS_DTYPE_F32, 0 },
	{ CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_BF16, 0 },
};

static const enum castfs_dtype castable[] = {
	CASTFS_DTYPE_F64,  CASTFS_DTYPE_F32,	 CASTFS_DTYPE_F16,
	CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F8_E5M2,
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t size_of(enum castfs_dtype dt)
{
	return castfs_dtype_bits(dt) / 8;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Calls per second of @fn over @sec seconds; the median of @rep runs. */
static double rate(void (*fn)(void *ctx), void *ctx, const struct opts *o)
{
	double r[64];
	int rep = o->repeats < 64 ? o->repeats : 64;

	for (int i = 0; i < rep; i++) {
		double t0 = now(), t;
		long calls = 0;

		do {
			fn(ctx);
			calls++;
			t = now();
		} while (t - t0 < o->seconds);
		r[i] = (double)calls / (t - t0);
	}
	qsort(r, (size_t)rep, sizeof(r[0]), cmp_double);
	return r[rep / 2];
}

struct run {
	castfs_convert_fn fn;
	void *dst;
	const void *src;
	size_t n; /* elements, or bytes for memcpy */
};

static void run_convert(void *ctx)
{
	struct run *r = ctx;

	r->fn(r->dst, r->src, r->n);
	__asm__ volatile("" ::: "memory"); /* keep every call */
}

static void run_memcpy(void *ctx)
{
	struct run *r = ctx;

	memcpy(r->dst, r->src, r->n);
	__asm__ volatile("" ::: "memory");
}

/* Weights as checkpoints hold them: normal, sigma 0.02, some outliers. */
static void fill_f32(float *f, size_t n)
{
	uint64_t s = 0x9e3779b97f4a7c15u;

	for (size_t i = 0; i < n; i += 2) {
		double u1, u2, m;

		s = s * 6364136223846793005u + 1442695040888963407u;
		u1 = ((double)(s >> 11) + 1) / 9007199254740993.0;
		s = s * 6364136223846793005u + 1442695040888963407u;
		u2 = (double)(s >> 11) / 9007199254740992.0;
		m = sqrt(-2 * log(u1)) * 0.02;
		f[i] = (float)(m * cos(2 * M_PI * u2));
		if (i + 1 < n)
			f[i + 1] = (float)(m * sin(2 * M_PI * u2));
		if (i % 4099 == 0)
			f[i] *= 1000; /* outliers exercise overflow paths */
	}
}

/* @n source elements of @dt made from normal weights. */
static void *make_source(enum castfs_dtype dt, size_t n)
{
	float *f = malloc(n * sizeof(float));
	void *out = malloc(n * 8);
	castfs_convert_fn to;

	if (!f || !out)
		goto fail;
	fill_f32(f, n);
	if (dt == CASTFS_DTYPE_F64) {
		for (size_t i = 0; i < n; i++)
			((double *)out)[i] = f[i];
	} else {
		to = castfs_convert_get_isa(CASTFS_ISA_SCALAR,
					    CASTFS_DTYPE_F32, dt,
					    CASTFS_CVT_SATURATE);
		if (!to)
			to = castfs_convert_get_isa(CASTFS_ISA_SCALAR,
						    CASTFS_DTYPE_F32, dt, 0);
		if (!to)
			goto fail;
		to(out, f, n);
	}
	free(f);
	return out;
fail:
	free(f);
	free(out);
	return NULL;
}

static void pair_name(const struct pair *p, char *buf, size_t len)
{
	snprintf(buf, len, "%s>%s%s", castfs_dtype_name(p->from),
		 castfs_dtype_name(p->to),
		 (p->flags & CASTFS_CVT_SATURATE) ? ":sat" : "");
}

/* One row per ISA for @p; returns 0, or -1 when buffers cannot be had. */
static int bench_pair(const struct pair *p, const struct opts *o, double mc)
{
	size_t n = o->bytes / size_of(p->from);
	void *src = make_source(p->from, n), *dst = malloc(n * 8);
	char name[64];

	if (!src || !dst) {
		free(src);
		free(dst);
		return -1;
	}
	pair_name(p, name, sizeof(name));
	for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
		struct run r = { .dst = dst, .src = src, .n = n };
		double calls, in_gbs, out_gbs;

		if (!castfs_isa_available((enum castfs_isa)isa))
			continue;
		r.fn = castfs_convert_get_isa((enum castfs_isa)isa, p->from,
					      p->to, p->flags);
		if (!r.fn)
			continue;
		calls = rate(run_convert, &r, o);
		in_gbs = calls * (double)(n * size_of(p->from)) / 1e9;
		out_gbs = calls * (double)(n * size_of(p->to)) / 1e9;
		printf("%-22s %-7s %8.2f %8.2f %8.2f %7.2f\n", name,
		       castfs_isa_name((enum castfs_isa)isa), in_gbs, out_gbs,
		       calls * (double)n / 1e9, in_gbs / mc);
	}
	free(src);
	free(dst);
	return 0;
}

static int parse_pair(const char *s, struct pair *p)
{
	char buf[64], *gt, *colon;

	snprintf(buf, sizeof(buf), "%s", s);
	colon = strchr(buf, ':');
	p->flags = 0;
	if (colon) {
		if (strcmp(colon, ":sat") != 0)
			return -1;
		*colon = '\0';
		p->flags = CASTFS_CVT_SATURATE;
	}
	gt = strchr(buf, '>');
	if (!gt)
		return -1;
	*gt = '\0';
	p->from = castfs_dtype_from_name(buf, strlen(buf));
	p->to = castfs_dtype_from_name(gt + 1, strlen(gt + 1));
	if (!castfs_convert_get_isa(CASTFS_ISA_SCALAR, p->from, p->to,
				    p->flags))
		return -1;
	return 0;
}

static double memcpy_gbs(const struct opts *o)
{
	void *a = malloc(o->bytes), *b = malloc(o->bytes);
	struct run r = { .dst = b, .src = a, .n = o->bytes };
	double gbs = 0;

	if (a && b) {
		memset(a, 1, o->bytes);
		memset(b, 2, o->bytes);
		gbs = rate(run_memcpy, &r, o) * (double)o->bytes / 1e9;
	}
	free(a);
	free(b);
	return gbs;
}

static int bench_all(const struct opts *o, double mc)
{
	size_t nc = sizeof(castable) / sizeof(castable[0]);

	for (size_t i = 0; i < nc; i++) {
		for (size_t j = 0; j < nc; j++) {
			for (unsigned sat = 0; sat < 2; sat++) {
				struct pair p = { castable[i], castable[j],
						  sat ? CASTFS_CVT_SATURATE
						      : 0 };

				if (!castfs_convert_get_isa(CASTFS_ISA_SCALAR,
							    p.from, p.to,
							    p.flags))
					continue;
				if (bench_pair(&p, o, mc))
					return -1;
			}
		}
	}
	return 0;
}

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [-s BYTES] [-t SECONDS] [-r REPEATS] [-a] "
		"[FROM>TO[:sat]...]\n",
		prog);
}

int main(int argc, char **argv)
{
	struct opts o = { .bytes = 2u << 20, .seconds = 0.2, .repeats = 5 };
	double mc;
	int c, rc = 0;

	while ((c = getopt(argc, argv, "s:t:r:ah")) != -1) {
		switch (c) {
		case 's':
			o.bytes = strtoull(optarg, NULL, 0);
			break;
		case 't':
			o.seconds = strtod(optarg, NULL);
			break;
		case 'r':
			o.repeats = atoi(optarg);
			break;
		case 'a':
			o.all = 1;
			break;
		default:
			usage(argv[0]);
			return c == 'h' ? 0 : 2;
		}
	}
	if (o.bytes < 64 || o.repeats < 1 || o.seconds <= 0) {
		usage(argv[0]);
		return 2;
	}
	mc = memcpy_gbs(&o);
	printf("# %zu source bytes per call, median of %d x %.2fs; "
	       "selected ISA: %s\n",
	       o.bytes, o.repeats, o.seconds,
	       castfs_isa_name(castfs_isa_selected()));
	printf("%-22s %-7s %8s %8s %8s %7s\n", "kernel", "isa", "in_GB/s",
	       "out_GB/s", "Gelem/s", "xmemcpy");
	printf("%-22s %-7s %8.2f %8.2f %8s %7.2f\n", "memcpy", "-", mc, mc,
	       "-", 1.0);
	for (int i = optind; i < argc && !rc; i++) {
		struct pair p;

		if (parse_pair(argv[i], &p)) {
			fprintf(stderr, "unknown or unsupported pair: %s\n",
				argv[i]);
			return 2;
		}
		rc = bench_pair(&p, &o, mc);
	}
	if (optind == argc && o.all)
		rc = bench_all(&o, mc);
	for (size_t i = 0; optind == argc && !o.all && !rc &&
			   i < sizeof(view_pairs) / sizeof(view_pairs[0]);
	     i++)
		rc = bench_pair(&view_pairs[i], &o, mc);
	if (rc)
		fprintf(stderr, "out of memory\n");
	return rc ? 1 : 0;
}
