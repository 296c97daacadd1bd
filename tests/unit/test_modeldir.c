/* SPDX-License-Identifier: MIT */
/*
 * Model-directory views: the config.json patch and index.json rewrite as
 * text (exact bytes, as json.dumps(indent=2, sort_keys=True) writes), the
 * bitsandbytes skip rule, hostile JSON, and the namespace: DIR.<view>/,
 * listing ids equal lookup ids, and rewritten JSON going stale when a
 * shard changes.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeldir/modeldir.h"
#include "ns/ns.h"
#include "plan/plan.h"
#include "ns/stats.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

static struct castfs_views vs;

static const struct castfs_view *view(const char *name)
{
	const struct castfs_view *v =
		castfs_views_find(&vs, name, strlen(name));

	ck_assert_ptr_nonnull(v);
	return v;
}

static void views_setup(void)
{
	ck_assert_int_eq(castfs_views_builtin(&vs), 0);
}

static void views_teardown(void)
{
	castfs_views_fini(&vs);
}

/* Patch @in and compare with @want exactly. */
static void check_patch(const char *in, const struct castfs_md_patch *p,
			const char *want)
{
	char *out = NULL;
	size_t len;

	ck_assert_int_eq(
		castfs_md_config_patch(in, strlen(in), p, &out, &len, NULL), 0);
	ck_assert_uint_eq(len, strlen(out));
	ck_assert_str_eq(out, want);
	free(out);
}

/* ---- names ---- */

START_TEST(test_modeldir__name_kinds)
{
	const char *v;
	size_t stem, vl;

	ck_assert_int_eq(castfs_md_name_kind("config.json"), CASTFS_MD_CONFIG);
	ck_assert_int_eq(castfs_md_name_kind("model_index.json"),
			 CASTFS_MD_PIPELINE);
	ck_assert_int_eq(castfs_md_name_kind("a.safetensors"),
			 CASTFS_MD_WEIGHTS);
	ck_assert_int_eq(castfs_md_name_kind(".safetensors"), CASTFS_MD_OTHER);
	ck_assert_int_eq(castfs_md_name_kind("model.safetensors.index.json"),
			 CASTFS_MD_INDEX);
	ck_assert_int_eq(
		castfs_md_name_kind(
			"diffusion_pytorch_model.safetensors.index.fp16.json"),
		CASTFS_MD_INDEX);
	ck_assert_int_eq(castfs_md_name_kind("tokenizer.json"),
			 CASTFS_MD_OTHER);
	ck_assert(castfs_md_is_base_index("model.safetensors.index.json"));
	ck_assert(!castfs_md_is_base_index("model.safetensors.index.fp8.json"));
	ck_assert(!castfs_md_is_base_index(".safetensors.index.json"));
	ck_assert(castfs_md_split_variant_index(
		"model.safetensors.index.fp8.json", &stem, &v, &vl));
	ck_assert_uint_eq(stem, strlen("model.safetensors.index"));
	ck_assert_uint_eq(vl, 3);
	ck_assert(!strncmp(v, "fp8", 3));
	ck_assert(!castfs_md_split_variant_index("model.safetensors.index.json",
						 &stem, &v, &vl));
	ck_assert(!castfs_md_split_variant_index(
		"model.safetensors.index.F.P8.json", &stem, &v, &vl));
}
END_TEST

/* ---- config.json ---- */

static const char llama_cfg[] =
	"{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
	"  \"dtype\": \"float32\",\n  \"rms_norm_eps\": 1e-06,\n"
	"  \"rope_theta\": 10000.0,\n  \"vocab_size\": 128\n}\n";

START_TEST(test_modeldir__dtype_replaced_numbers_kept)
{
	const struct castfs_md_patch p = { .dtype = "bfloat16" };

	check_patch(
		llama_cfg, &p,
		"{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
		"  \"dtype\": \"bfloat16\",\n  \"rms_norm_eps\": 1e-06,\n"
		"  \"rope_theta\": 10000.0,\n  \"vocab_size\": 128\n}\n");
	/* Older configs: torch_dtype; both are set when both exist. */
	check_patch("{\"dtype\": \"float32\", \"torch_dtype\": \"float32\"}",
		    &p,
		    "{\"dtype\": \"bfloat16\", \"torch_dtype\": \"bfloat16\"}");
	/* None: added where sorted keys put it. */
	check_patch(
		"{\n  \"a\": 1,\n  \"z\": 2\n}", &p,
		"{\n  \"a\": 1,\n  \"dtype\": \"bfloat16\",\n  \"z\": 2\n}");
}
END_TEST

static const char bnb4_text[] =
	"  \"quantization_config\": {\n"
	"    \"_load_in_4bit\": true,\n"
	"    \"_load_in_8bit\": false,\n"
	"    \"bnb_4bit_compute_dtype\": \"bfloat16\",\n"
	"    \"bnb_4bit_quant_storage\": \"uint8\",\n"
	"    \"bnb_4bit_quant_type\": \"nf4\",\n"
	"    \"bnb_4bit_use_double_quant\": true,\n"
	"    \"llm_int8_enable_fp32_cpu_offload\": false,\n"
	"    \"llm_int8_has_fp16_weight\": false,\n"
	"    \"llm_int8_skip_modules\": null,\n"
	"    \"llm_int8_threshold\": 6.0,\n"
	"    \"load_in_4bit\": true,\n"
	"    \"load_in_8bit\": false,\n"
	"    \"quant_method\": \"bitsandbytes\"\n"
	"  },\n";

