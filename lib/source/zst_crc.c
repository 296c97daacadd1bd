/* SPDX-License-Identifier: MIT */
/*
 * CRC32C (Castagnoli, reflected 0x82F63B78, initial and final value all
 * ones) of tiered frames (FORMATS.md): about three times cheaper than
 * XXH64 with SSE4.2's crc32 instruction, and an error-detecting code is
 * all a frame check needs. The byte-table reference, the variant choice
 * and the shift operators that join the SSE4.2 variant's three streams.
 */
#include <pthread.h>

#include "common/isa.h"
#include "source/zst_internal.h"

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[256];
/* zst_crc_shift tables: one per stream offset (ZST_CRC_STREAM, twice). */
static uint32_t shift_table[2][4][256];
static struct zst_crc_folds crc_folds;
static enum zst_crc_isa crc_isa = ZST_CRC_SCALAR;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* @a times @b modulo the polynomial, both reflected (x^0 in bit 31). */
static uint32_t mult_mod_p(uint32_t a, uint32_t b)
{
	uint32_t p = 0;

	for (uint32_t m = 1u << 31; m; m >>= 1) {
		if (a & m)
			p ^= b;
		b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return p;
}

/* x^@n modulo the polynomial. */
static uint32_t x_pow(size_t n)
{
	uint32_t r = 1u << 31, x = 1u << 30; /* 1 and x */

	for (; n; n >>= 1) {
		if (n & 1)
			r = mult_mod_p(r, x);
		x = mult_mod_p(x, x);
	}
	return r;
}

/* x^(8 @n) modulo the polynomial: the operator of @n zero bytes. */
static uint32_t x_pow_bytes(size_t n)
{
	return x_pow(8 * n);
}

/*
 * The pair folding a 128-bit lane @d bits forward (none when 0): its low
 * word is the earlier, x^(@d+64) away, its high word x^@d; one less each
 * because a carry-less product of two reflected words is one degree low.
 */
static void fold_pair(uint64_t *k, size_t d)
{
	k[0] = d ? (uint64_t)x_pow(d + 63) << 32 : 0;
	k[1] = d ? (uint64_t)x_pow(d - 1) << 32 : 0;
}

static void folds_init(struct zst_crc_folds *f)
{
	for (unsigned l = 0; l < 4; l++) {
		fold_pair(f->by2048 + 2 * l, 2048);
		fold_pair(f->by512 + 2 * l, 512);
		fold_pair(f->lanes + 2 * l, 128 * (3 - l));
	}
}

static void crc_init(void)
{
	for (uint32_t b = 0; b < 256; b++) {
		uint32_t c = b;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		crc_table[b] = c;
	}
	/* The shift is linear: the sum of the shifts of each byte. */
	for (unsigned s = 0; s < 2; s++) {
		uint32_t op = x_pow_bytes((size_t)ZST_CRC_STREAM * (s + 1));

		for (unsigned j = 0; j < 4; j++)
			for (uint32_t b = 0; b < 256; b++)
				shift_table[s][j][b] =
					mult_mod_p(op, b << (8 * j));
	}
	folds_init(&crc_folds);
	/* SSE4.2 is below AVX2: only CASTFS_ISA=scalar forbids it. */
	if (castfs_isa_allows(CASTFS_ISA_AVX512) &&
	    zst_crc_isa_runs(ZST_CRC_AVX512))
		crc_isa = ZST_CRC_AVX512;
	else if (castfs_isa_allows(CASTFS_ISA_AVX2) &&
		 zst_crc_isa_runs(ZST_CRC_SSE42))
		crc_isa = ZST_CRC_SSE42;
}

uint32_t zst_crc_shift(uint32_t crc, unsigned streams)
{
	const uint32_t(*t)[256] = shift_table[streams - 1];

	return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^
	       t[2][(crc >> 16) & 0xFF] ^ t[3][crc >> 24];
}

static uint32_t crc32c_scalar(uint32_t crc, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
	return crc;
}

bool zst_crc_isa_runs(enum zst_crc_isa isa)
{
	if (isa == ZST_CRC_SCALAR)
		return true;
#if ZST_HAVE_X86
	if (isa == ZST_CRC_AVX512)
		return __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("vpclmulqdq") &&
		       __builtin_cpu_supports("sse4.2");
	return isa == ZST_CRC_SSE42 && __builtin_cpu_supports("sse4.2");
#else
	return false;
#endif
}

/* The CRC by variant @isa; the tables are made (crc_init) by then. */
static uint32_t crc32c_run(const void *buf, size_t n, enum zst_crc_isa isa)
{
#if ZST_HAVE_X86
	if (isa == ZST_CRC_AVX512 && n >= 256) {
		uint32_t c = zst_crc32c_avx512(~0u, buf, n, &crc_folds);
		size_t done = n & ~(size_t)255;

		return ~zst_crc32c_sse42(c, (const uint8_t *)buf + done,
					 n - done);
	}
	if (isa == ZST_CRC_SSE42 || isa == ZST_CRC_AVX512)
		return ~zst_crc32c_sse42(~0u, buf, n);
#endif
	(void)isa;
	return ~crc32c_scalar(~0u, buf, n);
}

uint32_t zst_crc32c_isa(const void *buf, size_t n, enum zst_crc_isa isa)
{
	pthread_once(&crc_once, crc_init);
	return crc32c_run(buf, n, isa);
}

uint32_t zst_crc32c(const void *buf, size_t n)
{
	pthread_once(&crc_once, crc_init);
	return crc32c_run(buf, n, crc_isa);
}
