/* SPDX-License-Identifier: MIT */
/*
 * FP8 block weights (and compressed-tensors FP4 modules) whose scale is
 * in another shard (view/qsrc_xshard.c):
 * which tensors each output shard's composite header holds, and the bf16
 * view read through a composite source against a slow element-by-element
 * dequantization (OCP E4M3, fp32 product, RNE to bf16, fp8_slow.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/reader.h"
#include "plan/plan.h"
#include "fp8_slow.h"
#include "st_testutil.h"
#include "unit.h"
#include "view/qsrc.h"
#include "view/qsrc_xshard.h"
#include "view/view.h"

/* Two shards as save_pretrained may split them: every weight's scale in
 * the other shard, both spellings of the scale name. */
struct shards {
	uint8_t *file[2];
	size_t len[2];
	struct castfs_header *h[2];
	struct castfs_mem_reader mr[2];
	const struct castfs_reader *parts[2];
	struct castfs_multi_reader multi;
};

static void shards_init(struct shards *s)
{
	struct tu_st *b0 = tu_st_new(), *b1 = tu_st_new();
	uint64_t st = 17;

	tu_st_add_fill(b0, "a.weight", "F8_E4M3", SHAPE(300, 260), fill_codes,
		       &st);
	tu_st_add_fill(b0, "b.weight_scale_inv", "F32", SHAPE(1, 1),
		       fill_scales, &st);
	tu_st_add_fill(b0, "v.scale", "F8_E8M0", SHAPE(2, 2), fill_e8m0, &st);
	tu_st_add(b0, "n.weight", "BF16", SHAPE(7), NULL);
	tu_st_add_fill(b1, "a.weight_scale_inv", "F32", SHAPE(3, 3),
		       fill_scales, &st);
	tu_st_add_fill(b1, "b.weight", "F8_E4M3", SHAPE(100, 60), fill_codes,
		       &st);
	tu_st_add_fill(b1, "v.weight", "F8_E4M3", SHAPE(130, 129), fill_codes,
		       &st);
	s->file[0] = tu_st_build(b0, &s->len[0]);
	s->file[1] = tu_st_build(b1, &s->len[1]);
	tu_st_free(b0);
	tu_st_free(b1);
	for (size_t k = 0; k < 2; k++) {
		s->h[k] = stt_parse_ok(s->file[k], s->len[k]);
		castfs_mem_reader_init(&s->mr[k], s->file[k], s->len[k]);
		s->parts[k] = &s->mr[k].r;
	}
	castfs_multi_reader_init(&s->multi, s->parts, 2);
}

static void shards_fini(struct shards *s)
{
	for (size_t k = 0; k < 2; k++) {
		castfs_header_free(s->h[k]);
		free(s->file[k]);
	}
}

/* Tensor @name of the source shard that holds it, and its bytes. */
static const uint8_t *src_data(const struct shards *s, const char *name,
			       const struct castfs_tensor **t)
{
	for (size_t k = 0; k < 2; k++) {
		*t = castfs_header_find(s->h[k], name, strlen(name));
		if (*t)
			return s->file[k] + s->h[k]->data_start + (*t)->begin;
	}
	ck_abort_msg("no tensor %s", name);
	return NULL;
}

/* Weight @wname of view output @out (header @vh) against the slow path. */
static void check_weight(const struct shards *s, const uint8_t *out,
			 const struct castfs_header *vh, const char *wname,
			 const char *sname, bool e8m0)
{
	const struct castfs_tensor *w, *sc;
	const uint8_t *wd = src_data(s, wname, &w),
		      *sd = src_data(s, sname, &sc);
	const struct castfs_tensor *o = stt_find(vh, wname);
	const uint8_t *od = out + vh->data_start + o->begin;
	uint64_t R = w->shape[0], C = w->shape[1], ncol = sc->shape[1];

	ck_assert_int_eq(o->dtype, CASTFS_DTYPE_BF16);
	for (uint64_t r = 0; r < R; r++)
		for (uint64_t c = 0; c < C; c++) {
			uint64_t i = r * C + c;
			float k = slow_scale(sd, e8m0,
					     (r / 128) * ncol + c / 128);
			uint16_t want = slow_bf16(slow_e4m3(wd[i]) * k);

			ck_assert_uint_eq(od[2 * i] | (od[2 * i + 1] << 8),
					  want);
		}
}