START_TEST(test_modeldir__quantization_config_as_to_dict)
{
	const struct castfs_md_bnb q = {
		.quant_type = "nf4",
		.double_quant = true,
		.compute_dtype = "bfloat16",
		.skip_null = true,
	};
	const struct castfs_md_patch p = { .bnb = &q };
	char want[2048];

	snprintf(want, sizeof(want),
		 "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
		 "  \"dtype\": \"float32\",\n%s  \"rms_norm_eps\": 1e-06,\n"
		 "  \"rope_theta\": 10000.0,\n  \"vocab_size\": 128\n}\n",
		 bnb4_text);
	check_patch(llama_cfg, &p, want);
}
END_TEST

START_TEST(test_modeldir__skip_list_and_unsorted_and_compact)
{
	char s1[] = "lm_head", s2[] = "model.layers.0.mlp";
	char *skip[] = { s1, s2 };
	const struct castfs_md_bnb q = {
		.load_in_8bit = true,
		.quant_type = "fp4",
		.compute_dtype = "float32",
		.nskip = 2,
		.skip = skip,
	};
	const struct castfs_md_patch p = { .bnb = &q };

	/* Unsorted keys: appended after the last member. */
	check_patch(
		"{\n\t\"z\": 1,\n\t\"a\": 2\n}", &p,
		"{\n\t\"z\": 1,\n\t\"a\": 2,\n\t\"quantization_config\": {\n"
		"\t\t\"_load_in_4bit\": false,\n"
		"\t\t\"_load_in_8bit\": true,\n"
		"\t\t\"bnb_4bit_compute_dtype\": \"float32\",\n"
		"\t\t\"bnb_4bit_quant_storage\": \"uint8\",\n"
		"\t\t\"bnb_4bit_quant_type\": \"fp4\",\n"
		"\t\t\"bnb_4bit_use_double_quant\": false,\n"
		"\t\t\"llm_int8_enable_fp32_cpu_offload\": false,\n"
		"\t\t\"llm_int8_has_fp16_weight\": false,\n"
		"\t\t\"llm_int8_skip_modules\": [\n"
		"\t\t\t\"lm_head\",\n\t\t\t\"model.layers.0.mlp\"\n\t\t],\n"
		"\t\t\"llm_int8_threshold\": 6.0,\n"
		"\t\t\"load_in_4bit\": false,\n"
		"\t\t\"load_in_8bit\": true,\n"
		"\t\t\"quant_method\": \"bitsandbytes\"\n\t}\n}");
	/* json.dumps without indent: one line. */
	check_patch("{\"a\": 1}", &p,
		    "{\"a\": 1, \"quantization_config\": {\"_load_in_4bit\": "
		    "false, \"_load_in_8bit\": true, \"bnb_4bit_compute_dtype\""
		    ": \"float32\", \"bnb_4bit_quant_storage\": \"uint8\", "
		    "\"bnb_4bit_quant_type\": \"fp4\", "
		    "\"bnb_4bit_use_double_quant\": false, "
		    "\"llm_int8_enable_fp32_cpu_offload\": false, "
		    "\"llm_int8_has_fp16_weight\": false, "
		    "\"llm_int8_skip_modules\": [\"lm_head\", "
		    "\"model.layers.0.mlp\"], \"llm_int8_threshold\": 6.0, "
		    "\"load_in_4bit\": false, \"load_in_8bit\": true, "
		    "\"quant_method\": \"bitsandbytes\"}}");
}
END_TEST

