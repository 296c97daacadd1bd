/* SPDX-License-Identifier: MIT */
/* lib/st_emit: safetensors headers laid out as the official writer does. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "st_testutil.h"
#include "unit.h"

/* ---- emit ---- */

static uint8_t *emit_ok(struct castfs_emit_tensor *t, size_t n, bool has_meta,
			const struct castfs_meta_kv *m, size_t nm, size_t *len)
{
	struct castfs_diag d = { { 0 } };
	uint8_t *out = NULL;
	int rc = castfs_header_emit(t, n, has_meta, m, nm, &out, len, &d);

	ck_assert_msg(rc == 0, "emit: rc %d: %s", rc, d.msg);
	ck_assert_uint_eq(*len % 8, 0);
	ck_assert_uint_eq(castfs_load_le64(out), *len - 8);
	return out;
}

static void emit_bad(struct castfs_emit_tensor *t, size_t n,
		     const struct castfs_meta_kv *m, size_t nm, int rc,
		     const char *phrase)
{
	struct castfs_diag d = { { 0 } };
	uint8_t *out = NULL;
	size_t len = 12345;
	int got = castfs_header_emit(t, n, m != NULL, m, nm, &out, &len, &d);

	ck_assert_msg(got == rc, "emit: rc %d (%s), want %d", got, d.msg, rc);
	ck_assert_ptr_null(out);
	ck_assert_uint_eq(len, 12345);
	ck_assert_msg(strstr(d.msg, phrase), "diag '%s' lacks '%s'", d.msg,
		      phrase);
}

#define ET(nm, dt, nb, ...)                                                   \
	{                                                                     \
		.name = nm, .name_len = sizeof(nm) - 1,                       \
		.dtype = CASTFS_DTYPE_##dt,                                   \
		.ndim = (uint32_t)(sizeof((uint64_t[]){ __VA_ARGS__ }) / 8) - \
			1,                                                    \
		.shape = (uint64_t[]){ __VA_ARGS__ } + 1, .nbytes = nb        \
	}

START_TEST(test_st_header__emit_worked_example)
{
	struct castfs_emit_tensor t[] = {
		ET("b", BF16, 6, 0, 3),
		ET("a", F32, 16, 0, 2, 2),
		ET("w", F8_E4M3, 6, 0, 2, 3),
		ET("s", F32, 4, 0),
	};
	static const uint32_t cookies[] = { 1, 3, 0, 2 };
	static const uint64_t offs[] = { 0, 16, 20, 26, 32 };
	struct castfs_meta_kv m = { "format", "pt", 6, 2 };
	size_t len;
	uint8_t *out;

	for (uint32_t i = 0; i < 4; i++)
		t[i].cookie = i;
	out = emit_ok(t, 4, true, &m, 1, &len);
	ck_assert_uint_eq(len, 272);
	ck_assert_mem_eq(out, worked_prefix, 8);
	ck_assert_mem_eq(out + 8, worked_json, 264);
	for (int i = 0; i < 4; i++) {
		ck_assert_uint_eq(t[i].cookie, cookies[i]);
		ck_assert_uint_eq(t[i].begin, offs[i]);
		ck_assert_uint_eq(t[i].end, offs[i + 1]);
	}
	free(out);
}
END_TEST

START_TEST(test_st_header__emit_escapes)
{
	static const char name[] = "q\"\\/\b\f\n\r\t\x01\x0b\x1f\x7f\xc3\xa9 "
				   "\xf0\x9f\x98\x80\0z";
	static const char want[] =
		"{\"__metadata__\":{\"k\\n\":\"v\\u0000\\\"\"},"
		"\"q\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u000b\\u001f\x7f\xc3\xa9 "
		"\xf0\x9f\x98\x80\\u0000z\":{\"dtype\":\"I16\",\"shape\":[0,5],"
		"\"data_offsets\":[0,0]}}";
	struct castfs_emit_tensor t = {
		.name = name,
		.name_len = sizeof(name) - 1,
		.dtype = CASTFS_DTYPE_I16,
		.ndim = 2,
		.shape = (uint64_t[]){ 0, 5 },
	};
	struct castfs_meta_kv m = { "k\n", "v\0\"", 2, 3 };
	size_t len, jl = sizeof(want) - 1;
	uint8_t *out = emit_ok(&t, 1, true, &m, 1, &len);

	ck_assert_uint_eq(len, 8 + (jl + 7) / 8 * 8);
	ck_assert_mem_eq(out + 8, want, jl);
	for (size_t i = 8 + jl; i < len; i++)
		ck_assert_uint_eq(out[i], ' ');
	free(out);
}
END_TEST

