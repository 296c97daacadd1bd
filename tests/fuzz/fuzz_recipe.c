/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the JSON view config (castfs_views_load) and the -o views= list:
 * any input is a config file. A config that loads must give valid,
 * findable views, each of which builds a plan that tiles its file over a
 * fixed small checkpoint and reads back whole; a config that fails must
 * leave the view set as it was.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_util.h"
#include "view/view.h"

static const char ckpt_json[] =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"l.weight\":{\"dtype\":\"F32\",\"shape\":[4,64],"
	"\"data_offsets\":[0,1024]},"
	"\"l.bias\":{\"dtype\":\"BF16\",\"shape\":[4],"
	"\"data_offsets\":[1024,1032]},"
	"\"h\":{\"dtype\":\"F16\",\"shape\":[2,8],"
	"\"data_offsets\":[1032,1064]},"
	"\"n\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[1064,1072]}}";

#define CKPT_DATA 1072u

static uint8_t ckpt[8 + sizeof(ckpt_json) + 8 + CKPT_DATA];
static size_t ckpt_len;
static struct castfs_header *ckpt_h;

static void ckpt_init(void)
{
	size_t n = sizeof(ckpt_json) - 1, padded = (n + 7) & ~(size_t)7;

	if (ckpt_h)
		return;
	for (int i = 0; i < 8; i++)
		ckpt[i] = (uint8_t)(padded >> (8 * i));
	memcpy(ckpt + 8, ckpt_json, n);
	memset(ckpt + 8 + n, ' ', padded - n);
	for (size_t i = 0; i < CKPT_DATA; i++)
		ckpt[8 + padded + i] = (uint8_t)(i * 131 + 7);
	ckpt_len = 8 + padded + CKPT_DATA;
	FUZZ_CHECK(castfs_header_parse(ckpt, ckpt_len, ckpt_len, &ckpt_h,
				       NULL) == 0);
}

static void check_view(const struct castfs_views *vs,
		       const struct castfs_view *v)
{
	struct castfs_mem_reader mr;
	struct castfs_plan *p = NULL;
	uint8_t *out;
	int rc;

	FUZZ_CHECK(castfs_view_name_valid(v->name, strlen(v->name)));
	FUZZ_CHECK(castfs_views_find(vs, v->name, strlen(v->name)) == v);
	rc = castfs_view_plan(v, ckpt_h, &p, NULL);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOTSUP);
	if (rc)
		return;
	fuzz_check_plan(p);
	out = malloc(p->size + 1);
	FUZZ_CHECK(out);
	castfs_mem_reader_init(&mr, ckpt, ckpt_len);
	FUZZ_CHECK(castfs_plan_read(p, &mr.r, fuzz_scratch(), out, p->size + 1,
				    0) == (ssize_t)p->size);
	if (v->kind == CASTFS_VIEW_CAST)
		fuzz_check_cast_output(v, ckpt_h, ckpt, out, p->size);
	free(out);
	castfs_plan_free(p);
}

/* The same bytes as a -o views= list. */
static void check_select(struct castfs_views *vs, const uint8_t *data,
			 size_t size)
{
	char *list = strndup((const char *)data, size);
	int rc;

	FUZZ_CHECK(list);
	rc = castfs_views_select(vs, list, NULL);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL);
	free(list);
}

/* True if @v is built-in view @b unchanged (no need to check it again). */
static bool same_builtin(const struct castfs_view *v,
			 const struct castfs_view *b)
{
	return strcmp(v->name, b->name) == 0 && v->kind == b->kind &&
	       v->dtype == b->dtype && v->cvt_flags == b->cvt_flags &&
	       v->qtype == b->qtype && v->nested == b->nested &&
	       v->blocksize == b->blocksize && v->nrules == 0 && b->nrules == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct castfs_views builtin;
	struct castfs_views vs = { 0 };
	size_t n0;
	char *json;
	int rc;

	ckpt_init();
	if (!builtin.v)
		FUZZ_CHECK(castfs_views_builtin(&builtin) == 0);
	FUZZ_CHECK(castfs_views_builtin(&vs) == 0);
	n0 = vs.n;
	rc = castfs_views_load(&vs, (const char *)data, size, NULL);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	FUZZ_CHECK(rc == 0 || vs.n == n0);
	for (size_t i = 0; i < vs.n; i++) {
		if (i >= n0 || !same_builtin(&vs.v[i], &builtin.v[i]))
			check_view(&vs, &vs.v[i]);
	}
	json = castfs_views_json(&vs);
	FUZZ_CHECK(json);
	free(json);
	check_select(&vs, data, size);
	castfs_views_fini(&vs);
	return 0;
}
