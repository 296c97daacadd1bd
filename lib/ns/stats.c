/* SPDX-License-Identifier: MIT */
/* Mount counters: relaxed atomics on the hot path, cJSON when rendered. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ns/stats.h"
#include "source/zst.h"

struct view_ctr {
	_Atomic uint64_t opens, reads, bytes;
};

struct castfs_stats {
	struct timespec start;
	size_t nviews;
	_Atomic uint64_t ops[CASTFS_SOP_COUNT];
	_Atomic uint64_t errors[CASTFS_SOP_COUNT];
	_Atomic uint64_t ctr[CASTFS_SCTR_COUNT];
	_Atomic uint64_t read_sizes[CASTFS_STATS_READ_BUCKETS];
	struct view_ctr passthrough, other, tensors;
	struct castfs_zcache *zcache; /* packed sources, or NULL */
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
	if (rc < 0)
		add(&st->errors[op], 1);
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
}

void castfs_stats_open(struct castfs_stats *st, int view)
{
	if (st)
		add(&view_ctr(st, view)->opens, 1);
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
	for (int i = 0; i < CASTFS_SCTR_COUNT; i++)
		cJSON_AddNumberToObject(root, sctr_names[i],
					(double)get(&st->ctr[i]));
	out = cJSON_Print(root);
	cJSON_Delete(root);
	return out;
}
