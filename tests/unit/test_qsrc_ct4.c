/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors FP4 sources: the pairing of packed weights with their
 * scales (view/qsrc_ct4.c), the layouts refused with a reason, the
 * config.json check (modeldir_ct4.c), and the range logic of the FP4
 * dequantizer against a slow element-by-element materialisation. Values
 * against compressed-tensors itself: tests/compat/test_ct4_src.py.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeldir/modeldir.h"
#include "fp8_slow.h"
#include "st_testutil.h"
#include "unit.h"
#include "view/qsrc.h"
#include "view/view.h"

START_TEST(test_ct4__pairs)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	const struct castfs_tensor *w;
	struct castfs_tensor tmp;
	uint64_t shape[2];
	struct castfs_qsrc q;
	struct castfs_header *h;

	tu_st_add(b, "a.weight_packed", "U8", SHAPE(5, 16), NULL);
	tu_st_add(b, "a.weight_scale", "F8_E4M3", SHAPE(5, 2), NULL);
	tu_st_add(b, "a.weight_global_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b, "a.input_global_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b, "m.weight_packed", "U8", SHAPE(3, 32), NULL);
	tu_st_add(b, "m.weight_scale", "U8", SHAPE(3, 2), NULL);
	tu_st_add(b, "norm.weight", "BF16", SHAPE(7), NULL);
	tu_st_add(b, "position_ids", "I64", SHAPE(1, 8), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nfp8, 2);
	ck_assert_uint_eq(q.nct4, 2);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight_packed")->rule,
			  CASTFS_QRULE_NVFP4);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight_packed")->bcols, 16);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.weight_packed")->rule,
			  CASTFS_QRULE_MXFP4);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.weight_packed")->bcols, 32);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.weight_global_scale")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "a.input_global_scale")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "m.weight_scale")->role,
			  CASTFS_QR_SCALE);
	ck_assert_uint_eq(stt_qinfo(h, &q, "position_ids")->role,
			  CASTFS_QR_PLAIN);
	w = castfs_qsrc_weight(stt_find(h, "a.weight_packed"),
			       stt_qinfo(h, &q, "a.weight_packed"), &tmp,
			       shape);
	ck_assert_uint_eq(w->name_len, strlen("a.weight"));
	ck_assert_mem_eq(w->name, "a.weight", w->name_len);
	ck_assert_uint_eq(w->shape[0], 5);
	ck_assert_uint_eq(w->shape[1], 32);
	ck_assert_uint_eq(w->nelems, 160);
	ck_assert_int_eq(w->dtype, CASTFS_DTYPE_BF16);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
}
END_TEST

/* One refused module: up to four tensors, and the phrase of its reason. */
static const struct {
	const char *name[4];
	const char *dtype[4];
	uint64_t shape[4][2];
	uint32_t ndim[4];
	const char *phrase;
} refused[] = {
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale",
	    "l.weight_zero_point" },
	  { "U8", "F8_E4M3", "F32", "F8_E4M3" },
	  { { 4, 8 }, { 4, 1 }, { 1 }, { 4, 1 } },
	  { 2, 2, 1, 2 },
	  "zero point" },
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale",
	    "l.weight_g_idx" },
	  { "U8", "F8_E4M3", "F32", "I32" },
	  { { 4, 8 }, { 4, 1 }, { 1 }, { 16 } },
	  { 2, 2, 1, 1 },
	  "g_idx" },
	{ { "l.weight_packed", "l.weight_scale" },
	  { "U8", "F8_E4M3" },
	  { { 4, 8 }, { 4, 1 } },
	  { 2, 2 },
	  "without an F32 [1] weight_global_scale" },
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale" },
	  { "U8", "F8_E4M3", "F32" },
	  { { 4, 8 }, { 4, 1 }, { 0 } },
	  { 2, 2, 0 },
	  "without an F32 [1] weight_global_scale" },
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale" },
	  { "U8", "U8", "F32" },
	  { { 4, 16 }, { 4, 1 }, { 1 } },
	  { 2, 2, 1 },
	  "MXFP4 weight with a global scale" },
	{ { "l.weight_packed", "l.weight_scale" },
	  { "U8", "F8_E8M0" },
	  { { 4, 16 }, { 4, 1 } },
	  { 2, 2 },
	  "neither F8_E4M3" },
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale" },
	  { "U8", "F8_E4M3", "F32" },
	  { { 4, 16 }, { 4, 1 }, { 1 } },
	  { 2, 2, 1 },
	  "cols / 16" },
	{ { "l.weight_packed", "l.weight_scale" },
	  { "U8", "U8" },
	  { { 4, 8 }, { 4, 1 } },
	  { 2, 2 },
	  "cols / 32" },
	{ { "l.weight_packed" }, { "U8" }, { { 4, 8 } }, { 2 }, "weight_scale" },
	{ { "l.weight_global_scale" },
	  { "F32" },
	  { { 1 } },
	  { 1 },
	  "not in this file" },
	{ { "l.weight_packed", "l.weight_scale", "l.weight_global_scale",
	    "l.weight" },
	  { "U8", "F8_E4M3", "F32", "BF16" },
	  { { 4, 8 }, { 4, 1 }, { 1 }, { 4, 16 } },
	  { 2, 2, 1, 2 },
	  "beside an unpacked one" },
};