START_TEST(test_modeldir__config_facts_and_hostile_text)
{
	static const char *const bad[] = {
		"",
		"[]",
		"{",
		"{\"a\":1}}",
		"{\"a\":1} x",
		"\xef\xbb\xbf{}",
		"{\"a\":\"\x01\"}",
		"{\"a\" 1}",
		"\"s\"",
		"{\"a\":[1,}",
	};
	const struct castfs_md_bnb q = { .quant_type = "nf4",
					 .compute_dtype = "float32",
					 .skip_null = true };
	const struct castfs_md_patch p = { .dtype = "float16", .bnb = &q };
	struct castfs_md_config c;
	char *out, deep[3000];
	size_t len;
	static const char unet[] = "{\"_class_name\": \"UNet\"}";
	static const char quant[] = "{\"quantization_config\": {}}";

	ck_assert_int_eq(castfs_md_config_read(unet, strlen(unet), &c, NULL),
			 0);
	ck_assert(c.diffusers && !c.quantized);
	ck_assert_int_eq(castfs_md_config_read(quant, strlen(quant), &c, NULL),
			 0);
	ck_assert(!c.diffusers && c.quantized);
	ck_assert_int_eq(castfs_md_config_patch(quant, strlen(quant), &p, &out,
						&len, NULL),
			 -EINVAL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(castfs_md_config_patch(bad[i], strlen(bad[i]),
							&p, &out, &len, NULL),
				 -EINVAL);
	/* Deep nesting is refused by cJSON before the scanner sees it. */
	memset(deep, '[', sizeof(deep));
	memcpy(deep, "{\"a\":", 5);
	ck_assert_int_eq(castfs_md_config_patch(deep, sizeof(deep), &p, &out,
						&len, NULL),
			 -EINVAL);
	check_patch("{}", &p,
		    "{\"dtype\": \"float16\", "
		    "\"quantization_config\": {\"_load_in_4bit\": "
		    "true, \"_load_in_8bit\": false, "
		    "\"bnb_4bit_compute_dtype\": \"float32\", "
		    "\"bnb_4bit_quant_storage\": \"uint8\", "
		    "\"bnb_4bit_quant_type\": \"nf4\", "
		    "\"bnb_4bit_use_double_quant\": false, "
		    "\"llm_int8_enable_fp32_cpu_offload\": false, "
		    "\"llm_int8_has_fp16_weight\": false, "
		    "\"llm_int8_skip_modules\": null, "
		    "\"llm_int8_threshold\": 6.0, "
		    "\"load_in_4bit\": true, \"load_in_8bit\": false, "
		    "\"quant_method\": \"bitsandbytes\"}}");
}
END_TEST

/* ---- the skip rule ---- */

static struct castfs_header *header_of(const char *const *names,
				       const char *dtype, size_t n)
{
	static const uint64_t mat[] = { 64, 64 }, vec[] = { 64 };
	struct castfs_header *h;
	struct tu_st *b = tu_st_new();
	uint8_t *buf;
	size_t len;

	for (size_t i = 0; i < n; i++) {
		bool is_vec = strstr(names[i], "norm") != NULL;

		tu_st_add(b, names[i], dtype, is_vec ? 1 : 2,
			  is_vec ? vec : mat, NULL);
	}
	buf = tu_st_build(b, &len);
	ck_assert_int_eq(castfs_header_parse(buf, len, len, &h, NULL), 0);
	free(buf);
	tu_st_free(b);
	return h;
}

static const char *const llama_names[] = {
	"lm_head.weight",
	"model.embed_tokens.weight",
	"model.norm.weight",
	"model.layers.0.mlp.up_proj.weight",
	"model.layers.0.self_attn.q_proj.weight",
};

START_TEST(test_modeldir__skip_rule)
{
	struct castfs_header *h = header_of(llama_names, "BF16", 5);
	const struct castfs_header *hs[] = { h };
	struct castfs_view custom = *view("nf4");
	struct castfs_rule rule = { .pattern = (char[]){ "*.mlp.*" },
				    .min_rank = -1,
				    .max_rank = -1 };
	struct castfs_md_bnb q;

	/* transformers, default rule: the list, never null (which leaves
	 * the last module to the loader). */
	ck_assert_int_eq(castfs_md_bnb_init(&q, view("nf4"), hs, 1, false), 0);
	ck_assert(!q.skip_null);
	ck_assert_uint_eq(q.nskip, 2);
	ck_assert_str_eq(q.skip[0], "lm_head");
	ck_assert_str_eq(q.skip[1], "model.embed_tokens");
	ck_assert_str_eq(q.compute_dtype, "bfloat16");
	ck_assert_str_eq(q.quant_type, "nf4");
	ck_assert(q.double_quant && !q.load_in_8bit);
	castfs_md_bnb_fini(&q);
	/* diffusers: every unquantised 2-D weight, no lm_head added. */
	ck_assert_int_eq(castfs_md_bnb_init(&q, view("int8"), hs, 1, true), 0);
	ck_assert(!q.skip_null && q.load_in_8bit);
	ck_assert_str_eq(q.compute_dtype, "float32");
	ck_assert_uint_eq(q.nskip, 2);
	ck_assert_str_eq(q.skip[0], "lm_head");
	ck_assert_str_eq(q.skip[1], "model.embed_tokens");
	castfs_md_bnb_fini(&q);
	/* A rule keeping the MLP: the explicit list, plus lm_head. */
	custom.nrules = 1;
	custom.rules = &rule;
	ck_assert_int_eq(castfs_md_bnb_init(&q, &custom, hs, 1, false), 0);
	ck_assert(!q.skip_null);
	ck_assert_uint_eq(q.nskip, 3);
	ck_assert_str_eq(q.skip[0], "lm_head");
	ck_assert_str_eq(q.skip[1], "model.embed_tokens");
	ck_assert_str_eq(q.skip[2], "model.layers.0.mlp.up_proj");
	castfs_md_bnb_fini(&q);
	ck_assert_int_eq(castfs_md_bnb_init(&q, view("fp8"), hs, 1, false),
			 -EINVAL);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_modeldir__keep_rules_of_t5)
{
	static const char *const names[] = {
		"encoder.block.0.layer.1.DenseReluDense.wi.weight",
		"encoder.block.0.layer.1.DenseReluDense.wo.weight",
		"shared.weight",
	};
	struct castfs_header *h = header_of(names, "F32", 3);
	const struct castfs_header *hs[] = { h };
	struct castfs_md_config c;
	struct castfs_md_view mv;
	struct castfs_md_bnb q;
	static const char cfg[] = "{\"model_type\": \"t5\"}";

	ck_assert_int_eq(castfs_md_config_read(cfg, strlen(cfg), &c, NULL), 0);
	ck_assert_str_eq(c.model_type, "t5");
	ck_assert_int_gt(castfs_md_keep_id("t5"), 0);
	ck_assert_int_eq(castfs_md_keep_id("llama"), 0);
	ck_assert_int_eq(castfs_md_view_keep(view("nf4"),
					     castfs_md_keep_id("t5"), &mv),
			 0);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		ck_assert(castfs_view_converts(&mv.v, t) ==
			  (strstr(t->name, ".wi.") != NULL));
	}
	ck_assert_int_eq(castfs_md_bnb_init(&q, &mv.v, hs, 1, false), 0);
	ck_assert(!q.skip_null);
	ck_assert_uint_eq(q.nskip, 3);
	ck_assert_str_eq(q.skip[0],
			 "encoder.block.0.layer.1.DenseReluDense.wo");
	ck_assert_str_eq(q.skip[1], "lm_head");
	ck_assert_str_eq(q.skip[2], "shared");
	castfs_md_bnb_fini(&q);
	castfs_md_view_fini(&mv);
	/* _keep_in_fp32_modules are the bitsandbytes views' only: the
	 * compressed-tensors ones quantise wo, as llm-compressor does. */
	ck_assert_int_eq(castfs_md_view_keep(view("fp8_dynamic"),
					     castfs_md_keep_id("t5"), &mv),
			 0);
	ck_assert(castfs_view_converts(&mv.v, &h->tensors[1]));
	castfs_md_view_fini(&mv);
	ck_assert_int_eq(castfs_md_view_keep(view("nf4"), 999, &mv), -EINVAL);
	castfs_header_free(h);
}
END_TEST

