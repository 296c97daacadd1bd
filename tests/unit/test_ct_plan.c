/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors views (fp8_dynamic, fp8_block, w4a16, nvfp4) as plans: the tensor set, every quantised
 * tensor equal to a slow element-by-element materialisation (each block's
 * absmax by a plain loop), and any byte range equal to the same slice of a
 * full read, on matrices whose blocks need several tiles (wide rows,
 * 128-row blocks wider than the scratch) and edge blocks. The values are
 * checked against llm-compressor itself in tests/compat/test_ct.py.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "plan/plan.h"
#include "quant/quant_ct.h"
#include "testutil.h"
#include "unit.h"
#include "view/view.h"

#define WIDE "model.layers.0.mlp.down_proj.weight" /* bf16 300 x 9000 */
#define ODD "model.layers.0.self_attn.k_proj.weight" /* f16 130 x 200 */
#define LONG "model.layers.0.mlp.up_proj.weight" /* f32 3 x 70000 */
#define GRP "model.layers.0.self_attn.q_proj.weight" /* bf16 260 x 8192 */

static struct tu_fixture fx;

/* Finite values of the dtype (uintptr_t) @ctx, with a run of zeros and
 * rare outliers so that blocks get different scales (and eps scales). */
static void fill(uint8_t *dst, size_t n, void *ctx)
{
	enum castfs_dtype dt = (enum castfs_dtype)(uintptr_t)ctx;
	size_t sz = castfs_dtype_bits(dt) / 8;
	uint64_t seed = n;

	for (size_t i = 0; i < n / sz; i++) {
		double u = (double)(tu_rand(&seed) >> 11) / 9007199254740992.0;
		float f = (float)((u - 0.5) * 0.2);
		uint16_t h;

		if (seed % 97 == 0)
			f *= 300.0f;
		if (i >= 1000 && i < 1000 + 9000 * 2)
			f = i % 2 ? -0.0f : 0.0f; /* whole zero rows */
		if (dt == CASTFS_DTYPE_F32) {
			castfs_store_le32(dst + 4 * i, castfs_f32_bits(f));
			continue;
		}
		if (dt == CASTFS_DTYPE_F64) {
			castfs_store_le64(dst + 8 * i,
					  castfs_f64_bits((double)f));
			continue;
		}
		castfs_convert_get(CASTFS_DTYPE_F32, dt, 0)(&h, &f, 1);
		castfs_store_le16(dst + 2 * i, h);
	}
}

static void add(struct tu_st *b, const char *name, enum castfs_dtype dt,
		uint32_t ndim, uint64_t d0, uint64_t d1)
{
	const uint64_t shape[2] = { d0, d1 };

	tu_st_add_fill(b, name, castfs_dtype_name(dt), ndim, shape, fill,
		       (void *)(uintptr_t)dt);
}

static void setup(void)
{
	struct tu_st *b = tu_st_new();
	uint8_t *file;
	size_t len;

	tu_st_meta(b, "format", "pt");
	add(b, WIDE, CASTFS_DTYPE_BF16, 2, 300, 9000);
	add(b, ODD, CASTFS_DTYPE_F16, 2, 130, 200);
	add(b, LONG, CASTFS_DTYPE_F32, 2, 3, 70000);
	add(b, GRP, CASTFS_DTYPE_BF16, 2, 260, 8192);
	add(b, "model.layers.0.mlp.gate_proj.weight", CASTFS_DTYPE_F64, 2, 4,
	    8);
	add(b, "model.embed_tokens.weight", CASTFS_DTYPE_BF16, 2, 50, 64);
	add(b, "lm_head.weight", CASTFS_DTYPE_BF16, 2, 50, 64);
	add(b, "model.norm.weight", CASTFS_DTYPE_BF16, 1, 64, 0);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	tu_fixture_init(&fx, file, len);
}

static void teardown(void)
{
	tu_fixture_fini(&fx);
}

static const char *const views[] = { "fp8_dynamic", "fp8_block", "w4a16",
				     "nvfp4" };

/* The source elements of tensor @name as float32 (malloc'ed). */
static float *source_f32(const char *name, const struct castfs_tensor **t)
{
	float *x;

	*t = castfs_header_find(fx.h, name, strlen(name));
	ck_assert_ptr_nonnull(*t);
	x = malloc((size_t)(*t)->nelems * sizeof(*x));
	ck_assert_ptr_nonnull(x);
	castfs_convert_get((*t)->dtype, CASTFS_DTYPE_F32,
			   0)(x, fx.file + fx.h->data_start + (*t)->begin,
			      (size_t)(*t)->nelems);
	return x;
}

