/* SPDX-License-Identifier: MIT */
/*
 * Side data (format/st_side.c): which tensors' bytes are read with the
 * header, the bounds, errors of the reader; and the bitsandbytes 4-bit
 * scanners that read them (view/qsrc_bnb4.c, view/qsrc_ctw4.c): a
 * well-formed quant_state or weight_shape is paired, every lie refused. Values against bitsandbytes are checked
 * in tests/compat/test_bnb4_src.py.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/st_side.h"
#include "quant/quant.h"
#include "st_testutil.h"
#include "unit.h"
#include "view/qsrc.h"
#include "view/qsrc_xshard.h"

static const char state_nf4[] =
	"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	"\"bfloat16\", \"shape\": [10, 20]}";

/* Parse the built file and read its side data through a memory reader
 * over its first @avail bytes. */
static struct castfs_header *parse_side(struct tu_st *b, size_t cut, int *rc)
{
	size_t len;
	uint8_t *f = tu_st_build(b, &len);
	struct castfs_header *h = stt_parse_ok(f, len);
	struct castfs_mem_reader mr;

	castfs_mem_reader_init(&mr, f, len - cut);
	*rc = castfs_header_read_side(h, &mr.r, NULL);
	free(f);
	tu_st_free(b);
	return h;
}

START_TEST(test_st_side__reads_wanted)
{
	struct tu_st *b = tu_st_new();
	int64_t ws[2] = { 8, 32 };
	struct castfs_header *h;
	const uint8_t *p;
	size_t len = 0;
	int rc;

	tu_st_add(b, "l.weight.quant_state.bitsandbytes__nf4", "U8",
		  SHAPE(sizeof(state_nf4) - 1), state_nf4);
	tu_st_add(b, "c.weight_shape", "I64", SHAPE(2), ws);
	tu_st_add(b, "x", "U8", SHAPE(16), NULL);
	tu_st_add(b, "y.quant_state.bitsandbytes__nf4.z", "U8", SHAPE(4), NULL);
	h = parse_side(b, 0, &rc);
	ck_assert_int_eq(rc, 0);
	p = castfs_header_side(
		h, stt_find(h, "l.weight.quant_state.bitsandbytes__nf4"), &len);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(len, sizeof(state_nf4) - 1);
	ck_assert_int_eq(memcmp(p, state_nf4, len), 0);
	p = castfs_header_side(h, stt_find(h, "c.weight_shape"), &len);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(len, 16);
	ck_assert_int_eq(memcmp(p, ws, 16), 0);
	ck_assert_ptr_null(castfs_header_side(h, stt_find(h, "x"), &len));
	ck_assert_ptr_null(castfs_header_side(
		h, stt_find(h, "y.quant_state.bitsandbytes__nf4.z"), &len));
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_side__bounds)
{
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;
	size_t len, nread = 0;
	char name[64];
	int rc;

	tu_st_add(b, "big.quant_state.bitsandbytes__nf4", "U8",
		  SHAPE(CASTFS_SIDE_MAX + 1), NULL);
	for (int i = 0; i < 70; i++) {
		snprintf(name, sizeof(name),
			 "m%02d.quant_state.bitsandbytes__fp4", i);
		tu_st_add(b, name, "U8", SHAPE(CASTFS_SIDE_MAX), NULL);
	}
	h = parse_side(b, 0, &rc);
	ck_assert_int_eq(rc, 0);
	ck_assert_ptr_null(castfs_header_side(
		h, stt_find(h, "big.quant_state.bitsandbytes__nf4"), &len));
	for (size_t i = 0; i < h->ntensors; i++)
		nread += castfs_header_side(h, &h->tensors[i], &len) != NULL;
	ck_assert_uint_eq(nread, CASTFS_SIDE_TOTAL / CASTFS_SIDE_MAX);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_st_side__read_error)
{
	struct tu_st *b = tu_st_new();
	struct castfs_header *h;
	size_t len;
	int rc;

	tu_st_add(b, "l.weight.quant_state.bitsandbytes__nf4", "U8",
		  SHAPE(sizeof(state_nf4) - 1), state_nf4);
	h = parse_side(b, 8, &rc); /* the reader ends inside the blob */
	ck_assert_int_eq(rc, -EIO);
	ck_assert_ptr_null(h->side);
	ck_assert_ptr_null(castfs_header_side(h, &h->tensors[0], &len));
	castfs_header_free(h);
}
END_TEST

