/* SPDX-License-Identifier: MIT */
/* Oracles shared by the plan-building fuzz targets (see fuzz_util.h). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_util.h"
#include "ieee_ref.h"
#include "kernels/convert.h"
#include "format/st_header.h"

void fuzz_check_plan(const struct castfs_plan *p)
{
	uint64_t at = 0;

	for (size_t i = 0; i < p->nextents; i++) {
		const struct castfs_extent *e = &p->extents[i];

		FUZZ_CHECK(e->out_off == at);
		FUZZ_CHECK(e->len > 0 && e->unit > 0);
		FUZZ_CHECK(e->unit <= CASTFS_BOUNCE_LEN);
		/* Quantiser extents may end in a short block. */
		FUZZ_CHECK(e->op != CASTFS_OP_CAST || e->len % e->unit == 0);
		FUZZ_CHECK(e->op < CASTFS_OP_COUNT);
		FUZZ_CHECK(castfs_plan_find(p, e->out_off) == i);
		FUZZ_CHECK(castfs_plan_find(p, e->out_off + e->len - 1) == i);
		at += e->len;
	}
	FUZZ_CHECK(at == p->size);
}

struct castfs_scratch *fuzz_scratch(void)
{
	static struct castfs_scratch s;

	if (!s.buf && castfs_scratch_init(&s))
		abort();
	return &s;
}

static void check_tensor(const struct castfs_view *v,
			 const struct castfs_tensor *o,
			 const struct castfs_tensor *s, const uint8_t *src,
			 const uint8_t *got)
{
	uint8_t *want;

	FUZZ_CHECK(s && s->nelems == o->nelems && s->ndim == o->ndim);
	if (o->dtype == s->dtype) {
		FUZZ_CHECK(memcmp(got, src + s->begin, o->end - o->begin) == 0);
		return;
	}
	FUZZ_CHECK(o->dtype == v->dtype);
	want = malloc(o->end - o->begin + 1);
	FUZZ_CHECK(want);
	FUZZ_CHECK(ieee_ref_cast(s->dtype, o->dtype,
				 v->cvt_flags & CASTFS_CVT_SATURATE, want,
				 src + s->begin, s->nelems));
	FUZZ_CHECK(memcmp(got, want, o->end - o->begin) == 0);
	free(want);
}

void fuzz_check_cast_output(const struct castfs_view *v,
			    const struct castfs_header *h, const uint8_t *src,
			    const uint8_t *out, uint64_t out_len)
{
	struct castfs_header *oh = NULL;

	FUZZ_CHECK(castfs_header_parse(out, out_len, out_len, &oh, NULL) == 0);
	FUZZ_CHECK(oh->ntensors == h->ntensors);
	for (size_t i = 0; i < oh->ntensors; i++) {
		const struct castfs_tensor *o = &oh->tensors[i];

		check_tensor(v, o, castfs_header_find(h, o->name, o->name_len),
			     src + h->data_start,
			     out + oh->data_start + o->begin);
	}
	castfs_header_free(oh);
}