START_TEST(test_ct4__refused)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q = { 0 };
	struct castfs_header *h;

	tu_st_add(b, "model.norm.weight", "BF16", SHAPE(4), NULL);
	for (size_t i = 0; i < 4 && refused[_i].name[i]; i++)
		tu_st_add(b, refused[_i].name[i], refused[_i].dtype[i],
			  refused[_i].ndim[i], refused[_i].shape[i], NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_null(q.t);
	ck_assert_msg(strstr(d.msg, refused[_i].phrase), "%s", d.msg);
	ck_assert_msg(strstr(d.msg, "compressed-tensors"), "%s", d.msg);
	ck_assert_msg(strstr(d.msg, "no views"), "%s", d.msg);
	castfs_header_free(h);
}
END_TEST

/* In a directory that declares a quantized layout, a weight_scale whose
 * weight is in another shard is refused; in a bare file it is a tensor. */
START_TEST(test_ct4__orphan_scale)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct castfs_header *h;

	tu_st_add(b, "l.weight_scale", "U8", SHAPE(4, 1), NULL);
	tu_st_add(b, "n.weight", "BF16", SHAPE(4), NULL);
	h = stt_build_take(b);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	castfs_qsrc_fini(&q);
	ck_assert_int_eq(castfs_qsrc_scan(h, CASTFS_QSRC_STRICT, &q, &d),
			 -ENOTSUP);
	ck_assert_msg(strstr(d.msg, "split across shards"), "%s", d.msg);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_ct4__config)
{
/* @w comes first: cJSON takes the first of two equal keys. */
#define CT4_QC(fmt, w, extra)                                             \
	"{\"quantization_config\": {\"quant_method\": "                   \
	"\"compressed-tensors\", \"format\": \"" fmt "\", "               \
	"\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "   \
	"\"format\": \"" fmt "\", \"weights\": {" w ", \"num_bits\": 4, " \
	"\"type\": \"float\", \"symmetric\": true, \"dynamic\": false"    \
	"}}}" extra "}}"
#define NV "\"strategy\": \"tensor_group\", \"group_size\": 16"
#define MX "\"strategy\": \"group\", \"group_size\": 32"
	static const char *const ok[] = {
		CT4_QC("nvfp4-pack-quantized", NV, ""),
		CT4_QC("nvfp4-pack-quantized",
		       NV ", \"scale_dtype\": \"torch.float8_e4m3fn\", "
			  "\"actorder\": null",
		       ", \"sparsity_config\": {}"),
		CT4_QC("mxfp4-pack-quantized", MX, ""),
		CT4_QC("mxfp4-pack-quantized",
		       MX ", \"scale_dtype\": \"torch.uint8\"", ""),
	};
	static const char *const bad[] = {
		CT4_QC("nvfp4-pack-quantized", MX, ""),
		CT4_QC("mxfp4-pack-quantized", NV, ""),
		CT4_QC("nvfp4-pack-quantized", NV ", \"actorder\": \"group\"",
		       ""),
		CT4_QC("nvfp4-pack-quantized", NV ", \"symmetric\": false", ""),
		CT4_QC("mxfp4-pack-quantized",
		       MX ", \"scale_dtype\": \"torch.float8_e8m0fnu\"", ""),
		CT4_QC("nvfp4-pack-quantized", NV,
		       ", \"kv_cache_scheme\": {\"num_bits\": 8}"),
		CT4_QC("pack-quantized", NV, ""),
	};
	struct castfs_md_quant mq;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(ok[i], strlen(ok[i]), &mq,
						      NULL),
				 0);
		ck_assert_msg(mq.ct_fp4 && castfs_md_quant_dequantized(&mq),
			      "%s", ok[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(castfs_md_quant_read(bad[i], strlen(bad[i]),
						      &mq, NULL),
				 0);
		ck_assert_msg(mq.quantized && !castfs_md_quant_dequantized(&mq),
			      "%s", bad[i]);
	}
#undef MX
#undef NV
#undef CT4_QC
}
END_TEST

/* ---- the FP4 dequantizer against a slow materialisation ---- */

static void fill_bytes(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i < n; i++)
		dst[i] = (uint8_t)tu_rand(st);
}

