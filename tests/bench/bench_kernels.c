/* SPDX-License-Identifier: MIT */
/*
 * Kernel micro-benchmark (not a test): GB/s of every conversion kernel on
 * every ISA this CPU runs, next to memcpy of the same source buffer.
 *
 *   bench_kernels [-s BYTES] [-t SECONDS] [-r REPEATS] [-a] [PAIR...]
 *
 * BYTES is the source bytes per call (default 2 MiB, the read scratch);
 * each figure is the median of REPEATS runs of SECONDS of CPU time each. PAIR
 * is "BF16>F8_E4M3" (add ":sat" for the saturating kernel); without -a and
 * PAIRs only the pairs views use are measured, then the quantiser kernels
 * (-q: only those): 4-bit codes of BF16 and F32 blocks of 64 (absmax
 * included), block absmax, int8 codes, and the double quantisation of
 * block absmax values (GB/s of the absmax values read); then (-c: only
 * those) the scaled-fp8 loops of compressed-tensors and ComfyUI: E4M3
 * codes of BF16 / F16 bytes and of float32, row absmax, and the GGUF
 * Q8_0 / Q4_0 quantisers. The planes kernels (BF16>F8_E4M3 of a grouped
 * pack's frames) run with the view pairs and with -c.
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
#include "quant/quant.h"
#include "quant/quant_ct.h"
#include "quant/quant_gguf.h"

struct opts {
	size_t bytes;
	double seconds;
	int repeats;
	int all;
	int quant_only;
	int ct_only;
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

/* CPU time of this thread: on a shared machine wall time would measure
 * the neighbours too. */
static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
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
		to = castfs_convert_get_isa(CASTFS_ISA_SCALAR, CASTFS_DTYPE_F32,
					    dt, CASTFS_CVT_SATURATE);
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

/* ---- the planes kernels (a grouped pack's bf16 frames) ---- */

struct prun {
	castfs_convert_planes_fn fn;
	void *dst;
	const uint8_t *sm, *ex;
	size_t n;
};

static void run_planes(void *ctx)
{
	struct prun *r = ctx;

	r->fn(r->dst, r->sm, r->ex, r->n);
	__asm__ volatile("" ::: "memory");
}

/* BF16>F8_E4M3 from the two planes, one row per ISA with a kernel of its
 * own; GB/s of the bf16 elements' 2 bytes. */
static int bench_planes(const struct opts *o, double mc)
{
	size_t n = o->bytes / 2;
	uint8_t *bf = make_source(CASTFS_DTYPE_BF16, n);
	uint8_t *sm = malloc(n), *ex = malloc(n), *dst = malloc(n);

	if (!bf || !sm || !ex || !dst) {
		free(bf);
		free(sm);
		free(ex);
		free(dst);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		uint16_t v = (uint16_t)(bf[2 * i] | bf[2 * i + 1] << 8);

		sm[i] = (uint8_t)(((v >> 8) & 0x80u) | (v & 0x7fu));
		ex[i] = (uint8_t)(v >> 7);
	}
	for (unsigned sat = 0; sat < 2; sat++) {
		for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
			struct prun r = {
				.dst = dst, .sm = sm, .ex = ex, .n = n
			};
			double calls, gbs;

			r.fn = castfs_convert_planes_get_isa(
				(enum castfs_isa)isa, CASTFS_DTYPE_F8_E4M3,
				sat ? CASTFS_CVT_SATURATE : 0);
			if (!r.fn)
				continue;
			calls = rate(run_planes, &r, o);
			gbs = calls * (double)(2 * n) / 1e9;
			printf("%-22s %-7s %8.2f %8.2f %8.2f %7.2f\n",
			       sat ? "planes>F8_E4M3:sat" : "planes>F8_E4M3",
			       castfs_isa_name((enum castfs_isa)isa), gbs,
			       gbs / 2, calls * (double)n / 1e9, gbs / mc);
		}
	}
	free(bf);
	free(sm);
	free(ex);
	free(dst);
	return 0;
}

