/* SPDX-License-Identifier: MIT */
/*
 * Fuzz plans and castfs_plan_read: header + view + random ranges.
 * Input: [view][flags][nranges][nranges x (u32 off, u32 len)] then a whole
 * safetensors file. A file that parses gets the view's plan, which must
 * tile its output; the whole file read at once must equal, for cast views,
 * a slow tensor-by-tensor materialisation (scalar kernels); every range
 * must equal the slice of the whole; and a source that fails part-way must
 * give -EIO or correct bytes, never wrong ones.
 */
#include <errno.h>
#include <string.h>

#include "bytes_fuzz.h"
#include "fuzz.h"
#include "fuzz_util.h"
#include "format/st_header.h"
#include "view/qsrc.h"
#include "view/view.h"

#define PREFIX 3u
#define MAX_RANGES 16u
#define MAX_OUT (64u << 20)

/* A source that fails with -EIO on any read reaching byte @fail_at. */
struct flaky {
	const uint8_t *data;
	size_t len;
	uint64_t fail_at;
};

static ssize_t flaky_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct flaky *f = ctx;

	if (off > f->len || n > f->len - off)
		return -EIO; /* the plan must never read past its source */
	if (off + n > f->fail_at)
		return -EIO;
	memcpy(buf, f->data + off, n);
	return (ssize_t)n;
}

static const struct castfs_views *views(void)
{
	static struct castfs_views vs;

	if (!vs.v)
		FUZZ_CHECK(castfs_views_builtin(&vs) == 0);
	return &vs;
}

/* Every range of @ranges read through @src must be the slice of @whole,
 * or (@may_fail) -EIO. */
static void check_ranges(const struct castfs_plan *p,
			 const struct castfs_reader *src, const uint8_t *ranges,
			 size_t nranges, const uint8_t *whole, bool may_fail)
{
	uint8_t *buf = malloc(p->size + 2);

	FUZZ_CHECK(buf);
	for (size_t i = 0; i < nranges; i++) {
		uint64_t off = fz_le32(ranges + 8 * i) % (p->size + 2);
		size_t len = fz_le32(ranges + 8 * i + 4) % (p->size + 2);
		size_t want = off >= p->size	  ? 0 :
			      len < p->size - off ? len :
						    p->size - off;
		ssize_t n =
			castfs_plan_read(p, src, fuzz_scratch(), buf, len, off);

		if (may_fail && n == -EIO)
			continue;
		FUZZ_CHECK(n == (ssize_t)want);
		FUZZ_CHECK(memcmp(buf, whole + off, want) == 0);
	}
	free(buf);
}

/* Whether @h holds FP8 block weights: its cast views dequantize them and
 * drop their scales, which the slow element-wise cast does not model
 * (tests/unit/test_qsrc.c checks those values). */
static bool dequantized(const struct castfs_header *h)
{
	struct castfs_qsrc q;
	bool yes;

	if (castfs_qsrc_scan(h, 0, &q, NULL))
		return false;
	yes = q.nfp8 > 0;
	castfs_qsrc_fini(&q);
	return yes;
}

static void check_plan(const struct castfs_view *v,
		       const struct castfs_header *h, const uint8_t *file,
		       size_t file_len, const uint8_t *pre, size_t nranges)
{
	const uint8_t *ranges = pre + PREFIX;
	struct flaky good = { file, file_len, UINT64_MAX }, bad = good;
	struct castfs_reader gr = { flaky_pread, &good, NULL, NULL };
	struct castfs_reader br = { flaky_pread, &bad, NULL, NULL };
	struct castfs_plan *p = NULL;
	uint8_t *whole;
	int rc = castfs_view_plan(v, h, &p, NULL);

	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOTSUP || rc == -E2BIG ||
		   rc == -EOVERFLOW || rc == -ENOMEM);
	if (rc)
		return;
	fuzz_check_plan(p);
	if (p->size > MAX_OUT)
		goto out_plan;
	whole = malloc(p->size + 1);
	FUZZ_CHECK(whole);
	FUZZ_CHECK(castfs_plan_read(p, &gr, fuzz_scratch(), whole, p->size + 1,
				    0) == (ssize_t)p->size);
	if (v->kind == CASTFS_VIEW_CAST && !dequantized(h))
		fuzz_check_cast_output(v, h, file, whole, p->size);
	check_ranges(p, &gr, ranges, nranges, whole, false);
	bad.fail_at = fz_le32(ranges) % (file_len + 1);
	check_ranges(p, &br, ranges, nranges, whole, true);
	free(whole);
out_plan:
	castfs_plan_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct castfs_views *vs = views();
	struct castfs_header *h = NULL;
	size_t nranges, skip;

	if (size < PREFIX)
		return 0;
	nranges = data[2] % (MAX_RANGES + 1);
	skip = PREFIX + 8 * nranges;
	if (size < skip || nranges == 0)
		return 0;
	if (castfs_header_parse(data + skip, size - skip, size - skip, &h,
				NULL))
		return 0;
	check_plan(&vs->v[data[0] % vs->n], h, data + skip, size - skip, data,
		   nranges);
	castfs_header_free(h);
	return 0;
}
