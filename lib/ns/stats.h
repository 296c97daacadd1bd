/* SPDX-License-Identifier: MIT */
/* Live counters of a mount (lock-free), rendered as /.castfs/stats JSON. */
#ifndef CASTFS_STATS_H
#define CASTFS_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "view/view.h"

enum castfs_sop {
	CASTFS_SOP_LOOKUP,
	CASTFS_SOP_FORGET,
	CASTFS_SOP_GETATTR,
	CASTFS_SOP_READLINK,
	CASTFS_SOP_OPEN,
	CASTFS_SOP_READ,
	CASTFS_SOP_RELEASE,
	CASTFS_SOP_OPENDIR,
	CASTFS_SOP_READDIR,
	CASTFS_SOP_STATFS,
	CASTFS_SOP_GETXATTR,
	CASTFS_SOP_LISTXATTR,
	CASTFS_SOP_ACCESS,
	CASTFS_SOP_MUTATE, /* every write-type request (answered EROFS) */
	CASTFS_SOP_COUNT,
};

/* Global counters besides the per-op ones. */
enum castfs_sctr {
	CASTFS_SCTR_HEADERS_PARSED,
	CASTFS_SCTR_HEADERS_REJECTED,
	CASTFS_SCTR_PLANS_BUILT,
	CASTFS_SCTR_PLAN_CACHE_HITS,
	CASTFS_SCTR_HEADER_CACHE_HITS,
	CASTFS_SCTR_TENSOR_STATS, /* tensor-wide statistics computed */
	CASTFS_SCTR_STALE_READS, /* reads refused: the source changed */
	CASTFS_SCTR_TREES_BUILT, /* tensor trees indexed */
	CASTFS_SCTR_TREE_CACHE_HITS,
	/* source JSON texts read whole (config.json, indexes, tokenizers) */
	CASTFS_SCTR_TEXTS_READ,
	/* Names the change watcher told the kernel to drop, and those it
	 * did not because no lookup had answered them. */
	CASTFS_SCTR_INVAL_SENT,
	CASTFS_SCTR_INVAL_SKIPPED,
	/* whole-model parts that the nvfp4 files of a sharded model share
	 * (every shard's header; of a quantized model its bf16 plan): built
	 * once per identity of the shards, not per shard */
	CASTFS_SCTR_XFUSE_BUILT,
	/* The rescan after lost change events: entries compared with a
	 * directory's snapshot, names it reported changed (new, or another
	 * identity), and directories rescanned whole (no usable snapshot). */
	CASTFS_SCTR_RESCAN_COMPARED,
	CASTFS_SCTR_RESCAN_REPORTED,
	CASTFS_SCTR_RESCAN_WHOLE,
	/* Checkpoint-cache entries the budget's trims looked at. */
	CASTFS_SCTR_CACHE_TRIM_SCANNED,
	/* Walks of the source tree made for /.castfs/rejected and refused
	 * (kept and shared until the tree changes, ns_ctlshare.c). */
	CASTFS_SCTR_CTL_WALKS,
	/* Directory listings made for open handles (ns_list_dir()): shared
	 * ones once for every handle given them (ns_dirshare.c). */
	CASTFS_SCTR_LISTINGS_MADE,
	/* Opens answered with kernel passthrough (-o passthrough): their
	 * reads never reach the daemon, so they count in no read figure. */
	CASTFS_SCTR_PASSTHROUGH_OPENS,
	/* Backing files registered with the kernel for them (one per node
	 * from its first such open) and closed (the node forgotten). */
	CASTFS_SCTR_PT_BACKINGS,
	CASTFS_SCTR_PT_CLOSED,
	CASTFS_SCTR_COUNT,
};

/* Index of pass-through reads in per-view counters (after the views). */
#define CASTFS_STATS_PASSTHROUGH (-1)
/* Index of reads of other computed files (model-directory JSON...). */
#define CASTFS_STATS_OTHER (-2)
/* Index of reads of the files of tensor trees (.npy, .info, .raw). */
#define CASTFS_STATS_TENSORS (-3)

struct castfs_stats;

