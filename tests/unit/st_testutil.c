/* SPDX-License-Identifier: MIT */
/* Helpers shared by the test programs that parse headers. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "st_testutil.h"
#include "view/qsrc.h"

int stt_parse(const uint8_t *f, size_t len, struct castfs_header **h,
	      struct castfs_diag *d)
{
	castfs_diag_clear(d);
	*h = NULL;
	return castfs_header_parse(f, len, len, h, d);
}

void stt_expect_bad_file(const uint8_t *f, size_t len, int rc,
			 const char *phrase)
{
	struct castfs_diag d;
	struct castfs_header *h;
	int got = stt_parse(f, len, &h, &d);

	ck_assert_msg(got == rc, "rc %d (%s), want %d", got, d.msg, rc);
	ck_assert_ptr_null(h);
	ck_assert_msg(strstr(d.msg, phrase), "diag '%s' lacks '%s'", d.msg,
		      phrase);
}

void stt_expect_bad(const char *json, size_t json_len, size_t data_len, int rc,
		    const char *phrase)
{
	size_t len;
	uint8_t *f = tu_raw(json, json_len, UINT64_MAX, data_len, &len);

	stt_expect_bad_file(f, len, rc, phrase);
	free(f);
}

struct castfs_header *stt_parse_ok(const uint8_t *f, size_t len)
{
	struct castfs_diag d;
	struct castfs_header *h;
	int rc = stt_parse(f, len, &h, &d);

	ck_assert_msg(rc == 0, "rc %d: %s", rc, d.msg);
	ck_assert_ptr_nonnull(h);
	return h;
}

struct castfs_header *stt_parse_json_ok(const char *json, size_t data_len)
{
	size_t len;
	uint8_t *f = tu_raw_str(json, data_len, &len);
	struct castfs_header *h = stt_parse_ok(f, len);

	free(f);
	return h;
}

struct castfs_header *stt_build_ok(struct tu_st *b)
{
	size_t len;
	uint8_t *f = tu_st_build(b, &len);
	struct castfs_header *h = stt_parse_ok(f, len);

	free(f);
	return h;
}

struct castfs_header *stt_build_take(struct tu_st *b)
{
	struct castfs_header *h = stt_build_ok(b);

	tu_st_free(b);
	return h;
}

const struct castfs_qinfo *stt_qinfo(const struct castfs_header *h,
				     const struct castfs_qsrc *q,
				     const char *name)
{
	return &q->t[stt_find(h, name) - h->tensors];
}

const struct castfs_tensor *stt_find(const struct castfs_header *h,
				     const char *name)
{
	const struct castfs_tensor *t =
		castfs_header_find(h, name, strlen(name));

	ck_assert_msg(t != NULL, "tensor '%s' not found", name);
	return t;
}

void stt_check_sorted(const struct castfs_header *h)
{
	for (size_t i = 1; i < h->ntensors; i++) {
		const struct castfs_tensor *a = h->by_name[i - 1],
					   *b = h->by_name[i];
		size_t m = a->name_len < b->name_len ? a->name_len :
						       b->name_len;
		int r = memcmp(a->name, b->name, m);

		ck_assert(h->tensors[i - 1].end == h->tensors[i].begin);
		ck_assert(r < 0 || (r == 0 && a->name_len < b->name_len));
	}
}

const char worked_json[] =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
	"\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]},"
	"\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[20,26]},"
	"\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,3],\"data_offsets\":[26,32]}}"
	"     ";
const uint8_t worked_prefix[8] = { 0x08, 0x01, 0, 0, 0, 0, 0, 0 };
