/* SPDX-License-Identifier: MIT */
/* Mount counters: relaxed atomics on the hot path, cJSON when rendered. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/strbuf.h"

#include "ns/stats.h"
#include "source/zst.h"

struct view_ctr {
	_Atomic uint64_t opens, reads, bytes;
	_Atomic uint64_t closes, cpu_ns;
};

/* Errors by errno: Linux's errnos are below 134; the rest share a slot. */
#define STATS_ERRNOS 134

struct castfs_stats {
	struct timespec start;
	size_t nviews;
	_Atomic uint64_t ops[CASTFS_SOP_COUNT];
	_Atomic uint64_t errors[CASTFS_SOP_COUNT];
	_Atomic uint64_t ctr[CASTFS_SCTR_COUNT];
	_Atomic uint64_t read_sizes[CASTFS_STATS_READ_BUCKETS];
	_Atomic uint64_t read_size_sum; /* bytes asked by read requests */
	_Atomic uint64_t by_errno[STATS_ERRNOS + 1];
	struct view_ctr passthrough, other, tensors;
	struct castfs_zcache *zcache; /* packed sources, or NULL */
	_Atomic uint64_t mem[5]; /* struct castfs_stats_mem, in its order */
	struct view_ctr view[]; /* nviews */
};

static const char *const sop_names[CASTFS_SOP_COUNT] = {
	[CASTFS_SOP_LOOKUP] = "lookup",
	[CASTFS_SOP_FORGET] = "forget",
	[CASTFS_SOP_GETATTR] = "getattr",
	[CASTFS_SOP_READLINK] = "readlink",
	[CASTFS_SOP_OPEN] = "open",
	[CASTFS_SOP_READ] = "read",
	[CASTFS_SOP_RELEASE] = "release",
	[CASTFS_SOP_OPENDIR] = "opendir",
	[CASTFS_SOP_READDIR] = "readdir",
	[CASTFS_SOP_STATFS] = "statfs",
	[CASTFS_SOP_GETXATTR] = "getxattr",
	[CASTFS_SOP_LISTXATTR] = "listxattr",
	[CASTFS_SOP_ACCESS] = "access",
	[CASTFS_SOP_MUTATE] = "mutate",
};

static const char *const sctr_names[CASTFS_SCTR_COUNT] = {
	[CASTFS_SCTR_HEADERS_PARSED] = "headers_parsed",
	[CASTFS_SCTR_HEADERS_REJECTED] = "headers_rejected",
	[CASTFS_SCTR_PLANS_BUILT] = "plans_built",
	[CASTFS_SCTR_PLAN_CACHE_HITS] = "plan_cache_hits",
	[CASTFS_SCTR_HEADER_CACHE_HITS] = "header_cache_hits",
	[CASTFS_SCTR_TENSOR_STATS] = "tensor_stats_computed",
	[CASTFS_SCTR_STALE_READS] = "stale_reads",
	[CASTFS_SCTR_TREES_BUILT] = "tensor_trees_built",
	[CASTFS_SCTR_TREE_CACHE_HITS] = "tensor_tree_cache_hits",
	[CASTFS_SCTR_TEXTS_READ] = "texts_read",
	[CASTFS_SCTR_INVAL_SENT] = "entry_invalidations",
	[CASTFS_SCTR_INVAL_SKIPPED] = "entry_invalidations_skipped",
	[CASTFS_SCTR_XFUSE_BUILT] = "shard_fuse_built",
	[CASTFS_SCTR_RESCAN_COMPARED] = "rescan_entries_compared",
	[CASTFS_SCTR_RESCAN_REPORTED] = "rescan_entries_reported",
	[CASTFS_SCTR_RESCAN_WHOLE] = "rescan_dirs_whole",
	[CASTFS_SCTR_CACHE_TRIM_SCANNED] = "cache_trim_scanned",
	[CASTFS_SCTR_CTL_WALKS] = "ctl_walks",
	[CASTFS_SCTR_LISTINGS_MADE] = "listings_made",
	[CASTFS_SCTR_PASSTHROUGH_OPENS] = "passthrough_opens",
	[CASTFS_SCTR_PT_BACKINGS] = "passthrough_backing_opened",
	[CASTFS_SCTR_PT_CLOSED] = "passthrough_backing_closed",
};

