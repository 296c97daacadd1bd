/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes views as plans: the tensor set of each view, any byte range
 * equal to the same slice of a full read (also with a scratch so small that
 * every generator works in chunks), known double-quantisation values, racing
 * first reads, errors of the statistics pass, and rules. The values
 * themselves are checked against bitsandbytes in tests/compat/test_bnb.py.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "plan/plan.h"
#include "quant/quant.h"
#include "common/reader.h"
#include "format/st_header.h"
#include "testutil.h"
#include "view/view.h"

#define Q "model.layers.0.self_attn.q_proj.weight"

static struct tu_fixture fx;

/* Deterministic finite values of the castable dtype (uintptr_t) @ctx. */
static void fill_weights(uint8_t *dst, size_t n, void *ctx)
{
	enum castfs_dtype dt = (enum castfs_dtype)(uintptr_t)ctx;
	uint64_t seed = n;

	for (size_t i = 0; i < n;) {
		double u = (double)(tu_rand(&seed) >> 11) / 9007199254740992.0;
		float f = (float)((u - 0.5) * 6.0);

		if (dt == CASTFS_DTYPE_F32) {
			castfs_store_le32(dst + i, castfs_f32_bits(f));
			i += 4;
		} else if (dt == CASTFS_DTYPE_F64) {
			castfs_store_le64(dst + i, castfs_f64_bits((double)f));
			i += 8;
		} else if (dt == CASTFS_DTYPE_BF16) {
			castfs_store_le16(dst + i,
					  (uint16_t)(castfs_f32_bits(f) >> 16));
			i += 2;
		} else if (dt == CASTFS_DTYPE_F16) {
			/* A finite half: sign, exponent 10..20, mantissa. */
			castfs_store_le16(dst + i,
					  (uint16_t)((seed & 0x8000) |
						     (10 + seed % 11) << 10 |
						     (seed >> 20 & 0x3ff)));
			i += 2;
		} else {
			dst[i++] = (uint8_t)(seed % 0x7e); /* fp8, finite */
		}
	}
}

static void add_w(struct tu_st *b, const char *name, enum castfs_dtype dt,
		  uint32_t ndim, const uint64_t *shape)
{
	tu_st_add_fill(b, name, castfs_dtype_name(dt), ndim, shape,
		       fill_weights, (void *)(uintptr_t)dt);
}

static uint8_t *build_source(size_t *len)
{
	static const uint64_t s_q[] = { 64, 100 }; /* rows straddle blocks */
	static const uint64_t s_odd[] = { 7, 33 }; /* odd n */
	static const uint64_t s_wide[] = { 3, 3000 }; /* rows > tiny chunk */
	static const uint64_t s_emb[] = { 50, 64 };
	static const uint64_t s_vec[] = { 64 };
	static const uint64_t s_conv[] = { 8, 3, 3, 3 };
	struct tu_st *b = tu_st_new();
	uint8_t *file;

	tu_st_meta(b, "format", "pt");
	add_w(b, Q, CASTFS_DTYPE_BF16, 2, s_q);
	add_w(b, "model.layers.0.self_attn.k_proj.weight", CASTFS_DTYPE_F16, 2,
	      s_odd);
	add_w(b, "model.layers.0.mlp.up_proj.weight", CASTFS_DTYPE_F32, 2,
	      s_wide);
	add_w(b, "model.layers.0.mlp.down_proj.weight", CASTFS_DTYPE_F64, 2,
	      s_odd);
	add_w(b, "model.layers.1.mlp.gate_proj.weight", CASTFS_DTYPE_F8_E4M3, 2,
	      s_odd);
	add_w(b, "model.embed_tokens.weight", CASTFS_DTYPE_BF16, 2, s_emb);
	add_w(b, "lm_head.weight", CASTFS_DTYPE_BF16, 2, s_emb);
	add_w(b, "model.norm.weight", CASTFS_DTYPE_BF16, 1, s_vec);
	add_w(b, "model.layers.0.self_attn.q_proj.bias", CASTFS_DTYPE_BF16, 1,
	      s_vec);
	add_w(b, "conv.weight", CASTFS_DTYPE_BF16, 4, s_conv);
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

static const char *const bnb_views[] = { "nf4", "fp4", "nf4_nodq", "fp4_nodq",
					 "int8" };

static const struct castfs_tensor *find(const struct castfs_header *h,
					const char *name)
{
	return castfs_header_find(h, name, strlen(name));
}

static void expect(const struct castfs_header *h, const char *name,
		   enum castfs_dtype dt, uint32_t ndim, uint64_t d0,
		   uint64_t d1)
{
	const struct castfs_tensor *t = find(h, name);

	ck_assert_msg(t != NULL, "missing %s", name);
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_uint_eq(t->ndim, ndim);
	if (ndim > 0)
		ck_assert_uint_eq(t->shape[0], d0);
	if (ndim > 1)
		ck_assert_uint_eq(t->shape[1], d1);
}

static struct castfs_header *view_header(const char *name, uint8_t **bytes)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, name);
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h;

	*bytes = tu_fixture_read_all(&fx, p, &fx.s);
	ck_assert_int_eq(castfs_header_parse(*bytes, p->size, p->size, &h, &d),
			 0);
	castfs_plan_free(p);
	return h;
}

