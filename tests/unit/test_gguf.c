/* SPDX-License-Identifier: MIT */
/*
 * format/gguf.c and quant/quant_gguf.c where an oracle outside castfs
 * exists in C: the fp16 scale rounding against the CPU's own F16C
 * conversion (vcvtps2ph, round to nearest even, as ggml uses it), and the
 * GGUF layout rules of gguf.cpp (offsets, padding, name limits). The bytes
 * of whole files are checked against gguf-py in tests/compat/test_gguf*.py.
 */
#include <check.h>
#include <errno.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "format/gguf.h"
#include "quant/quant_gguf.h"
#include "unit.h"

__attribute__((target("f16c"))) static uint16_t hw_fp16(float f)
{
	return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

START_TEST(test_gguf__fp16_matches_f16c)
{
	if (!__builtin_cpu_supports("f16c"))
		return; /* no oracle on this CPU: nothing to compare */
	static const uint32_t hi[] = { 0, 1, 0x155, 0x2aa, 0x3fe, 0x3ff };
	static const uint32_t lo[] = { 0,      1,      0xfff, 0x1000,
				       0x1001, 0x1ffe, 0x1fff };
	uint64_t bad = 0;

	/* every exponent, at and around each rounding boundary */
	for (uint32_t e = 0; e < 255; e++)
		for (size_t h = 0; h < sizeof(hi) / sizeof(hi[0]); h++)
			for (size_t l = 0; l < sizeof(lo) / sizeof(lo[0]); l++)
				for (uint32_t sg = 0; sg < 2; sg++) {
					float f = castfs_f32_from_bits(
						sg << 31 | e << 23 |
						hi[h] << 13 | lo[l]);

					bad += castfs_gguf_fp16(f) !=
					       hw_fp16(f);
				}
	for (int i = 0; i < 1000000; i++) {
		float f = castfs_f32_from_bits(next32());

		if (f == f) /* NaN: ggml's 0x7e00 rule, below */
			bad += castfs_gguf_fp16(f) != hw_fp16(f);
	}
	ck_assert_uint_eq(bad, 0);
	ck_assert_uint_eq(castfs_gguf_fp16(castfs_f32_from_bits(0x7fc00001u)),
			  0x7e00);
}
END_TEST

START_TEST(test_gguf__layout_is_sequential_and_padded)
{
	struct castfs_gguf_w *w;
	uint64_t shape[2] = { 3, 64 }, off, nb, data_len;
	uint8_t *hdr;
	size_t len;

	ck_assert_int_eq(castfs_gguf_w_new(&w), 0);
	castfs_gguf_kv_str(w, "general.architecture", "flux");
	ck_assert_int_eq(castfs_gguf_tensor(w, "a", 1, 2, shape,
					    CASTFS_GGML_Q8_0, &off, &nb),
			 0);
	ck_assert_uint_eq(off, 0);
	ck_assert_uint_eq(nb, 3 * 2 * 34);
	shape[1] = 5;
	ck_assert_int_eq(castfs_gguf_tensor(w, "b", 1, 2, shape,
					    CASTFS_GGML_F32, &off, &nb),
			 0);
	ck_assert_uint_eq(off, 224); /* 204 padded to 32 */
	ck_assert_uint_eq(nb, 60);
	/* rows that are not whole blocks, bad names and ranks */
	ck_assert_int_eq(castfs_gguf_tensor(w, "c", 1, 2, shape,
					    CASTFS_GGML_Q4_0, &off, &nb),
			 -EINVAL);
	ck_assert_int_eq(castfs_gguf_tensor(w, "", 0, 2, shape, CASTFS_GGML_F32,
					    &off, &nb),
			 -EINVAL);
	ck_assert_int_eq(castfs_gguf_tensor(w, "x\0y", 3, 2, shape,
					    CASTFS_GGML_F32, &off, &nb),
			 -EINVAL);
	ck_assert_int_eq(castfs_gguf_tensor(w, "d", 1, 5, shape,
					    CASTFS_GGML_F32, &off, &nb),
			 -EINVAL);
	ck_assert_int_eq(castfs_gguf_w_finish(w, &hdr, &len, &data_len), 0);
	ck_assert_uint_eq(len % 32, 0);
	ck_assert_uint_eq(data_len, 224 + 64);
	ck_assert(!memcmp(hdr, "GGUF", 4));
	ck_assert_uint_eq(castfs_load_le32(hdr + 4), 3);
	ck_assert_uint_eq(castfs_load_le64(hdr + 8), 2); /* tensors */
	ck_assert_uint_eq(castfs_load_le64(hdr + 16), 1); /* KVs */
	free(hdr);
	castfs_gguf_w_free(w);
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_gguf__fp16_matches_f16c);
	tcase_add_test(tc, test_gguf__layout_is_sequential_and_padded);
	suite_add_tcase(s, tc);
	return s;
}