int castfs_stats_new(size_t nviews, struct castfs_stats **out)
{
	struct castfs_stats *st;

	st = calloc(1, sizeof(*st) + nviews * sizeof(st->view[0]));
	if (!st)
		return -ENOMEM;
	st->nviews = nviews;
	clock_gettime(CLOCK_MONOTONIC, &st->start);
	*out = st;
	return 0;
}

void castfs_stats_free(struct castfs_stats *st)
{
	free(st);
}

static void add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static uint64_t get(const _Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

void castfs_stats_op(struct castfs_stats *st, enum castfs_sop op, int rc)
{
	if (!st || (unsigned)op >= CASTFS_SOP_COUNT)
		return;
	add(&st->ops[op], 1);
	/* "No such attribute" and "no such namespace" (security.selinux, the
	 * ACLs: ls -l probes them) are answers of getxattr, not errors. */
	if (rc >= 0 || (op == CASTFS_SOP_GETXATTR &&
			(rc == -ENODATA || rc == -EOPNOTSUPP)))
		return;
	add(&st->errors[op], 1);
	add(&st->by_errno[-rc < STATS_ERRNOS ? -rc : STATS_ERRNOS], 1);
}

static struct view_ctr *view_ctr(struct castfs_stats *st, int view)
{
	if (view == CASTFS_STATS_PASSTHROUGH)
		return &st->passthrough;
	if (view == CASTFS_STATS_TENSORS)
		return &st->tensors;
	if (view >= 0 && (size_t)view < st->nviews)
		return &st->view[view];
	return &st->other;
}

void castfs_stats_read(struct castfs_stats *st, int view, uint64_t bytes)
{
	struct view_ctr *c;

	if (!st)
		return;
	c = view_ctr(st, view);
	add(&c->reads, 1);
	add(&c->bytes, bytes);
}

void castfs_stats_read_size(struct castfs_stats *st, size_t len)
{
	unsigned b = 0;

	if (!st)
		return;
	/* Bucket b holds lengths in (2^(11+b), 2^(12+b)]; b = 0 is <= 4 KiB. */
	while (b + 1 < CASTFS_STATS_READ_BUCKETS && len > (size_t)4096 << b)
		b++;
	add(&st->read_sizes[b], 1);
	add(&st->read_size_sum, len);
}

void castfs_stats_open(struct castfs_stats *st, int view)
{
	if (st)
		add(&view_ctr(st, view)->opens, 1);
}

void castfs_stats_close(struct castfs_stats *st, int view)
{
	if (st)
		add(&view_ctr(st, view)->closes, 1);
}

void castfs_stats_cpu(struct castfs_stats *st, int view, uint64_t ns)
{
	if (st)
		add(&view_ctr(st, view)->cpu_ns, ns);
}

void castfs_stats_count(struct castfs_stats *st, enum castfs_sctr c, uint64_t n)
{
	if (st && (unsigned)c < CASTFS_SCTR_COUNT)
		add(&st->ctr[c], n);
}

uint64_t castfs_stats_get(const struct castfs_stats *st, enum castfs_sctr c)
{
	if (!st || (unsigned)c >= CASTFS_SCTR_COUNT)
		return 0;
	return get(&st->ctr[c]);
}

static cJSON *view_json(const struct view_ctr *c)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		return NULL;
	cJSON_AddNumberToObject(o, "opens", (double)get(&c->opens));
	cJSON_AddNumberToObject(o, "reads", (double)get(&c->reads));
	cJSON_AddNumberToObject(o, "bytes", (double)get(&c->bytes));
	return o;
}

static double uptime(const struct castfs_stats *st)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - st->start.tv_sec) +
	       (double)(now.tv_nsec - st->start.tv_nsec) / 1e9;
}

static void add_ops(cJSON *root, const struct castfs_stats *st, uint64_t *nops,
		    uint64_t *nerrs)
{
	cJSON *ops = cJSON_AddObjectToObject(root, "requests");
	cJSON *errs = cJSON_AddObjectToObject(root, "errors");

	*nops = *nerrs = 0;
	for (int i = 0; i < CASTFS_SOP_COUNT; i++) {
		cJSON_AddNumberToObject(ops, sop_names[i],
					(double)get(&st->ops[i]));
		cJSON_AddNumberToObject(errs, sop_names[i],
					(double)get(&st->errors[i]));
		*nops += get(&st->ops[i]);
		*nerrs += get(&st->errors[i]);
	}
}

static void ctr_sum(struct view_ctr *sum, const struct view_ctr *c)
{
	add(&sum->opens, get(&c->opens));
	add(&sum->reads, get(&c->reads));
	add(&sum->bytes, get(&c->bytes));
}

