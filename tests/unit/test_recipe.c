/* SPDX-License-Identifier: MIT */
/* Recipe tests: built-in views, JSON config validation, rules, -o views=. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "plan/plan.h"
#include "format/gguf.h"
#include "view/view.h"
#include "unit.h"

static struct castfs_views vs;

static void setup(void)
{
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
}

static void teardown(void)
{
	castfs_views_fini(&vs);
}

static const struct castfs_view *find(const char *name)
{
	return castfs_views_find(&vs, name, strlen(name));
}

static int load(const char *json, struct castfs_diag *d)
{
	return castfs_views_load(&vs, json, strlen(json), d);
}

START_TEST(test_recipe__builtins_are_what_the_docs_say)
{
	ck_assert_int_eq(find("fp8")->dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_uint_eq(find("fp8")->cvt_flags, CASTFS_CVT_SATURATE);
	ck_assert_uint_eq(find("fp8_e4m3fn")->cvt_flags, CASTFS_CVT_SATURATE);
	ck_assert_uint_eq(find("fp8_nan")->cvt_flags, 0);
	ck_assert_uint_eq(find("fp8_e5m2")->cvt_flags, 0);
	ck_assert_uint_eq(find("fp8_e5m2_sat")->cvt_flags, CASTFS_CVT_SATURATE);
	ck_assert_int_eq(find("fp8_e5m2")->dtype, CASTFS_DTYPE_F8_E5M2);
	ck_assert_int_eq(find("bf16")->dtype, CASTFS_DTYPE_BF16);
	ck_assert_int_eq(find("fp16")->dtype, CASTFS_DTYPE_F16);
	ck_assert_int_eq(find("fp32")->dtype, CASTFS_DTYPE_F32);
	ck_assert(find("nf4")->nested);
	ck_assert(!find("nf4_nodq")->nested);
	ck_assert_int_eq(find("nf4")->kind, CASTFS_VIEW_BNB4);
	ck_assert_int_eq(find("int8")->kind, CASTFS_VIEW_INT8);
	ck_assert_uint_eq(find("nf4")->blocksize, 64);
	ck_assert_ptr_null(find("fp9"));
	for (size_t i = 0; i < vs.n; i++) {
		size_t n = strlen(vs.v[i].name);

		/* GGUF views are named with their extension, "q8_0.gguf" */
		if (vs.v[i].kind == CASTFS_VIEW_GGUF) {
			ck_assert(n > 5 &&
				  !strcmp(vs.v[i].name + n - 5, ".gguf"));
			n -= 5;
		}
		ck_assert(castfs_view_name_valid(vs.v[i].name, n));
	}
	ck_assert_int_eq(find("q8_0.gguf")->gguf_type, CASTFS_GGML_Q8_0);
	ck_assert_ptr_eq(find("q8_0"), find("q8_0.gguf"));
	ck_assert_int_eq(find("bf16")->kind, CASTFS_VIEW_CAST);
}
END_TEST

START_TEST(test_recipe__config_adds_and_overrides_views)
{
	struct castfs_diag d = { { 0 } };
	size_t n = vs.n;

	ck_assert_int_eq(load("{\"views\":{\"half\":{\"dtype\":\"F16\"},"
			      "\"fp8\":{\"base\":\"fp8\",\"saturate\":false}}}",
			      &d),
			 0);
	ck_assert_uint_eq(vs.n, n + 1);
	ck_assert_int_eq(find("half")->kind, CASTFS_VIEW_CAST);
	ck_assert_int_eq(find("half")->dtype, CASTFS_DTYPE_F16);
	ck_assert(find("half")->listed);
	ck_assert_uint_eq(find("fp8")->cvt_flags, 0);
}
END_TEST

/*
 * A known view's name without "base" changes that view in place (it
 * started from an empty cast view: {"nf4": {"listed": false}} failed with
 * "cannot cast to ?"); its listing is kept. Node-id salts: 0 where the
 * view converts as the built-in of its name (ids and NFS handles kept),
 * else its fingerprint, which tells definitions apart.
 */
