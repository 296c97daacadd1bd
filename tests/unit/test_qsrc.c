/* SPDX-License-Identifier: MIT */
/*
 * Quantized sources: the classification of checkpoints (view/qsrc.c), the
 * range logic of the FP8 block dequantizer against a slow element-by-element
 * materialisation, and the config.json of a quantized model
 * (modeldir_quant.c). Values against the real loaders are checked in
 * tests/compat/test_quant_src.py.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/reader.h"
#include "format/st_side.h"
#include "modeldir/modeldir.h"
#include "fp8_slow.h"
#include "st_testutil.h"
#include "unit.h"
#include "view/qsrc.h"

/* @b's header with its side data read from its bytes, as a mount reads
 * it; @b is consumed. */
static struct castfs_header *build_side(struct tu_st *b)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_mem_reader mr;
	struct castfs_header *h;
	size_t len;
	uint8_t *f = tu_st_build(b, &len);

	h = stt_parse_ok(f, len);
	castfs_mem_reader_init(&mr, f, len);
	ck_assert_int_eq(castfs_header_read_side(h, &mr.r, &d), 0);
	free(f);
	tu_st_free(b);
	return h;
}

/* A comfy_quant form layer m.a whose marker holds @json (NULL: the
 * header parsed without its side data). */
static struct castfs_header *comfy_layer(const char *json)
{
	static const char e4m3[] = "{\"format\": \"float8_e4m3fn\"}";
	struct tu_st *b = tu_st_new();
	const char *js = json ? json : e4m3;

	tu_st_add(b, "m.a.weight", "F8_E4M3", SHAPE(6, 10), NULL);
	tu_st_add(b, "m.a.weight_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b, "m.a.input_scale", "F32", 0, NULL, NULL);
	tu_st_add(b, "m.a.comfy_quant", "U8", SHAPE(strlen(js)), js);
	tu_st_add(b, "m.b.weight", "BF16", SHAPE(6, 10), NULL);
	return json ? build_side(b) : stt_build_take(b);
}

/* FP8 block pairs of every kind, and an F8 tensor without a scale if
 * @lone. */
static struct tu_st *fp8_pairs(bool lone)
{
	struct tu_st *b = tu_st_new();

	tu_st_add(b, "a.weight", "F8_E4M3", SHAPE(576, 200), NULL);
	tu_st_add(b, "a.weight_scale_inv", "F32", SHAPE(5, 2), NULL);
	tu_st_add(b, "e.gate_up_proj", "F8_E4M3", SHAPE(3, 200, 129), NULL);
	tu_st_add(b, "e.gate_up_proj_scale_inv", "F8_E8M0", SHAPE(3, 2, 2),
		  NULL);
	tu_st_add(b, "t.weight", "F8_E4M3", SHAPE(10, 7), NULL);
	tu_st_add(b, "t.weight_scale_inv", "F32", 0, NULL, NULL);
	tu_st_add(b, "v4.weight", "F8_E4M3", SHAPE(130, 129), NULL);
	tu_st_add(b, "v4.scale", "F8_E8M0", SHAPE(2, 2), NULL);
	tu_st_add(b, "ln.weight", "F32", SHAPE(4), NULL);
	tu_st_add(b, "ln.scale", "F32", SHAPE(4), NULL);
	tu_st_add(b, "position_ids", "I64", SHAPE(1, 8), NULL);
	tu_st_add(b, "mask", "BOOL", SHAPE(8), NULL);
	if (lone)
		tu_st_add(b, "plain.weight", "F8_E4M3", SHAPE(4, 4), NULL);
	return b;
}

START_TEST(test_qsrc__fp8_pairs)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h = stt_build_take(fp8_pairs(false));

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nfp8, 4);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight")->role,
			  CASTFS_QR_FP8_BLOCK);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight")->brows, 128);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight_scale_inv")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "e.gate_up_proj")->role,
			  CASTFS_QR_FP8_BLOCK);
	ck_assert_uint_eq(stt_qinfo(h, &q, "t.weight")->brows, 10);
	ck_assert_uint_eq(stt_qinfo(h, &q, "t.weight")->bcols, 7);
	ck_assert_uint_eq(stt_qinfo(h, &q, "v4.scale")->role, CASTFS_QR_SCALE);
	/* A module's own scale and integers are plain. */
	ck_assert_uint_eq(stt_qinfo(h, &q, "ln.scale")->role, CASTFS_QR_PLAIN);
	ck_assert_uint_eq(stt_qinfo(h, &q, "position_ids")->role,
			  CASTFS_QR_PLAIN);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
	/* An F8 tensor without a scale beside FP8 block weights lost it,
	 * in a model directory or not (DeepSeek's converter would copy its
	 * raw codes into a "bf16" file). */
	h = stt_build_take(fp8_pairs(true));
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "'plain.weight'"));
	ck_assert_int_eq(castfs_qsrc_scan(h, CASTFS_QSRC_STRICT, &q, &d),
			 -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "'plain.weight'"));
	castfs_header_free(h);
}
END_TEST