/* Sums over the views ("conversions": bytes the view plans produced) and
 * over every file ("totals"), and the cache hits in one place. */
static void add_sums(cJSON *root, const struct castfs_stats *st, uint64_t nops,
		     uint64_t nerrs)
{
	struct view_ctr views = { 0 }, all = { 0 };
	cJSON *o;

	for (size_t i = 0; i < st->nviews; i++)
		ctr_sum(&views, &st->view[i]);
	ctr_sum(&all, &views);
	ctr_sum(&all, &st->passthrough);
	ctr_sum(&all, &st->tensors);
	ctr_sum(&all, &st->other);
	o = view_json(&all);
	cJSON_AddNumberToObject(o, "requests", (double)nops);
	cJSON_AddNumberToObject(o, "errors", (double)nerrs);
	cJSON_AddItemToObject(root, "totals", o);
	cJSON_AddItemToObject(root, "conversions", view_json(&views));
	o = cJSON_AddObjectToObject(root, "cache_hits");
	cJSON_AddNumberToObject(
		o, "headers",
		(double)get(&st->ctr[CASTFS_SCTR_HEADER_CACHE_HITS]));
	cJSON_AddNumberToObject(
		o, "plans", (double)get(&st->ctr[CASTFS_SCTR_PLAN_CACHE_HITS]));
	cJSON_AddNumberToObject(
		o, "tensor_trees",
		(double)get(&st->ctr[CASTFS_SCTR_TREE_CACHE_HITS]));
}

/* "read_sizes": {"4K": n, "8K": n, ..., "1M": n, ">1M": n}. */
static void add_read_sizes(cJSON *root, const struct castfs_stats *st)
{
	cJSON *o = cJSON_AddObjectToObject(root, "read_sizes");
	char name[16];

	for (unsigned b = 0; o && b < CASTFS_STATS_READ_BUCKETS; b++) {
		unsigned kib = 4u << b;

		if (b + 1 == CASTFS_STATS_READ_BUCKETS)
			snprintf(name, sizeof(name), ">%uM", kib / 2048);
		else if (kib >= 1024)
			snprintf(name, sizeof(name), "%uM", kib / 1024);
		else
			snprintf(name, sizeof(name), "%uK", kib);
		cJSON_AddNumberToObject(o, name,
					(double)get(&st->read_sizes[b]));
	}
}

void castfs_stats_set_zcache(struct castfs_stats *st, struct castfs_zcache *c)
{
	st->zcache = c;
}

static void add_zst(cJSON *root, struct castfs_zcache *c)
{
	struct castfs_zcache_stats z;
	cJSON *o;

	if (!c)
		return;
	castfs_zcache_stats_get(c, &z);
	o = cJSON_AddObjectToObject(root, "zst");
	if (!o)
		return;
	cJSON_AddNumberToObject(o, "frame_cache_hits", (double)z.hits);
	cJSON_AddNumberToObject(o, "frames_decoded", (double)z.misses);
	cJSON_AddNumberToObject(o, "bytes_decoded", (double)z.bytes_decoded);
	cJSON_AddNumberToObject(o, "frame_errors", (double)z.errors);
	cJSON_AddNumberToObject(o, "cached_bytes", (double)z.cached_bytes);
}

/* The fields of struct castfs_stats_mem, in its order: the JSON key and
 * the Prometheus family. */
static const char *const mem_names[5][3] = {
	{ "cache_bytes", "castfs_checkpoint_cache_bytes",
	  "Bytes the checkpoint cache is estimated to hold (headers, plans, "
	  "tensor trees)." },
	{ "cache_budget_bytes", "castfs_checkpoint_cache_budget_bytes",
	  "The checkpoint cache's budget for unused entries (-o cache_mb)." },
	{ "cache_entries", "castfs_checkpoint_cache_entries",
	  "Checkpoints the cache holds parsed." },
	{ "nodes", "castfs_nodes",
	  "Nodes the node table holds, forgotten ones included." },
	{ "nodes_forgotten", "castfs_nodes_forgotten",
	  "Nodes the kernel forgot, kept for NFS file handles." },
};

void castfs_stats_set_mem(struct castfs_stats *st,
			  const struct castfs_stats_mem *m)
{
	const uint64_t v[5] = { m->cache_bytes, m->cache_budget,
				m->cache_entries, m->nodes,
				m->nodes_forgotten };

	for (int i = 0; i < 5; i++)
		atomic_store_explicit(&st->mem[i], v[i], memory_order_relaxed);
}

