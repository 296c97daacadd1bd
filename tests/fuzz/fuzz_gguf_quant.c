/* SPDX-License-Identifier: MIT */
/*
 * Differential fuzzing of the GGUF Q8_0 / Q4_0 quantisers: every ISA this
 * CPU runs (and the table castfs_gguf_kernels_get() selects) must write
 * exactly the scalar reference's bytes, for float32 and BF16 / F16 input,
 * at any block count and alignment. Input: [mode] then elements; mode bit
 * 0 Q4_0 (else Q8_0), bits 1-2 F32 / BF16 / F16 (3: F32), bits 3-5 the
 * source's byte offset, bits 6-7 the output's. The reference's bytes are
 * checked against ggml's own quantizers in tests/compat/test_gguf*.py.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "quant/quant_gguf.h"

struct job {
	bool q4, wide; /* wide: float32 elements */
	bool f16;
	size_t nb, out_sz; /* blocks, output bytes per block */
	unsigned so, dof;
};

/* Quantise with @k into an exact-size buffer at the job's offsets (so
 * that ASan sees any overrun); the result is malloc'ed. */
static uint8_t *run(const struct castfs_gguf_kernels *k, const struct job *j,
		    const uint8_t *src, size_t in_len)
{
	uint8_t *s = malloc(in_len + j->so + 1);
	uint8_t *d = malloc(j->nb * j->out_sz + j->dof + 1);
	uint8_t *out = malloc(j->nb * j->out_sz + 1), *dst = d + j->dof;
	float *f = malloc(in_len + 1);

	FUZZ_CHECK(s && d && out && f);
	memcpy(s + j->so, src, in_len);
	memcpy(f, src, in_len); /* float32 input needs float alignment */

	if (j->wide)
		(j->q4 ? k->q4_0 : k->q8_0)(dst, f, j->nb);
	else
		(j->q4 ? k->q4_0_16 : k->q8_0_16)(dst, s + j->so, j->nb,
						  j->f16);
	memcpy(out, dst, j->nb * j->out_sz);
	free(f);
	free(s);
	free(d);
	return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct job j;
	size_t esz, in_len;
	uint8_t *want, *got;
	unsigned src;

	if (size < 1)
		return 0;
	src = (data[0] >> 1) & 3u;
	j.q4 = data[0] & 1u;
	j.wide = src == 0 || src == 3;
	j.f16 = src == 2;
	j.so = (data[0] >> 3) & 7u;
	j.dof = (data[0] >> 6) & 3u;
	j.out_sz = j.q4 ? CASTFS_GGUF_Q4_0_BYTES : CASTFS_GGUF_Q8_0_BYTES;
	esz = j.wide ? 4 : 2;
	j.nb = (size - 1) / (esz * CASTFS_GGUF_QK);
	in_len = j.nb * esz * CASTFS_GGUF_QK;
	want = run(&castfs_gguf_scalar, &j, data + 1, in_len);
	for (int isa = 0; isa <= CASTFS_ISA_COUNT; isa++) {
		const struct castfs_gguf_kernels *k =
			isa == CASTFS_ISA_COUNT ?
				castfs_gguf_kernels_get() :
				castfs_gguf_kernels_isa((enum castfs_isa)isa);

		FUZZ_CHECK(isa == CASTFS_ISA_COUNT ||
			   !k == !castfs_isa_available((enum castfs_isa)isa));
		if (!k)
			continue;
		got = run(k, &j, data + 1, in_len);
		FUZZ_CHECK(memcmp(got, want, j.nb * j.out_sz) == 0);
		free(got);
	}
	free(want);
	return 0;
}