/* The slow materialisation: block (bi, bj)'s scale by a plain loop. */
static float slow_scale(const float *x, uint64_t cols, uint64_t rows,
			uint64_t bh, uint64_t bw, uint64_t bi, uint64_t bj,
			enum castfs_dtype dt, bool w4)
{
	float m = 0.0f;

	for (uint64_t r = bi * bh; r < rows && r < (bi + 1) * bh; r++)
		for (uint64_t c = bj * bw; c < cols && c < (bj + 1) * bw; c++)
			m = castfs_ct_absmax_merge(
				m, castfs_ct_absmax(&x[r * cols + c], 1));
	return w4 ? castfs_ct_i4_scale(m, dt) : castfs_ct_f8_scale(m, dt);
}

/* The int4 weight @name: packed codes, group scales, shape. */
static void check_w4(const struct castfs_header *h, const uint8_t *b,
		     const char *name)
{
	const struct castfs_tensor *t, *q, *s, *sh;
	float *x = source_f32(name, &t);
	uint64_t rows = t->shape[0], cols = t->shape[1], ng = cols / 128;
	char n1[128], n2[128], n3[128];

	snprintf(n1, sizeof(n1), "%s_packed", name);
	snprintf(n2, sizeof(n2), "%s_scale", name);
	snprintf(n3, sizeof(n3), "%s_shape", name);
	q = castfs_header_find(h, n1, strlen(n1));
	s = castfs_header_find(h, n2, strlen(n2));
	sh = castfs_header_find(h, n3, strlen(n3));
	ck_assert_ptr_nonnull(q);
	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_nonnull(sh);
	ck_assert_ptr_null(castfs_header_find(h, name, strlen(name)));
	ck_assert_int_eq(q->dtype, CASTFS_DTYPE_I32);
	ck_assert_uint_eq(q->shape[1], cols / 8);
	ck_assert_uint_eq(s->shape[1], ng);
	ck_assert_uint_eq(castfs_load_le64(b + h->data_start + sh->begin + 8),
			  cols);
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t g = 0; g < ng; g++) {
			float sc = slow_scale(x, cols, rows, 1, 128, r, g,
					      t->dtype, true);
			int8_t v[128];
			uint8_t want[2];

			castfs_ct_i4_codes(v, &x[r * cols + g * 128], 128, sc,
					   t->dtype);
			for (int k = 0; k < 128; k += 2) {
				uint64_t e = r * cols + g * 128 + (uint64_t)k;

				ck_assert_msg(
					b[h->data_start + q->begin + e / 2] ==
						(uint8_t)((v[k] + 8) |
							  (v[k + 1] + 8) << 4),
					"%s [%lu, %lu] %d %d %g %g %g", name,
					(unsigned long)r,
					(unsigned long)(g * 128 + k), v[k],
					v[k + 1], (double)sc, (double)x[e],
					(double)x[e + 1]);
			}
			castfs_ct_store(want, sc, t->dtype);
			ck_assert(memcmp(b + h->data_start + s->begin +
						 (r * ng + g) * 2,
					 want, 2) == 0);
		}
	}
	free(x);
}

/* The NVFP4 weight @name (no fused sibling): packed codes, scales and the
 * global scale from a whole-tensor absmax computed here. */