static void add_mem(cJSON *root, const struct castfs_stats *st)
{
	cJSON *o = cJSON_AddObjectToObject(root, "memory");

	for (int i = 0; o && i < 5; i++)
		cJSON_AddNumberToObject(o, mem_names[i][0],
					(double)get(&st->mem[i]));
}

char *castfs_stats_json(const struct castfs_stats *st,
			const struct castfs_views *vs)
{
	cJSON *root = cJSON_CreateObject();
	uint64_t nops, nerrs;
	cJSON *views;
	char *out;

	if (!root)
		return NULL;
	cJSON_AddNumberToObject(root, "uptime_s", uptime(st));
	add_ops(root, st, &nops, &nerrs);
	views = cJSON_AddObjectToObject(root, "views");
	for (size_t i = 0; views && i < st->nviews && i < vs->n; i++)
		cJSON_AddItemToObject(views, vs->v[i].name,
				      view_json(&st->view[i]));
	cJSON_AddItemToObject(root, "passthrough", view_json(&st->passthrough));
	cJSON_AddItemToObject(root, "tensor_files", view_json(&st->tensors));
	cJSON_AddItemToObject(root, "other_files", view_json(&st->other));
	add_sums(root, st, nops, nerrs);
	add_read_sizes(root, st);
	add_zst(root, st->zcache);
	add_mem(root, st);
	for (int i = 0; i < CASTFS_SCTR_COUNT; i++)
		cJSON_AddNumberToObject(root, sctr_names[i],
					(double)get(&st->ctr[i]));
	out = cJSON_Print(root);
	cJSON_Delete(root);
	return out;
}

/* Prometheus text exposition format 0.0.4: one HELP and TYPE per family. */
static void prom_family(struct castfs_strbuf *b, const char *name,
			const char *type, const char *help)
{
	castfs_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
			 type);
}

/* A label value with \, " and newline escaped as the format asks. */
static void prom_label_value(struct castfs_strbuf *b, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			castfs_sb_printf(b, "\\%c", *v);
		else if (*v == '\n')
			castfs_sb_puts(b, "\\n");
		else
			castfs_sb_put(b, v, 1);
	}
}

static void prom_u64(struct castfs_strbuf *b, const char *name,
		     const char *label, const char *value, uint64_t n)
{
	castfs_sb_puts(b, name);
	if (label) {
		castfs_sb_printf(b, "{%s=\"", label);
		prom_label_value(b, value);
		castfs_sb_puts(b, "\"}");
	}
	castfs_sb_printf(b, " %" PRIu64 "\n", n);
}

enum prom_file_field {
	PF_OPENS,
	PF_OPEN_FILES,
	PF_READS,
	PF_BYTES,
	PF_CPU,
	PF_COUNT,
};

static const char *const pf_family[PF_COUNT][3] = {
	[PF_OPENS] = { "castfs_opens_total", "counter",
		       "Files opened, per kind of file." },
	[PF_OPEN_FILES] = { "castfs_open_files", "gauge",
			    "Files open now, per kind of file." },
	[PF_READS] = { "castfs_reads_total", "counter",
		       "Read requests served, per kind of file." },
	[PF_BYTES] = { "castfs_read_bytes_total", "counter",
		       "Bytes served by reads, per kind of file." },
	[PF_CPU] = { "castfs_conversion_cpu_seconds_total", "counter",
		     "CPU time of the threads serving reads of a view "
		     "(converting and reading the source), per view." },
};

static void prom_file_sample(struct castfs_strbuf *b, enum prom_file_field f,
			     const char *kind, const char *view,
			     const struct view_ctr *c)
{
	uint64_t opens = get(&c->opens), closes = get(&c->closes);

	castfs_sb_printf(b, "%s{kind=\"%s\"", pf_family[f][0], kind);
	if (view) {
		castfs_sb_puts(b, ",view=\"");
		prom_label_value(b, view);
		castfs_sb_puts(b, "\"");
	}
	castfs_sb_puts(b, "} ");
	switch (f) {
	case PF_OPENS:
		castfs_sb_printf(b, "%" PRIu64 "\n", opens);
		break;
	case PF_OPEN_FILES: /* closes are counted after their opens */
		castfs_sb_printf(b, "%" PRIu64 "\n",
				 opens > closes ? opens - closes : 0);
		break;
	case PF_READS:
		castfs_sb_printf(b, "%" PRIu64 "\n", get(&c->reads));
		break;
	case PF_BYTES:
		castfs_sb_printf(b, "%" PRIu64 "\n", get(&c->bytes));
		break;
	case PF_CPU:
		castfs_sb_printf(b, "%.9f\n", (double)get(&c->cpu_ns) / 1e9);
		break;
	case PF_COUNT:
		break;
	}
}

