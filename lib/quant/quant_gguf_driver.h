/* SPDX-License-Identifier: MIT */
/*
 * The Q8_0 / Q4_0 drivers, written once for every ISA: included at the end
 * of each quant_gguf_<isa>.c after it defines GQD_ISA (its target
 * attribute), GQD_GROUP (blocks whose scales are computed together),
 * GQD_Q8_N / GQD_Q4_N (those GQD_GROUP blocks without NaN at once),
 * GQD_FN(name) (the ISA's suffix) and GQD_KERNELS (the table's name), and
 * the ISA's struct blk, enum src, load_any(), has_nan(), spill(),
 * q8_0_vec() and q4_0_vec(). Only the lanes differ between ISAs; the
 * order of blocks and the NaN rule (see quant_gguf_avx2.c) are these.
 */
enum gq { GQ_Q8_0, GQ_Q4_0 };

/* One block: @vec where it holds no NaN, else the scalar code @scalar on
 * the widened values. */
static inline GQD_ISA void block_one(uint8_t *dst, const struct blk *b,
				     void (*vec)(uint8_t *, const struct blk *),
				     void (*scalar)(uint8_t *, const float *,
						    size_t))
{
	float f[CASTFS_GGUF_QK];

	if (!has_nan(b)) {
		vec(dst, b);
		return;
	}
	spill(f, b);
	scalar(dst, f, 1);
}

/* @nblocks blocks of type @t: GQD_GROUP at a time where none holds a NaN.
 * @t and @src are constants in every caller, so each use compiles to its
 * own loop without a branch on them. */
static inline GQD_ISA void blocks_run(uint8_t *dst, const void *x,
				      size_t nblocks, enum src src, enum gq t)
{
	const size_t bytes = t == GQ_Q8_0 ? CASTFS_GGUF_Q8_0_BYTES :
					    CASTFS_GGUF_Q4_0_BYTES;
	void (*xn)(uint8_t *, const struct blk *) = t == GQ_Q8_0 ? GQD_Q8_N :
								   GQD_Q4_N;
	void (*vec)(uint8_t *, const struct blk *) = t == GQ_Q8_0 ? q8_0_vec :
								    q4_0_vec;
	void (*scalar)(uint8_t *, const float *, size_t) =
		t == GQ_Q8_0 ? castfs_gguf_q8_0 : castfs_gguf_q4_0;
	struct blk b[GQD_GROUP];
	size_t i = 0;

	for (; i + GQD_GROUP <= nblocks; i += GQD_GROUP) {
		bool nan = false;

		for (size_t k = 0; k < GQD_GROUP; k++) {
			load_any(&b[k], x, i + k, src);
			nan |= has_nan(&b[k]);
		}
		if (!nan) {
			xn(dst + i * bytes, b);
			continue;
		}
		for (size_t k = 0; k < GQD_GROUP; k++)
			block_one(dst + (i + k) * bytes, &b[k], vec, scalar);
	}
	for (; i < nblocks; i++) {
		load_any(&b[0], x, i, src);
		block_one(dst + i * bytes, &b[0], vec, scalar);
	}
}

static GQD_ISA void GQD_FN(q8_0)(uint8_t *restrict dst, const float *restrict x,
				 size_t nblocks)
{
	blocks_run(dst, x, nblocks, SRC_F32, GQ_Q8_0);
}

static GQD_ISA void GQD_FN(q4_0)(uint8_t *restrict dst, const float *restrict x,
				 size_t nblocks)
{
	blocks_run(dst, x, nblocks, SRC_F32, GQ_Q4_0);
}

static GQD_ISA void GQD_FN(q8_0_16)(uint8_t *restrict dst,
				    const void *restrict x, size_t nblocks,
				    bool f16)
{
	if (f16)
		blocks_run(dst, x, nblocks, SRC_F16, GQ_Q8_0);
	else
		blocks_run(dst, x, nblocks, SRC_BF16, GQ_Q8_0);
}

static GQD_ISA void GQD_FN(q4_0_16)(uint8_t *restrict dst,
				    const void *restrict x, size_t nblocks,
				    bool f16)
{
	if (f16)
		blocks_run(dst, x, nblocks, SRC_F16, GQ_Q4_0);
	else
		blocks_run(dst, x, nblocks, SRC_BF16, GQ_Q4_0);
}

const struct castfs_gguf_kernels GQD_KERNELS = {
	.q8_0 = GQD_FN(q8_0),
	.q4_0 = GQD_FN(q4_0),
	.q8_0_16 = GQD_FN(q8_0_16),
	.q4_0_16 = GQD_FN(q4_0_16),
};