/* Names sorted for castfs_header_find; data in (part, offset) order. */
static void check_order(const struct castfs_header *h)
{
	for (size_t i = 1; i < h->ntensors; i++) {
		const struct castfs_tensor *a = h->by_name[i - 1],
					   *b = h->by_name[i];
		size_t m = a->name_len < b->name_len ? a->name_len :
						       b->name_len;
		int r = memcmp(a->name, b->name, m);

		ck_assert(h->tensors[i - 1].end <= h->tensors[i].begin);
		ck_assert(r < 0 || (r == 0 && a->name_len < b->name_len));
	}
}

/* Alone, each shard is refused in an FP8 folder: the scale is elsewhere. */
START_TEST(test_xshard__alone_refused)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	struct shards s;

	shards_init(&s);
	for (size_t k = 0; k < 2; k++)
		ck_assert_int_eq(castfs_qsrc_scan(s.h[k], CASTFS_QSRC_STRICT,
						  &q, &d),
				 -ENOTSUP);
	/* With an index to look in, the partners are counted, not refused:
	 * shard 0 has a weight and two scales alone (v.scale with no
	 * v.weight beside it too), shard 1 a scale and two weights. */
	for (size_t k = 0; k < 2; k++) {
		ck_assert_int_eq(castfs_qsrc_scan(s.h[k],
						  CASTFS_QSRC_STRICT |
							  CASTFS_QSRC_XSHARD,
						  &q, &d),
				 0);
		ck_assert_uint_eq(q.nxshard, 3);
		ck_assert_uint_eq(q.nfp8, 0);
		castfs_qsrc_fini(&q);
	}
	shards_fini(&s);
}
END_TEST

/* Each composite header holds its own weights and their scales only. */
START_TEST(test_xshard__headers)
{
	static const char *const has[2][4] = {
		{ "a.weight", "a.weight_scale_inv", "n.weight", NULL },
		{ "b.weight", "b.weight_scale_inv", "v.weight", "v.scale" },
	};
	const struct castfs_header *const *hs;
	struct castfs_header *x;
	struct castfs_qsrc q;
	struct shards s;

	shards_init(&s);
	hs = (const struct castfs_header *const *)s.h;
	ck_assert_int_eq(castfs_qsrc_xshard(hs, 2, 2, &x, NULL), -EINVAL);
	for (size_t k = 0; k < 2; k++) {
		size_t want = k ? 4 : 3;

		ck_assert_int_eq(castfs_qsrc_xshard(hs, 2, k, &x, NULL), 0);
		ck_assert_uint_eq(x->ntensors, want);
		for (size_t i = 0; i < want; i++)
			ck_assert_ptr_nonnull(castfs_header_find(
				x, has[k][i], strlen(has[k][i])));
		check_order(x);
		ck_assert_int_eq(
			castfs_qsrc_scan(x, CASTFS_QSRC_STRICT, &q, NULL), 0);
		ck_assert_uint_eq(q.nfp8, k ? 2 : 1);
		castfs_qsrc_fini(&q);
		castfs_header_free(x);
	}
	shards_fini(&s);
}
END_TEST

/* The merged header holds every tensor of every shard, each offset in
 * its shard's part, in name order; it is no shard's own header. */
START_TEST(test_xshard__all)
{
	const struct castfs_header *const *hs;
	struct castfs_header *x;
	struct shards s;
	size_t n = 0;

	shards_init(&s);
	hs = (const struct castfs_header *const *)s.h;
	ck_assert_int_eq(castfs_qsrc_xshard_all(hs, 0, &x), -EINVAL);
	ck_assert_int_eq(castfs_qsrc_xshard_all(hs, 2, &x), 0);
	for (size_t k = 0; k < 2; k++) {
		n += hs[k]->ntensors;
		for (size_t i = 0; i < hs[k]->ntensors; i++) {
			const struct castfs_tensor *t = &hs[k]->tensors[i];
			const struct castfs_tensor *m =
				castfs_header_find(x, t->name, t->name_len);

			ck_assert_ptr_nonnull(m);
			ck_assert_uint_eq(m->begin,
					  castfs_part_off(k, hs[k]->data_start +
								     t->begin));
			ck_assert_uint_eq(m->end - m->begin, t->end - t->begin);
		}
	}
	ck_assert_uint_eq(x->ntensors, n);
	ck_assert_uint_eq(x->data_start, 0);
	castfs_header_free(x);
	shards_fini(&s);
}
END_TEST

/* Tensor @name of @x: in it, with its own copy of the name and shape
 * (not the pointers of @src's), shaped @r x @c. */