/* ComfyUI's two forms: weights paired, every companion left out. */
START_TEST(test_qsrc__comfy)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h;

	tu_st_add(b, "scaled_fp8", "F8_E4M3", SHAPE(0), NULL);
	tu_st_add(b, "a.weight", "F8_E4M3", SHAPE(6, 10), NULL);
	tu_st_add(b, "a.scale_weight", "F32", 0, NULL, NULL);
	tu_st_add(b, "a.scale_input", "F32", 0, NULL, NULL);
	tu_st_add(b, "a.bias", "BF16", SHAPE(6), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nfp8, 1);
	ck_assert_uint_eq(q.ncomfy, 1);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight")->rule,
			  CASTFS_QRULE_COMPUTE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight")->brows, 6);
	ck_assert_uint_eq(stt_qinfo(h, &q, "scaled_fp8")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.scale_input")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.bias")->role, CASTFS_QR_PLAIN);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
	h = comfy_layer("{\"format\": \"float8_e4m3fn\"}");
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.ncomfy, 1);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.a.comfy_quant")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.a.input_scale")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.b.weight")->role,
			  CASTFS_QR_PLAIN);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
}
END_TEST

/* ComfyUI reads a layer by its comfy_quant JSON's "format", as
 * json.loads() parses it: another format, another JSON, trailing bytes
 * or a marker whose bytes were not read refuse the file. */
START_TEST(test_qsrc__comfy_quant_json)
{
	static const struct {
		const char *json, *phrase;
	} bad[] = {
		{ "{\"format\": \"nvfp4\"}", "'nvfp4'" },
		{ "{\"format\": \"float8_e5m2\"}", "'float8_e5m2'" },
		{ "\"float8_e4m3fn\"", "JSON object" },
		{ "{\"format\": \"float8_e4m3fn\"} x", "JSON object" },
		{ "{\"format\": 8}", "JSON object" },
		{ NULL, "did not read" },
	};
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct castfs_header *h = comfy_layer(bad[i].json);

		castfs_diag_clear(&d);
		ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
		ck_assert_msg(strstr(d.msg, bad[i].phrase), "%zu: %s", i,
			      d.msg);
		castfs_header_free(h);
	}
	/* Whitespace around the value is JSON's own. */
	{
		struct castfs_header *h = comfy_layer(
			" \n{\"format\": \"float8_e4m3fn\", \"x\": 1}\r\n");

		ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
		castfs_qsrc_fini(&q);
		castfs_header_free(h);
	}
}
END_TEST