START_TEST(test_st_header__emit_empty)
{
	size_t len;
	uint8_t *out = emit_ok(NULL, 0, false, NULL, 0, &len);

	ck_assert_uint_eq(len, 16);
	ck_assert_mem_eq(out, "\x08\0\0\0\0\0\0\0{}      ", 16);
	free(out);
	out = emit_ok(NULL, 0, true, NULL, 0, &len);
	ck_assert_uint_eq(len, 32);
	ck_assert_mem_eq(out + 8, "{\"__metadata__\":{}}     ", 24);
	free(out);
}
END_TEST

/* FORMATS.md 1.4: U64 first ... BOOL last. */
START_TEST(test_st_header__emit_dtype_order)
{
	static const char *const want[] = {
		"U64",	   "I64",	  "F64",	 "C64",	    "F32",
		"U32",	   "I32",	  "BF16",	 "F16",	    "U16",
		"I16",	   "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3",
		"F8_E5M2", "I8",	  "U8",		 "F6_E3M2", "F6_E2M3",
		"F4",	   "BOOL",
	};
	struct castfs_emit_tensor t[CASTFS_DTYPE_COUNT];
	uint64_t shape[1] = { 8 };
	size_t len;
	uint8_t *out;

	ck_assert_uint_eq(CASTFS_DTYPE_COUNT, 22);
	for (int i = 0; i < CASTFS_DTYPE_COUNT; i++) {
		const char *n = castfs_dtype_name((enum castfs_dtype)i);

		t[i] = (struct castfs_emit_tensor){
			.name = n,
			.name_len = strlen(n),
			.dtype = (enum castfs_dtype)i,
			.ndim = 1,
			.shape = shape,
			.nbytes = castfs_dtype_bits((enum castfs_dtype)i),
		};
	}
	out = emit_ok(t, CASTFS_DTYPE_COUNT, false, NULL, 0, &len);
	for (int i = 0; i < CASTFS_DTYPE_COUNT; i++) {
		unsigned unit = castfs_dtype_bits(t[i].dtype) / 8;

		ck_assert_str_eq(t[i].name, want[i]);
		if (unit)
			ck_assert_uint_eq(t[i].begin % unit, 0);
		if (i)
			ck_assert_uint_eq(t[i].begin, t[i - 1].end);
	}
	free(out);
}
END_TEST

/* Tensors [(name, dtype, bytes, late)] laid out; their begins by name. */
static void emit_late(const char *const *names, const enum castfs_dtype *dt,
		      const uint64_t *bytes, const bool *late, size_t n,
		      const uint64_t *want)
{
	struct castfs_emit_tensor t[4];
	uint64_t shape[4];
	size_t len;
	uint8_t *out;

	for (size_t i = 0; i < n; i++) {
		shape[i] = bytes[i] / (castfs_dtype_bits(dt[i]) / 8);
		t[i] = (struct castfs_emit_tensor){
			.name = names[i],
			.name_len = strlen(names[i]),
			.dtype = dt[i],
			.ndim = 1,
			.shape = &shape[i],
			.nbytes = bytes[i],
			.cookie = (uint32_t)i,
			.late = late[i],
		};
	}
	out = emit_ok(t, n, false, NULL, 0, &len);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(t[i].begin, want[t[i].cookie]);
	free(out);
}

/* Late tensors form a second run in the usual order, unless that leaves
 * one misaligned: then every tensor takes its usual place. */
START_TEST(test_st_header__emit_late_run)
{
	static const char *const names[] = { "a", "b", "c", "d" };
	static const enum castfs_dtype dt[] = { CASTFS_DTYPE_F32,
						CASTFS_DTYPE_U8,
						CASTFS_DTYPE_U8,
						CASTFS_DTYPE_F32 };
	static const bool late[] = { true, false, true, false };
	static const uint64_t even[] = { 8, 4, 3, 4 }, odd[] = { 8, 3, 3, 4 };
	/* d, b | a, c */
	static const uint64_t want_even[] = { 8, 4, 16, 0 };
	/* a, d, b, c: safetensors' order */
	static const uint64_t want_odd[] = { 0, 12, 15, 8 };

	emit_late(names, dt, even, late, 4, want_even);
	emit_late(names, dt, odd, late, 4, want_odd);
}
END_TEST