/* ---- quantisers ---- */

enum qkind {
	Q_NF4_BF16,
	Q_NF4_F32,
	Q_ABSMAX_BF16,
	Q_ABSMAX_F32,
	Q_I8_F32,
	Q_DOUBLE,
	Q_NKINDS
};

static const char *const qnames[Q_NKINDS] = {
	[Q_NF4_BF16] = "nf4 BF16 (bs 64)",
	[Q_NF4_F32] = "nf4 F32 (bs 64)",
	[Q_ABSMAX_BF16] = "absmax BF16 (bs 64)",
	[Q_ABSMAX_F32] = "absmax F32 (bs 64)",
	[Q_I8_F32] = "int8 F32",
	[Q_DOUBLE] = "double-quant F32",
};

struct qrun {
	const struct castfs_quant_kernels *k;
	enum qkind kind;
	void *dst;
	const void *src;
	size_t n; /* elements */
};

static void run_quant(void *ctx)
{
	struct qrun *r = ctx;

	switch (r->kind) {
	case Q_NF4_BF16:
		r->k->q4_16(r->dst, NULL, r->src, r->n, 64, CASTFS_Q_NF4,
			    false);
		break;
	case Q_NF4_F32:
		r->k->q4(r->dst, r->src, r->n, 64, CASTFS_Q_NF4);
		break;
	case Q_ABSMAX_BF16:
		r->k->absmax16(r->dst, r->src, r->n, 64, false);
		break;
	case Q_ABSMAX_F32:
		r->k->absmax(r->dst, r->src, r->n, 64);
		break;
	case Q_I8_F32:
		r->k->i8(r->dst, r->src, r->n, 127.0f / 0.08f);
		break;
	case Q_DOUBLE:
		r->k->q8(r->dst, r->src, r->n, 0.05f, 1.0f / 0.04f);
		break;
	case Q_NKINDS:
		break;
	}
	__asm__ volatile("" ::: "memory");
}

static int bench_quant(const struct opts *o, double mc)
{
	size_t nf = o->bytes / 4, nb = o->bytes / 2;
	void *bf = make_source(CASTFS_DTYPE_BF16, nb);
	void *f32 = make_source(CASTFS_DTYPE_F32, nf);
	void *dst = malloc(o->bytes);
	float *amax = f32;

	if (!bf || !f32 || !dst) {
		free(bf);
		free(f32);
		free(dst);
		return -1;
	}
	/* Double quantisation reads block absmax: positive, near 0.05. */
	for (size_t i = 0; i < nf; i++)
		amax[i] = 0.03f + fabsf(amax[i]);
	for (int kind = 0; kind < Q_NKINDS; kind++) {
		bool is16 = kind == Q_NF4_BF16 || kind == Q_ABSMAX_BF16;
		size_t n = is16 ? nb : nf;

		for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
			struct qrun r = { .kind = (enum qkind)kind,
					  .dst = dst,
					  .src = is16 ? bf : f32,
					  .n = n };
			double calls, gbs;

			r.k = castfs_quant_kernels_isa((enum castfs_isa)isa);
			if (!r.k)
				continue;
			calls = rate(run_quant, &r, o);
			gbs = calls * (double)o->bytes / 1e9;
			printf("%-22s %-7s %8.2f %8s %8.2f %7.2f\n",
			       qnames[kind],
			       castfs_isa_name((enum castfs_isa)isa), gbs, "-",
			       calls * (double)n / 1e9, gbs / mc);
		}
	}
	free(bf);
	free(f32);
	free(dst);
	return 0;
}

/* ---- scaled-fp8 loops (compressed-tensors, ComfyUI) ---- */

enum ckind {
	C_CODES16_BF16,
	C_CODES16_F16,
	C_CODES_F32,
	C_COMFY_F32,
	C_ABSMAX16_BF16,
	C_ABSMAX_F32,
	C_NKINDS
};