static void check_nvfp4(const struct castfs_header *h, const uint8_t *b,
			const char *name)
{
	const struct castfs_tensor *t, *q, *s, *g;
	float *x = source_f32(name, &t);
	uint64_t rows = t->shape[0], cols = t->shape[1], ng = cols / 16;
	char n1[128], n2[128], n3[128];
	float gs, m = castfs_ct_absmax(x, (size_t)t->nelems);

	snprintf(n1, sizeof(n1), "%s_packed", name);
	snprintf(n2, sizeof(n2), "%s_scale", name);
	snprintf(n3, sizeof(n3), "%s_global_scale", name);
	q = castfs_header_find(h, n1, strlen(n1));
	s = castfs_header_find(h, n2, strlen(n2));
	g = castfs_header_find(h, n3, strlen(n3));
	ck_assert_ptr_nonnull(q);
	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_nonnull(g);
	ck_assert_ptr_null(castfs_header_find(h, name, strlen(name)));
	ck_assert_int_eq(q->dtype, CASTFS_DTYPE_U8);
	ck_assert_int_eq(s->dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_int_eq(g->dtype, CASTFS_DTYPE_F32);
	ck_assert_uint_eq(q->shape[1], cols / 2);
	ck_assert_uint_eq(s->shape[1], ng);
	gs = castfs_ct_nvfp4_gscale(m, t->dtype);
	ck_assert_uint_eq(castfs_load_le32(b + h->data_start + g->begin),
			  castfs_f32_bits(gs));
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t j = 0; j < ng; j++) {
			const float *xg = &x[r * cols + j * 16];
			float sc = castfs_ct_nvfp4_scale(
				castfs_ct_absmax(xg, 16), gs, t->dtype);
			uint8_t want[8], code;

			castfs_ct_fp4_pack(want, xg, 16, sc, gs);
			ck_assert(memcmp(b + h->data_start + q->begin +
						 (r * cols + j * 16) / 2,
					 want, 8) == 0);
			castfs_convert_get(CASTFS_DTYPE_F32,
					   CASTFS_DTYPE_F8_E4M3,
					   0)(&code, &sc, 1);
			ck_assert_uint_eq(
				b[h->data_start + s->begin + r * ng + j], code);
		}
	}
	free(x);
}

static void check_tensor(const struct castfs_header *h, const uint8_t *b,
			 const char *name, unsigned block)
{
	const struct castfs_tensor *t, *q, *s;
	float *x = source_f32(name, &t);
	uint64_t rows = t->shape[0], cols = t->shape[1];
	uint64_t bh = block ? block : 1, bw = block ? block : cols;
	uint64_t nbc = (cols + bw - 1) / bw;
	size_t sz = castfs_dtype_bits(t->dtype) / 8;
	char sname[128];
	float *sg;

	snprintf(sname, sizeof(sname), "%s_scale", name);
	q = castfs_header_find(h, name, strlen(name));
	s = castfs_header_find(h, sname, strlen(sname));
	ck_assert_ptr_nonnull(q);
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(q->dtype, CASTFS_DTYPE_F8_E4M3);
	ck_assert_int_eq(s->dtype, t->dtype);
	ck_assert_uint_eq(s->shape[0], (rows + bh - 1) / bh);
	ck_assert_uint_eq(s->shape[1], nbc);
	sg = malloc((size_t)(s->shape[0] * nbc) * sizeof(*sg));
	ck_assert_ptr_nonnull(sg);
	for (uint64_t i = 0; i < s->shape[0] * nbc; i++)
		sg[i] = slow_scale(x, cols, rows, bh, bw, i / nbc, i % nbc,
				   t->dtype, false);
	for (uint64_t r = 0; r < rows; r++) {
		for (uint64_t c = 0; c < cols; c++) {
			float sc = sg[r / bh * nbc + c / bw];
			uint8_t code, want[4];

			castfs_ct_f8_codes(&code, &x[r * cols + c], 1, sc,
					   t->dtype);
			ck_assert_msg(
				b[h->data_start + q->begin + r * cols + c] ==
					code,
				"%s [%lu, %lu]", name, (unsigned long)r,
				(unsigned long)c);
			if (r % bh || c % bw)
				continue;
			castfs_ct_store(want, sc, t->dtype);
			ck_assert(memcmp(b + h->data_start + s->begin +
						 (r / bh * nbc + c / bw) * sz,
					 want, sz) == 0);
		}
	}
	free(sg);
	free(x);
}

START_TEST(test_ct__views_equal_slow_materialisation)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, views[_i]);
	uint8_t *b = tu_fixture_read_all(&fx, p, &fx.s);
	struct castfs_header *h;
	struct castfs_diag d = { { 0 } };
	unsigned block = _i ? 128 : 0;

	ck_assert_int_eq(castfs_header_parse(b, p->size, p->size, &h, &d), 0);
	if (_i == 3) {
		/* Only LONG's width is a multiple of 16; GRP (q_proj) has
		 * no v_proj in the file: its fused group stays. 1 x 3 + 7. */
		ck_assert_uint_eq(h->ntensors, 10);
		check_nvfp4(h, b, LONG);
		ck_assert_int_eq(castfs_header_find(h, GRP, strlen(GRP))->dtype,
				 CASTFS_DTYPE_BF16);
		goto out;
	}
	if (_i == 2) {
		/* Only GRP has groups that the rows do not cut: 1 x 3 + 7. */
		ck_assert_uint_eq(h->ntensors, 10);
		check_w4(h, b, GRP);
		ck_assert_int_eq(
			castfs_header_find(h, WIDE, strlen(WIDE))->dtype,
			CASTFS_DTYPE_BF16);
		goto out;
	}
	/* 4 weights x 2 + 4 kept (f64, embedding, lm_head, norm). */
	ck_assert_uint_eq(h->ntensors, 12);
	check_tensor(h, b, WIDE, block);
	check_tensor(h, b, ODD, block);
	check_tensor(h, b, LONG, block);
	check_tensor(h, b, GRP, block);