/* The per-file families: every view by name, then the other kinds. */
static void prom_files(struct castfs_strbuf *b, const struct castfs_stats *st,
		       const struct castfs_views *vs)
{
	for (int f = 0; f < PF_COUNT; f++) {
		prom_family(b, pf_family[f][0], pf_family[f][1],
			    pf_family[f][2]);
		for (size_t i = 0; i < st->nviews && i < vs->n; i++)
			prom_file_sample(b, f, "view", vs->v[i].name,
					 &st->view[i]);
		if (f == PF_CPU) /* only views convert, only they are timed */
			continue;
		prom_file_sample(b, f, "passthrough", NULL, &st->passthrough);
		prom_file_sample(b, f, "tensor_files", NULL, &st->tensors);
		prom_file_sample(b, f, "other", NULL, &st->other);
	}
}

static void prom_ops(struct castfs_strbuf *b, const struct castfs_stats *st)
{
	prom_family(b, "castfs_requests_total", "counter",
		    "FUSE requests answered, per operation.");
	for (int i = 0; i < CASTFS_SOP_COUNT; i++)
		prom_u64(b, "castfs_requests_total", "op", sop_names[i],
			 get(&st->ops[i]));
	prom_family(
		b, "castfs_request_errors_total", "counter",
		"FUSE requests answered with an error, per operation "
		"(getxattr's ENODATA and EOPNOTSUPP are answers, not errors).");
	for (int i = 0; i < CASTFS_SOP_COUNT; i++)
		prom_u64(b, "castfs_request_errors_total", "op", sop_names[i],
			 get(&st->errors[i]));
}

static void errno_name(int e, char *buf, size_t len)
{
	const char *name = NULL;

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
	if (e < STATS_ERRNOS)
		name = strerrorname_np(e);
#endif
	if (name)
		snprintf(buf, len, "%s", name);
	else if (e < STATS_ERRNOS)
		snprintf(buf, len, "%d", e);
	else
		snprintf(buf, len, "other");
}

/* Only the errnos seen: a family without samples is valid too. */
static void prom_errnos(struct castfs_strbuf *b, const struct castfs_stats *st)
{
	char name[32];

	prom_family(b, "castfs_errors_total", "counter",
		    "Requests answered with an error, per errno.");
	for (int e = 1; e <= STATS_ERRNOS; e++) {
		uint64_t n = get(&st->by_errno[e]);

		if (!n)
			continue;
		errno_name(e, name, sizeof(name));
		prom_u64(b, "castfs_errors_total", "errno", name, n);
	}
}

/* The histogram's buckets are cumulative; the last one is +Inf. */
static void prom_read_sizes(struct castfs_strbuf *b,
			    const struct castfs_stats *st)
{
	static const char name[] = "castfs_read_request_bytes";
	uint64_t sum = 0;

	prom_family(b, name, "histogram",
		    "Sizes of read requests as the kernel asked them.");
	for (unsigned i = 0; i < CASTFS_STATS_READ_BUCKETS; i++) {
		sum += get(&st->read_sizes[i]);
		if (i + 1 < CASTFS_STATS_READ_BUCKETS)
			castfs_sb_printf(b,
					 "%s_bucket{le=\"%zu\"} %" PRIu64 "\n",
					 name, (size_t)4096 << i, sum);
		else
			castfs_sb_printf(b,
					 "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n",
					 name, sum);
	}
	castfs_sb_printf(b, "%s_sum %" PRIu64 "\n%s_count %" PRIu64 "\n", name,
			 get(&st->read_size_sum), name, sum);
}

