/* SPDX-License-Identifier: MIT */
/*
 * The bf16 view of a quantized source as the GGUF builders read it
 * (view/view_gguf_deq.c): which tensors it has and where each comes from.
 * The bytes of the GGUF files are checked against the reference
 * dequantizers in tests/compat/test_gguf_qsrc*.py.
 */
#include <errno.h>
#include <string.h>

#include "st_testutil.h"
#include "unit.h"
#include "view/view_gguf.h"

static struct castfs_header *build(struct tu_st *b)
{
	struct castfs_header *h = stt_build_ok(b);

	tu_st_free(b);
	return h;
}

START_TEST(test_gguf_deq__plain_is_null)
{
	struct tu_st *b = tu_st_new();
	struct castfs_gguf_deq *g = (void *)1;
	struct castfs_header *h;

	tu_st_add(b, "a.weight", "BF16", SHAPE(4, 32), NULL);
	h = build(b);
	ck_assert_int_eq(castfs_gguf_deq_new(h, NULL, &g, NULL), 0);
	ck_assert_ptr_null(g);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_gguf_deq__fp8_is_its_bf16_view)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	const struct castfs_tensor *w, *n;
	struct castfs_gguf_deq *g = NULL;
	struct castfs_header *h;

	tu_st_add(b, "a.weight", "F8_E4M3", SHAPE(200, 130), NULL);
	tu_st_add(b, "a.weight_scale_inv", "F32", SHAPE(2, 2), NULL);
	tu_st_add(b, "norm.weight", "F32", SHAPE(130), NULL);
	h = build(b);
	ck_assert_int_eq(castfs_gguf_deq_new(h, NULL, &g, &d), 0);
	ck_assert_ptr_nonnull(g);
	ck_assert_uint_eq(g->h->ntensors, 2); /* the scale is gone */
	w = stt_find(g->h, "a.weight");
	n = stt_find(g->h, "norm.weight");
	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_nonnull(n);
	ck_assert_int_eq(w->dtype, CASTFS_DTYPE_BF16);
	ck_assert_uint_eq(w->shape[0], 200);
	ck_assert_uint_eq(w->shape[1], 130);
	ck_assert(castfs_gguf_deq_ent(g, w)->deq);
	ck_assert_uint_eq(castfs_gguf_deq_ent(g, w)->op, CASTFS_OP_DEQ_FP8);
	/* kept as stored: its bytes are the source's */
	ck_assert(!castfs_gguf_deq_ent(g, n)->deq);
	ck_assert_int_eq(n->dtype, CASTFS_DTYPE_F32);
	ck_assert_uint_eq(castfs_gguf_deq_ent(g, n)->src_off,
			  h->data_start + stt_find(h, "norm.weight")->begin);
	castfs_gguf_deq_free(g);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_gguf_deq__mxfp4_refused)
{
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_gguf_deq *g = NULL;
	struct castfs_header *h;

	tu_st_add(b, "m.experts.gate_up_proj_blocks", "U8", SHAPE(2, 8, 2, 16),
		  NULL);
	tu_st_add(b, "m.experts.gate_up_proj_scales", "U8", SHAPE(2, 8, 2),
		  NULL);
	h = build(b);
	ck_assert_int_eq(castfs_gguf_deq_new(h, NULL, &g, &d), -ENOTSUP);
	ck_assert_ptr_null(g);
	ck_assert_ptr_nonnull(strstr(d.msg, "no llama.cpp mapping"));
	castfs_header_free(h);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("gguf_deq");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_gguf_deq__plain_is_null);
	tcase_add_test(tc, test_gguf_deq__fp8_is_its_bf16_view);
	tcase_add_test(tc, test_gguf_deq__mxfp4_refused);
	suite_add_tcase(s, tc);
	return s;
}