/* Files castfs must refuse: tensors (name, dtype, shape) and the reason. */
static const struct {
	const char *name[3], *dtype[3];
	uint64_t shape[3][2];
	uint32_t ndim[3];
	const char *phrase;
} refused[] = {
	{ { "l.weight", "l.weight_scale_inv" },
	  { "F8_E4M3", "F32" },
	  { { 256, 256 }, { 4, 4 } },
	  { 2, 2 },
	  "128x128" },
	/* 16-bit float block scales are read since stop 42; F64 is not. */
	{ { "l.weight", "l.weight_scale_inv" },
	  { "F8_E4M3", "F64" },
	  { { 256, 256 }, { 2, 2 } },
	  { 2, 2 },
	  "128x128" },
	{ { "l.weight", "l.weight_scale_inv" },
	  { "F8_E5M2", "F32" },
	  { { 256, 256 }, { 2, 2 } },
	  { 2, 2 },
	  "128x128" },
	{ { "l.weight_scale_inv" }, { "F32" }, { { 2, 2 } }, { 2 }, "without" },
	{ { "l.weight", "l.weight.absmax" },
	  { "U8", "F32" },
	  { { 32, 1 }, { 1, 0 } },
	  { 2, 1 },
	  "bitsandbytes 4-bit" },
	{ { "l.weight", "l.weight.quant_state.bitsandbytes__nf4" },
	  { "U8", "U8" },
	  { { 32, 1 }, { 10, 0 } },
	  { 2, 1 },
	  "bitsandbytes 4-bit" },
	{ { "l.weight", "l.SCB" },
	  { "I8", "F32" },
	  { { 4, 4 }, { 3, 0 } },
	  { 2, 1 },
	  "LLM.int8" },
	{ { "l.weight", "l.SCB" },
	  { "U8", "F32" },
	  { { 4, 4 }, { 4, 0 } },
	  { 2, 1 },
	  "LLM.int8" },
	{ { "x.down_proj_blocks", "x.down_proj_scales" },
	  { "U8", "U8" },
	  { { 4, 16 }, { 4, 1 } },
	  { 2, 2 },
	  "MXFP4" },
	{ { "l.weight_packed", "l.weight_scale" },
	  { "U8", "F8_E4M3" },
	  { { 4, 8 }, { 4, 1 } },
	  { 2, 2 },
	  "compressed-tensors" },
	/* compressed-tensors FP8 whose scale fits no strategy (a fitting
	 * one is dequantized: test_qsrc__ct_fp8). */
	{ { "l.weight", "l.weight_scale" },
	  { "F8_E4M3", "BF16" },
	  { { 4, 4 }, { 3, 1 } },
	  { 2, 2 },
	  "compressed-tensors FP8" },
	{ { "scaled_fp8", "l.weight", "l.scale_weight" },
	  { "F8_E4M3", "F8_E4M3", "F32" },
	  { { 0, 0 }, { 4, 4 }, { 4, 1 } },
	  { 1, 2, 2 },
	  "ComfyUI" },
	{ { "scaled_fp8", "l.weight", "l.scale_weight" },
	  { "F8_E5M2", "F8_E5M2", "F32" },
	  { { 0, 0 }, { 4, 4 }, { 1, 0 } },
	  { 1, 2, 1 },
	  "ComfyUI" },
	{ { "l.weight", "l.weight_scale", "l.comfy_quant" },
	  { "F8_E4M3", "BF16", "U8" },
	  { { 4, 4 }, { 1, 0 }, { 27, 0 } },
	  { 2, 1, 1 },
	  "ComfyUI" },
	{ { "l.qweight", "l.scales" },
	  { "I32", "F16" },
	  { { 4, 4 }, { 1, 32 } },
	  { 2, 2 },
	  "GPTQ" },
	/* optimum-quanto's qfloat8 (QModuleMixin._save_to_state_dict):
	 * codes and scale, no "l.weight" (a bug hunt: cast as values). */
	{ { "l.weight._data", "l.weight._scale", "l.input_scale" },
	  { "F8_E4M3", "F32", "F32" },
	  { { 4, 4 }, { 4, 1 }, { 0, 0 } },
	  { 2, 2, 0 },
	  "optimum-quanto" },
	{ { "l.weight._data", "l.weight._scale" },
	  { "I8", "BF16" },
	  { { 4, 4 }, { 4, 1 } },
	  { 2, 2 },
	  "optimum-quanto" },
	/* Layouts a bug hunt saw served as casts: codes kept, their F16
	 * scales narrowed to BF16 (HQQLinear's state dict, exllamav2's and
	 * exllamav3's tensors, AQLM's QuantizedLinear, Marlin's Layer). */
	{ { "l.W_q", "l.scale", "l.zero" },
	  { "U8", "F16", "F16" },
	  { { 2, 4 }, { 4, 1 }, { 4, 1 } },
	  { 2, 2, 2 },
	  "HQQ" },
	{ { "l.q_weight", "l.q_invperm", "l.q_scale_max" },
	  { "I32", "I16", "F16" },
	  { { 1, 4 }, { 4, 0 }, { 1, 0 } },
	  { 2, 1, 1 },
	  "EXL2" },
	{ { "l.trellis", "l.suh", "l.svh" },
	  { "I16", "F16", "F16" },
	  { { 1, 16 }, { 16, 0 }, { 16, 0 } },
	  { 2, 1, 1 },
	  "EXL3" },
	{ { "l.codes", "l.codebooks", "l.scales" },
	  { "I16", "F16", "F16" },
	  { { 4, 1 }, { 1, 256 }, { 4, 1 } },
	  { 2, 2, 2 },
	  "AQLM" },
	{ { "l.B", "l.s" },
	  { "I32", "F16" },
	  { { 1, 16 }, { 1, 4 } },
	  { 2, 2 },
	  "Marlin" },
	{ { "l.weight", "l.scb" },
	  { "I8", "F32" },
	  { { 4, 4 }, { 4, 0 } },
	  { 2, 1 },
	  "scale of a packed" },
	/* Transformer Engine's te.Linear saved with FP8 weights: its
	 * scales are in the module's pickled "_extra_state" bytes (a
	 * note left it cast as unscaled codes). */
	{ { "l.weight", "l._extra_state" },
	  { "F8_E4M3", "U8" },
	  { { 4, 4 }, { 64, 0 } },
	  { 2, 1 },
	  "Transformer Engine FP8" },
	{ { "l.weight", "l.bias", "l._extra_state" },
	  { "F8_E5M2", "BF16", "U8" },
	  { { 4, 4 }, { 4, 0 }, { 64, 0 } },
	  { 2, 1, 1 },
	  "Transformer Engine FP8" },
	/* te.LayerNormMLP's and te.GroupedLinear's weights (a review). */
	{ { "mlp.fc1_weight", "mlp.fc2_weight", "mlp._extra_state" },
	  { "BF16", "F8_E4M3", "U8" },
	  { { 4, 4 }, { 4, 4 }, { 64, 0 } },
	  { 2, 2, 1 },
	  "Transformer Engine FP8" },
	{ { "experts.weight0", "experts.weight1", "experts._extra_state" },
	  { "F8_E4M3", "F8_E4M3", "U8" },
	  { { 4, 4 }, { 4, 4 }, { 64, 0 } },
	  { 2, 2, 1 },
	  "Transformer Engine FP8" },
};