START_TEST(test_quant__views_have_bnb_tensor_sets)
{
	uint8_t *b;
	struct castfs_header *h = view_header("nf4", &b);

	/* 64 x 100 = 6400 elements: 100 blocks, 1 nested block. */
	expect(h, Q, CASTFS_DTYPE_U8, 2, 3200, 1);
	expect(h, Q ".absmax", CASTFS_DTYPE_U8, 1, 100, 0);
	expect(h, Q ".quant_map", CASTFS_DTYPE_F32, 1, 16, 0);
	expect(h, Q ".nested_absmax", CASTFS_DTYPE_F32, 1, 1, 0);
	expect(h, Q ".nested_quant_map", CASTFS_DTYPE_F32, 1, 256, 0);
	ck_assert_ptr_nonnull(find(h, Q ".quant_state.bitsandbytes__nf4"));
	expect(h, "model.layers.0.self_attn.k_proj.weight", CASTFS_DTYPE_U8, 2,
	       116, 1);
	expect(h, "model.embed_tokens.weight", CASTFS_DTYPE_BF16, 2, 50, 64);
	expect(h, "lm_head.weight", CASTFS_DTYPE_BF16, 2, 50, 64);
	expect(h, "model.norm.weight", CASTFS_DTYPE_BF16, 1, 64, 0);
	expect(h, "conv.weight", CASTFS_DTYPE_BF16, 4, 8, 3);
	/* 5 weights x 6 tensors + 5 kept. */
	ck_assert_uint_eq(h->ntensors, 35);
	castfs_header_free(h);
	free(b);

	h = view_header("fp4_nodq", &b);
	expect(h, Q ".absmax", CASTFS_DTYPE_F32, 1, 100, 0);
	ck_assert_ptr_null(find(h, Q ".nested_absmax"));
	ck_assert_ptr_nonnull(find(h, Q ".quant_state.bitsandbytes__fp4"));
	ck_assert_uint_eq(h->ntensors, 5 * 4 + 5);
	castfs_header_free(h);
	free(b);

	h = view_header("int8", &b);
	expect(h, Q, CASTFS_DTYPE_I8, 2, 64, 100);
	expect(h, "model.layers.0.self_attn.q_proj.SCB", CASTFS_DTYPE_F32, 1,
	       64, 0);
	expect(h, "model.layers.0.self_attn.q_proj.weight_format",
	       CASTFS_DTYPE_U8, 0, 0, 0);
	ck_assert_uint_eq(h->ntensors, 5 * 3 + 5);
	castfs_header_free(h);
	free(b);
}
END_TEST

/* The bytes of tensor @name of view file @b (header @h). */
static const uint8_t *tensor_bytes(const struct castfs_header *h,
				   const uint8_t *b, const char *name,
				   size_t *len)
{
	const struct castfs_tensor *t = find(h, name);

	ck_assert_ptr_nonnull(t);
	*len = (size_t)(t->end - t->begin);
	return b + h->data_start + t->begin;
}