/*
 * A mixture of experts (counted by one of three keys, over 0): the
 * routers stay unquantised in every quantising view, the per-expert
 * weights in the bitsandbytes ones (transformers fuses them on load).
 */
START_TEST(test_modeldir__keep_rules_of_moe)
{
	static const char *const names[] = {
		"model.layers.0.block_sparse_moe.experts.0.w1.weight",
		"model.layers.0.block_sparse_moe.gate.weight",
		"model.layers.0.mlp.gate.weight",
		"model.layers.0.mlp.gate_proj.weight",
		"model.layers.0.mlp.shared_experts.up_proj.weight",
		"model.layers.0.self_attn.q_proj.weight",
	};
	static const struct {
		const char *json;
		bool moe;
	} cfgs[] = {
		{ "{\"model_type\": \"mixtral\", \"num_local_experts\": 8}",
		  true },
		{ "{\"num_experts\": 64}", true },
		{ "{\"n_routed_experts\": 256}", true },
		{ "{\"num_experts\": 0}", false },
		{ "{\"num_experts\": \"8\"}", false },
		{ "{\"num_experts\": -8}", false },
		{ "{\"num_experts\": 8.5}", false },
		{ "{\"model_type\": \"llama\"}", false },
	};
	struct castfs_header *h = header_of(names, "BF16", 6);
	struct castfs_md_config c;
	struct castfs_md_view mv;

	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		ck_assert_int_eq(castfs_md_config_read(cfgs[i].json,
						       strlen(cfgs[i].json), &c,
						       NULL),
				 0);
		ck_assert_msg(c.moe == cfgs[i].moe, "%s", cfgs[i].json);
		ck_assert_int_eq(castfs_md_keep_of(&c),
				 cfgs[i].moe ? CASTFS_MD_KEEP_MOE : 0);
	}
	for (int ct = 0; ct < 2; ct++) {
		ck_assert_int_eq(
			castfs_md_view_keep(view(ct ? "fp8_dynamic" : "nf4"),
					    CASTFS_MD_KEEP_MOE, &mv),
			0);
		for (size_t i = 0; i < h->ntensors; i++) {
			const struct castfs_tensor *t = &h->tensors[i];
			bool kept = strstr(t->name, ".gate.weight") ||
				    (!ct && strstr(t->name, ".experts."));

			ck_assert_msg(castfs_view_converts(&mv.v, t) == !kept,
				      "%s %s", ct ? "ct" : "bnb", t->name);
		}
		castfs_md_view_fini(&mv);
	}
	ck_assert_int_eq(castfs_md_view_keep(view("nf4"), 0, &mv), -EINVAL);
	castfs_header_free(h);
}
END_TEST

/* Quantising views only for the checked architectures: every class
 * named must be one; none named, or a list castfs cannot read, is none. */