static void check_owned(const struct castfs_header *x,
			const struct castfs_header *src, const char *name,
			uint64_t r, uint64_t c)
{
	const struct castfs_tensor *t = stt_find(x, name),
				   *o = stt_find(src, name);

	ck_assert_ptr_ne(t->name, o->name);
	ck_assert_ptr_ne(t->shape, o->shape);
	ck_assert_uint_eq(t->ndim, 2);
	ck_assert_uint_eq(t->shape[0], r);
	ck_assert_uint_eq(t->shape[1], c);
}

/* The merged header is kept while other shards' headers are freed and
 * read again (ns_mdxshard.c): it owns its names and shapes; metadata is
 * the first shard's, whose entry keeps it. */
START_TEST(test_xshard__all_outlives_shards)
{
	struct tu_st *b[2] = { tu_st_new(), tu_st_new() };
	struct castfs_header *h[2], *x;
	const struct castfs_meta_kv *kv;
	uint8_t *file[2];
	size_t len;

	tu_st_meta(b[0], "format", "pt");
	tu_st_add(b[0], "mlp.gate_proj.weight", "BF16", SHAPE(4, 6), NULL);
	tu_st_add(b[1], "mlp.up_proj.weight", "BF16", SHAPE(5, 6), NULL);
	for (size_t k = 0; k < 2; k++) {
		file[k] = tu_st_build(b[k], &len);
		tu_st_free(b[k]);
		h[k] = stt_parse_ok(file[k], len);
	}
	ck_assert_int_eq(castfs_qsrc_xshard_all(
				 (const struct castfs_header *const *)h, 2, &x),
			 0);
	check_owned(x, h[0], "mlp.gate_proj.weight", 4, 6);
	check_owned(x, h[1], "mlp.up_proj.weight", 5, 6);
	castfs_header_free(h[1]);
	free(file[1]);
	/* Read after the shard is gone (ASan builds see any borrow). */
	ck_assert_ptr_nonnull(stt_find(x, "mlp.gate_proj.weight"));
	ck_assert_uint_eq(stt_find(x, "mlp.up_proj.weight")->shape[0], 5);
	kv = castfs_header_meta(x, "format");
	ck_assert_ptr_nonnull(kv);
	ck_assert_str_eq(kv->value, "pt");
	castfs_header_free(x);
	castfs_header_free(h[0]);
	free(file[0]);
}
END_TEST

/* The bf16 view of each shard, read through the composite source, is
 * the slow dequantization; any range is a slice of the whole. */
START_TEST(test_xshard__bf16_reads)
{
	const struct castfs_header *const *hs;
	struct castfs_views views;
	struct castfs_scratch sc;
	struct shards s;
	uint64_t st = 5;

	shards_init(&s);
	hs = (const struct castfs_header *const *)s.h;
	ck_assert_int_eq(castfs_views_builtin(&views), 0);
	ck_assert_int_eq(castfs_scratch_init(&sc), 0);
	for (size_t k = 0; k < 2; k++) {
		const struct castfs_view *v =
			castfs_views_find(&views, "bf16", 4);
		struct castfs_header *x, *vh;
		struct castfs_plan *p;
		uint8_t *all, *part;

		ck_assert_int_eq(castfs_qsrc_xshard(hs, 2, k, &x, NULL), 0);
		ck_assert_int_eq(castfs_view_plan(v, x, &p, NULL), 0);
		all = malloc(p->size);
		part = malloc(p->size);
		ck_assert_int_eq(castfs_plan_read(p, &s.multi.r, &sc, all,
						  p->size, 0),
				 (ssize_t)p->size);
		vh = stt_parse_ok(all, p->size);
		ck_assert_uint_eq(vh->ntensors, 2); /* no scale */
		if (!k) {
			check_weight(&s, all, vh, "a.weight",
				     "a.weight_scale_inv", false);
			ck_assert_ptr_nonnull(stt_find(vh, "n.weight"));
		} else {
			check_weight(&s, all, vh, "b.weight",
				     "b.weight_scale_inv", false);
			check_weight(&s, all, vh, "v.weight", "v.scale", true);
		}
		for (int i = 0; i < 200; i++) {
			uint64_t off = tu_rand(&st) % p->size;
			size_t n = (size_t)(tu_rand(&st) % (p->size - off) + 1);

			ck_assert_int_eq(castfs_plan_read(p, &s.multi.r, &sc,
							  part, n, off),
					 (ssize_t)n);
			ck_assert_mem_eq(part, all + off, n);
		}
		castfs_header_free(vh);
		free(part);
		free(all);
		castfs_plan_free(p);
		castfs_header_free(x);
	}
	castfs_scratch_fini(&sc);
	castfs_views_fini(&views);
	shards_fini(&s);
}
END_TEST