/* E4M3 scales of moderate size (no NaN), exponent bytes near 127. */
static void fill_e4m3(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i < n; i++)
		dst[i] = (uint8_t)(0x20 + tu_rand(st) % 0x40);
}

static void fill_exp(uint8_t *dst, size_t n, void *ctx)
{
	uint64_t *st = ctx;

	for (size_t i = 0; i < n; i++)
		dst[i] = (uint8_t)(115 + tu_rand(st) % 20);
}

static void fill_gs(uint8_t *dst, size_t n, void *ctx)
{
	float gs = 1234.567f;

	(void)ctx;
	if (n == 4)
		memcpy(dst, &gs, 4);
}

/* E2M1 by the spec: sign bit 3, 2 exponent bits (bias 1), 1 mantissa. */
static float slow_e2m1(uint8_t c)
{
	int e = (c >> 1) & 3, m = c & 1;
	float v = e ? (float)(2 + m) / 2.0f : (float)m / 2.0f;

	for (int k = 1; k < e; k++)
		v *= 2.0f;
	return c & 8 ? -v : v;
}

/* Element i of FP4 weight @w (@cols wide) with scales @s (@g per scale). */
static uint16_t slow_fp4(const uint8_t *w, const uint8_t *s, uint64_t g,
			 const float *gs, uint64_t i)
{
	uint8_t byte = w[i / 2];
	float e = slow_e2m1(i & 1 ? byte >> 4 : byte & 15), k = 1.0f;

	if (gs) {
		k = slow_e4m3(s[i / g]) / *gs;
	} else {
		for (int x = s[i / g]; x < 127; x++)
			k /= 2.0f;
		for (int x = 127; x < s[i / g]; x++)
			k *= 2.0f;
	}
	return slow_bf16(e * k);
}

static void check_fp4(struct tu_fixture *fx, const uint8_t *out,
		      const struct castfs_header *vh, const char *mod, bool nv)
{
	char n[64];
	const struct castfs_tensor *w, *s, *o;
	float gs = 0;
	const uint8_t *od;

	snprintf(n, sizeof(n), "%s.weight_packed", mod);
	w = stt_find(fx->h, n);
	snprintf(n, sizeof(n), "%s.weight_scale", mod);
	s = stt_find(fx->h, n);
	if (nv) {
		snprintf(n, sizeof(n), "%s.weight_global_scale", mod);
		memcpy(&gs,
		       fx->file + fx->h->data_start + stt_find(fx->h, n)->begin,
		       4);
	}
	snprintf(n, sizeof(n), "%s.weight", mod);
	o = stt_find(vh, n);
	ck_assert_int_eq(o->dtype, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(o->nelems, 2 * w->nelems);
	od = out + vh->data_start + o->begin;
	for (uint64_t i = 0; i < o->nelems; i++)
		ck_assert_uint_eq(
			od[2 * i] | (od[2 * i + 1] << 8),
			slow_fp4(fx->file + fx->h->data_start + w->begin,
				 fx->file + fx->h->data_start + s->begin,
				 nv ? 16 : 32, nv ? &gs : NULL, i));
}

START_TEST(test_ct4__ranges_match_slow)
{
	struct tu_st *b = tu_st_new();
	struct tu_fixture fx;
	const struct castfs_view *v;
	struct castfs_plan *p;
	struct castfs_header *vh;
	uint64_t st = 17;
	uint8_t *file, *all, *part;
	size_t len;

	tu_st_add_fill(b, "a.weight_packed", "U8", SHAPE(301, 40), fill_bytes,
		       &st);
	tu_st_add_fill(b, "a.weight_scale", "F8_E4M3", SHAPE(301, 5), fill_e4m3,
		       &st);
	tu_st_add_fill(b, "a.weight_global_scale", "F32", SHAPE(1), fill_gs,
		       NULL);
	tu_st_add_fill(b, "m.weight_packed", "U8", SHAPE(77, 48), fill_bytes,
		       &st);
	tu_st_add_fill(b, "m.weight_scale", "U8", SHAPE(77, 3), fill_exp, &st);
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
	check_fp4(&fx, all, vh, "a", true);
	check_fp4(&fx, all, vh, "m", false);
	/* Any range, odd offsets and odd elements included, is a slice. */
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

Suite *unit_suite(void)
{
	Suite *s = suite_create("qsrc_ct4");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_ct4__pairs);
	tcase_add_loop_test(tc, test_ct4__refused, 0,
			    sizeof(refused) / sizeof(refused[0]));
	tcase_add_test(tc, test_ct4__orphan_scale);
	tcase_add_test(tc, test_ct4__config);
	tcase_add_test(tc, test_ct4__ranges_match_slow);
	suite_add_tcase(s, tc);
	return s;
}