/* A 4-bit layout of [10, 20] (200 elements, 4 blocks of 64) whose
 * quant_state is @js, its packed weight @packed bytes. */
static struct castfs_header *bnb4(const char *js, uint64_t packed,
				  const char *absmax_dt, bool nested)
{
	struct tu_st *b = tu_st_new();
	int rc;

	tu_st_add(b, "l.weight", "U8", SHAPE(packed, 1), NULL);
	tu_st_add(b, "l.weight.absmax", absmax_dt, SHAPE(4), NULL);
	tu_st_add(b, "l.weight.quant_map", "F32", SHAPE(16), NULL);
	if (nested) {
		tu_st_add(b, "l.weight.nested_absmax", "F32", SHAPE(1), NULL);
		tu_st_add(b, "l.weight.nested_quant_map", "F32", SHAPE(256),
			  NULL);
	}
	tu_st_add(b, "l.weight.quant_state.bitsandbytes__nf4", "U8",
		  SHAPE(strlen(js)), js);
	return parse_side(b, 0, &rc);
}

START_TEST(test_qsrc_bnb4__pairs)
{
	static const char nested[] =
		"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
		"\"float16\", \"shape\": [10, 20], \"nested_blocksize\": 256, "
		"\"nested_dtype\": \"float32\", \"nested_offset\": 0.25}";
	struct castfs_header *h = bnb4(state_nf4, 100, "F32", false);
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	const struct castfs_q4src *s;

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nbnb4, 1);
	ck_assert_uint_eq(stt_qinfo(h, &q, "l.weight")->role, CASTFS_QR_BNB4);
	ck_assert_uint_eq(stt_qinfo(h, &q, "l.weight.absmax")->role,
			  CASTFS_QR_SCALE);
	s = &q.q4[0];
	ck_assert_uint_eq(s->ndim, 2);
	ck_assert_uint_eq(s->shape[0], 10);
	ck_assert_uint_eq(s->shape[1], 20);
	ck_assert_uint_eq(s->blocksize, 64);
	ck_assert_uint_eq(s->qtype, CASTFS_Q_NF4);
	ck_assert_uint_eq(s->dtype, CASTFS_DTYPE_BF16);
	ck_assert(!s->nested);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);

	h = bnb4(nested, 100, "U8", true);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert(q.q4[0].nested);
	ck_assert_uint_eq(q.q4[0].nested_blocksize, 256);
	ck_assert(q.q4[0].offset == 0.25f);
	ck_assert_uint_eq(q.q4[0].dtype, CASTFS_DTYPE_F16);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
}
END_TEST

/* quant_state lies and what the reason says. */
static const struct {
	const char *js;
	uint64_t packed;
	const char *absmax_dt;
	const char *why;
} lies[] = {
	{ "{\"quant_type\": \"nf4\", ", 100, "F32", "not a JSON object" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 22]}",
	  100, "F32", "packed size" },
	{ "{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 20]}",
	  100, "F32", "quant_type is not its name's" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 48, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 20]}",
	  100, "F32", "blocksize" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	  "\"int8\", \"shape\": [10, 20]}",
	  100, "F32", "dtype" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 20]}",
	  100, "U8", "absmax" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 20], \"nested_offset\": 1}",
	  100, "F32", "nested" },
	{ "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
	  "\"bfloat16\", \"shape\": [10, 20], \"shape\": [20, 10]}",
	  100, "F32", "key twice" },
};

START_TEST(test_qsrc_bnb4__lies_refused)
{
	struct castfs_header *h =
		bnb4(lies[_i].js, lies[_i].packed, lies[_i].absmax_dt, false);
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "bitsandbytes 4-bit"));
	ck_assert_msg(strstr(d.msg, lies[_i].why), "%s", d.msg);
	castfs_header_free(h);
}
END_TEST

/* A pack-quantized int4 layout: codes [4, @words] I32, scales [4,
 * @groups] BF16, weight_shape [4, @cols], and @extra ("" or a leaf). */
static struct castfs_header *ctw4(uint64_t words, uint64_t groups, int64_t cols,
				  const char *extra)
{
	struct tu_st *b = tu_st_new();
	int64_t ws[2] = { 4, cols };
	char name[64];
	int rc;

	tu_st_add(b, "l.weight_packed", "I32", SHAPE(4, words), NULL);
	tu_st_add(b, "l.weight_scale", "BF16", SHAPE(4, groups), NULL);
	if (cols)
		tu_st_add(b, "l.weight_shape", "I64", SHAPE(2), ws);
	if (extra[0]) {
		snprintf(name, sizeof(name), "l.%s", extra);
		tu_st_add(b, name, "I32", SHAPE(1, 1), NULL);
	}
	return parse_side(b, 0, &rc);
}

