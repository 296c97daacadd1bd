/* SPDX-License-Identifier: MIT */
/*
 * Plan tests: extents tile the output exactly, and every range read equals
 * the same slice of a slow materialisation built tensor by tensor with the
 * scalar kernels (a different code path from castfs_plan_read).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "plan/plan.h"
#include "common/reader.h"
#include "format/st_header.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

static struct tu_fixture fx;

/* Tensors of every castable dtype and then some, with odd shapes, a 0-d and
 * an empty tensor, metadata, and one tensor larger than the scratch. */
static uint8_t *build_source(size_t *len)
{
	static const uint64_t s_big[] = { 1024, 1537 };
	static const uint64_t s_odd[] = { 3, 5, 7 };
	static const uint64_t s_row[] = { 33 };
	static const uint64_t s_empty[] = { 0, 4 };
	struct tu_st *b = tu_st_new();
	uint8_t *file;

	tu_st_meta(b, "format", "pt");
	tu_st_meta(b, "note", "kept as is");
	tu_st_add(b, "big.weight", "BF16", 2, s_big, NULL);
	tu_st_add(b, "odd.f32", "F32", 3, s_odd, NULL);
	tu_st_add(b, "odd.f16", "F16", 3, s_odd, NULL);
	tu_st_add(b, "odd.f64", "F64", 1, s_row, NULL);
	tu_st_add(b, "e4m3", "F8_E4M3", 1, s_row, NULL);
	tu_st_add(b, "e5m2", "F8_E5M2", 1, s_row, NULL);
	tu_st_add(b, "scalar", "F32", 0, NULL, NULL);
	tu_st_add(b, "empty", "BF16", 2, s_empty, NULL);
	tu_st_add(b, "ids", "I64", 1, s_row, NULL);
	tu_st_add(b, "mask", "BOOL", 1, s_row, NULL);
	tu_st_add(b, "bytes", "U8", 3, s_odd, NULL);
	file = tu_st_build(b, len);
	tu_st_free(b);
	return file;
}

static void setup(void)
{
	uint8_t *file;
	size_t len;

	file = build_source(&len);
	tu_fixture_init(&fx, file, len);
}

static void teardown(void)
{
	tu_fixture_fini(&fx);
}

static const struct castfs_view *view(const char *name)
{
	const struct castfs_view *v =
		castfs_views_find(&fx.views, name, strlen(name));

	ck_assert_ptr_nonnull(v);
	return v;
}

static void check_tiling(const struct castfs_plan *p)
{
	uint64_t off = 0;

	for (size_t i = 0; i < p->nextents; i++) {
		const struct castfs_extent *e = &p->extents[i];

		ck_assert_uint_eq(e->out_off, off);
		ck_assert_uint_gt(e->len, 0);
		ck_assert_uint_gt(e->unit, 0);
		off += e->len;
	}
	ck_assert_uint_eq(off, p->size);
	ck_assert_uint_gt(p->nextents, 0);
	ck_assert_uint_eq(p->extents[0].op, CASTFS_OP_MEM);
}

static uint8_t *read_all(const struct castfs_plan *p)
{
	uint8_t *buf = malloc(p->size + 1);
	ssize_t n;

	ck_assert_ptr_nonnull(buf);
	n = castfs_plan_read(p, &fx.mr.r, &fx.s, buf, p->size + 1, 0);
	ck_assert_int_eq(n, (ssize_t)p->size);
	return buf;
}

/* The oracle: parse the plan's own header, then convert each tensor from
 * the source with the scalar reference, one tensor at a time. */
static uint8_t *materialise(const struct castfs_plan *p,
			    const struct castfs_view *v)
{
	struct castfs_header *oh;
	struct castfs_diag d = { { 0 } };
	uint8_t *out = calloc(1, p->size);
	uint8_t *hdr = read_all(p);

	ck_assert_int_eq(castfs_header_parse(hdr, p->size, p->size, &oh, &d),
			 0);
	memcpy(out, hdr, oh->data_start);
	for (size_t i = 0; i < oh->ntensors; i++) {
		const struct castfs_tensor *o = &oh->tensors[i];
		const struct castfs_tensor *s =
			castfs_header_find(fx.h, o->name, o->name_len);
		const uint8_t *src;
		castfs_convert_fn fn;

		ck_assert_ptr_nonnull(s);
		ck_assert_uint_eq(s->nelems, o->nelems);
		src = fx.file + fx.h->data_start + s->begin;
		if (o->dtype == s->dtype) {
			memcpy(out + oh->data_start + o->begin, src,
			       s->end - s->begin);
			continue;
		}
		ck_assert_int_eq(o->dtype, v->dtype);
		fn = castfs_convert_get_isa(CASTFS_ISA_SCALAR, s->dtype,
					    o->dtype, v->cvt_flags);
		ck_assert_ptr_nonnull(fn);
		fn(out + oh->data_start + o->begin, src, s->nelems);
	}
	castfs_header_free(oh);
	free(hdr);
	return out;
}

