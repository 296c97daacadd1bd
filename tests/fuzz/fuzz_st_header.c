/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the safetensors header parser: any input is a whole file. A header
 * that parses must satisfy the validation rules it claims (sorted, gap-free
 * offsets within the file, names sorted), read through a reader the same
 * way, and survive an emit -> parse round trip unchanged.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "format/st_header.h"

static void check_layout(const struct castfs_header *h, uint64_t file_size)
{
	uint64_t at = 0;

	FUZZ_CHECK(h->data_start == 8 + h->header_len);
	FUZZ_CHECK(h->data_start <= file_size);
	FUZZ_CHECK(h->data_len == file_size - h->data_start);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		uint64_t nbytes;

		FUZZ_CHECK(t->begin == at && t->end >= t->begin);
		FUZZ_CHECK(castfs_tensor_nbytes(t->dtype, t->nelems, &nbytes) ==
			   0);
		FUZZ_CHECK(nbytes == t->end - t->begin);
		FUZZ_CHECK(castfs_header_find(h, t->name, t->name_len) == t);
		at = t->end;
	}
	FUZZ_CHECK(at == h->data_len);
	for (size_t i = 1; i < h->ntensors; i++) {
		const struct castfs_tensor *a = h->by_name[i - 1],
					   *b = h->by_name[i];
		size_t n = a->name_len < b->name_len ? a->name_len :
						       b->name_len;
		int c = memcmp(a->name, b->name, n);

		FUZZ_CHECK(c < 0 || (c == 0 && a->name_len < b->name_len));
	}
}

static bool same_tensor(const struct castfs_tensor *a,
			const struct castfs_tensor *b)
{
	return a->name_len == b->name_len &&
	       memcmp(a->name, b->name, a->name_len) == 0 &&
	       a->dtype == b->dtype && a->ndim == b->ndim &&
	       memcmp(a->shape, b->shape, a->ndim * sizeof(*a->shape)) == 0 &&
	       a->end - a->begin == b->end - b->begin;
}

static void check_same(const struct castfs_header *a,
		       const struct castfs_header *b)
{
	FUZZ_CHECK(a->ntensors == b->ntensors);
	FUZZ_CHECK(a->nmeta == b->nmeta && a->has_metadata == b->has_metadata);
	for (size_t i = 0; i < a->ntensors; i++)
		FUZZ_CHECK(same_tensor(a->by_name[i], b->by_name[i]));
	for (size_t i = 0; i < a->nmeta; i++) {
		const struct castfs_meta_kv *x = &a->meta[i], *y = &b->meta[i];

		FUZZ_CHECK(x->key_len == y->key_len &&
			   x->value_len == y->value_len);
		FUZZ_CHECK(memcmp(x->key, y->key, x->key_len) == 0);
		FUZZ_CHECK(memcmp(x->value, y->value, x->value_len) == 0);
	}
}

/* Emit @h as the official writer would and parse the result again. */
static void check_round_trip(const struct castfs_header *h)
{
	struct castfs_emit_tensor *et = calloc(h->ntensors + 1, sizeof(*et));
	struct castfs_header *h2 = NULL;
	uint8_t *out = NULL;
	size_t out_len = 0;
	int rc;

	FUZZ_CHECK(et);
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		et[i] = (struct castfs_emit_tensor){
			.name = t->name,
			.name_len = t->name_len,
			.dtype = t->dtype,
			.ndim = t->ndim,
			.shape = t->shape,
			.nbytes = t->end - t->begin,
			.cookie = (uint32_t)i,
		};
	}
	rc = castfs_header_emit(et, h->ntensors, h->has_metadata, h->meta,
				h->nmeta, &out, &out_len, NULL);
	/* Only sizes the writer cannot express may fail (none here). */
	FUZZ_CHECK(rc == 0 || rc == -E2BIG || rc == -ENOMEM);
	if (rc == 0) {
		rc = castfs_header_parse(out, out_len, out_len + h->data_len,
					 &h2, NULL);
		FUZZ_CHECK(rc == 0);
		check_same(h, h2);
		castfs_header_free(h2);
	}
	free(out);
	free(et);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_mem_reader mr;
	struct castfs_header *h = NULL, *h2 = NULL;
	int rc, rc2;

	rc = castfs_header_parse(data, size, size, &h, &d);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -E2BIG ||
		   rc == -EOVERFLOW || rc == -ENOMEM);
	/* Every rejection says why. */
	FUZZ_CHECK(rc == 0 || rc == -ENOMEM || d.msg[0] != '\0');
	castfs_mem_reader_init(&mr, data, size);
	rc2 = castfs_header_read(&mr.r, size, &h2, NULL);
	FUZZ_CHECK(rc2 == rc || rc2 == -ENOMEM || rc == -ENOMEM);
	if (h) {
		check_layout(h, size);
		check_round_trip(h);
	}
	if (h && h2)
		check_same(h, h2);
	castfs_header_free(h);
	castfs_header_free(h2);
	return 0;
}