/* The generic words of those layouts alone are plain parameters. */
START_TEST(test_qsrc__generic_words_plain)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h;

	tu_st_add(b, "vq.codebooks", "F32", SHAPE(8, 4), NULL);
	tu_st_add(b, "vq.codes", "F32", SHAPE(8), NULL);
	tu_st_add(b, "ssm.B", "F32", SHAPE(4, 4), NULL);
	tu_st_add(b, "ssm.s", "F32", SHAPE(4), NULL);
	tu_st_add(b, "attn.q_weight", "BF16", SHAPE(4, 4), NULL);
	/* A te.Linear of bf16 weights: its _extra_state is run-time state. */
	tu_st_add(b, "te.weight", "BF16", SHAPE(4, 4), NULL);
	tu_st_add(b, "te._extra_state", "U8", SHAPE(64), NULL);
	tu_st_add(b, "mlp.fc1_weight", "BF16", SHAPE(4, 4), NULL);
	tu_st_add(b, "mlp._extra_state", "U8", SHAPE(64), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nfp8, 0);
	for (size_t i = 0; i < q.n; i++)
		ck_assert_uint_eq(q.t[i].role, CASTFS_QR_PLAIN);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_qsrc__refused)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q = { 0 };
	struct castfs_header *h;

	tu_st_add(b, "model.norm.weight", "BF16", SHAPE(4), NULL);
	for (size_t i = 0; i < 3 && refused[_i].name[i]; i++)
		tu_st_add(b, refused[_i].name[i], refused[_i].dtype[i],
			  refused[_i].ndim[i], refused[_i].shape[i], NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_null(q.t); /* nothing handed out */
	ck_assert_msg(strstr(d.msg, refused[_i].phrase), "%s", d.msg);
	ck_assert_msg(strstr(d.msg, "no views"), "%s", d.msg);
	castfs_header_free(h);
}
END_TEST

/* ---- the FP8 dequantizer against a slow materialisation ---- */

/* Element (m, r, c) of weight @w (E x R x C) with grid @sr x @sc. */
/* The block size check_weight() assumes (128x128 unless a test sets it). */
static uint64_t slow_bm = 128, slow_bn = 128;

static uint16_t slow_elem(const uint8_t *w, const uint8_t *s, bool e8m0,
			  uint64_t R, uint64_t C, uint64_t sr, uint64_t sc,
			  uint64_t m, uint64_t r, uint64_t c)
{
	float f = slow_e4m3(w[(m * R + r) * C + c]);
	float k =
		slow_scale(s, e8m0, (m * sr + r / slow_bm) * sc + c / slow_bn);

	return slow_bf16(f * k);
}

static void check_weight(struct tu_fixture *fx, const uint8_t *out,
			 const struct castfs_header *vh, const char *wname,
			 const char *sname, bool e8m0)
{
	const struct castfs_tensor *w = stt_find(fx->h, wname);
	const struct castfs_tensor *s = stt_find(fx->h, sname);
	const struct castfs_tensor *o = stt_find(vh, wname);
	const uint8_t *wd = fx->file + fx->h->data_start + w->begin;
	const uint8_t *sd = fx->file + fx->h->data_start + s->begin;
	uint64_t R = w->shape[w->ndim - 2], C = w->shape[w->ndim - 1];
	uint64_t E = w->nelems / (R * C), sr = s->shape[s->ndim - 2];
	uint64_t sc = s->shape[s->ndim - 1];
	const uint8_t *od = out + vh->data_start + o->begin;

	ck_assert_int_eq(o->dtype, CASTFS_DTYPE_BF16);
	for (uint64_t m = 0; m < E; m++)
		for (uint64_t r = 0; r < R; r++)
			for (uint64_t c = 0; c < C; c++) {
				uint64_t i = (m * R + r) * C + c;
				uint16_t want = slow_elem(wd, sd, e8m0, R, C,
							  sr, sc, m, r, c);

				ck_assert_uint_eq(
					od[2 * i] | (od[2 * i + 1] << 8), want);
			}
}

START_TEST(test_deq__ranges_match_slow)
{
	struct tu_st *b = tu_st_new();
	struct tu_fixture fx;
	const struct castfs_view *v;
	struct castfs_plan *p;
	struct castfs_header *vh;
	uint64_t st = 11;
	uint8_t *file, *all, *part;
	size_t len;

	tu_st_add_fill(b, "a.weight", "F8_E4M3", SHAPE(300, 260), fill_codes,
		       &st);
	tu_st_add_fill(b, "a.weight_scale_inv", "F32", SHAPE(3, 3), fill_scales,
		       &st);
	tu_st_add_fill(b, "e.up", "F8_E4M3", SHAPE(2, 130, 1000), fill_codes,
		       &st);
	tu_st_add_fill(b, "e.up_scale_inv", "F8_E8M0", SHAPE(2, 2, 8),
		       fill_e8m0, &st);
	tu_st_add(b, "n.weight", "BF16", SHAPE(7), NULL);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	tu_fixture_init(&fx, file, len);
	v = castfs_views_find(&fx.views, "bf16", 4);
	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, NULL), 0);
	all = malloc(p->size);
	part = malloc(p->size);
	ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, all, p->size, 0),
			 (ssize_t)p->size);
	vh = stt_parse_ok(all, p->size);
	ck_assert_uint_eq(vh->ntensors, 3); /* the scales are left out */
	check_weight(&fx, all, vh, "a.weight", "a.weight_scale_inv", false);
	check_weight(&fx, all, vh, "e.up", "e.up_scale_inv", true);
	/* Any range, odd offsets included, is a slice of the whole. */
	for (int i = 0; i < 300; i++) {
		uint64_t off = tu_rand(&st) % p->size;
		size_t n = (size_t)(tu_rand(&st) % (p->size - off) + 1);

		ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, part, n,
						  off),
				 (ssize_t)n);
		ck_assert_mem_eq(part, all + off, n);
	}
	castfs_header_free(vh);
	free(part);
	free(all);
	castfs_plan_free(p);
	tu_fixture_fini(&fx);
}
END_TEST