START_TEST(test_recipe__config_changes_a_view_in_place)
{
	struct castfs_diag d = { { 0 } };
	size_t n = vs.n;

	ck_assert_int_eq(load("{\"views\":{\"nf4\":{\"listed\":false},"
			      "\"w4a16\":{\"summary\":\"mine\"},"
			      "\"fp4\":{\"blocksize\":128},"
			      "\"a\":{\"dtype\":\"F16\"},"
			      "\"b\":{\"base\":\"fp16\"},"
			      "\"c\":{\"dtype\":\"BF16\"}}}",
			      &d),
			 0);
	ck_assert_uint_eq(vs.n, n + 3);
	ck_assert_int_eq(find("nf4")->kind, CASTFS_VIEW_BNB4);
	ck_assert_int_eq(find("nf4")->qtype, CASTFS_Q_NF4);
	ck_assert(!find("nf4")->listed);
	ck_assert_uint_eq(find("nf4")->id_salt, 0);
	ck_assert(!find("w4a16")->listed); /* not listed by default */
	ck_assert_uint_eq(find("w4a16")->id_salt, 0);
	ck_assert_uint_eq(find("fp4")->blocksize, 128);
	ck_assert_uint_ne(find("fp4")->id_salt, 0);
	/* Same definition, same salt; another definition, another. */
	ck_assert_uint_ne(find("a")->id_salt, 0);
	ck_assert_uint_eq(find("a")->id_salt, find("b")->id_salt);
	ck_assert_uint_ne(find("a")->id_salt, find("c")->id_salt);
	ck_assert_uint_eq(find("a")->id_salt,
			  castfs_view_fingerprint(find("fp16")));
}
END_TEST

START_TEST(test_recipe__rules_parse)
{
	struct castfs_diag d = { { 0 } };
	const struct castfs_view *v;

	ck_assert_int_eq(load("{\"views\":{\"q\":{\"base\":\"nf4\",\"rules\":["
			      "{\"match\":\"*.norm*\",\"convert\":false},"
			      "{\"dtypes\":[\"F32\",\"bf16\"],\"rank\":2,"
			      "\"convert\":true}]}}}",
			      &d),
			 0);
	v = find("q");
	ck_assert_uint_eq(v->nrules, 2);
	ck_assert_str_eq(v->rules[0].pattern, "*.norm*");
	ck_assert(!v->rules[0].convert);
	ck_assert_int_eq(v->rules[1].min_rank, 2);
	ck_assert_int_eq(v->rules[1].max_rank, 2);
	ck_assert_uint_eq(v->rules[1].dtype_mask,
			  (1u << CASTFS_DTYPE_F32) | (1u << CASTFS_DTYPE_BF16));
	ck_assert_int_eq(v->kind, CASTFS_VIEW_BNB4);
}
END_TEST