static const char *const cnames[C_NKINDS] = {
	[C_CODES16_BF16] = "ct codes BF16",
	[C_CODES16_F16] = "ct codes F16",
	[C_CODES_F32] = "ct codes F32 (bf16)",
	[C_COMFY_F32] = "comfy codes F32 (bf16)",
	[C_ABSMAX16_BF16] = "ct absmax BF16",
	[C_ABSMAX_F32] = "ct absmax F32",
};

struct crun {
	const struct castfs_ct_kernels *k;
	enum ckind kind;
	void *dst;
	const void *src;
	size_t n; /* elements */
	float out;
};

static void run_ct(void *ctx)
{
	struct crun *r = ctx;
	const float scale = 0x1p-12f; /* a BF16 / F16 value, ~0.02 / 448 */

	switch (r->kind) {
	case C_CODES16_BF16:
		r->k->f8_codes16(r->dst, r->src, r->n, scale,
				 CASTFS_DTYPE_BF16);
		break;
	case C_CODES16_F16:
		r->k->f8_codes16(r->dst, r->src, r->n, scale, CASTFS_DTYPE_F16);
		break;
	case C_CODES_F32:
		r->k->f8_codes(r->dst, r->src, r->n, scale, CASTFS_DTYPE_BF16);
		break;
	case C_COMFY_F32:
		r->k->comfy_codes(r->dst, r->src, r->n, 1.0f / scale,
				  CASTFS_DTYPE_BF16);
		break;
	case C_ABSMAX16_BF16:
		r->out = r->k->absmax16(r->src, r->n, false);
		break;
	case C_ABSMAX_F32:
		r->out = r->k->absmax(r->src, r->n);
		break;
	case C_NKINDS:
		break;
	}
	__asm__ volatile("" ::: "memory");
}

static const void *ct_source(enum ckind kind, const void *bf, const void *f16,
			     const void *f32)
{
	if (kind == C_CODES16_BF16 || kind == C_ABSMAX16_BF16)
		return bf;
	return kind == C_CODES16_F16 ? f16 : f32;
}

/* One row per kind and ISA; GB/s of source bytes read. */
static int bench_ct(const struct opts *o, double mc)
{
	size_t nf = o->bytes / 4, nb = o->bytes / 2;
	void *bf = make_source(CASTFS_DTYPE_BF16, nb);
	void *f16 = make_source(CASTFS_DTYPE_F16, nb);
	void *f32 = make_source(CASTFS_DTYPE_F32, nf);
	void *dst = malloc(nb);
	int rc = -1;

	if (!bf || !f16 || !f32 || !dst)
		goto out;
	for (int kind = 0; kind < C_NKINDS; kind++) {
		const void *src = ct_source((enum ckind)kind, bf, f16, f32);
		size_t n = src == f32 ? nf : nb;

		for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
			struct crun r = { .kind = (enum ckind)kind,
					  .dst = dst,
					  .src = src,
					  .n = n };
			double calls, gbs;

			r.k = castfs_ct_kernels_isa((enum castfs_isa)isa);
			if (!r.k)
				continue;
			calls = rate(run_ct, &r, o);
			gbs = calls * (double)o->bytes / 1e9;
			printf("%-22s %-7s %8.2f %8s %8.2f %7.2f\n",
			       cnames[kind],
			       castfs_isa_name((enum castfs_isa)isa), gbs, "-",
			       calls * (double)n / 1e9, gbs / mc);
		}
	}
	rc = 0;
out:
	free(bf);
	free(f16);
	free(f32);
	free(dst);
	return rc;
}

/* ---- GGUF Q8_0 / Q4_0 ---- */

struct grun {
	const struct castfs_gguf_kernels *k;
	bool q4, f32;
	void *dst;
	const void *src;
	size_t nblocks;
};