START_TEST(test_quant__state_json_names_source_dtype)
{
	static const struct {
		const char *name, *dtype;
	} want[] = {
		{ Q, "bfloat16" },
		{ "model.layers.0.self_attn.k_proj.weight", "float16" },
		{ "model.layers.0.mlp.up_proj.weight", "float32" },
		{ "model.layers.0.mlp.down_proj.weight", "float32" },
		{ "model.layers.1.mlp.gate_proj.weight", "bfloat16" },
	};
	uint8_t *b;
	struct castfs_header *h = view_header("nf4", &b);

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char name[128], json[CASTFS_Q4_STATE_MAX + 1], key[64];
		size_t len;
		const uint8_t *s;

		snprintf(name, sizeof(name), "%s.quant_state.bitsandbytes__nf4",
			 want[i].name);
		s = tensor_bytes(h, b, name, &len);
		ck_assert_uint_lt(len, sizeof(json));
		memcpy(json, s, len);
		json[len] = '\0';
		snprintf(key, sizeof(key), "\"dtype\": \"%s\"", want[i].dtype);
		ck_assert_msg(strstr(json, key) != NULL, "%s", json);
		ck_assert_int_eq(json[len - 1], '}');
		ck_assert_ptr_nonnull(strstr(json, "\"nested_offset\": "));
	}
	castfs_header_free(h);
	free(b);
}
END_TEST

/* Random ranges, with the normal scratch and a tiny one that forces every
 * generator to work in several chunks, equal slices of a full read. */
START_TEST(test_quant__random_ranges_equal_full_read)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, bnb_views[_i]);
	uint8_t *all = tu_fixture_read_all(&fx, p, &fx.s),
		*buf = malloc(p->size + 64);
	struct castfs_scratch tiny = { .buf = malloc(16384 + CASTFS_BOUNCE_LEN),
				       .len = 16384 };
	uint64_t seed = 7 + (uint64_t)_i;

	tiny.bounce = tiny.buf + tiny.len;
	for (int k = 0; k < 2000; k++) {
		struct castfs_scratch *s = k % 2 ? &tiny : &fx.s;
		uint64_t off = tu_rand(&seed) % (p->size + 16);
		size_t len =
			(size_t)(tu_rand(&seed) % (k % 3 ? 300 : p->size + 8));
		ssize_t n = castfs_plan_read(p, &fx.mr.r, s, buf, len, off);
		size_t want = off >= p->size ? 0 :
					       (size_t)(len < p->size - off ?
								len :
								p->size - off);

		ck_assert_int_eq(n, (ssize_t)want);
		ck_assert_int_eq(memcmp(buf, all + off, want), 0);
	}
	free(tiny.buf);
	free(buf);
	free(all);
	castfs_plan_free(p);
}
END_TEST

/* Two blocks with absmax 2 and 4: offset 3, nested absmax 1, codes 0/255. */
START_TEST(test_quant__double_quant_known_values)
{
	static const uint64_t shape[] = { 1, 128 };
	float w[128] = { 0 };
	struct tu_st *b = tu_st_new();
	struct castfs_diag d = { { 0 } };
	struct castfs_header *src, *h;
	const struct castfs_view *v;
	struct castfs_mem_reader mr;
	struct castfs_plan *p;
	uint8_t *file, *out;
	const uint8_t *t;
	size_t len, n;

	w[5] = -2.0f;
	w[64] = 4.0f;
	tu_st_add(b, "l.weight", "F32", 2, shape, w);
	file = tu_st_build(b, &len);
	tu_st_free(b);
	ck_assert_int_eq(castfs_header_parse(file, len, len, &src, &d), 0);
	v = castfs_views_find(&fx.views, "nf4", 3);
	ck_assert_int_eq(castfs_view_plan(v, src, &p, &d), 0);
	castfs_mem_reader_init(&mr, file, len);
	out = malloc(p->size);
	ck_assert_int_eq(castfs_plan_read(p, &mr.r, &fx.s, out, p->size, 0),
			 (ssize_t)p->size);
	ck_assert_int_eq(castfs_header_parse(out, p->size, p->size, &h, &d), 0);
	t = tensor_bytes(h, out, "l.weight.absmax", &n);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(t[0], 0);
	ck_assert_uint_eq(t[1], 255);
	t = tensor_bytes(h, out, "l.weight.nested_absmax", &n);
	ck_assert(castfs_f32_from_bits(castfs_load_le32(t)) == 1.0f);
	t = tensor_bytes(h, out, "l.weight", &n);
	ck_assert_uint_eq(t[2], 0x70); /* -2 / 2 = -1.0: code 0 */
	ck_assert_uint_eq(t[32], 0xf7); /* 4 / 4 = 1.0: code 15 */
	t = tensor_bytes(h, out, "l.weight.quant_state.bitsandbytes__nf4", &n);
	ck_assert_ptr_nonnull(memmem(t, n, "\"nested_offset\": 3.0 ", 21));
	castfs_header_free(h);
	castfs_header_free(src);
	castfs_plan_free(p);
	free(out);
	free(file);
}
END_TEST