static const struct {
	const char *json, *phrase;
} bad_configs[] = {
	{ "[1]", "top level" },
	{ "{\"views\":{\"x\":{\"dtype\":\"F17\"}}}", "unknown dtype" },
	{ "{\"views\":{\"x.y\":{\"dtype\":\"F16\"}}}", "view name" },
	{ "{\"views\":{\"X\":{\"dtype\":\"F16\"}}}", "view name" },
	{ "{\"views\":{\"x\":{\"dtype\":\"F16\",\"colour\":1}}}",
	  "unknown key" },
	{ "{\"views\":{\"x\":{\"base\":\"nope\"}}}", "unknown base" },
	{ "{\"views\":{\"x\":{\"dtype\":\"I32\"}}}", "cannot cast" },
	{ "{\"views\":{\"x\":{\"dtype\":\"F16\",\"saturate\":true}}}", "fp8" },
	{ "{\"views\":{\"x\":{\"kind\":\"bnb4\",\"blocksize\":100}}}",
	  "power" },
	{ "{\"views\":{\"x\":{\"kind\":\"zip\"}}}", "kind" },
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":[{\"match\":1,"
	  "\"convert\":true}]}}}",
	  "match" },
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":[{\"match\":\"a\"}]}}}",
	  "convert" },
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":{}}}}", "array" },
	{ "{\"views\":3}", "object" },
	{ "{\"views\":{}} trailing", "JSON" },
	{ "{\"other\":{}}", "unknown key" },
	/* stop 39: said "cannot cast to ?" */
	{ "{\"views\":{\"x\":{}}}", "no dtype" },
	/* saturate came from the base, not from the user */
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"dtype\":\"BF16\"}}}",
	  "\"saturate\": false" },
	/* listed, and never opened: config names cannot end in .gguf */
	{ "{\"views\":{\"x\":{\"base\":\"q8_0.gguf\"}}}", "GGUF" },
	/* the last one silently won */
	{ "{\"views\":{\"x\":{\"dtype\":\"F16\"},\"x\":{\"dtype\":\"BF16\"}}}",
	  "defined twice" },
	{ "{\"views\":{\"x\":{\"dtype\":\"F16\",\"dtype\":\"BF16\"}}}",
	  "'dtype' is given twice" },
	{ "{\"views\":{\"x\":{\"dtype\":\"F16\"}},\"views\":{}}",
	  "'views' is given twice" },
	/* stop 43 (bug hunt): a rule's keys were the last exception */
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":[{\"match\":\"*\","
	  "\"match\":\"a\",\"convert\":true}]}}}",
	  "rule key 'match' given twice" },
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":[{\"rank\":2,"
	  "\"min_rank\":1,\"convert\":true}]}}}",
	  "rule key 'rank' given twice" },
	{ "{\"views\":{\"x\":{\"base\":\"fp8\",\"rules\":[{\"min_rank\":3,"
	  "\"max_rank\":2,\"convert\":true}]}}}",
	  "matches nothing" },
};

START_TEST(test_recipe__bad_configs_rejected_with_reason)
{
	struct castfs_diag d = { { 0 } };
	size_t n = vs.n;

	ck_assert_int_eq(load(bad_configs[_i].json, &d), -EINVAL);
	ck_assert_msg(strstr(d.msg, bad_configs[_i].phrase), "'%s' lacks '%s'",
		      d.msg, bad_configs[_i].phrase);
	/* A failed load leaves the set as it was. */
	ck_assert_uint_eq(vs.n, n);
	ck_assert_ptr_null(find("x"));
}
END_TEST

START_TEST(test_recipe__select_lists_only_named_views)
{
	struct castfs_diag d = { { 0 } };

	ck_assert_int_eq(castfs_views_select(&vs, "fp8,nf4", &d), 0);
	for (size_t i = 0; i < vs.n; i++)
		ck_assert(vs.v[i].listed == (!strcmp(vs.v[i].name, "fp8") ||
					     !strcmp(vs.v[i].name, "nf4")));
	ck_assert_int_eq(castfs_views_select(&vs, "fp8,nope", &d), -EINVAL);
	ck_assert(strstr(d.msg, "nope"));
	ck_assert(find("nf4")->listed); /* unchanged on error */
}
END_TEST

static struct castfs_tensor tensor(const char *name, enum castfs_dtype dt,
				   uint32_t ndim)
{
	static const uint64_t shape[] = { 8, 8, 3, 3 };
	struct castfs_tensor t = {
		.name = name,
		.name_len = strlen(name),
		.dtype = dt,
		.ndim = ndim,
		.shape = shape,
		.nelems = 1,
	};

	for (uint32_t i = 0; i < ndim; i++)
		t.nelems *= shape[i];
	return t;
}

/*
 * A config view's rules as FORMATS.md states them: the first rule that
 * matches a tensor decides; a rule matches when its glob (fnmatch), its
 * dtypes and its rank bounds all do ("rank" is both bounds). Each tensor
 * below is decided by one rule, and any other rule deciding it gives
 * another answer: a rule whose dtypes, min_rank or max_rank were not
 * checked would catch "c", the last matching rule would decide "a.keep.w".
 */