START_TEST(test_modeldir__quantisable_architectures)
{
	static const struct {
		const char *json;
		bool yes;
	} cfgs[] = {
		{ "{\"architectures\": [\"LlamaForCausalLM\"]}", true },
		{ "{\"architectures\": [\"T5EncoderModel\"]}", true },
		{ "{\"architectures\": [\"BertForMaskedLM\"]}", false },
		{ "{\"architectures\": [\"LlamaForCausalLM\", "
		  "\"FalconForCausalLM\"]}",
		  false },
		{ "{\"architectures\": []}", false },
		{ "{\"architectures\": null}", false },
		{ "{\"architectures\": [1]}", false },
		{ "{\"model_type\": \"llama\"}", false },
		{ "{\"_class_name\": \"UNet2DConditionModel\"}", true },
		{ "{\"_class_name\": \"UNet2DConditionModel\", "
		  "\"num_class_embeds\": null}",
		  true },
		/* class_embedding is then an nn.Embedding */
		{ "{\"_class_name\": \"UNet2DConditionModel\", "
		  "\"num_class_embeds\": 1000}",
		  false },
		{ "{\"_class_name\": \"FluxTransformer2DModel\"}", true },
		{ "{\"_class_name\": \"DiTTransformer2DModel\"}", false },
		{ "{\"_class_name\": \"WanTransformer3DModel\"}", false },
		{ "{\"_diffusers_version\": \"0.42.1\"}", false },
	};
	static const char t5[] = "{\"architectures\": [\"T5EncoderModel\"]}";
	struct castfs_md_config c;

	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		ck_assert_int_eq(castfs_md_config_read(cfgs[i].json,
						       strlen(cfgs[i].json), &c,
						       NULL),
				 0);
		ck_assert_msg(castfs_md_quantisable(&c, false) == cfgs[i].yes,
			      "%s", cfgs[i].json);
	}
	/* bitsandbytes checked, compressed-tensors not */
	ck_assert_int_eq(castfs_md_config_read(t5, strlen(t5), &c, NULL), 0);
	ck_assert(castfs_md_quantisable(&c, false));
	ck_assert(!castfs_md_quantisable(&c, true));
}
END_TEST

/* ---- index.json ---- */

static int shard_fn(void *ctx, const char *name, struct castfs_header **out)
{
	static const char *const s1[] = { "b.weight",
					  "a\"\xc3\xa9\xf0\x9f\x98\x80" };
	static const char *const s2[] = { "c.weight", "d.norm" };

	(void)ctx;
	if (strcmp(name, "m-1.safetensors") == 0)
		*out = header_of(s1, "F32", 2);
	else if (strcmp(name, "m-2.safetensors") == 0)
		*out = header_of(s2, "BF16", 2);
	else
		return -ENOENT;
	return 0;
}

static char *rewrite(const char *in, const char *variant, int *rc)
{
	char *out = NULL;
	size_t len;

	*rc = castfs_md_index_rewrite(in, strlen(in), variant, shard_fn, NULL,
				      &out, &len, NULL);
	ck_assert(*rc || len == strlen(out));
	return out;
}

START_TEST(test_modeldir__index_rewritten)
{
	static const char in[] =
		"{\n  \"metadata\": {\n    \"total_parameters\": 9,\n"
		"    \"total_size\": 1\n  },\n  \"weight_map\": {\n"
		"    \"b.weight\": \"m-1.safetensors\",\n"
		"    \"c.weight\": \"m-2.safetensors\"\n  }\n}\n";
	/* 64*64*4 * 2 + 64*64*2 + 64*2 */
	static const char want[] =
		"{\n  \"metadata\": {\n    \"total_parameters\": 9,\n"
		"    \"total_size\": 41088\n  },\n  \"weight_map\": {\n"
		"    \"a\\\"\\u00e9\\ud83d\\ude00\": \"m-1.fp8.safetensors\",\n"
		"    \"b.weight\": \"m-1.fp8.safetensors\",\n"
		"    \"c.weight\": \"m-2.fp8.safetensors\",\n"
		"    \"d.norm\": \"m-2.fp8.safetensors\"\n  }\n}\n";
	int rc;
	char *out = rewrite(in, "fp8", &rc);

	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(out, want);
	free(out);
	/* No metadata, an extra member: metadata added, the extra kept. */
	out = rewrite("{\"weight_map\": {\"c.weight\": \"m-2.safetensors\"}, "
		      "\"x\": [1, 2.50]}",
		      NULL, &rc);
	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(out, "{\n  \"metadata\": {\n    \"total_size\": 8320"
			      "\n  },\n  \"weight_map\": {\n    \"c.weight\": "
			      "\"m-2.safetensors\",\n    \"d.norm\": "
			      "\"m-2.safetensors\"\n  },\n  \"x\": [1, 2.50]"
			      "\n}\n");
	free(out);
}
END_TEST

START_TEST(test_modeldir__index_hostile)
{
	static const char *const bad[] = {
		"{}",
		"{\"weight_map\": []}",
		"{\"weight_map\": {\"a\": 1}}",
		"{\"weight_map\": {\"a\": \"../m-1.safetensors\"}}",
		"{\"weight_map\": {\"a\": \"x/m-1.safetensors\"}}",
		"{\"weight_map\": {\"a\": \"m-1.bin\"}}",
		"{\"weight_map\": {\"a\": \".safetensors\"}}",
		"{\"weight_map\": {\"a\": \"m-1.safetensors\"}",
	};
	int rc;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_ptr_null(rewrite(bad[i], NULL, &rc));
		ck_assert_int_eq(rc, -EINVAL);
	}
	ck_assert_ptr_null(rewrite("{\"weight_map\": {\"a\": "
				   "\"gone.safetensors\"}}",
				   NULL, &rc));
	ck_assert_int_eq(rc, -ENOENT);
}
END_TEST