START_TEST(test_qsrc_ctw4__pairs)
{
	struct castfs_header *h = ctw4(8, 2, 64, "");
	struct castfs_diag d = { { 0 } };
	const struct castfs_qinfo *qi;
	struct castfs_qsrc q;

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	ck_assert_uint_eq(q.nctw4, 1);
	qi = stt_qinfo(h, &q, "l.weight_packed");
	ck_assert_uint_eq(qi->role, CASTFS_QR_CTW4);
	ck_assert_uint_eq(qi->bcols, 32);
	ck_assert_uint_eq(stt_qinfo(h, &q, "l.weight_shape")->role,
			  CASTFS_QR_SCALE);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
}
END_TEST

static const struct {
	uint64_t words, groups;
	int64_t cols;
	const char *extra, *why;
} w4_lies[] = {
	{ 8, 2, 64, "weight_zero_point", "weight_zero_point" }, /* [1, 1] */
	{ 8, 2, 64, "weight_g_idx", "g_idx" },
	{ 8, 2, 72, "", "weight_shape" },
	{ 8, 2, 0, "", "weight_shape" },
	{ 2, 1, 16, "", "fewer than 32" },
	{ 8, 3, 64, "", "per channel or per group" },
};

/* ctw4(8, 2, 64) with an I32 zero point of @zrows x @zcols. */
static struct castfs_header *ctw4_zp(uint64_t zrows, uint64_t zcols)
{
	struct tu_st *b = tu_st_new();
	int64_t ws[2] = { 4, 64 };
	int rc;

	tu_st_add(b, "l.weight_packed", "I32", SHAPE(4, 8), NULL);
	tu_st_add(b, "l.weight_scale", "BF16", SHAPE(4, 2), NULL);
	tu_st_add(b, "l.weight_shape", "I64", SHAPE(2), ws);
	tu_st_add(b, "l.weight_zero_point", "I32", SHAPE(zrows, zcols), NULL);
	return parse_side(b, 0, &rc);
}

/* Asymmetric: the zero points [ceil(rows / 8), groups], packed along the
 * rows, are paired and dropped; a directory's config.json decides whether
 * a weight must have them. */
START_TEST(test_qsrc_ctw4__zero_points)
{
	struct castfs_header *h = ctw4_zp(1, 2), *sym = ctw4(8, 2, 64, "");
	struct castfs_diag d = { { 0 } };
	const struct castfs_qinfo *qi;
	const struct castfs_tensor *zp = stt_find(h, "l.weight_zero_point");
	struct castfs_qsrc q;

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), 0);
	qi = &q.t[stt_find(h, "l.weight_packed") - h->tensors];
	ck_assert_uint_eq(qi->role, CASTFS_QR_CTW4);
	ck_assert_uint_eq(qi->zp, (uint32_t)(zp - h->tensors) + 1);
	ck_assert_uint_eq(q.t[zp - h->tensors].role, CASTFS_QR_SCALE);
	castfs_qsrc_fini(&q);
	ck_assert_int_eq(castfs_qsrc_scan(h, CASTFS_QSRC_W4ASYM, &q, &d), 0);
	castfs_qsrc_fini(&q);
	ck_assert_int_eq(castfs_qsrc_scan(h, CASTFS_QSRC_W4SYM, &q, &d),
			 -ENOTSUP);
	ck_assert_msg(strstr(d.msg, "declares symmetric"), "%s", d.msg);
	d.msg[0] = '\0'; /* the first error's message is kept */
	ck_assert_int_eq(castfs_qsrc_scan(sym, CASTFS_QSRC_W4ASYM, &q, &d),
			 -ENOTSUP);
	ck_assert_msg(strstr(d.msg, "requires"), "%s", d.msg);
	ck_assert_int_eq(castfs_qsrc_scan(sym, CASTFS_QSRC_W4SYM, &q, &d), 0);
	ck_assert_uint_eq(
		q.t[stt_find(sym, "l.weight_packed") - sym->tensors].zp, 0);
	castfs_qsrc_fini(&q);
	castfs_header_free(h);
	castfs_header_free(sym);
	/* not packed along the rows, or one per row instead of per group */
	h = ctw4_zp(4, 2);
	d.msg[0] = '\0';
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_msg(strstr(d.msg, "weight_zero_point that"), "%s", d.msg);
	castfs_header_free(h);
	h = ctw4_zp(1, 1);
	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	castfs_header_free(h);
}
END_TEST