/* A 2-byte late tensor counts too: after an odd run it would start at an
 * odd offset, so every tensor takes its usual place (an element of 2
 * bytes needs an even offset as one of 4 needs a multiple of 4). */
START_TEST(test_st_header__emit_late_run_two_byte)
{
	static const char *const names[] = { "a", "b", "c" };
	static const enum castfs_dtype dt[] = { CASTFS_DTYPE_BF16,
						CASTFS_DTYPE_U8,
						CASTFS_DTYPE_F32 };
	static const bool late[] = { true, false, false };
	static const uint64_t even[] = { 4, 4, 4 }, odd[] = { 4, 3, 4 };
	/* c, b | a */
	static const uint64_t want_even[] = { 8, 4, 0 };
	/* c, a, b: safetensors' order (F32, BF16, U8 by the dtype enum) */
	static const uint64_t want_odd[] = { 4, 8, 0 };

	emit_late(names, dt, even, late, 3, want_even);
	emit_late(names, dt, odd, late, 3, want_odd);
}
END_TEST

START_TEST(test_st_header__emit_name_order_bytewise)
{
	struct castfs_emit_tensor t[] = {
		ET("b", U8, 1, 0, 1),	     ET("a", U8, 1, 0, 1),
		ET("aa", U8, 1, 0, 1),	     ET("B", U8, 1, 0, 1),
		ET("\xc3\xa9", U8, 1, 0, 1), ET("a\0", U8, 1, 0, 1),
		ET("~", U8, 1, 0, 1),
	};
	static const char *const want[] = { "B", "a", "a",	 "aa",
					    "b", "~", "\xc3\xa9" };
	size_t len;
	uint8_t *out = emit_ok(t, 7, false, NULL, 0, &len);

	for (int i = 0; i < 7; i++)
		ck_assert_str_eq(t[i].name, want[i]);
	ck_assert_uint_eq(t[1].name_len, 1);
	ck_assert_uint_eq(t[2].name_len, 2);
	free(out);
}
END_TEST

/* A random name of valid UTF-8, escapes and controls included. */
static size_t rand_name(uint64_t *s, char *out, size_t i, bool controls)
{
	static const char *const frag[] = {
		"a",	"layer",    ".",
		"\"",	"\\",	    "/",
		" ",	"\xc3\xa9", "\xf0\x9f\x98\x80",
		"\x7f", "_",	    "9",
		"\n",	"\x01",	    "\0",
		"\t"
	};
	size_t n = 0, nf = controls ? 16 : 12;

	for (uint64_t k = tu_rand(s) % 6; k > 0; k--) {
		const char *f = frag[tu_rand(s) % nf];
		size_t fl = *f ? strlen(f) : 1;

		memcpy(out + n, f, fl);
		n += fl;
	}
	return n + (size_t)sprintf(out + n, "#%zu", i);
}

struct rand_set {
	struct castfs_emit_tensor t[24];
	uint64_t shape[24][5];
	char name[24][64];
	size_t n;
};

static void rand_set(struct rand_set *r, uint64_t *s, bool controls)
{
	r->n = tu_rand(s) % 24;
	for (size_t i = 0; i < r->n; i++) {
		struct castfs_emit_tensor *t = &r->t[i];
		uint64_t nel = 1;

		t->name = r->name[i];
		t->name_len = rand_name(s, r->name[i], i, controls);
		t->dtype = (enum castfs_dtype)(tu_rand(s) % CASTFS_DTYPE_COUNT);
		t->ndim = (uint32_t)(tu_rand(s) % 4);
		t->shape = r->shape[i];
		for (uint32_t k = 0; k < t->ndim; k++)
			nel *= (r->shape[i][k] = tu_rand(s) % 6);
		if (castfs_dtype_bits(t->dtype) < 8) /* whole bytes */
			nel *= (r->shape[i][t->ndim++] = 4);
		t->nbytes = nel * castfs_dtype_bits(t->dtype) / 8;
		t->cookie = (uint32_t)i;
		t->late = false;
	}
}

