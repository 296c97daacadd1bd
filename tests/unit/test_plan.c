/* SPDX-License-Identifier: MIT */
/*
 * Plan tests: extents tile the output exactly, and every range read equals
 * the same slice of the expected file built without castfs: the header as
 * safetensors' writer lays it out (written by the test), the values cast
 * by tests/fuzz/ieee_ref.c (the IEEE rules written in the test).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "plan/plan.h"
#include "plan/plan_build.h"
#include "common/bytes.h"
#include "common/reader.h"
#include "format/st_header.h"
#include "../fuzz/ieee_ref.h"
#include "testutil.h"
#include "view/view.h"
#include "unit.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNIT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNIT_ASAN 1
#endif
#endif
#ifdef UNIT_ASAN
#include <sanitizer/asan_interface.h>
#endif

static struct tu_fixture fx;

/* Tensors of every castable dtype and then some, with odd shapes, a 0-d and
 * an empty tensor, metadata, and one tensor larger than the scratch. */
static const uint64_t s_big[] = { 1024, 1537 };
static const uint64_t s_odd[] = { 3, 5, 7 };
static const uint64_t s_row[] = { 33 };
static const uint64_t s_empty[] = { 0, 4 };

static const struct src_tensor {
	const char *name, *dtype;
	uint32_t ndim;
	const uint64_t *shape;
} src_tensors[] = {
	{ "big.weight", "BF16", 2, s_big }, { "odd.f32", "F32", 3, s_odd },
	{ "odd.f16", "F16", 3, s_odd },	    { "odd.f64", "F64", 1, s_row },
	{ "e4m3", "F8_E4M3", 1, s_row },    { "e5m2", "F8_E5M2", 1, s_row },
	{ "scalar", "F32", 0, NULL },	    { "empty", "BF16", 2, s_empty },
	{ "ids", "I64", 1, s_row },	    { "mask", "BOOL", 1, s_row },
	{ "bytes", "U8", 3, s_odd },
};
#define NSRC (sizeof(src_tensors) / sizeof(src_tensors[0]))