static void prom_caches(struct castfs_strbuf *b, const struct castfs_stats *st,
			const struct castfs_zcache_stats *z)
{
	static const char *const cache[] = { "headers", "plans", "tensor_trees",
					     "zst_frames" };
	uint64_t hits[] = { get(&st->ctr[CASTFS_SCTR_HEADER_CACHE_HITS]),
			    get(&st->ctr[CASTFS_SCTR_PLAN_CACHE_HITS]),
			    get(&st->ctr[CASTFS_SCTR_TREE_CACHE_HITS]),
			    z->hits };
	/* A miss is what a hit saves: a header parsed, a plan built... */
	uint64_t misses[] = { get(&st->ctr[CASTFS_SCTR_HEADERS_PARSED]),
			      get(&st->ctr[CASTFS_SCTR_PLANS_BUILT]),
			      get(&st->ctr[CASTFS_SCTR_TREES_BUILT]),
			      z->misses };

	prom_family(b, "castfs_cache_hits_total", "counter",
		    "Lookups a cache answered, per cache.");
	for (size_t i = 0; i < 4; i++)
		prom_u64(b, "castfs_cache_hits_total", "cache", cache[i],
			 hits[i]);
	prom_family(b, "castfs_cache_misses_total", "counter",
		    "Lookups a cache did not answer (the work was done), per "
		    "cache.");
	for (size_t i = 0; i < 4; i++)
		prom_u64(b, "castfs_cache_misses_total", "cache", cache[i],
			 misses[i]);
}

static void prom_counter(struct castfs_strbuf *b, const char *name,
			 const char *type, const char *help, uint64_t n)
{
	prom_family(b, name, type, help);
	prom_u64(b, name, NULL, NULL, n);
}

static void prom_misc(struct castfs_strbuf *b, const struct castfs_stats *st,
		      const struct castfs_zcache_stats *z)
{
	/* Closed first: every close counted was an open counted before. */
	uint64_t pt_closed = get(&st->ctr[CASTFS_SCTR_PT_CLOSED]);
	uint64_t pt_opened = get(&st->ctr[CASTFS_SCTR_PT_BACKINGS]);

	prom_counter(b, "castfs_headers_rejected_total", "counter",
		     "Source files rejected (listed in /.castfs/rejected).",
		     get(&st->ctr[CASTFS_SCTR_HEADERS_REJECTED]));
	prom_counter(b, "castfs_stale_reads_total", "counter",
		     "Reads refused because the source changed.",
		     get(&st->ctr[CASTFS_SCTR_STALE_READS]));
	prom_counter(b, "castfs_passthrough_opens_total", "counter",
		     "Opens of unconverted files the kernel reads from the "
		     "source itself (-o passthrough).",
		     get(&st->ctr[CASTFS_SCTR_PASSTHROUGH_OPENS]));
	prom_counter(b, "castfs_passthrough_backing_files", "gauge",
		     "Source files the kernel holds open as backing files "
		     "(-o passthrough).",
		     pt_opened - pt_closed);
	prom_counter(b, "castfs_tensor_stats_computed_total", "counter",
		     "Tensor-wide statistics computed.",
		     get(&st->ctr[CASTFS_SCTR_TENSOR_STATS]));
	prom_counter(b, "castfs_zst_decoded_bytes_total", "counter",
		     "Bytes decoded from packed (zstd) sources.",
		     z->bytes_decoded);
	prom_counter(b, "castfs_zst_frame_errors_total", "counter",
		     "Frames of packed sources that failed to read, decode or "
		     "verify.",
		     z->errors);
	prom_counter(b, "castfs_zst_cached_bytes", "gauge",
		     "Decoded bytes the frame cache holds now.",
		     z->cached_bytes);
}

static void prom_mem(struct castfs_strbuf *b, const struct castfs_stats *st)
{
	for (int i = 0; i < 5; i++)
		prom_counter(b, mem_names[i][1], "gauge", mem_names[i][2],
			     get(&st->mem[i]));
}

char *castfs_stats_prometheus(const struct castfs_stats *st,
			      const struct castfs_views *vs)
{
	struct castfs_zcache_stats z = { 0 };
	struct castfs_strbuf b = { 0 };
	char *out;

	if (st->zcache)
		castfs_zcache_stats_get(st->zcache, &z);
	prom_family(&b, "castfs_uptime_seconds", "gauge",
		    "Seconds since the daemon started.");
	castfs_sb_printf(&b, "castfs_uptime_seconds %.3f\n", uptime(st));
	prom_ops(&b, st);
	prom_errnos(&b, st);
	prom_files(&b, st, vs);
	prom_read_sizes(&b, st);
	prom_caches(&b, st, &z);
	prom_misc(&b, st, &z);
	prom_mem(&b, st);
	return castfs_sb_take(&b, &out, NULL) ? NULL : out;
}