static void check_roundtrip(struct rand_set *r, bool has_meta,
			    const struct castfs_meta_kv *m, size_t nm)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_header *h = NULL;
	uint64_t data = 0;
	size_t len;
	uint8_t *out = emit_ok(r->t, r->n, has_meta, m, nm, &len);

	for (size_t i = 0; i < r->n; i++)
		data += r->t[i].nbytes;
	ck_assert_int_eq(castfs_header_parse(out, len, len + data, &h, &d), 0);
	ck_assert_uint_eq(h->ntensors, r->n);
	ck_assert_uint_eq(h->has_metadata, has_meta);
	ck_assert_uint_eq(h->nmeta, has_meta ? nm : 0);
	for (size_t i = 0; i < r->n; i++) {
		const struct castfs_emit_tensor *e = &r->t[i];
		const struct castfs_tensor *t =
			castfs_header_find(h, e->name, e->name_len);

		ck_assert_ptr_nonnull(t);
		ck_assert_int_eq(t->dtype, e->dtype);
		ck_assert_uint_eq(t->ndim, e->ndim);
		for (uint32_t k = 0; k < e->ndim; k++)
			ck_assert_uint_eq(t->shape[k], e->shape[k]);
		ck_assert_uint_eq(t->begin, e->begin);
		ck_assert_uint_eq(t->end, e->end);
	}
	for (size_t i = 0; has_meta && i < nm; i++) {
		ck_assert_uint_eq(h->meta[i].key_len, m[i].key_len);
		ck_assert_mem_eq(h->meta[i].value, m[i].value, m[i].value_len);
	}
	castfs_header_free(h);
	free(out);
}

START_TEST(test_st_header__emit_roundtrip)
{
	struct rand_set r;
	struct castfs_meta_kv m[] = { { "format", "pt", 6, 2 },
				      { "k\0\"", "\x01v\xc3\xa9", 3, 4 } };
	uint64_t s = 5;

	do
		rand_set(&r, &s, true);
	while (r.n < 5);
	check_roundtrip(&r, true, m, 2);
	check_roundtrip(&r, false, m, 2);
}
END_TEST

START_TEST(test_st_header__emit_random_roundtrip)
{
	uint64_t s = 0x5eed;

	for (int it = 0; it < 400; it++) {
		struct rand_set r;
		struct castfs_meta_kv m = { "format", "pt", 6, 2 };

		rand_set(&r, &s, true);
		check_roundtrip(&r, it % 3 != 0, &m, (size_t)(it % 2));
	}
}
END_TEST

/* The builder writes its own JSON; without controls (which it escapes as
 * \u00XX uppercase) it must agree with the emitter byte for byte. */
START_TEST(test_st_header__emit_matches_builder)
{
	uint64_t s = 99;

	for (int it = 0; it < 100; it++) {
		struct rand_set r;
		struct tu_st *b = tu_st_new();
		size_t len, blen;
		uint8_t *out, *bf;
		struct castfs_meta_kv m = { "format", "pt", 6, 2 };

		rand_set(&r, &s, false);
		for (size_t i = 0; i < r.n; i++)
			tu_st_add_n(b, r.t[i].name, r.t[i].name_len,
				    castfs_dtype_name(r.t[i].dtype),
				    r.t[i].ndim, r.t[i].shape, NULL,
				    TU_NBYTES_AUTO);
		tu_st_meta(b, "format", "pt");
		out = emit_ok(r.t, r.n, true, &m, 1, &len);
		bf = tu_st_build(b, &blen);
		ck_assert_uint_ge(blen, len);
		ck_assert_mem_eq(out, bf, len);
		free(bf);
		free(out);
		tu_st_free(b);
	}
}
END_TEST

START_TEST(test_st_header__emit_rejects_duplicates)
{
	struct castfs_emit_tensor t[] = { ET("w", U8, 1, 0, 1),
					  ET("v", F32, 4, 0, 1),
					  ET("w", F32, 4, 0, 1) };
	struct castfs_meta_kv m[] = { { "k", "1", 1, 1 }, { "k", "2", 1, 1 } };

	emit_bad(t, 3, NULL, 0, -EINVAL, "duplicate tensor name 'w'");
	emit_bad(t, 2, m, 2, -EINVAL, "duplicate __metadata__ key 'k'");
}
END_TEST