/* A scale whose weight is in no shard stays where it is, and is refused. */
START_TEST(test_xshard__orphan_scale)
{
	struct tu_st *b0 = tu_st_new(), *b1 = tu_st_new();
	struct castfs_header *h[2], *x;
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	uint8_t *f[2];
	size_t len[2];

	tu_st_add(b0, "z.weight_scale_inv", "F32", SHAPE(1, 1), NULL);
	tu_st_add(b1, "n.weight", "BF16", SHAPE(7), NULL);
	f[0] = tu_st_build(b0, &len[0]);
	f[1] = tu_st_build(b1, &len[1]);
	tu_st_free(b0);
	tu_st_free(b1);
	h[0] = stt_parse_ok(f[0], len[0]);
	h[1] = stt_parse_ok(f[1], len[1]);
	ck_assert_int_eq(
		castfs_qsrc_xshard((const struct castfs_header *const *)h, 2, 0,
				   &x, NULL),
		0);
	ck_assert_uint_eq(x->ntensors, 1);
	ck_assert_int_eq(castfs_qsrc_scan(x, CASTFS_QSRC_STRICT, &q, &d),
			 -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "without its weight"));
	castfs_header_free(x);
	for (size_t k = 0; k < 2; k++) {
		castfs_header_free(h[k]);
		free(f[k]);
	}
}
END_TEST

/* compressed-tensors FP4 modules split across two shards: each shard
 * alone is refused (strict) or counts its partners (XSHARD); each
 * composite header holds its packed weights and all their companions. */