/* weight_block_size [64, 48] from config.json: partial edge blocks in
 * both dimensions, fused experts; any range a slice of the whole. */
START_TEST(test_deq__any_block_size)
{
	static const struct castfs_qsrc_opts o = { .brows = 64, .bcols = 48 };
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct tu_fixture fx;
	const struct castfs_view *v;
	struct castfs_plan *p;
	struct castfs_header *vh;
	uint64_t st = 13;
	uint8_t *file, *all, *part;
	size_t len;

	tu_st_add_fill(b, "a.weight", "F8_E4M3", SHAPE(150, 100), fill_codes,
		       &st);
	tu_st_add_fill(b, "a.weight_scale_inv", "F32", SHAPE(3, 3), fill_scales,
		       &st);
	tu_st_add_fill(b, "e.up", "F8_E4M3", SHAPE(2, 64, 97), fill_codes, &st);
	tu_st_add_fill(b, "e.up_scale_inv", "F8_E8M0", SHAPE(2, 1, 3),
		       fill_e8m0, &st);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	tu_fixture_init(&fx, file, len);
	v = castfs_views_find(&fx.views, "bf16", 4);
	/* Without the directory's block size the scales do not fit. */
	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "128x128 block"));
	ck_assert_int_eq(castfs_view_plan_opts(v, fx.h, &o, &p, NULL), 0);
	all = malloc(p->size);
	part = malloc(p->size);
	ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, all, p->size, 0),
			 (ssize_t)p->size);
	vh = stt_parse_ok(all, p->size);
	slow_bm = 64;
	slow_bn = 48;
	check_weight(&fx, all, vh, "a.weight", "a.weight_scale_inv", false);
	check_weight(&fx, all, vh, "e.up", "e.up_scale_inv", true);
	slow_bm = slow_bn = 128;
	for (int i = 0; i < 200; i++) {
		uint64_t off = tu_rand(&st) % p->size;
		size_t n = (size_t)(tu_rand(&st) % (p->size - off) + 1);

		ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, part, n,
						  off),
				 (ssize_t)n);
		ck_assert_mem_eq(part, all + off, n);
	}
	castfs_header_free(vh);
	free(part);
	free(all);
	castfs_plan_free(p);
	tu_fixture_fini(&fx);
}
END_TEST

/* bitsandbytes views of an FP8 source: computed, scales gone, and any
 * range a slice of the whole (values: tests/compat/test_quant_src.py). */
START_TEST(test_deq__bnb_views_ranges)
{
	static const char *const views[] = { "nf4", "nf4_nodq", "int8" };
	struct tu_st *b = tu_st_new();
	struct tu_fixture fx;
	struct castfs_plan *p;
	struct castfs_header *vh;
	uint64_t st = 5;
	uint8_t *file, *all, *part;
	size_t len;

	tu_st_add_fill(b, "a.weight", "F8_E4M3", SHAPE(300, 260), fill_codes,
		       &st);
	tu_st_add_fill(b, "a.weight_scale_inv", "F32", SHAPE(3, 3), fill_scales,
		       &st);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	tu_fixture_init(&fx, file, len);
	ck_assert_int_eq(castfs_view_plan(castfs_views_find(&fx.views,
							    views[_i],
							    strlen(views[_i])),
					  fx.h, &p, NULL),
			 0);
	all = malloc(p->size);
	part = malloc(p->size);
	ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, all, p->size, 0),
			 (ssize_t)p->size);
	vh = stt_parse_ok(all, p->size);
	ck_assert_ptr_null(castfs_header_find(vh, "a.weight_scale_inv", 18));
	ck_assert_int_eq(stt_find(vh, "a.weight")->dtype,
			 _i == 2 ? CASTFS_DTYPE_I8 : CASTFS_DTYPE_U8);
	for (int i = 0; i < 200; i++) {
		uint64_t off = tu_rand(&st) % p->size;
		size_t n = (size_t)(tu_rand(&st) % (p->size - off) + 1);

		ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, part, n,
						  off),
				 (ssize_t)n);
		ck_assert_mem_eq(part, all + off, n);
	}
	castfs_header_free(vh);
	free(part);
	free(all);
	castfs_plan_free(p);
	tu_fixture_fini(&fx);
}
END_TEST