/* Threads reading one fresh plan race to compute its statistics. */
struct racer {
	const struct castfs_plan *p;
	uint8_t *out;
	int rc;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	struct castfs_scratch s;
	ssize_t n;

	r->rc = castfs_scratch_init(&s);
	if (r->rc)
		return NULL;
	/* Back to front: the quant_state JSONs come last in the file. */
	for (uint64_t off = r->p->size; off > 0;) {
		size_t len = off < 4096 ? (size_t)off : 4096;

		off -= len;
		n = castfs_plan_read(r->p, &fx.mr.r, &s, r->out + off, len,
				     off);
		if (n != (ssize_t)len)
			r->rc = -1;
	}
	castfs_scratch_fini(&s);
	return NULL;
}

START_TEST(test_quant__concurrent_first_reads_agree)
{
	struct castfs_plan *ref = tu_fixture_plan(&fx, "nf4"),
			   *p = tu_fixture_plan(&fx, "nf4");
	uint8_t *all = tu_fixture_read_all(&fx, ref, &fx.s);
	struct racer r[4];
	pthread_t t[4];

	for (int i = 0; i < 4; i++) {
		r[i] = (struct racer){ .p = p, .out = malloc(p->size) };
		ck_assert_int_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		ck_assert_int_eq(r[i].rc, 0);
		ck_assert_int_eq(memcmp(r[i].out, all, p->size), 0);
		free(r[i].out);
	}
	free(all);
	castfs_plan_free(ref);
	castfs_plan_free(p);
}
END_TEST

/* @len bytes of @p at @off (view offsets) with scratch @s, as a full read. */
static void read_at(struct castfs_plan *p, struct castfs_scratch *s,
		    uint8_t *dst, size_t len, uint64_t off)
{
	ck_assert_int_eq(castfs_plan_read(p, &fx.mr.r, s, dst, len, off),
			 (ssize_t)len);
}

/*
 * A weight's .absmax read when only part of its blocks' codes were read
 * (a read-ahead's request still running elsewhere): the chunks found in the
 * absmax cache and those computed again make the bytes of a full read.
 */
START_TEST(test_quant__absmax_partly_cached_equals_full_read)
{
	struct castfs_plan *p = tu_fixture_plan(&fx, "nf4");
	uint8_t *hb, *all = tu_fixture_read_all(&fx, p, &fx.s);
	struct castfs_header *h = view_header("nf4", &hb);
	const struct castfs_tensor *w = find(h, Q), *a = find(h, Q ".absmax");
	/* 9 bytes per element: chunks of 2048 elements, 32 blocks. */
	struct castfs_scratch small = {
		.buf = malloc(18432 + 64 + CASTFS_BOUNCE_LEN), .len = 18432 + 64
	};
	uint8_t got[100], codes[48 * 32];

	small.bounce = small.buf + small.len;
	ck_assert_uint_eq(a->end - a->begin, sizeof(got)); /* 100 blocks */
	/* Codes of blocks 0-47 only: chunk 0 cached, chunk 1 half. */
	read_at(p, &fx.s, codes, sizeof(codes), h->data_start + w->begin);
	read_at(p, &small, got, sizeof(got), h->data_start + a->begin);
	ck_assert_int_eq(
		memcmp(got, all + h->data_start + a->begin, sizeof(got)), 0);
	free(small.buf);
	castfs_header_free(h);
	free(hb);
	free(all);
	castfs_plan_free(p);
}
END_TEST

