/* SPDX-License-Identifier: MIT */
/* Reference-counted immutable bytes: see shared.h. */
#include "common/shared.h"

#include <stdlib.h>
#include <string.h>

struct castfs_shared *castfs_shared_new(const void *src, size_t len)
{
	struct castfs_shared *s;

	if (len > (size_t)-1 - sizeof(*s))
		return NULL;
	s = malloc(sizeof(*s) + len);
	if (!s)
		return NULL;
	atomic_init(&s->refs, 1);
	s->len = len;
	if (len)
		memcpy(s->bytes, src, len);
	return s;
}

struct castfs_shared *castfs_shared_get(struct castfs_shared *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
	return s;
}

void castfs_shared_put(struct castfs_shared *s)
{
	/* Release our writes before the free another owner may do; acquire
	 * theirs before ours. */
	if (s &&
	    atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
		free(s);
}