/* castfs_stats_new - counters for @nviews views. Returns 0 or -ENOMEM. */
int castfs_stats_new(size_t nviews, struct castfs_stats **out);

/* castfs_stats_free - NULL is accepted. */
void castfs_stats_free(struct castfs_stats *st);

/* castfs_stats_op - count one request of @op that ended with @rc (0 or
 * -errno). @st may be NULL. Thread-safe, lock-free. */
void castfs_stats_op(struct castfs_stats *st, enum castfs_sop op, int rc);

/* castfs_stats_read - count a read of @bytes served by view @view (its
 * index in the view set) or CASTFS_STATS_PASSTHROUGH / _OTHER. */
void castfs_stats_read(struct castfs_stats *st, int view, uint64_t bytes);

/* Buckets of the read-size histogram: <= 4 KiB, <= 8 KiB, ..., <= 1 MiB,
 * larger. */
#define CASTFS_STATS_READ_BUCKETS 10

/* castfs_stats_read_size - count one read request of @len bytes (as asked,
 * before clipping at EOF) in the histogram of request sizes: it shows
 * whether the kernel sends the large requests the mount asks for. */
void castfs_stats_read_size(struct castfs_stats *st, size_t len);

/* castfs_stats_open - count an open of a file of view @view (as above). */
void castfs_stats_open(struct castfs_stats *st, int view);

/* castfs_stats_close - count the release of a file castfs_stats_open()
 * counted: opens minus closes is the number of open files. */
void castfs_stats_close(struct castfs_stats *st, int view);

/* castfs_stats_cpu - add @ns nanoseconds of CPU time that reads of view
 * @view (an index in the view set) spent converting, source reads
 * included. @st may be NULL. Thread-safe, lock-free. */
void castfs_stats_cpu(struct castfs_stats *st, int view, uint64_t ns);

/* castfs_stats_count - add @n to counter @c. */
void castfs_stats_count(struct castfs_stats *st, enum castfs_sctr c,
			uint64_t n);

/* castfs_stats_get - current value of @c (tests). */
uint64_t castfs_stats_get(const struct castfs_stats *st, enum castfs_sctr c);

/* What the daemon holds now, for /.castfs/stats and metrics. */
struct castfs_stats_mem {
	uint64_t cache_bytes; /* checkpoint cache: estimated bytes held */
	uint64_t cache_budget; /* its budget (-o cache_mb) */
	uint64_t cache_entries; /* its valid entries */
	uint64_t nodes; /* node table: nodes, forgotten ones included */
	uint64_t nodes_forgotten; /* of which the kernel holds none */
};

/*
 * castfs_stats_set_mem - record @m, shown by the next castfs_stats_json()
 * and castfs_stats_prometheus(). Thread-safe (each field is atomic; the
 * snapshot as a whole is not).
 */
void castfs_stats_set_mem(struct castfs_stats *st,
			  const struct castfs_stats_mem *m);

/*
 * castfs_stats_json - the counters as a malloc'ed JSON text (uptime,
 * requests and errors per operation, opens/reads/bytes per view and for
 * pass-through, tensor-tree and other files, their totals, the bytes the
 * views converted, cache hits, and the global counters), or NULL on
 * -ENOMEM. @vs names the views. The layout is in docs/castfs.1.
 */
char *castfs_stats_json(const struct castfs_stats *st,
			const struct castfs_views *vs);

/*
 * castfs_stats_prometheus - the counters as a malloc'ed text in the
 * Prometheus text exposition format 0.0.4 (HELP and TYPE lines, one family
 * each), or NULL on -ENOMEM. Families and labels are in docs/castfs.1 and
 * README.md. Thread-safe: each counter is read once, relaxed.
 */
char *castfs_stats_prometheus(const struct castfs_stats *st,
			      const struct castfs_views *vs);

struct castfs_zcache;

/*
 * castfs_stats_set_zcache - also render @c's counters (hits, misses,
 * bytes decoded, errors, bytes held) as "zst" in castfs_stats_json().
 * @c is borrowed: it must outlive every later castfs_stats_json() call.
 */
void castfs_stats_set_zcache(struct castfs_stats *st, struct castfs_zcache *c);

#endif