/* The shape check a listing makes agrees with what the rewrite refuses,
 * and says why; a shard that is merely missing is not its business. */
START_TEST(test_modeldir__index_check_agrees_with_rewrite)
{
	static const char *const bad[] = {
		"{}",
		"[]",
		"{\"weight_map\": []}",
		"{\"weight_map\": {\"a\": 1}}",
		"{\"weight_map\": {\"a\": \"../m-1.safetensors\"}}",
		"{\"weight_map\": {\"a\": \"/m-1.safetensors\"}}",
		"{\"weight_map\": {\"a\": \"x/m-1.safetensors\"}}",
		"{\"weight_map\": {\"a\": \"m-1.bin\"}}",
		"{\"weight_map\": {\"a\": \"m-1.safetensors\"}",
	};
	static const char ok[] =
		"{\"weight_map\": {\"a\": \"m-1.safetensors\", "
		"\"b\": \"gone.safetensors\", "
		"\"c\": \"m-1.safetensors\"}}";
	struct castfs_diag d = { { 0 } };
	size_t longest = 0;
	int rc;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&d, 0, sizeof(d));
		ck_assert_int_eq(castfs_md_index_check(bad[i], strlen(bad[i]),
						       NULL, &d),
				 -EINVAL);
		ck_assert_str_ne(d.msg, "");
		ck_assert_ptr_null(rewrite(bad[i], NULL, &rc));
		ck_assert_int_eq(rc, -EINVAL);
	}
	memset(&d, 0, sizeof(d));
	castfs_md_index_check(bad[4], strlen(bad[4]), NULL, &d);
	ck_assert_str_eq(d.msg, "index: bad shard name for 'a'");
	ck_assert_int_eq(castfs_md_index_check(ok, strlen(ok), &longest, NULL),
			 0);
	ck_assert_uint_eq(longest, strlen("gone.safetensors"));
}
END_TEST

/* ---- the namespace ---- */

static char root[64];
static struct castfs_stats *st;
static struct castfs_ns *ns;
static struct castfs_scratch scr;

static void write_file(const char *name, const void *data, size_t len)
{
	tu_write_file(root, name, data, len);
}

static void write_shard(const char *name, const char *tensor, uint64_t rows)
{
	const uint64_t shape[] = { rows, 64 };
	struct tu_st *b = tu_st_new();
	uint8_t *buf;
	size_t len;

	tu_st_add(b, tensor, "BF16", 2, shape, NULL);
	buf = tu_st_build(b, &len);
	write_file(name, buf, len);
	free(buf);
	tu_st_free(b);
}