static void run_gguf(void *ctx)
{
	struct grun *r = ctx;

	if (r->f32 && r->q4)
		r->k->q4_0(r->dst, r->src, r->nblocks);
	else if (r->f32)
		r->k->q8_0(r->dst, r->src, r->nblocks);
	else if (r->q4)
		r->k->q4_0_16(r->dst, r->src, r->nblocks, false);
	else
		r->k->q8_0_16(r->dst, r->src, r->nblocks, false);
	__asm__ volatile("" ::: "memory");
}

/* Q8_0 and Q4_0 of BF16 bytes and of float32, one row per ISA; GB/s of
 * source bytes read. */
static int bench_gguf(const struct opts *o, double mc)
{
	static const char *const names[4] = { "q8_0 BF16", "q4_0 BF16",
					      "q8_0 F32", "q4_0 F32" };
	size_t nb = o->bytes / 2, nf = o->bytes / 4;
	void *bf = make_source(CASTFS_DTYPE_BF16, nb);
	void *f32 = make_source(CASTFS_DTYPE_F32, nf);
	void *dst = malloc(nb + nb / 8);

	if (!bf || !f32 || !dst) {
		free(bf);
		free(f32);
		free(dst);
		return -1;
	}
	for (int kind = 0; kind < 4; kind++) {
		for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
			struct grun r = { .q4 = kind & 1,
					  .f32 = kind >= 2,
					  .dst = dst,
					  .src = kind >= 2 ? f32 : bf };
			size_t n = kind >= 2 ? nf : nb;
			double calls, gbs;

			r.nblocks = n / CASTFS_GGUF_QK;
			r.k = castfs_gguf_kernels_isa((enum castfs_isa)isa);
			if (!r.k)
				continue;
			calls = rate(run_gguf, &r, o);
			gbs = calls * (double)o->bytes / 1e9;
			printf("%-22s %-7s %8.2f %8s %8.2f %7.2f\n",
			       names[kind],
			       castfs_isa_name((enum castfs_isa)isa), gbs, "-",
			       calls * (double)n / 1e9, gbs / mc);
		}
	}
	free(bf);
	free(f32);
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
						  sat ? CASTFS_CVT_SATURATE :
							0 };

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
		"usage: %s [-s BYTES] [-t SECONDS] [-r REPEATS] [-a|-q|-c] "
		"[FROM>TO[:sat]...]\n",
		prog);
}

int main(int argc, char **argv)
{
	struct opts o = { .bytes = 2u << 20, .seconds = 0.2, .repeats = 5 };
	double mc;
	int c, rc = 0;

	while ((c = getopt(argc, argv, "s:t:r:aqch")) != -1) {
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
		case 'q':
			o.quant_only = 1;
			break;
		case 'c':
			o.ct_only = 1;
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
	printf("# %zu source bytes per call, median of %d x %.2f CPU s; "
	       "selected ISA: %s\n",
	       o.bytes, o.repeats, o.seconds,
	       castfs_isa_name(castfs_isa_selected()));
	printf("%-22s %-7s %8s %8s %8s %7s\n", "kernel", "isa", "in_GB/s",
	       "out_GB/s", "Gelem/s", "xmemcpy");
	printf("%-22s %-7s %8.2f %8.2f %8s %7.2f\n", "memcpy", "-", mc, mc, "-",
	       1.0);
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
	for (size_t i = 0;
	     optind == argc && !o.all && !o.quant_only && !o.ct_only && !rc &&
	     i < sizeof(view_pairs) / sizeof(view_pairs[0]);
	     i++)
		rc = bench_pair(&view_pairs[i], &o, mc);
	if (optind == argc && !o.all && !o.quant_only && !rc)
		rc = bench_planes(&o, mc);
	if (optind == argc && !o.ct_only && !rc)
		rc = bench_quant(&o, mc);
	if (optind == argc && !o.quant_only && !rc)
		rc = bench_ct(&o, mc);
	if (optind == argc && !o.quant_only && !rc)
		rc = bench_gguf(&o, mc);
	if (rc)
		fprintf(stderr, "out of memory\n");
	return rc ? 1 : 0;
}
