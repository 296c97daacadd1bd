/* SPDX-License-Identifier: MIT */
/*
 * The watcher's queue of changed source paths (fs_watchq.c): events are
 * drained from inotify into it as fast as they come, one entry per path
 * with the union of its events, so that a burst of changes neither
 * overflows the kernel's queue nor is handled twice for one path.
 */
#ifndef CASTFS_FS_WATCHQ_H
#define CASTFS_FS_WATCHQ_H

#include <stddef.h>
#include <stdint.h>

/* At most this many paths wait (about 25 MB); beyond, the caller treats
 * the burst like a lost-events overflow (one rescan instead of unbounded
 * memory). */
#define CASTFS_WATCHQ_MAX (1u << 18)

struct castfs_watchq_item {
	char *rel; /* source-relative path, owned by the queue */
	uint64_t hash;
	uint32_t mask; /* the union of the inotify masks seen for @rel */
};

struct castfs_watchq {
	struct castfs_watchq_item *items; /* in arrival order */
	size_t n, cap, head; /* [head, n) wait; [0, head) were popped */
	uint32_t *slots; /* open addressing: item index + 1, 0 empty */
	size_t nslots; /* a power of two, or 0 */
};

/*
 * castfs_watchq_add - note that @dir/@name (@dir "" for the root) changed
 * with inotify @mask: a path already waiting gets @mask or'ed in, else it
 * joins the end of the queue. Returns 0, -ENOMEM, or -ENOSPC when
 * CASTFS_WATCHQ_MAX paths wait (nothing is added). Not thread-safe: one
 * watcher thread owns @q.
 */
int castfs_watchq_add(struct castfs_watchq *q, const char *dir,
		      const char *name, uint32_t mask);

/*
 * castfs_watchq_pop - the oldest waiting path, or NULL when none waits.
 * The item stays owned by @q and valid until the next castfs_watchq_add()
 * or castfs_watchq_clear(); a later change of the same path queues it
 * again.
 */
const struct castfs_watchq_item *castfs_watchq_pop(struct castfs_watchq *q);

/* castfs_watchq_clear - drop every path (waiting or popped); the memory
 * is kept for reuse. */
void castfs_watchq_clear(struct castfs_watchq *q);

/* castfs_watchq_fini - release what @q holds; @q may be zeroed or used. */
void castfs_watchq_fini(struct castfs_watchq *q);

#endif
