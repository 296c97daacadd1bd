// SPDX-License-Identifier: MIT
/*
 * Plans that every layer needs: one extent of memory or of source bytes,
 * and the safetensors header a view's plan starts with.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "plan/plan_build.h"

static int one_extent_plan(const struct castfs_producer *p, uint64_t len,
			   struct castfs_plan **out)
{
	struct castfs_pb *pb;
	int rc = castfs_pb_new(&pb);

	if (rc)
		return rc;
	rc = castfs_pb_append(pb, p, len);
	if (rc) {
		castfs_pb_free(pb);
		return rc;
	}
	return castfs_pb_finish_raw(pb, out);
}

int castfs_plan_new_range(uint64_t off, uint64_t len, struct castfs_plan **out)
{
	struct castfs_producer p = { .op = CASTFS_OP_COPY, .src_off = off };

	return one_extent_plan(&p, len, out);
}

int castfs_plan_new_mem(const void *data, size_t len, struct castfs_plan **out)
{
	struct castfs_producer p = { .op = CASTFS_OP_MEM, .mem = data };

	return one_extent_plan(&p, len, out);
}

/* The first @n bytes of @p, if its leading MEM extents hold them. */
static bool mem_prefix(const struct castfs_plan *p, uint8_t *buf, uint64_t n)
{
	uint64_t done = 0;

	for (size_t i = 0; done < n && i < p->nextents; i++) {
		const struct castfs_extent *e = &p->extents[i];
		uint64_t take = CASTFS_MIN(e->len, n - done);

		if (e->op != CASTFS_OP_MEM)
			return false;
		memcpy(buf + done, e->mem, (size_t)take);
		done += take;
	}
	return done == n;
}

int castfs_plan_header(const struct castfs_plan *p, struct castfs_header **out,
		       struct castfs_diag *d)
{
	uint8_t len8[8], *buf;
	uint64_t n;
	int rc;

	if (!mem_prefix(p, len8, sizeof(len8)))
		return castfs_diag_set(d, -EINVAL, "plan has no header");
	n = castfs_load_le64(len8);
	if (n > CASTFS_HEADER_MAX || n + 8 > p->size)
		return castfs_diag_set(d, -EINVAL,
				       "plan header length %" PRIu64, n);
	buf = malloc((size_t)n + 8);
	if (!buf)
		return -ENOMEM;
	rc = mem_prefix(p, buf, n + 8) ?
		     castfs_header_parse(buf, (size_t)n + 8, p->size, out, d) :
		     castfs_diag_set(d, -EINVAL, "plan header not in memory");
	free(buf);
	return rc;
}