static uint8_t *build_source(size_t *len)
{
	struct tu_st *b = tu_st_new();
	uint8_t *file;

	tu_st_meta(b, "format", "pt");
	tu_st_meta(b, "note", "kept as is");
	for (size_t i = 0; i < NSRC; i++)
		tu_st_add(b, src_tensors[i].name, src_tensors[i].dtype,
			  src_tensors[i].ndim, src_tensors[i].shape, NULL);
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

/*
 * The oracle, built without castfs's writer or kernels. The header: what
 * safetensors' writer emits for the converted tensors (reference/FORMATS.md
 * §1.4), laid out here from the source's tensor list and the writer's
 * dtype enum order written below, and written by the tests' own JSON
 * writer (testutil.c). The values: each tensor copied or cast by
 * ieee_ref.c (the IEEE rules written in the test).
 */

/* safetensors' enum Dtype order (reference/FORMATS.md §1.3). */
static const char *const st_enum[] = {
	"BOOL",	   "F4",      "F6_E2M3", "F6_E3M2",	"U8",	       "I8",
	"F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
	"U16",	   "F16",     "BF16",	 "I32",		"U32",	       "F32",
	"C64",	   "F64",     "I64",	 "U64",
};

static int st_rank(const char *dtype)
{
	for (size_t i = 0; i < sizeof(st_enum) / sizeof(st_enum[0]); i++)
		if (!strcmp(st_enum[i], dtype))
			return (int)i;
	ck_abort_msg("dtype %s not in the enum", dtype);
	return -1;
}

/* The dtype a cast view gives a source dtype (FORMATS.md "Plain casts"). */
static const char *cast_to(const char *view, const char *dtype)
{
	static const char *const castable[] = { "F64",	"F32",	   "F16",
						"BF16", "F8_E4M3", "F8_E5M2" };
	static const char *const map[][2] = {
		{ "fp32", "F32" },
		{ "fp16", "F16" },
		{ "bf16", "BF16" },
		{ "fp8", "F8_E4M3" },
		{ "fp8_nan", "F8_E4M3" },
		{ "fp8_e5m2", "F8_E5M2" },
		{ "fp8_e5m2_sat", "F8_E5M2" },
	};

	for (size_t i = 0; i < 6; i++) {
		if (strcmp(castable[i], dtype))
			continue;
		for (size_t k = 0; k < sizeof(map) / sizeof(map[0]); k++)
			if (!strcmp(map[k][0], view))
				return map[k][1];
		ck_abort_msg("no target for view %s", view);
	}
	return dtype;
}

struct out_tensor {
	const struct src_tensor *src;
	const char *dtype;
};

static int writer_order(const void *a, const void *b)
{
	const struct out_tensor *x = a, *y = b;
	int rx = st_rank(x->dtype), ry = st_rank(y->dtype);

	if (rx != ry)
		return ry - rx; /* dtype descending */
	return strcmp(x->src->name, y->src->name); /* then bytewise name */
}

/* Cast (or copy) source tensor @s's bytes into @dst as @v does. */
static void oracle_values(const struct castfs_view *v,
			  const struct out_tensor *o, uint8_t *dst)
{
	const struct castfs_tensor *s =
		castfs_header_find(fx.h, o->src->name, strlen(o->src->name));
	const uint8_t *src = fx.file + fx.h->data_start + s->begin;
	enum castfs_dtype from, to;

	if (!strcmp(o->dtype, o->src->dtype)) {
		memcpy(dst, src, s->end - s->begin);
		return;
	}
	from = castfs_dtype_from_name(o->src->dtype, strlen(o->src->dtype));
	to = castfs_dtype_from_name(o->dtype, strlen(o->dtype));
	ck_assert(ieee_ref_cast(from, to, v->cvt_flags & CASTFS_CVT_SATURATE,
				dst, src, s->nelems));
}

/* The whole expected view file of cast view @v; its length in *@len. */
static uint8_t *materialise(const struct castfs_view *v, size_t *len)
{
	struct tu_st_opts opts = { .layout = TU_LAYOUT_ADDED };
	struct out_tensor out[NSRC];
	struct tu_st *b = tu_st_new();
	uint8_t *file;
	uint64_t data, begin, end;

	for (size_t i = 0; i < NSRC; i++) {
		out[i].src = &src_tensors[i];
		out[i].dtype = cast_to(v->name, src_tensors[i].dtype);
	}
	qsort(out, NSRC, sizeof(out[0]), writer_order);
	tu_st_set_opts(b, &opts);
	tu_st_meta(b, "format", "pt");
	tu_st_meta(b, "note", "kept as is");
	for (size_t i = 0; i < NSRC; i++)
		tu_st_add(b, out[i].src->name, out[i].dtype, out[i].src->ndim,
			  out[i].src->shape, NULL);
	file = tu_st_build(b, len);
	data = 8 + castfs_load_le64(file);
	for (size_t i = 0; i < NSRC; i++) {
		tu_st_layout(b, i, &begin, &end);
		oracle_values(v, &out[i], file + data + begin);
	}
	tu_st_free(b);
	return file;
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
	size_t len;

	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, &d), 0);
	check_tiling(p);
	all = tu_fixture_read_all(&fx, p, &fx.s);
	oracle = materialise(v, &len);
	ck_assert_uint_eq(p->size, len);
	ck_assert_int_eq(memcmp(all, oracle, 8 + castfs_load_le64(oracle)), 0);
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
	size_t olen;

	ck_assert_int_eq(castfs_view_plan(v, fx.h, &p, &d), 0);
	oracle = materialise(v, &olen);
	ck_assert_uint_eq(p->size, olen);
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
	out = tu_fixture_read_all(&fx, p, &fx.s);
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
	out = tu_fixture_read_all(&fx, p, &fx.s);
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
	struct castfs_reader bad = { failing_pread, NULL, NULL, NULL };
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

/*
 * A builder's pieces come from shared chunks; each must be zeroed, aligned
 * and apart from the next. Under AddressSanitizer the byte after a piece
 * (alignment slack and redzone) is poisoned, so that an overflow from one
 * piece into the next is reported.
 */
START_TEST(test_plan__arena_pieces_apart)
{
	static const size_t sizes[] = { 1, 7, 16, 33, 1000, 5000, 20000 };
	struct castfs_pb *pb;

	ck_assert_int_eq(castfs_pb_new(&pb), 0);
	for (int round = 0; round < 40; round++) {
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			size_t n = sizes[i];
			uint8_t *p = castfs_pb_alloc(pb, n);

			ck_assert_ptr_nonnull(p);
			ck_assert_uint_eq((uintptr_t)p % _Alignof(max_align_t),
					  0);
			for (size_t k = 0; k < n; k++)
				ck_assert_uint_eq(p[k], 0);
			memset(p, 0xA5, n);
#ifdef UNIT_ASAN
			ck_assert(!__asan_region_is_poisoned(p, n));
			ck_assert(__asan_address_is_poisoned(p + n));
#endif
		}
	}
	castfs_pb_free(pb);
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
	tcase_add_test(tc, test_plan__arena_pieces_apart);
	suite_add_tcase(s, tc);
	return s;
}
