/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the GGUF header reader (castfs info FILE.gguf): any input is a
 * whole file. A rejection says why; a header that parses satisfies what
 * the reader promises: an aligned data start, aligned tensor offsets,
 * tensors of known types within the file, at most 4 dimensions.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "format/gguf_read.h"

static void check(const struct castfs_gguf_file *f, size_t size)
{
	FUZZ_CHECK(f->version == 2 || f->version == 3);
	FUZZ_CHECK(f->alignment && !(f->alignment & (f->alignment - 1)));
	FUZZ_CHECK(f->data_start % f->alignment == 0);
	for (uint64_t i = 0; i < f->nkv; i++) {
		FUZZ_CHECK(f->kv[i].key);
		FUZZ_CHECK(castfs_gguf_vtype_name(f->kv[i].type));
		FUZZ_CHECK(f->kv[i].type != CASTFS_GGUF_V_STRING ||
			   f->kv[i].str);
	}
	for (uint64_t i = 0; i < f->ntensors; i++) {
		const struct castfs_gguf_ti *t = &f->t[i];

		FUZZ_CHECK(t->name && t->ndim >= 1 && t->ndim <= 4);
		FUZZ_CHECK(t->offset % f->alignment == 0);
		FUZZ_CHECK(f->data_start <= size);
		FUZZ_CHECK(t->offset <= size - f->data_start);
		FUZZ_CHECK(t->nbytes <= size - f->data_start - t->offset);
		FUZZ_CHECK(castfs_gguf_type_name(t->type, NULL, NULL) ||
			   !t->nbytes);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_mem_reader mr;
	struct castfs_gguf_file *f = NULL;
	int rc;

	castfs_mem_reader_init(&mr, data, size);
	rc = castfs_gguf_read(&mr.r, size, &f, &d);
	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc == -EINVAL)
		FUZZ_CHECK(d.msg[0] != '\0');
	if (!rc)
		check(f, size);
	castfs_gguf_file_free(f);
	return 0;
}