START_TEST(test_st_header__emit_rejects_bad_sizes)
{
	struct castfs_emit_tensor t[] = {
		ET("w", F16, 7, 0, 2, 2),
		ET("f4", F4, 1, 0, 3),
		ET("o", U8, 0, 0, UINT64_C(1) << 40, UINT64_C(1) << 40, 0),
	};
	const uint64_t g = (UINT64_C(1) << 61) - 1; /* 8 * g bits still fit */
	struct castfs_emit_tensor big[9];
	char names[9][2];

	for (int i = 0; i < 9; i++) {
		names[i][0] = (char)('a' + i);
		big[i] = (struct castfs_emit_tensor){ .name = names[i],
						      .name_len = 1,
						      .dtype = CASTFS_DTYPE_U8,
						      .ndim = 1,
						      .shape = &g,
						      .nbytes = g };
	}

	emit_bad(&t[0], 1, NULL, 0, -EINVAL,
		 "tensor 'w': nbytes 7 but 4 elements of F16 need 8");
	emit_bad(&t[1], 1, NULL, 0, -EINVAL, "does not fill whole bytes");
	emit_bad(&t[2], 1, NULL, 0, -EOVERFLOW, "overflows 64 bits");
	emit_bad(big, 9, NULL, 0, -EOVERFLOW, "data size overflows 64 bits");
}
END_TEST

START_TEST(test_st_header__emit_rejects_bad_names)
{
	struct castfs_emit_tensor t[] = {
		ET("\xff", U8, 1, 0, 1),
		ET("__metadata__", U8, 1, 0, 1),
		ET("ok", U8, 1, 0, 1),
	};
	struct castfs_meta_kv m = { "k", "\xc3", 1, 1 };

	emit_bad(&t[0], 1, NULL, 0, -EINVAL, "not valid UTF-8 or is reserved");
	emit_bad(&t[1], 1, NULL, 0, -EINVAL, "'__metadata__' is not valid");
	t[2].dtype = CASTFS_DTYPE_INVALID;
	emit_bad(&t[2], 1, NULL, 0, -EINVAL, "tensor 'ok': invalid dtype 22");
	t[2].dtype = CASTFS_DTYPE_U8;
	emit_bad(&t[2], 1, &m, 1, -EINVAL, "__metadata__ entry 0 is not valid");
}
END_TEST

/* 17 M control bytes escape to 102 MB of JSON. */
START_TEST(test_st_header__emit_e2big)
{
	size_t n = 17000000;
	char *name = malloc(n);
	struct castfs_emit_tensor t = { .name = name,
					.name_len = n,
					.dtype = CASTFS_DTYPE_U8 };

	memset(name, 1, n);
	t.nbytes = 1;
	emit_bad(&t, 1, NULL, 0, -E2BIG, "header would exceed 100000000 bytes");
	free(name);
}
END_TEST

static void st_emit_tests(TCase *tc)
{
	tcase_add_test(tc, test_st_header__emit_worked_example);
	tcase_add_test(tc, test_st_header__emit_escapes);
	tcase_add_test(tc, test_st_header__emit_empty);
	tcase_add_test(tc, test_st_header__emit_dtype_order);
	tcase_add_test(tc, test_st_header__emit_name_order_bytewise);
	tcase_add_test(tc, test_st_header__emit_late_run);
	tcase_add_test(tc, test_st_header__emit_late_run_two_byte);
	tcase_add_test(tc, test_st_header__emit_roundtrip);
	tcase_add_test(tc, test_st_header__emit_random_roundtrip);
	tcase_add_test(tc, test_st_header__emit_matches_builder);
	tcase_add_test(tc, test_st_header__emit_rejects_duplicates);
	tcase_add_test(tc, test_st_header__emit_rejects_bad_sizes);
	tcase_add_test(tc, test_st_header__emit_rejects_bad_names);
	tcase_add_test(tc, test_st_header__emit_e2big);
}

Suite *unit_suite(void)
{
	Suite *s = suite_create("st_emit");
	TCase *tc = tcase_create("emit");

	st_emit_tests(tc);
	suite_add_tcase(s, tc);
	return s;
}
