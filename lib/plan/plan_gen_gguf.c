/* SPDX-License-Identifier: MIT */
/*
 * The generator of GGUF quantised blocks: source elements of whole blocks
 * are read, widened to float32 and quantised by ggml's reference rules
 * (quant/quant_gguf.h, quant/quant_gguf_k.h). A block depends on its own
 * elements only (32, or 256 for the K-quants), so any range is computed
 * alone.
 */
#include <errno.h>

#include "common/compiler.h"
#include "plan/plan_internal.h"
#include "quant/quant_gguf_k.h"

int castfs_gen_gguf_blocks(const struct castfs_read_env *env,
			   const struct castfs_extent *e, uint64_t first,
			   uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	size_t in_sz = castfs_dtype_bits(q->src_dtype) / 8;
	size_t qk = q->blocksize;
	/* float32 values first, the source bytes behind them */
	size_t per_block = qk * (sizeof(float) + in_sz);
	size_t chunk = per_block ? env->s->len / per_block : 0;
	castfs_convert_fn widen =
		castfs_convert_get(q->src_dtype, CASTFS_DTYPE_F32, 0);

	if (!widen || !chunk)
		return -EIO;
	while (count) {
		size_t n = (size_t)CASTFS_MIN(count, chunk);
		size_t nel = n * qk;
		float *x = (float *)(void *)env->s->buf;
		uint8_t *raw = env->s->buf + nel * sizeof(float);
		/* e->src_off is the extent's first element: a tensor with
		 * permuted rows has one extent per row (modeldir_gguf.c) */
		int rc = castfs_reader_read(env->src, raw, nel * in_sz,
					    e->src_off + first * qk * in_sz);

		if (rc)
			return rc;
		widen(x, raw, nel);
		rc = castfs_gguf_quantize(q->qtype, dst, x, n);
		if (rc)
			return rc;
		dst += n * e->unit;
		first += n;
		count -= n;
	}
	return 0;
}
