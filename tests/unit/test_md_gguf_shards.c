/* SPDX-License-Identifier: MIT */
/*
 * modeldir/modeldir_gguf_shards: the shards of a sharded folder's GGUF
 * file in convert_hf_to_gguf.py's order (sorted file names, each once),
 * names that are not plain files beside the index refused, and an index
 * that must map exactly what the shards hold.
 */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "modeldir/modeldir.h"
#include "st_testutil.h"
#include "unit.h"

#define IX(wm) "{\"metadata\":{},\"weight_map\":{" wm "}}"

START_TEST(test_md_gguf_shards__sorted_once)
{
	static const char js[] = IX("\"c\":\"m-2.safetensors\","
				    "\"a\":\"m-10.safetensors\","
				    "\"b\":\"m-2.safetensors\","
				    "\"d\":\"m-1.safetensors\"");
	struct castfs_diag d = { { 0 } };
	char **names = NULL;
	size_t n = 0;

	ck_assert_int_eq(castfs_md_gguf_shards(js, strlen(js), &names, &n, &d),
			 0);
	ck_assert_uint_eq(n, 3);
	/* bytewise, as Python's sorted(): "m-10" before "m-2" */
	ck_assert_str_eq(names[0], "m-1.safetensors");
	ck_assert_str_eq(names[1], "m-10.safetensors");
	ck_assert_str_eq(names[2], "m-2.safetensors");
	castfs_md_gguf_shards_free(names, n);
}
END_TEST

static const char *const bad_indexes[] = {
	IX("\"a\":\"../x.safetensors\""),
	IX("\"a\":\"d/x.safetensors\""),
	IX("\"a\":\"x.bin\""),
	IX("\"a\":\".safetensors\""),
	IX("\"a\":1"),
	IX(""),
	"{\"weight_map\":[]}",
	"[]",
};

START_TEST(test_md_gguf_shards__refused)
{
	const char *js = bad_indexes[_i];
	struct castfs_diag d = { { 0 } };
	char **names = NULL;
	size_t n = 7;

	ck_assert_int_eq(castfs_md_gguf_shards(js, strlen(js), &names, &n, &d),
			 -EINVAL);
	ck_assert_ptr_null(names);
	ck_assert_uint_eq(n, 7);
	ck_assert_int_ne(d.msg[0], '\0');
}
END_TEST

#define T(name, off)                                                           \
	"\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" off \
	"]}"

/* castfs_md_gguf_check_map() of shards {a, b} and {c} against @wm. */
static int check_map(const char *wm, struct castfs_diag *d)
{
	static const char *const shards[] = { "s-1.safetensors",
					      "s-2.safetensors" };
	struct castfs_header *h[2] = {
		stt_parse_json_ok("{" T("a", "0,4") "," T("b", "4,8") "}", 8),
		stt_parse_json_ok("{" T("c", "0,4") "}", 4),
	};
	const struct castfs_md_gguf_src s = {
		.index = wm,
		.index_len = strlen(wm),
		.shards = shards,
		.h = (const struct castfs_header *const *)h,
		.nh = 2,
	};
	int rc = castfs_md_gguf_check_map(&s, d);

	castfs_header_free(h[0]);
	castfs_header_free(h[1]);
	return rc;
}

START_TEST(test_md_gguf_shards__map_exact)
{
	struct castfs_diag d = { { 0 } };

	ck_assert_int_eq(check_map(IX("\"a\":\"s-1.safetensors\","
				      "\"c\":\"s-2.safetensors\","
				      "\"b\":\"s-1.safetensors\""),
				   &d),
			 0);
	/* c mapped to the wrong shard */
	d.msg[0] = '\0';
	ck_assert_int_eq(check_map(IX("\"a\":\"s-1.safetensors\","
				      "\"c\":\"s-1.safetensors\","
				      "\"b\":\"s-1.safetensors\""),
				   &d),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(d.msg, "'c'"));
	/* a tensor no shard holds */
	ck_assert_int_eq(check_map(IX("\"a\":\"s-1.safetensors\","
				      "\"c\":\"s-2.safetensors\","
				      "\"b\":\"s-1.safetensors\","
				      "\"z\":\"s-2.safetensors\""),
				   &d),
			 -EINVAL);
	/* b not in the index (a diag keeps its first message) */
	d.msg[0] = '\0';
	ck_assert_int_eq(check_map(IX("\"a\":\"s-1.safetensors\","
				      "\"c\":\"s-2.safetensors\""),
				   &d),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(d.msg, "'b'"));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("md_gguf_shards");
	TCase *tc = tcase_create("shards");

	tcase_add_test(tc, test_md_gguf_shards__sorted_once);
	tcase_add_loop_test(
		tc, test_md_gguf_shards__refused, 0,
		(int)(sizeof(bad_indexes) / sizeof(bad_indexes[0])));
	tcase_add_test(tc, test_md_gguf_shards__map_exact);
	suite_add_tcase(s, tc);
	return s;
}