/* ---- config.json of a quantized model ---- */

START_TEST(test_md_quant__read)
{
	static const char fp8[] =
		"{\"quantization_config\": {\"quant_method\": \"fp8\", "
		"\"weight_block_size\": [128, 128], \"fmt\": \"e4m3\"}}";
	static const char pt[] = "{\"quantization_config\": {\"quant_method\": "
				 "\"fp8\", \"weight_block_size\": null}}";
	static const char b64[] =
		"{\"quantization_config\": {\"quant_method\": "
		"\"fp8\", \"weight_block_size\": [64, 48]}}";
	static const char *const bad[] = {
		"{\"quantization_config\": {\"quant_method\": \"fp8\", "
		"\"weight_block_size\": [0, 64]}}",
		"{\"quantization_config\": {\"quant_method\": \"fp8\", "
		"\"weight_block_size\": [64.5, 64]}}",
		"{\"quantization_config\": {\"quant_method\": \"fp8\", "
		"\"weight_block_size\": [64]}}",
		"{\"quantization_config\": {\"quant_method\": \"fp8\", "
		"\"weight_block_size\": [64, 65537]}}",
	};
	static const char bnb[] = "{\"text_config\": {\"quantization_config\": "
				  "{\"quant_method\": \"bitsandbytes\"}}}";
	static const char b8[] = "{\"quantization_config\": {\"quant_method\": "
				 "\"bitsandbytes\", \"load_in_8bit\": true, "
				 "\"load_in_4bit\": false}}";
	static const char b48[] =
		"{\"quantization_config\": {\"quant_method\": "
		"\"bitsandbytes\", \"load_in_8bit\": true, "
		"\"load_in_4bit\": true}}";
	static const char none[] = "{\"model_type\": \"llama\"}";
	struct castfs_md_quant q;

	ck_assert_int_eq(castfs_md_quant_read(fp8, strlen(fp8), &q, NULL), 0);
	ck_assert(q.quantized && q.fp8_block);
	ck_assert_int_eq(castfs_md_quant_read(pt, strlen(pt), &q, NULL), 0);
	ck_assert(q.quantized && q.fp8_block);
	ck_assert_int_eq(castfs_md_quant_read(b64, strlen(b64), &q, NULL), 0);
	ck_assert(q.quantized && q.fp8_block);
	ck_assert_uint_eq(q.block_rows, 64);
	ck_assert_uint_eq(q.block_cols, 48);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(bad[i], strlen(bad[i]),
						      &q, NULL),
				 0);
		ck_assert(q.quantized && !q.fp8_block);
	}
	ck_assert_int_eq(castfs_md_quant_read(bnb, strlen(bnb), &q, NULL), 0);
	ck_assert(q.quantized && !q.fp8_block);
	ck_assert_str_eq(q.method, "bitsandbytes");
	ck_assert(!q.bnb_int8 && !castfs_md_quant_dequantized(&q));
	ck_assert_int_eq(castfs_md_quant_read(b8, strlen(b8), &q, NULL), 0);
	ck_assert(q.bnb_int8 && castfs_md_quant_dequantized(&q));
	ck_assert_int_eq(castfs_md_quant_read(b48, strlen(b48), &q, NULL), 0);
	ck_assert(!q.bnb_int8 && !castfs_md_quant_dequantized(&q));
	ck_assert_int_eq(castfs_md_quant_read(none, strlen(none), &q, NULL), 0);
	ck_assert(!q.quantized);
}
END_TEST

/* gpt-oss MXFP4: the two expert pairs transformers dequantizes, and a
 * misshapen pair refused; "x_blocks" elsewhere is still refused. */
