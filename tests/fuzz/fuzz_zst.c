/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the seekable-zstd reader: any input is a whole packed file. A table
 * that validates must tile the file; reads must never crash, and whatever
 * decodes must agree with libzstd's own decode of the same bytes and with
 * reads of other ranges of it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "fuzz.h"
#include "source/zst.h"
#include "source/zst_internal.h"

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

/* A visit's pieces put back together, planes by the bf16 bit layout. */
struct sink {
	uint8_t *out;
	size_t at, cap;
};

static int collect(void *arg, const struct castfs_piece *p)
{
	struct sink *s = arg;

	FUZZ_CHECK(p->n % 2 == 0 && p->n <= s->cap - s->at);
	for (size_t k = 0; k < p->n / 2; k++) {
		uint8_t lo = p->sm ? p->sm[k] : p->bytes[2 * k];
		uint8_t hi = p->sm ? p->ex[k] : p->bytes[2 * k + 1];

		if (p->sm) {
			uint16_t v =
				(uint16_t)(((lo & 0x80u) << 8) |
					   ((unsigned)hi << 7) | (lo & 0x7Fu));

			lo = (uint8_t)v;
			hi = (uint8_t)(v >> 8);
		}
		s->out[s->at + 2 * k] = lo;
		s->out[s->at + 2 * k + 1] = hi;
	}
	s->at += p->n;
	return 0;
}

/*
 * The visit op of a grouped pack agrees with pread: where the whole file
 * read, a visit of an even range is declined or gives the same bytes.
 */
static void check_visit(const struct castfs_zst_reader *zr,
			const uint8_t *whole, uint64_t total,
			const uint8_t *data, size_t size)
{
	uint8_t buf[8192];

	if (!zr->r.visit)
		return;
	/* Whole frames not cached are handed over as planes; from offset 0
	 * or 1, whichever parity the frame boundaries have. */
	for (uint64_t at = 0; whole && at < 2 && at < total; at++) {
		struct sink s = { malloc(total + 1), 0, total + 1 };
		int rc;

		FUZZ_CHECK(s.out);
		rc = zr->r.visit(zr->r.ctx, at, (total - at) & ~(uint64_t)1,
				 2 | CASTFS_VISIT_BF16, collect, &s);
		FUZZ_CHECK(rc == -ENOTSUP ||
			   (rc == 0 && memcmp(s.out, whole + at, s.at) == 0));
		free(s.out);
	}
	for (size_t k = 0; k + 8 <= size && k < 16 * 8; k += 8) {
		uint64_t off = (data[k + 5] | (uint64_t)data[k + 6] << 8 |
				(uint64_t)data[k + 7] << 16) %
			       (total + 1);
		size_t len = (size_t)(data[k] | data[k + 3] << 8) % sizeof(buf);
		/* bf16 planes, 2-byte or 4-byte elements as bytes */
		unsigned how = data[k + 1] % 3 == 0 ? 2 | CASTFS_VISIT_BF16 :
			       data[k + 1] % 3 == 1 ? 2 :
						      4;
		struct sink s = { buf, 0, sizeof(buf) };
		int rc;

		if (len > total - off)
			len = (size_t)(total - off);
		len &= ~(size_t)((how & CASTFS_VISIT_SIZE) - 1);
		rc = zr->r.visit(zr->r.ctx, off, len, how, collect, &s);
		if (rc == -ENOTSUP)
			FUZZ_CHECK(s.at == 0);
		if (whole && rc != -ENOTSUP)
			FUZZ_CHECK(rc == 0 && s.at == len &&
				   memcmp(buf, whole + off, s.at) == 0);
	}
}

/*
 * Where the whole file read, libzstd decodes every frame castfs decoded to
 * the table's size and, in a standard pack, to the same bytes (a grouped
 * pack's frames hold planes). Tiered frames are castfs's own (skippable to
 * libzstd), and frames of no bytes are never decoded: a file whose empty
 * frames libzstd would reject still serves the right bytes.
 */
static void check_frames_with_libzstd(const struct castfs_zst_index *ix,
				      const uint8_t *whole, const uint8_t *data)
{
	for (size_t i = 0; i < ix->nframes; i++) {
		uint64_t dsize = ix->doff[i + 1] - ix->doff[i];
		uint8_t *ref;

		if (!dsize || (ix->xform && zst_xform_tiered(ix->xform[i])))
			continue;
		ref = malloc((size_t)dsize + 1);
		FUZZ_CHECK(ref);
		FUZZ_CHECK(ZSTD_decompress(
				   ref, (size_t)dsize + 1, data + ix->coff[i],
				   (size_t)(ix->coff[i + 1] - ix->coff[i])) ==
			   dsize);
		FUZZ_CHECK(ix->xform || memcmp(ref, whole + ix->doff[i],
					       (size_t)dsize) == 0);
		free(ref);
	}
}

/*
 * castfs pack's read-back (castfs_zst_verify) of a pack that reads whole:
 * it equals what it decodes to; the same bytes with one changed differ
 * at that byte, or one byte short are another size.
 */
static void check_verify(const uint8_t *data, size_t size, uint8_t *whole,
			 uint64_t total)
{
	struct castfs_mem_reader pr, orr;
	struct castfs_diag d = { { 0 } };
	char want[64];
	uint64_t at;

	castfs_mem_reader_init(&pr, data, size);
	castfs_mem_reader_init(&orr, whole, (size_t)total);
	FUZZ_CHECK(castfs_zst_verify(&pr.r, size, &orr.r, total, NULL, &d) ==
		   0);
	if (!total)
		return;
	at = (data[size / 2] | (uint64_t)data[size / 3] << 8) % total;
	whole[at] ^= 0x40;
	FUZZ_CHECK(castfs_zst_verify(&pr.r, size, &orr.r, total, NULL, &d) ==
		   -EBADMSG);
	snprintf(want, sizeof(want), "from byte %llu", (unsigned long long)at);
	FUZZ_CHECK(strstr(d.msg, want) != NULL);
	whole[at] ^= 0x40;
	castfs_mem_reader_init(&orr, whole, (size_t)total - 1);
	FUZZ_CHECK(castfs_zst_verify(&pr.r, size, &orr.r, total - 1, NULL,
				     NULL) == -EBADMSG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct castfs_mem_reader mr;
	struct castfs_zst_reader zr;
	struct castfs_zst_index *ix;
	struct castfs_zcache *c;
	uint8_t *whole = NULL;
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
		FUZZ_CHECK(whole);
		if (castfs_reader_read(&zr.r, whole, (size_t)total, 0) == 0) {
			check_frames_with_libzstd(ix, whole, data);
			check_verify(data, size, whole, total);
		} else {
			free(whole);
			whole = NULL;
		}
	}
	/* Visits first: frames cut by check_ranges() end up cached. */
	check_visit(&zr, whole, total, data, size);
	check_ranges(&zr, whole, total, data, size);
	free(whole);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	return 0;
}