static const char *const cast_views[] = {
	"fp32", "fp16", "bf16", "fp8", "fp8_nan", "fp8_e5m2", "fp8_e5m2_sat",
};

START_TEST(test_plan__cast_views_tile_and_match_oracle)
{
	const struct castfs_view *v = view(cast_views[_i]);
	struct castfs_plan *p;
	struct castfs_diag d = { { 0 } };
	uint8_t *all, *oracle;

	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, &d), 0);
	check_tiling(p);
	all = read_all(p);
	oracle = materialise(p, v);
	ck_assert_int_eq(memcmp(all, oracle, p->size), 0);
	free(all);
	free(oracle);
	castfs_plan_free(p);
}
END_TEST

START_TEST(test_plan__random_ranges_equal_slices)
{
	const struct castfs_view *v = view(cast_views[_i]);
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *p;
	uint64_t seed = 42 + (uint64_t)_i;
	uint8_t *oracle, *buf;

	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, &d), 0);
	oracle = materialise(p, v);
	buf = malloc(p->size + 64);
	for (int k = 0; k < 3000; k++) {
		uint64_t off = tu_rand(&seed) % (p->size + 16);
		size_t len =
			(size_t)(tu_rand(&seed) % (k % 3 ? 64 : p->size + 8));
		ssize_t n = castfs_plan_read(p, &fx.mr.r, &fx.s, buf, len, off);
		size_t want = off >= p->size ? 0 :
					       (size_t)(len < p->size - off ?
								len :
								p->size - off);

		ck_assert_int_eq(n, (ssize_t)want);
		ck_assert_int_eq(memcmp(buf, oracle + off, want), 0);
	}
	free(buf);
	free(oracle);
	castfs_plan_free(p);
}
END_TEST

START_TEST(test_plan__metadata_kept_and_format_added)
{
	struct castfs_header *oh, *src;
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *p;
	static const uint64_t one[] = { 1 };
	struct tu_st *b = tu_st_new();
	size_t len;
	uint8_t *file, *out;
	struct castfs_mem_reader mr;

	tu_st_meta(b, "origin", "test");
	tu_st_add(b, "w", "F32", 1, one, NULL);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	ck_assert_int_eq(castfs_header_parse(file, len, len, &src, &d), 0);
	ck_assert_int_eq(castfs_view_plan(view("bf16"), src, &p, &d), 0);
	castfs_mem_reader_init(&mr, file, len);
	out = malloc(p->size);
	ck_assert_int_eq(castfs_plan_read(p, &mr.r, &fx.s, out, p->size, 0),
			 (ssize_t)p->size);
	ck_assert_int_eq(castfs_header_parse(out, p->size, p->size, &oh, &d),
			 0);
	ck_assert_ptr_nonnull(castfs_header_meta(oh, "format"));
	ck_assert_str_eq(castfs_header_meta(oh, "format")->value, "pt");
	ck_assert_str_eq(castfs_header_meta(oh, "origin")->value, "test");
	ck_assert_int_eq(oh->tensors[0].dtype, CASTFS_DTYPE_BF16);
	castfs_header_free(oh);
	castfs_header_free(src);
	castfs_plan_free(p);
	free(out);
	free(file);
}
END_TEST

START_TEST(test_plan__copied_extents_merge_and_do_no_conversion)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *p;
	size_t copies = 0;

	/* Integer and bool tensors are copied, never cast. */
	ck_assert_int_eq(castfs_view_plan(view("fp8"), fx.h, &p, &d), 0);
	for (size_t i = 0; i < p->nextents; i++) {
		const struct castfs_extent *e = &p->extents[i];

		if (e->op == CASTFS_OP_COPY)
			copies++;
		if (e->op == CASTFS_OP_CAST)
			ck_assert(castfs_dtype_is_castable(e->src_dtype));
	}
	ck_assert_uint_ge(copies, 1);
	castfs_plan_free(p);
}
END_TEST

