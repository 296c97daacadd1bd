/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the seekable-zstd reader: any input is a whole packed file. A table
 * that validates must tile the file; reads must never crash, and whatever
 * decodes must agree with libzstd's own decode of the same bytes and with
 * reads of other ranges of it.
 */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "fuzz.h"
#include "source/zst.h"

/* Decoded sizes compared whole against libzstd (bounds the memory). */
#define FUZZ_ZST_MAX_OUT (4u << 20)

static void check_ranges(const struct castfs_zst_reader *zr,
			 const uint8_t *whole, uint64_t total,
			 const uint8_t *data, size_t size)
{
	uint8_t buf[4096];

	/* Offsets and lengths drawn from the input: deterministic. */
	for (size_t k = 0; k + 8 <= size && k < 64 * 8; k += 8) {
		uint64_t off = (data[k] | (uint64_t)data[k + 1] << 8 |
				(uint64_t)data[k + 2] << 16) %
			       (total + 1);
		size_t len =
			(size_t)(data[k + 3] | data[k + 4] << 8) % sizeof(buf);

		if (len > total - off)
			len = (size_t)(total - off);
		if (castfs_reader_read(&zr->r, buf, len, off) == 0 && whole)
			FUZZ_CHECK(memcmp(buf, whole + off, len) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zst_index *ix;
	struct castfs_zcache *c;
	uint8_t *whole = NULL, *ref;
	uint64_t total;

	if (castfs_zcache_new(64 << 10, &c))
		return 0;
	castfs_mem_reader_init(&mr, data, size);
	if (castfs_zst_index_read(&mr.r, size, c, &ix, NULL)) {
		castfs_zcache_free(c);
		return 0;
	}
	total = castfs_zst_index_size(ix);
	castfs_zst_reader_init(&zr, ix, &mr.r);
	if (total <= FUZZ_ZST_MAX_OUT) {
		whole = malloc(total + 1);
		ref = malloc(total + 1);
		FUZZ_CHECK(whole && ref);
		if (castfs_reader_read(&zr.r, whole, (size_t)total, 0) == 0) {
			/* Every frame decoded to the table's size: libzstd
			 * decodes the file to the same bytes (the stored
			 * ones: a grouped pack's are its byte planes). */
			FUZZ_CHECK(ZSTD_decompress(ref, total + 1, data,
						   size) == total);
			FUZZ_CHECK(castfs_zst_index_grouped(ix) ||
				   memcmp(ref, whole, (size_t)total) == 0);
		} else {
			free(whole);
			whole = NULL;
		}
		free(ref);
	}
	check_ranges(&zr, whole, total, data, size);
	free(whole);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return 0;
}