START_TEST(test_qsrc__mxfp4)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h;
	static const char mx[] = "{\"quantization_config\": "
				 "{\"quant_method\": \"mxfp4\"}}";
	struct castfs_md_quant mq;

	tu_st_add(b, "m.experts.gate_up_proj_blocks", "U8", SHAPE(2, 6, 3, 16),
		  NULL);
	tu_st_add(b, "m.experts.gate_up_proj_scales", "U8", SHAPE(2, 6, 3),
		  NULL);
	tu_st_add(b, "m.experts.down_proj_blocks", "U8", SHAPE(2, 96, 1, 16),
		  NULL);
	tu_st_add(b, "m.experts.down_proj_scales", "F8_E8M0", SHAPE(2, 96, 1),
		  NULL);
	tu_st_add(b, "m.experts.down_proj_bias", "BF16", SHAPE(2, 96), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nmxfp4, 2);
	ck_assert_uint_eq(q.nfp8, 0);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.experts.down_proj_blocks")->role,
			  CASTFS_QR_MXFP4);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.experts.down_proj_scales")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.experts.down_proj_bias")->role,
			  CASTFS_QR_PLAIN);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);

	b = tu_st_new();
	tu_st_add(b, "m.experts.gate_up_proj_blocks", "U8", SHAPE(2, 6, 3, 16),
		  NULL);
	tu_st_add(b, "m.experts.gate_up_proj_scales", "U8", SHAPE(2, 6, 2),
		  NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "MXFP4"));
	castfs_header_free(h);

	/* Scales of the right shape in a dtype other than E8M0 bytes (what
	 * a tool that widened them writes): their bytes are not exponents,
	 * so refused, not read one byte a scale. */
	for (int k = 0; k < 3; k++) {
		static const char *const dt[] = { "BF16", "F32", "I8" };

		b = tu_st_new();
		tu_st_add(b, "m.experts.gate_up_proj_blocks", "U8",
			  SHAPE(2, 6, 3, 16), NULL);
		tu_st_add(b, "m.experts.gate_up_proj_scales", dt[k],
			  SHAPE(2, 6, 3), NULL);
		h = stt_build_take(b);
		memset(&d, 0, sizeof(d));
		ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
		ck_assert_ptr_nonnull(strstr(d.msg, "E8M0"));
		castfs_header_free(h);
	}

	ck_assert_int_eq(castfs_md_quant_read(mx, strlen(mx), &mq, NULL), 0);
	ck_assert(mq.quantized && mq.mxfp4 && !mq.fp8_block);
}
END_TEST

/* compressed-tensors FP8 scales: per tensor, channel, 128x128 block; a
 * static input_scale is a companion; other scale dtypes refused. */
START_TEST(test_qsrc__ct_fp8)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h;

	tu_st_add(b, "t.input_scale", "BF16", SHAPE(1), NULL);
	tu_st_add(b, "t.weight", "F8_E4M3", SHAPE(10, 7), NULL);
	tu_st_add(b, "t.weight_scale", "BF16", SHAPE(1), NULL);
	tu_st_add(b, "c.weight", "F8_E4M3", SHAPE(10, 7), NULL);
	tu_st_add(b, "c.weight_scale", "F32", SHAPE(10, 1), NULL);
	tu_st_add(b, "k.weight", "F8_E4M3", SHAPE(200, 320), NULL);
	tu_st_add(b, "k.weight_scale", "BF16", SHAPE(2, 3), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nfp8, 3);
	ck_assert_uint_eq(stt_qinfo(h, &q, "t.weight")->brows, 10);
	ck_assert_uint_eq(stt_qinfo(h, &q, "t.input_scale")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "c.weight")->brows, 1);
	ck_assert_uint_eq(stt_qinfo(h, &q, "c.weight")->bcols, 7);
	ck_assert_uint_eq(stt_qinfo(h, &q, "k.weight")->brows, 128);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);

	b = tu_st_new();
	tu_st_add(b, "c.weight", "F8_E4M3", SHAPE(10, 7), NULL);
	tu_st_add(b, "c.weight_scale", "F16", SHAPE(10, 1), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "F32/BF16"));
	castfs_header_free(h);

	/* A 200 x 320 weight's 128 x 128 grid is [2, 3] (partial edge
	 * blocks count): a grid one block short or long in either dimension
	 * is no strategy's. */
	for (int k = 0; k < 4; k++) {
		static const uint64_t grid[][2] = {
			{ 2, 2 }, { 2, 4 }, { 1, 3 }, { 3, 3 }
		};

		b = tu_st_new();
		tu_st_add(b, "k.weight", "F8_E4M3", SHAPE(200, 320), NULL);
		tu_st_add(b, "k.weight_scale", "BF16",
			  SHAPE(grid[k][0], grid[k][1]), NULL);
		h = stt_build_take(b);
		memset(&d, 0, sizeof(d));
		ck_assert_msg(castfs_qsrc_scan(h, 0, &q, &d) == -ENOTSUP,
			      "grid %d accepted", k);
		ck_assert_ptr_nonnull(strstr(d.msg, "128x128"));
		castfs_header_free(h);
	}
}
END_TEST

/* compressed-tensors int4: symmetric or not, the same in every group. */
START_TEST(test_md_quant__ct_w4_symmetry)
{
#define W4_GROUP(sym)                                                         \
	"{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, "         \
	"\"type\": \"int\", \"strategy\": \"group\", \"group_size\": 128" sym \
	"}}"
#define W4_QC(groups)                                              \
	"{\"quantization_config\": {\"quant_method\": "            \
	"\"compressed-tensors\", \"format\": \"pack-quantized\", " \
	"\"config_groups\": {" groups "}}}"
	static const struct {
		const char *qc;
		bool w4, asym;
	} cases[] = {
		{ W4_QC("\"g\": " W4_GROUP("")), true, false },
		{ W4_QC("\"g\": " W4_GROUP(", \"symmetric\": true")), true,
		  false },
		{ W4_QC("\"g\": " W4_GROUP(", \"symmetric\": false")), true,
		  true },
		{ W4_QC("\"a\": " W4_GROUP(", \"symmetric\": false") ", \"b\": " W4_GROUP(
			  ", \"symmetric\": false")),
		  true, true },
		{ W4_QC("\"a\": " W4_GROUP(
			  ", \"symmetric\": false") ", \"b\": " W4_GROUP("")),
		  false, false },
		{ W4_QC("\"g\": " W4_GROUP(", \"symmetric\": 0")), false,
		  false },
	};
	struct castfs_md_quant mq;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(cases[i].qc,
						      strlen(cases[i].qc), &mq,
						      NULL),
				 0);
		ck_assert_msg(mq.ct_w4 == cases[i].w4 &&
				      mq.ct_w4_asym == cases[i].asym,
			      "%s", cases[i].qc);
	}