/* Each output element maps back to its source element; headers to none. */
START_TEST(test_plan__src_off_maps_elements_back)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_header *oh;
	struct castfs_plan *p;
	uint8_t *out;

	ck_assert_int_eq(castfs_view_plan(view("fp8"), fx.h, &p, &d), 0);
	out = read_all(p);
	ck_assert_int_eq(castfs_header_parse(out, p->size, p->size, &oh, &d),
			 0);
	ck_assert_uint_eq(castfs_plan_src_off(p, 0), UINT64_MAX);
	for (size_t i = 0; i < oh->ntensors; i++) {
		const struct castfs_tensor *o = &oh->tensors[i];
		const struct castfs_tensor *t =
			castfs_header_find(fx.h, o->name, o->name_len);
		uint64_t osz = castfs_dtype_bits(o->dtype) / 8;
		uint64_t ssz = castfs_dtype_bits(t->dtype) / 8;

		if (o->nelems == 0 || osz == 0)
			continue;
		/* The first and the last element. */
		for (uint64_t k = 0; k < o->nelems; k += o->nelems - 1 ?: 1) {
			uint64_t at = oh->data_start + o->begin + k * osz;
			uint64_t from = fx.h->data_start + t->begin + k * ssz;

			ck_assert_uint_eq(castfs_plan_src_off(p, at), from);
		}
	}
	castfs_header_free(oh);
	free(out);
	castfs_plan_free(p);
}
END_TEST

START_TEST(test_plan__rules_keep_matching_tensors)
{
	static const char cfg[] =
		"{\"views\":{\"fp8keep\":{\"base\":\"fp8\",\"rules\":"
		"[{\"match\":\"odd.*\",\"convert\":false}]}}}";
	struct castfs_diag d = { { 0 } };
	struct castfs_header *oh;
	struct castfs_plan *p;
	uint8_t *out;

	ck_assert_int_eq(castfs_views_load(&fx.views, cfg, strlen(cfg), &d), 0);
	ck_assert_int_eq(castfs_view_plan(view("fp8keep"), fx.h, &p, &d), 0);
	out = read_all(p);
	ck_assert_int_eq(castfs_header_parse(out, p->size, p->size, &oh, &d),
			 0);
	ck_assert_int_eq(castfs_header_find(oh, "odd.f32", 7)->dtype,
			 CASTFS_DTYPE_F32);
	ck_assert_int_eq(castfs_header_find(oh, "big.weight", 10)->dtype,
			 CASTFS_DTYPE_F8_E4M3);
	castfs_header_free(oh);
	castfs_plan_free(p);
	free(out);
}
END_TEST

/* A reader that fails: errors surface as the reader's errno. */
static ssize_t failing_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	(void)ctx, (void)buf, (void)n, (void)off;
	return -EIO;
}

START_TEST(test_plan__source_errors_propagate)
{
	struct castfs_reader bad = { failing_pread, NULL };
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *p;
	uint8_t buf[64];
	uint64_t data;

	ck_assert_int_eq(castfs_view_plan(view("fp8"), fx.h, &p, &d), 0);
	data = p->extents[1].out_off;
	/* The header is memory: readable without the source. */
	ck_assert_int_eq(castfs_plan_read(p, &bad, &fx.s, buf, 8, 0), 8);
	ck_assert_int_eq(castfs_plan_read(p, &bad, &fx.s, buf, 16, data), -EIO);
	castfs_plan_free(p);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("core");
	int nviews = (int)(sizeof(cast_views) / sizeof(cast_views[0]));

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_plan__cast_views_tile_and_match_oracle, 0,
			    nviews);
	tcase_add_loop_test(tc, test_plan__random_ranges_equal_slices, 0,
			    nviews);
	tcase_add_test(tc, test_plan__metadata_kept_and_format_added);
	tcase_add_test(tc,
		       test_plan__copied_extents_merge_and_do_no_conversion);
	tcase_add_test(tc, test_plan__src_off_maps_elements_back);
	tcase_add_test(tc, test_plan__rules_keep_matching_tensors);
	tcase_add_test(tc, test_plan__source_errors_propagate);
	suite_add_tcase(s, tc);
	return s;
}