static void ns_setup(void)
{
	static const char index[] = "{\"metadata\": {}, \"weight_map\": {"
				    "\"a.weight\": \"m-1.safetensors\", "
				    "\"b.weight\": \"m-2.safetensors\"}}";
	static const char cfg[] = "{\"architectures\": [\"LlamaForCausalLM\"], "
				  "\"model_type\": \"llama\"}";
	struct castfs_ns_opts o = { .views = &vs };
	char path[256];

	strcpy(root, "/tmp/castfs-md-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(path, sizeof(path), "%s/m", root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/m/sub", root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/plain", root);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	write_shard("m/m-1.safetensors", "a.weight", 64);
	write_shard("m/m-2.safetensors", "b.weight", 64);
	write_file("m/model.safetensors.index.json", index, strlen(index));
	write_file("m/config.json", cfg, strlen(cfg));
	write_file("m/README.md", "hi\n", 3);
	write_file("plain/config.json", cfg, strlen(cfg));
	views_setup();
	ck_assert_int_eq(castfs_stats_new(vs.n, &st), 0);
	ck_assert_int_eq(castfs_scratch_init(&scr), 0);
	o.source = root;
	o.stats = st;
	/* These tests ask which names depend on a changed path, every one:
	 * as a successor daemon, this one does not leave out the names no
	 * lookup of its own answered (that filter: test_watch_seen.py). */
	o.successor = true;
	ck_assert_int_eq(castfs_ns_new(&o, &ns, NULL), 0);
}

static void ns_teardown(void)
{
	char cmd[128];

	castfs_ns_free(ns);
	castfs_scratch_fini(&scr);
	castfs_stats_free(st);
	views_teardown();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

/* The id @dir's listing gives @name, or 0 if not listed. */
static uint64_t listed_id(uint64_t dir, const char *name)
{
	struct castfs_dir *d;
	uint64_t id = 0;

	ck_assert_int_eq(castfs_ns_opendir(ns, dir, &d), 0);
	for (size_t i = 0; i < d->n; i++) {
		if (strcmp(d->ents[i].name, name) == 0)
			id = d->ents[i].ino;
	}
	castfs_dir_free(d);
	return id;
}

static uint64_t look(uint64_t dir, const char *name, struct stat *s)
{
	struct stat tmp;
	uint64_t id;

	ck_assert_int_eq(castfs_ns_lookup(ns, dir, name, &id, s ? s : &tmp), 0);
	return id;
}

static char *read_all(uint64_t id, size_t *len)
{
	struct castfs_file *f;
	char *buf = malloc(1 << 16);
	ssize_t n;

	ck_assert_int_eq(castfs_ns_open(ns, id, &f), 0);
	n = castfs_file_read(f, &scr, buf, (1 << 16) - 1, 0);
	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	*len = (size_t)n;
	castfs_file_close(f);
	return buf;
}

START_TEST(test_modeldir__views_listed_with_lookup_ids)
{
	static const char *const inside[] = {
		"config.json",
		"model.safetensors.index.json",
		"m-1.safetensors",
		"README.md",
		"sub",
	};
	uint64_t vdir, id;
	struct stat s;

	ck_assert_uint_ne(listed_id(CASTFS_NS_ROOT_ID, "m.nf4"), 0);
	ck_assert_uint_eq(listed_id(CASTFS_NS_ROOT_ID, "plain.nf4"), 0);
	ck_assert_uint_eq(listed_id(CASTFS_NS_ROOT_ID, "m.fp8_nan"), 0);
	vdir = look(CASTFS_NS_ROOT_ID, "m.fp8", &s);
	ck_assert(S_ISDIR(s.st_mode));
	ck_assert_uint_eq(listed_id(CASTFS_NS_ROOT_ID, "m.fp8"), vdir);
	look(CASTFS_NS_ROOT_ID, "m.fp8_nan", NULL); /* unlisted resolves */
	for (size_t i = 0; i < sizeof(inside) / sizeof(inside[0]); i++) {
		id = look(vdir, inside[i], NULL);
		ck_assert_uint_eq(listed_id(vdir, inside[i]), id);
	}
	/* Pass-through files are the source's nodes. */
	ck_assert_uint_eq(look(vdir, "README.md", NULL),
			  look(look(CASTFS_NS_ROOT_ID, "m", NULL), "README.md",
			       NULL));
	id = look(look(CASTFS_NS_ROOT_ID, "m", NULL),
		  "model.safetensors.index.fp8.json", NULL);
	ck_assert_uint_eq(listed_id(look(CASTFS_NS_ROOT_ID, "m", NULL),
				    "model.safetensors.index.fp8.json"),
			  id);
	ck_assert_uint_eq(listed_id(look(CASTFS_NS_ROOT_ID, "m", NULL),
				    "model.safetensors.index.nf4.json"),
			  0);
}
END_TEST

START_TEST(test_modeldir__json_sizes_and_staleness)
{
	uint64_t vdir = look(CASTFS_NS_ROOT_ID, "m.bf16", NULL), id, id2;
	struct stat s;
	size_t len;
	char *text;

	id = look(vdir, "config.json", &s);
	text = read_all(id, &len);
	ck_assert_uint_eq(len, (size_t)s.st_size);
	ck_assert_str_eq(text, "{\"architectures\": [\"LlamaForCausalLM\"], "
			       "\"dtype\": \"bfloat16\", "
			       "\"model_type\": \"llama\"}");
	free(text);
	id = look(vdir, "model.safetensors.index.json", &s);
	text = read_all(id, &len);
	ck_assert_uint_eq(len, (size_t)s.st_size);
	ck_assert_msg(strstr(text, "\"total_size\": 16384"), "%s", text);
	free(text);
	/* A shard changes: the index is another identity. */
	write_shard("m/m-2.safetensors", "b.weight", 32);
	ck_assert_int_eq(castfs_ns_getattr(ns, id, &s), -ESTALE);
	id2 = look(vdir, "model.safetensors.index.json", &s);
	ck_assert_uint_ne(id2, id);
	text = read_all(id2, &len);
	ck_assert_msg(strstr(text, "\"total_size\": 12288"), "%s", text);
	free(text);
}
END_TEST

struct seen {
	uint64_t parent[512];
	char name[512][64];
	size_t n;
};

static void collect(void *ctx, uint64_t parent, const char *name)
{
	struct seen *s = ctx;

	if (s->n < 512) {
		s->parent[s->n] = parent;
		snprintf(s->name[s->n++], 64, "%s", name);
	}
}

static bool reported(const struct seen *s, uint64_t parent, const char *name)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->parent[i] == parent && strcmp(s->name[i], name) == 0)
			return true;
	}
	return false;
}