START_TEST(test_recipe__rules_pick_tensors)
{
	struct castfs_diag d = { { 0 } };
	const struct castfs_view *v;
	static const struct {
		const char *name;
		enum castfs_dtype dt;
		uint32_t ndim;
		bool converts;
	} want[] = {
		{ "a.keep.w", CASTFS_DTYPE_BF16, 2, false }, /* the glob */
		{ "b", CASTFS_DTYPE_F16, 2, false }, /* dtypes F16 */
		{ "conv", CASTFS_DTYPE_BF16, 4, false }, /* min_rank 3 */
		{ "scalar", CASTFS_DTYPE_BF16, 0, false }, /* max_rank 0 */
		{ "bias", CASTFS_DTYPE_BF16, 1, false }, /* rank 1 */
		{ "c", CASTFS_DTYPE_BF16, 2, true }, /* the last rule */
		{ "a.kept", CASTFS_DTYPE_BF16, 2, true }, /* not the glob */
		{ "d", CASTFS_DTYPE_F32, 3, false }, /* dtypes F32, rank 3 */
	};

	ck_assert_int_eq(load("{\"views\":{\"r\":{\"base\":\"fp16\","
			      "\"rules\":["
			      "{\"match\":\"a.keep.*\",\"convert\":false},"
			      "{\"dtypes\":[\"F16\"],\"convert\":false},"
			      "{\"min_rank\":3,\"convert\":false},"
			      "{\"max_rank\":0,\"convert\":false},"
			      "{\"rank\":1,\"convert\":false},"
			      "{\"convert\":true}]}}}",
			      &d),
			 0);
	v = find("r");
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct castfs_tensor t =
			tensor(want[i].name, want[i].dt, want[i].ndim);

		ck_assert_msg(castfs_view_converts(v, &t) == want[i].converts,
			      "%s", want[i].name);
	}
}
END_TEST

START_TEST(test_recipe__default_rules_pick_linear_weights)
{
	const struct castfs_view *nf4 = find("nf4"), *fp8 = find("fp8");
	struct castfs_tensor t;

	t = tensor("model.layers.0.self_attn.q_proj.weight", CASTFS_DTYPE_BF16,
		   2);
	ck_assert(castfs_view_converts(nf4, &t));
	t = tensor("time_embedding.linear_1.weight", CASTFS_DTYPE_F32, 2);
	ck_assert(castfs_view_converts(nf4, &t));
	t = tensor("model.embed_tokens.weight", CASTFS_DTYPE_BF16, 2);
	ck_assert(!castfs_view_converts(nf4, &t));
	ck_assert(castfs_view_converts(fp8, &t));
	t = tensor("lm_head.weight", CASTFS_DTYPE_BF16, 2);
	ck_assert(!castfs_view_converts(nf4, &t));
	t = tensor("model.norm.weight", CASTFS_DTYPE_BF16, 1);
	ck_assert(!castfs_view_converts(nf4, &t));
	t = tensor("layers.0.q_proj.bias", CASTFS_DTYPE_BF16, 2);
	ck_assert(!castfs_view_converts(nf4, &t));
	t = tensor("conv_in.weight", CASTFS_DTYPE_F32, 4);
	ck_assert(!castfs_view_converts(nf4, &t));
	ck_assert(castfs_view_converts(fp8, &t));
	t = tensor("x.weight", CASTFS_DTYPE_I32, 2);
	ck_assert(!castfs_view_converts(nf4, &t));
	ck_assert(!castfs_view_converts(fp8, &t));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("recipe");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_recipe__builtins_are_what_the_docs_say);
	tcase_add_test(tc, test_recipe__config_adds_and_overrides_views);
	tcase_add_test(tc, test_recipe__config_changes_a_view_in_place);
	tcase_add_test(tc, test_recipe__rules_parse);
	tcase_add_loop_test(
		tc, test_recipe__bad_configs_rejected_with_reason, 0,
		(int)(sizeof(bad_configs) / sizeof(bad_configs[0])));
	tcase_add_test(tc, test_recipe__select_lists_only_named_views);
	tcase_add_test(tc, test_recipe__default_rules_pick_linear_weights);
	tcase_add_test(tc, test_recipe__rules_pick_tensors);
	suite_add_tcase(s, tc);
	return s;
}