START_TEST(test_qsrc_ctw4__lies_refused)
{
	struct castfs_header *h = ctw4(w4_lies[_i].words, w4_lies[_i].groups,
				       w4_lies[_i].cols, w4_lies[_i].extra);
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;

	ck_assert_int_eq(castfs_qsrc_scan(h, 0, &q, &d), -ENOTSUP);
	ck_assert_ptr_nonnull(strstr(d.msg, "compressed-tensors"));
	ck_assert_msg(strstr(d.msg, w4_lies[_i].why), "%s", d.msg);
	castfs_header_free(h);
}
END_TEST

/* An int4 module split across two shards: its weight_shape's data comes
 * with it into the composite header, which then pairs it strictly. */
START_TEST(test_st_side__gathered_across_shards)
{
	struct tu_st *b0 = tu_st_new(), *b1 = tu_st_new();
	int64_t ws[2] = { 4, 64 };
	struct castfs_header *h[2], *x;
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc q;
	const uint8_t *p;
	size_t len = 0;
	int rc;

	tu_st_add(b0, "l.weight_packed", "I32", SHAPE(4, 8), NULL);
	tu_st_add(b0, "n.weight", "BF16", SHAPE(3), NULL);
	tu_st_add(b1, "l.weight_scale", "BF16", SHAPE(4, 2), NULL);
	tu_st_add(b1, "l.weight_shape", "I64", SHAPE(2), ws);
	h[0] = parse_side(b0, 0, &rc);
	ck_assert_int_eq(rc, 0);
	h[1] = parse_side(b1, 0, &rc);
	ck_assert_int_eq(rc, 0);
	for (size_t k = 0; k < 2; k++) {
		ck_assert_int_eq(castfs_qsrc_scan(h[k],
						  CASTFS_QSRC_XSHARD |
							  CASTFS_QSRC_W4SYM,
						  &q, &d),
				 0);
		ck_assert_uint_gt(q.nxshard, 0);
		castfs_qsrc_fini(&q);
	}
	ck_assert_int_eq(
		castfs_qsrc_xshard((const struct castfs_header *const *)h, 2, 0,
				   &x, NULL),
		0);
	ck_assert_uint_eq(x->ntensors, 4);
	p = castfs_header_side(x, stt_find(x, "l.weight_shape"), &len);
	ck_assert_ptr_nonnull(p);
	ck_assert_uint_eq(len, 16);
	ck_assert_mem_eq(p, (const uint8_t *)ws, 16);
	ck_assert_int_eq(
		castfs_qsrc_scan(x, CASTFS_QSRC_STRICT | CASTFS_QSRC_W4SYM, &q,
				 &d),
		0);
	ck_assert_uint_eq(q.nctw4, 1);
	castfs_qsrc_fini(&q);
	castfs_header_free(x);
	/* shard 1's output holds none of them */
	ck_assert_int_eq(
		castfs_qsrc_xshard((const struct castfs_header *const *)h, 2, 1,
				   &x, NULL),
		0);
	ck_assert_uint_eq(x->ntensors, 0);
	castfs_header_free(x);
	castfs_header_free(h[0]);
	castfs_header_free(h[1]);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("st_side");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_st_side__reads_wanted);
	tcase_add_test(tc, test_st_side__bounds);
	tcase_add_test(tc, test_st_side__read_error);
	tcase_add_test(tc, test_qsrc_bnb4__pairs);
	tcase_add_loop_test(tc, test_qsrc_bnb4__lies_refused, 0,
			    sizeof(lies) / sizeof(lies[0]));
	tcase_add_test(tc, test_qsrc_ctw4__pairs);
	tcase_add_test(tc, test_qsrc_ctw4__zero_points);
	tcase_add_test(tc, test_st_side__gathered_across_shards);
	tcase_add_loop_test(tc, test_qsrc_ctw4__lies_refused, 0,
			    sizeof(w4_lies) / sizeof(w4_lies[0]));
	suite_add_tcase(s, tc);
	return s;
}