START_TEST(test_modeldir__invalidation_names_the_dependents)
{
	uint64_t m = look(CASTFS_NS_ROOT_ID, "m", NULL);
	uint64_t vdir = look(CASTFS_NS_ROOT_ID, "m.fp8", NULL);
	uint64_t sub = look(vdir, "sub", NULL);
	struct seen *s = calloc(1, sizeof(*s));

	write_shard("m/m-2.safetensors", "b.weight", 32);
	castfs_ns_invalidate(ns, "m/m-2.safetensors", collect, s);
	ck_assert(reported(s, vdir, "m-2.safetensors"));
	ck_assert(reported(s, vdir, "config.json"));
	ck_assert(reported(s, vdir, "model.safetensors.index.json"));
	ck_assert(reported(s, CASTFS_NS_ROOT_ID, "m.fp8"));
	ck_assert(reported(s, m, "model.safetensors.index.fp8.json"));
	/* Deeper: an entry of m/sub is in m.fp8/sub/. */
	s->n = 0;
	write_file("m/sub/new.safetensors", "x", 1);
	castfs_ns_invalidate(ns, "m/sub/new.safetensors", collect, s);
	ck_assert(reported(s, sub, "new.safetensors"));
	ck_assert(reported(s, CASTFS_NS_ROOT_ID, "m.nf4"));
	ck_assert(reported(s, m, "sub.fp8")); /* m/sub as a root */
	free(s);
}
END_TEST

static char last_log[512];
static int nlogs;

static void keep_log(void *ctx, const char *msg)
{
	(void)ctx;
	snprintf(last_log, sizeof(last_log), "%s", msg);
	nlogs++;
}

/*
 * An index that names a shard by a path: a DIR.<view>/ looked up while it
 * was good refuses the index at lookup, and logs why; the directory is
 * then neither listed nor found (issue 17), and comes back when fixed.
 */
START_TEST(test_modeldir__index_with_a_path_is_refused_and_logged)
{
	static const char *const bad[] = {
		"{\"weight_map\": {\"a.weight\": \"../m-1.safetensors\"}}",
		"{\"weight_map\": {\"a.weight\": \"/tmp/m-1.safetensors\"}}",
	};
	static const char good[] =
		"{\"weight_map\": {\"a.weight\": \"m-1.safetensors\"}}";
	struct castfs_ns_opts o = {
		.source = root, .views = &vs, .stats = st, .log = keep_log
	};
	uint64_t id;
	struct stat s;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t vdir;

		write_file("m/model.safetensors.index.json", good,
			   strlen(good));
		castfs_ns_free(ns);
		ck_assert_int_eq(castfs_ns_new(&o, &ns, NULL), 0);
		vdir = look(CASTFS_NS_ROOT_ID, "m.bf16", NULL);
		write_file("m/model.safetensors.index.json", bad[i],
			   strlen(bad[i]));
		nlogs = 0;
		ck_assert_int_eq(
			castfs_ns_lookup(ns, vdir,
					 "model.safetensors.index.json", &id,
					 &s),
			-EINVAL);
		ck_assert_int_ge(nlogs, 1);
		ck_assert_msg(strstr(last_log,
				     "model.safetensors.index.json") &&
				      strstr(last_log, "refused") &&
				      strstr(last_log, "bad shard name"),
			      "%s", last_log);
		ck_assert_int_eq(castfs_ns_lookup(ns, CASTFS_NS_ROOT_ID,
						  "m.bf16", &id, &s),
				 -ENOENT);
		ck_assert_uint_eq(listed_id(CASTFS_NS_ROOT_ID, "m.bf16"), 0);
		ck_assert_uint_eq(
			listed_id(look(CASTFS_NS_ROOT_ID, "m", NULL),
				  "model.safetensors.index.fp16.json"),
			0);
	}
	write_file("m/model.safetensors.index.json", good, strlen(good));
	ck_assert_uint_ne(listed_id(CASTFS_NS_ROOT_ID, "m.bf16"), 0);
	look(CASTFS_NS_ROOT_ID, "m.bf16", NULL);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("modeldir");
	TCase *tc = tcase_create("json");

	tcase_add_checked_fixture(tc, views_setup, views_teardown);
	tcase_add_test(tc, test_modeldir__name_kinds);
	tcase_add_test(tc, test_modeldir__dtype_replaced_numbers_kept);
	tcase_add_test(tc, test_modeldir__quantization_config_as_to_dict);
	tcase_add_test(tc, test_modeldir__skip_list_and_unsorted_and_compact);
	tcase_add_test(tc, test_modeldir__config_facts_and_hostile_text);
	tcase_add_test(tc, test_modeldir__skip_rule);
	tcase_add_test(tc, test_modeldir__keep_rules_of_t5);
	tcase_add_test(tc, test_modeldir__keep_rules_of_moe);
	tcase_add_test(tc, test_modeldir__quantisable_architectures);
	tcase_add_test(tc, test_modeldir__index_rewritten);
	tcase_add_test(tc, test_modeldir__index_hostile);
	tcase_add_test(tc, test_modeldir__index_check_agrees_with_rewrite);
	suite_add_tcase(s, tc);
	tc = tcase_create("ns");
	tcase_add_checked_fixture(tc, ns_setup, ns_teardown);
	tcase_add_test(tc, test_modeldir__views_listed_with_lookup_ids);
	tcase_add_test(tc, test_modeldir__json_sizes_and_staleness);
	tcase_add_test(tc, test_modeldir__invalidation_names_the_dependents);
	tcase_add_test(tc,
		       test_modeldir__index_with_a_path_is_refused_and_logged);
	suite_add_tcase(s, tc);
	return s;
}