START_TEST(test_xshard__fp4_modules)
{
	static const char *const has[2][4] = {
		{ "a.weight_packed", "a.weight_scale", "a.weight_global_scale",
		  "a.input_global_scale" },
		{ "b.weight_packed", "b.weight_scale", "b.weight_global_scale",
		  NULL },
	};
	struct tu_st *b0 = tu_st_new(), *b1 = tu_st_new();
	struct castfs_header *h[2], *x;
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	uint8_t *f[2];
	size_t len[2];

	tu_st_add(b0, "a.weight_packed", "U8", SHAPE(4, 16), NULL);
	tu_st_add(b0, "b.weight_scale", "F8_E4M3", SHAPE(4, 2), NULL);
	tu_st_add(b0, "b.weight_global_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b1, "a.weight_scale", "F8_E4M3", SHAPE(4, 2), NULL);
	tu_st_add(b1, "a.weight_global_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b1, "a.input_global_scale", "F32", SHAPE(1), NULL);
	tu_st_add(b1, "b.weight_packed", "U8", SHAPE(4, 16), NULL);
	f[0] = tu_st_build(b0, &len[0]);
	f[1] = tu_st_build(b1, &len[1]);
	tu_st_free(b0);
	tu_st_free(b1);
	for (size_t k = 0; k < 2; k++) {
		h[k] = stt_parse_ok(f[k], len[k]);
		d.msg[0] = '\0';
		ck_assert_int_eq(castfs_qsrc_scan(h[k], CASTFS_QSRC_STRICT, &q,
						  &d),
				 -ENOTSUP);
		ck_assert_ptr_nonnull(strstr(d.msg, "compressed-tensors FP4"));
		ck_assert_int_eq(castfs_qsrc_scan(h[k],
						  CASTFS_QSRC_STRICT |
							  CASTFS_QSRC_XSHARD,
						  &q, &d),
				 0);
		ck_assert_uint_gt(q.nxshard, 0);
		ck_assert_uint_eq(q.nct4, 0);
		castfs_qsrc_fini(&q);
	}
	for (size_t k = 0; k < 2; k++) {
		size_t want = k ? 3 : 4;

		ck_assert_int_eq(castfs_qsrc_xshard(
					 (const struct castfs_header *const *)h,
					 2, k, &x, NULL),
				 0);
		ck_assert_uint_eq(x->ntensors, want);
		for (size_t i = 0; i < want; i++)
			ck_assert_ptr_nonnull(castfs_header_find(
				x, has[k][i], strlen(has[k][i])));
		ck_assert_int_eq(
			castfs_qsrc_scan(x, CASTFS_QSRC_STRICT, &q, NULL), 0);
		ck_assert_uint_eq(q.nct4, 1);
		castfs_qsrc_fini(&q);
		castfs_header_free(x);
	}
	for (size_t k = 0; k < 2; k++) {
		castfs_header_free(h[k]);
		free(f[k]);
	}
}
END_TEST

/* Index of tensor @name of @h. */
static size_t tensor_ix(const struct castfs_header *h, const char *name)
{
	const struct castfs_tensor *t =
		castfs_header_find(h, name, strlen(name));

	ck_assert_ptr_nonnull(t);
	return (size_t)(t - h->tensors);
}

/* bitsandbytes 4-bit weights with their companions in the other shard:
 * refused alone, held under Q4XS, and each composite holds its own
 * weights' companions (the quant_state JSON is side data: not read
 * here, the scan of a composite is tested by test_gguf_qsrc.py). */
START_TEST(test_xshard__bnb4_modules)
{
	static const char *const has[2][5] = {
		{ "a.weight", "a.weight.absmax", "a.weight.quant_map",
		  "a.weight.quant_state.bitsandbytes__nf4", "n.weight" },
		{ "b.weight", "b.weight.absmax", "b.weight.quant_map",
		  "b.weight.quant_state.bitsandbytes__nf4", NULL },
	};
	struct tu_st *b0 = tu_st_new(), *b1 = tu_st_new();
	struct castfs_header *h[2], *x;
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	uint8_t *f[2];
	size_t len[2];
	int rc;

	tu_st_add(b0, "a.weight", "U8", SHAPE(8, 1), NULL);
	tu_st_add(b0, "b.weight.absmax", "F32", SHAPE(1), NULL);
	tu_st_add(b0, "b.weight.quant_state.bitsandbytes__nf4", "U8", SHAPE(16),
		  NULL);
	tu_st_add(b0, "n.weight", "BF16", SHAPE(4), NULL);
	tu_st_add(b1, "a.weight.absmax", "F32", SHAPE(1), NULL);
	tu_st_add(b1, "a.weight.quant_map", "F32", SHAPE(16), NULL);
	tu_st_add(b1, "a.weight.quant_state.bitsandbytes__nf4", "U8", SHAPE(16),
		  NULL);
	tu_st_add(b1, "b.weight", "U8", SHAPE(8, 1), NULL);
	tu_st_add(b1, "b.weight.quant_map", "F32", SHAPE(16), NULL);
	f[0] = tu_st_build(b0, &len[0]);
	f[1] = tu_st_build(b1, &len[1]);
	tu_st_free(b0);
	tu_st_free(b1);
	for (size_t k = 0; k < 2; k++) {
		h[k] = stt_parse_ok(f[k], len[k]);
		d.msg[0] = '\0';
		ck_assert_int_eq(castfs_qsrc_scan(h[k], CASTFS_QSRC_XSHARD, &q,
						  &d),
				 -ENOTSUP);
		ck_assert_ptr_nonnull(strstr(d.msg, "without its weight"));
		d.msg[0] = '\0';
		rc = castfs_qsrc_scan(
			h[k], CASTFS_QSRC_XSHARD | CASTFS_QSRC_Q4XS, &q, &d);
		ck_assert_msg(rc == 0, "%d %s", rc, d.msg);
		ck_assert_uint_eq(q.nbnb4, 0);
		/* every 4-bit tensor of the shard is held */
		ck_assert_uint_eq(q.nxshard, k ? 5 : 3);
		/* the packed weight is never served as stored */
		ck_assert_int_ne(
			q.t[tensor_ix(h[k], k ? "b.weight" : "a.weight")].role,
			CASTFS_QR_PLAIN);
		castfs_qsrc_fini(&q);
	}
	for (size_t k = 0; k < 2; k++) {
		size_t want = k ? 4 : 5;

		ck_assert_int_eq(castfs_qsrc_xshard(
					 (const struct castfs_header *const *)h,
					 2, k, &x, NULL),
				 0);
		ck_assert_uint_eq(x->ntensors, want);
		for (size_t i = 0; i < want; i++)
			ck_assert_ptr_nonnull(castfs_header_find(
				x, has[k][i], strlen(has[k][i])));
		castfs_header_free(x);
	}
	for (size_t k = 0; k < 2; k++) {
		castfs_header_free(h[k]);
		free(f[k]);
	}
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("qsrc_xshard");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_xshard__alone_refused);
	tcase_add_test(tc, test_xshard__headers);
	tcase_add_test(tc, test_xshard__all);
	tcase_add_test(tc, test_xshard__all_outlives_shards);
	tcase_add_test(tc, test_xshard__bf16_reads);
	tcase_add_test(tc, test_xshard__orphan_scale);
	tcase_add_test(tc, test_xshard__fp4_modules);
	tcase_add_test(tc, test_xshard__bnb4_modules);
	suite_add_tcase(s, tc);
	return s;
}