/* A reader that fails after @budget bytes. */
struct flaky {
	struct castfs_reader r;
	size_t budget;
};

static ssize_t flaky_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct flaky *f = ctx;

	if (f->budget < n)
		return -EIO;
	f->budget -= n;
	memcpy(buf, fx.file + off, n);
	return (ssize_t)n;
}

/* A source error during the statistics pass is returned, not cached. */
START_TEST(test_quant__stats_errors_propagate_and_retry)
{
	const char *v = _i ? "fp4" : "nf4";
	struct castfs_plan *p = tu_fixture_plan(&fx, v);
	struct flaky f = { { flaky_pread, &f, NULL, NULL }, 0 };
	struct castfs_diag d = { { 0 } };
	const struct castfs_tensor *t;
	struct castfs_header *h;
	char name[96];
	uint8_t *all = tu_fixture_read_all(&fx, p, &fx.s), *buf;
	uint64_t off, size = p->size;
	size_t len;
	ssize_t n;

	castfs_plan_free(p);
	ck_assert_int_eq(castfs_header_parse(all, size, size, &h, &d), 0);
	snprintf(name, sizeof(name), Q ".quant_state.bitsandbytes__%s", v);
	t = find(h, name);
	off = h->data_start + t->begin;
	len = (size_t)(t->end - t->begin);
	buf = malloc(len);
	p = tu_fixture_plan(&fx, v);
	/* Only the statistics pass reads the source for these bytes. */
	n = castfs_plan_read(p, &f.r, &fx.s, buf, len, off);
	ck_assert_int_eq(n, -EIO);
	f.budget = SIZE_MAX;
	n = castfs_plan_read(p, &f.r, &fx.s, buf, len, off);
	ck_assert_int_eq(n, (ssize_t)len);
	ck_assert_int_eq(memcmp(buf, all + off, len), 0);
	castfs_header_free(h);
	castfs_plan_free(p);
	free(buf);
	free(all);
}
END_TEST

/* Rules override the default: keep a Linear, quantise lm_head. */
START_TEST(test_quant__rules_override_default)
{
	static const char cfg[] =
		"{\"views\":{\"nf4r\":{\"base\":\"nf4\",\"rules\":["
		"{\"match\":\"lm_head.weight\",\"convert\":true},"
		"{\"match\":\"*.k_proj.weight\",\"convert\":false}]}}}";
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h;
	uint8_t *b;

	ck_assert_int_eq(castfs_views_load(&fx.views, cfg, strlen(cfg), &d), 0);
	h = view_header("nf4r", &b);
	expect(h, "lm_head.weight", CASTFS_DTYPE_U8, 2, 1600, 1);
	expect(h, "model.layers.0.self_attn.k_proj.weight", CASTFS_DTYPE_F16, 2,
	       7, 33);
	/* Rules cannot quantise what bnb cannot: a norm stays 1-D. */
	expect(h, "model.norm.weight", CASTFS_DTYPE_BF16, 1, 64, 0);
	castfs_header_free(h);
	free(b);
}
END_TEST

TCase *quant_plan_tcase(void);

TCase *quant_plan_tcase(void)
{
	TCase *plan = tcase_create("plan");

	tcase_add_checked_fixture(plan, setup, teardown);
	tcase_add_test(plan, test_quant__views_have_bnb_tensor_sets);
	tcase_add_test(plan, test_quant__state_json_names_source_dtype);
	tcase_add_loop_test(plan, test_quant__random_ranges_equal_full_read, 0,
			    (int)(sizeof(bnb_views) / sizeof(bnb_views[0])));
	tcase_add_test(plan, test_quant__double_quant_known_values);
	tcase_add_test(plan, test_quant__concurrent_first_reads_agree);
	tcase_add_test(plan, test_quant__absmax_partly_cached_equals_full_read);
	tcase_add_loop_test(plan, test_quant__stats_errors_propagate_and_retry,
			    0, 2);
	tcase_add_test(plan, test_quant__rules_override_default);
	return plan;
}