#undef W4_QC
#undef W4_GROUP
}
END_TEST

/* compressed-tensors FP8: which quantization_configs castfs takes. */
START_TEST(test_md_quant__ct_fp8)
{
#define CT_QC(fmt, w, extra)                                            \
	"{\"quantization_config\": {\"quant_method\": "                 \
	"\"compressed-tensors\", \"format\": \"" fmt "\", "             \
	"\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], " \
	"\"weights\": {\"num_bits\": 8, \"type\": \"float\", "          \
	"\"symmetric\": true, \"dynamic\": false, " w "}}}" extra "}}"
	static const char *const ok[] = {
		CT_QC("float-quantized", "\"strategy\": \"channel\"", ""),
		CT_QC("naive-quantized", "\"strategy\": \"tensor\"", ""),
		CT_QC("float-quantized",
		      "\"strategy\": \"block\", \"block_structure\": [128, 128]",
		      ", \"kv_cache_scheme\": null"),
	};
	static const char *const bad[] = {
		CT_QC("float-quantized",
		      "\"strategy\": \"block\", \"block_structure\": [64, 64]",
		      ""),
		CT_QC("float-quantized", "\"strategy\": \"group\"", ""),
		CT_QC("pack-quantized", "\"strategy\": \"channel\"", ""),
		CT_QC("float-quantized", "\"strategy\": \"channel\"",
		      ", \"kv_cache_scheme\": {\"num_bits\": 8}"),
	};
	struct castfs_md_quant mq;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(ok[i], strlen(ok[i]), &mq,
						      NULL),
				 0);
		ck_assert_msg(mq.quantized && mq.ct_fp8, "%s", ok[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(bad[i], strlen(bad[i]),
						      &mq, NULL),
				 0);
		ck_assert_msg(mq.quantized && !mq.ct_fp8, "%s", bad[i]);
	}
#undef CT_QC
}
END_TEST

/* Expected texts: json.dumps(d, indent=2) of the dict without the key. */
static const struct {
	const char *in, *out;
} unquant[] = {
	{ "{\n  \"a\": 1,\n  \"quantization_config\": {\n    \"quant_method\": "
	  "\"fp8\"\n  },\n  \"text_config\": {\n    \"quantization_config\": "
	  "{\n      \"x\": 1\n    },\n    \"z\": 2\n  }\n}",
	  "{\n  \"a\": 1,\n  \"text_config\": {\n    \"z\": 2\n  }\n}" },
	{ "{\"b\": 2, \"quantization_config\": {\"q\": [1, 2]}}",
	  "{\"b\": 2}" },
	{ "{\"quantization_config\": {}, \"b\": 2}", "{\"b\": 2}" },
	{ "{\"b\": 2}", "{\"b\": 2}" },
};

START_TEST(test_md_quant__unquant)
{
	char *out;
	size_t len;

	ck_assert_int_eq(castfs_md_config_unquant(unquant[_i].in,
						  strlen(unquant[_i].in), &out,
						  &len, NULL),
			 0);
	ck_assert_str_eq(out, unquant[_i].out);
	ck_assert_uint_eq(len, strlen(unquant[_i].out));
	free(out);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("qsrc");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_qsrc__fp8_pairs);
	tcase_add_test(tc, test_qsrc__comfy);
	tcase_add_test(tc, test_qsrc__comfy_quant_json);
	tcase_add_loop_test(tc, test_qsrc__refused, 0,
			    sizeof(refused) / sizeof(refused[0]));
	tcase_add_test(tc, test_qsrc__generic_words_plain);
	tcase_add_test(tc, test_deq__ranges_match_slow);
	tcase_add_test(tc, test_deq__any_block_size);
	tcase_add_loop_test(tc, test_deq__bnb_views_ranges, 0, 3);
	tcase_add_test(tc, test_md_quant__read);
	tcase_add_test(tc, test_qsrc__mxfp4);
	tcase_add_test(tc, test_md_quant__ct_w4_symmetry);
	tcase_add_test(tc, test_md_quant__ct_fp8);
	tcase_add_test(tc, test_qsrc__ct_fp8);
	tcase_add_loop_test(tc, test_md_quant__unquant, 0,
			    sizeof(unquant) / sizeof(unquant[0]));
	suite_add_tcase(s, tc);
	return s;
}