out:
	ck_assert_int_eq(castfs_header_find(h, "lm_head.weight", 14)->dtype,
			 CASTFS_DTYPE_BF16);
	castfs_header_free(h);
	free(b);
	castfs_plan_free(p);
}
END_TEST

START_TEST(test_ct__random_ranges_equal_full_read)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, views[_i]);
	uint8_t *full = tu_fixture_read_all(&fx, p, &fx.s);
	uint8_t *buf = malloc(p->size + 16);
	uint64_t seed = 1300 + (uint64_t)_i;

	ck_assert_ptr_nonnull(buf);
	for (int k = 0; k < 300; k++) {
		uint64_t off = tu_rand(&seed) % (p->size + 16);
		size_t len = (size_t)(tu_rand(&seed) %
				      (k % 3 ? 20000 : p->size + 8));
		ssize_t want = off >= p->size ?
				       0 :
				       (ssize_t)(len < p->size - off ?
							 len :
							 p->size - off);

		ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, buf, len,
						  off),
				 want);
		ck_assert(memcmp(buf, full + off, (size_t)want) == 0);
	}
	free(buf);
	free(full);
	castfs_plan_free(p);
}
END_TEST

static ssize_t no_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	(void)ctx;
	(void)buf;
	(void)n;
	(void)off;
	return -EIO;
}

/* Whether tensor @t is a weight's scale (CT_SCALE bytes). */
static bool is_scale(const struct castfs_tensor *t)
{
	static const char sfx[] = ".weight_scale";

	return t->name_len >= sizeof(sfx) - 1 &&
	       !memcmp(t->name + t->name_len - (sizeof(sfx) - 1), sfx,
		       sizeof(sfx) - 1);
}

/*
 * The scales lie after every weight's codes (the late run), and a
 * sequential read of the codes keeps them: the _scale tensors are then
 * served without reading the source again, and equal a full read's.
 * Read first, they need the source (its read fails here).
 */
START_TEST(test_ct__scales_after_codes_need_no_source)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, views[_i]);
	uint8_t *full = tu_fixture_read_all(&fx, p, &fx.s), *buf;
	struct castfs_reader none = { no_pread, NULL, NULL, NULL };
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h;
	uint64_t first = UINT64_MAX;
	unsigned nscale = 0;

	ck_assert_int_eq(castfs_header_parse(full, p->size, p->size, &h, &d),
			 0);
	castfs_plan_free(p);
	p = tu_fixture_plan(&fx, views[_i]);
	buf = malloc(p->size);
	ck_assert_ptr_nonnull(buf);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (!is_scale(t))
			continue;
		nscale++;
		first = t->begin < first ? t->begin : first;
		ck_assert_int_eq(castfs_plan_read(p, &none, &fx.s, buf,
						  (size_t)(t->end - t->begin),
						  h->data_start + t->begin),
				 -EIO);
	}
	ck_assert_uint_gt(nscale, 0);
	/* Everything before the first scale: the header and the codes. */
	ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, &fx.s, buf,
					  (size_t)(h->data_start + first), 0),
			 (ssize_t)(h->data_start + first));
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		size_t len = (size_t)(t->end - t->begin);
		uint64_t off = h->data_start + t->begin;

		if (!is_scale(t))
			continue;
		ck_assert_int_eq(castfs_plan_read(p, &none, &fx.s, buf, len,
						  off),
				 (ssize_t)len);
		ck_assert(memcmp(buf, full + off, len) == 0);
	}
	castfs_header_free(h);
	free(buf);
	free(full);
	castfs_plan_free(p);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("ct_plan");
	TCase *tc = tcase_create("plan");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300); /* slow materialisation, shared CI */
	tcase_add_loop_test(tc, test_ct__views_equal_slow_materialisation, 0,
			    4);
	tcase_add_loop_test(tc, test_ct__random_ranges_equal_full_read, 0, 4);
	tcase_add_loop_test(tc, test_ct__scales_after_codes_need_no_source, 0,
			    4);
	suite_add_tcase(s, tc);
	return s;
}
