/* SPDX-License-Identifier: MIT */
/*
 * Quantized sources: which tensors of a checkpoint form a quantized layout
 * (a weight and its scale companions), whether castfs dequantizes that
 * layout exactly, and if not, why the checkpoint gets no views at all.
 */
#ifndef CASTFS_QSRC_H
#define CASTFS_QSRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "format/st_header.h"

/* What a tensor is in a quantized layout. */
enum castfs_qrole {
	CASTFS_QR_PLAIN, /* an ordinary tensor: views treat it as always */
	CASTFS_QR_FP8_BLOCK, /* F8_E4M3 (or LLM.int8 I8) weight dequantized
			      * with its scale */
	CASTFS_QR_SCALE, /* the scale of an FP8_BLOCK weight: not emitted */
	CASTFS_QR_MXFP4, /* gpt-oss "*_blocks" U8 weight with its "*_scales" */
	CASTFS_QR_BNB4, /* bitsandbytes 4-bit U8 weight: its scale is an
			 * index into castfs_qsrc.q4 (qsrc_bnb4.c) */
	CASTFS_QR_CTW4, /* compressed-tensors pack-quantized int4 I32
			 * "M.weight_packed": scale, 1 x bcols groups */
};

/* How an FP8_BLOCK weight is multiplied by its scale. */
enum castfs_qrule {
	CASTFS_QRULE_F32, /* fp32 product (DeepSeek, transformers) */
	CASTFS_QRULE_COMPUTE, /* the scale rounded to the compute dtype
			       * first (ComfyUI scaled fp8) */
	CASTFS_QRULE_INT8, /* an I8 weight with its SCB row scales
			    * (bitsandbytes LLM.int8) */
	CASTFS_QRULE_NVFP4, /* compressed-tensors nvfp4-pack-quantized: a
			     * U8 "M.weight_packed" of E2M1 pairs, an
			     * F8_E4M3 scale per 16, an F32 global divisor */
	CASTFS_QRULE_MXFP4, /* compressed-tensors mxfp4-pack-quantized: a
			     * U8 "M.weight_packed", a U8 exponent per 32 */
	CASTFS_QRULE_WIDE, /* FP8 block with a BF16/F16 scale: widened to
			    * fp32, the fp32 product (transformers) */
};

/* The block edge of the FP8 block layout (DeepSeek-V3, Qwen3-FP8). */
#define CASTFS_FP8_BLOCK 128u

/* One tensor of the scanned header (same index as h->tensors). */
struct castfs_qinfo {
	uint8_t role; /* enum castfs_qrole */
	uint8_t rule; /* FP8_BLOCK: enum castfs_qrule */
	uint32_t scale; /* FP8_BLOCK, MXFP4: index of its scale in h->tensors */
	uint32_t brows, bcols; /* FP8_BLOCK: elements per scale (block) */
	uint32_t gscale; /* NVFP4: index of its weight_global_scale */
	/* CTW4: 1 + index of its packed weight_zero_point (asymmetric);
	 * 0: symmetric */
	uint32_t zp;
};

/*
 * What the checkpoint's directory says about its layout: the FP8
 * weight_block_size [brows, bcols] of config.json's quantization_config;
 * 0, 0 when it gives none (then 128x128, DeepSeek's and transformers'
 * default). Per-tensor scales are accepted either way.
 */
/*
 * Quantized layouts, as a model folder's config.json declares them
 * (castfs_qsrc_opts.declared): every quantized weight of its files must
 * be of one it declares, else the file is refused (tensors guessed into
 * another layout than the loader's would be dequantized by the wrong
 * rule). 0: a file alone, nothing declared, not checked.
 */
#define CASTFS_QK_FP8_BLOCK 1u /* F8 + "_scale_inv" / ".scale" (DeepSeek) */
#define CASTFS_QK_CT_FP8 2u /* F8 + "weight_scale" (compressed-tensors) */
#define CASTFS_QK_COMFY 4u /* ComfyUI scaled fp8 */
#define CASTFS_QK_INT8 8u /* bitsandbytes LLM.int8 */
#define CASTFS_QK_NVFP4 16u /* compressed-tensors nvfp4-pack-quantized */
#define CASTFS_QK_CT_MXFP4 32u /* compressed-tensors mxfp4-pack-quantized */
#define CASTFS_QK_MXFP4 64u /* gpt-oss "_blocks" / "_scales" */
#define CASTFS_QK_BNB4 128u /* bitsandbytes 4-bit */
#define CASTFS_QK_CT_W4 256u /* compressed-tensors pack-quantized int4 */

/* compressed-tensors FP8 weight strategies a config declares
 * (castfs_qsrc_opts.ct_strategies; 0: not checked). */
#define CASTFS_QSTRAT_TENSOR 1u
#define CASTFS_QSTRAT_CHANNEL 2u
#define CASTFS_QSTRAT_BLOCK 4u

struct castfs_qsrc_opts {
	unsigned flags; /* CASTFS_QSRC_* */
	uint32_t brows, bcols;
	unsigned declared; /* CASTFS_QK_* */
	unsigned ct_strategies; /* CASTFS_QSTRAT_* */
};

/* The most dimensions of a bitsandbytes 4-bit weight's true shape. */
#define CASTFS_Q4SRC_NDIM 4u

/*
 * A bitsandbytes 4-bit weight as its quant_state JSON (side data) and its
 * companions describe it: tensor indices are into h->tensors.
 */
struct castfs_q4src {
	uint8_t qtype; /* CASTFS_Q_NF4 or CASTFS_Q_FP4 */
	uint8_t dtype; /* quant_state "dtype": BF16, F16 or F32 */
	bool nested; /* double quantisation */
	uint32_t ndim;
	uint64_t shape[CASTFS_Q4SRC_NDIM]; /* quant_state "shape" */
	uint64_t nelems;
	uint32_t blocksize, nested_blocksize;
	uint32_t absmax, nested_absmax, nested_quant_map;
	float offset; /* nested_offset as bitsandbytes' fp32 tensor */
};

struct castfs_qsrc {
	size_t n; /* h->ntensors */
	struct castfs_qinfo *t;
	size_t nfp8; /* FP8_BLOCK weights */
	size_t nmxfp4; /* MXFP4 weights */
	size_t ncomfy; /* of which ComfyUI scaled fp8 (CASTFS_QRULE_COMPUTE) */
	size_t nint8; /* of which LLM.int8 (CASTFS_QRULE_INT8) */
	size_t nct4; /* of which compressed-tensors NVFP4 / MXFP4 */
	size_t nbnb4; /* bitsandbytes 4-bit weights: q4[nbnb4] */
	struct castfs_q4src *q4;
	size_t nctw4; /* compressed-tensors pack-quantized int4 weights */
	uint32_t brows, bcols; /* the block size scales were paired with */
	size_t nxshard; /* XSHARD: FP8 tensors whose partner is elsewhere */
	unsigned flags; /* the CASTFS_QSRC_* flags of the scan */
	unsigned ct_strategies; /* castfs_qsrc_opts.ct_strategies */
};

/* Elements per MXFP4 block (one E8M0 scale each, 16 bytes of codes). */
#define CASTFS_MX_BLOCK 32u

/*
 * Scan flags. STRICT: the model directory's config.json declares the
 * FP8 block layout, so an F8 tensor without a scale beside it is a weight
 * whose scale lives elsewhere, not a plain fp8 tensor.
 */
#define CASTFS_QSRC_STRICT 1u
/*
 * XSHARD (for a shard of a sharded FP8 block, compressed-tensors FP4 or
 * int4 folder): an F8 weight without its scale, a "*_scale_inv" /
 * "*.scale" without its weight, and a compressed-tensors packed weight
 * without a companion (or a companion without its weight) are counted in
 * nxshard instead of refused: their partner may be in another shard
 * (view/qsrc_xshard.h). No view of such a header alone
 * may be served: it must be rescanned as its composite header.
 */
#define CASTFS_QSRC_XSHARD 2u
/*
 * W4SYM / W4ASYM: the directory's config.json declares compressed-tensors
 * pack-quantized int4 weights symmetric / asymmetric (symmetric: false),
 * so every int4 weight must have no weight_zero_point / one: the
 * decompressor reads the zero point by the config, not by the file.
 */
#define CASTFS_QSRC_W4SYM 4u
#define CASTFS_QSRC_W4ASYM 8u
/*
 * Q4XS (with XSHARD, for a shard of a sharded bitsandbytes load_in_4bit
 * folder): a "*.quant_state.bitsandbytes__*" without its weight, a
 * 4-bit weight whose absmax / quant_map / nested_* are not all here, a
 * companion without its weight, and a U8 [n, 1] "*.weight" without a
 * quant_state here (the packed shape bitsandbytes saves) are held and
 * counted in nxshard instead of refused or served as stored: their
 * partner may be in another shard (view/qsrc_xshard.h).
 */
#define CASTFS_QSRC_Q4XS 16u
/*
 * MX: the model directory's config.json says quant_method "mxfp4"
 * (gpt-oss): a gpt-oss expert "_blocks" or "_scales" without its partner
 * in the same file is refused (castfs_qsrc_mx_orphans()), where a file
 * alone keeps it as stored.
 */
#define CASTFS_QSRC_MX 32u

/*
 * castfs_qsrc_scan - classify every tensor of @h (docs/FORMATS.md,
 * "Quantized sources"). On success @out holds one castfs_qinfo per tensor
 * (castfs_qsrc_fini() releases it). Returns 0; -ENOTSUP when @h holds
 * tensors of a quantized layout castfs does not dequantize exactly (@d
 * names the tensor and the layout: the checkpoint must get no views);
 * -ENOMEM. Pure function of @h and @flags; thread-safe.
 */
int castfs_qsrc_scan(const struct castfs_header *h, unsigned flags,
		     struct castfs_qsrc *out, struct castfs_diag *d);

/*
 * castfs_qsrc_scan_opts - castfs_qsrc_scan() with the flags and FP8 block
 * size of @o (NULL: none, 128x128). Same results, errors and thread-safety.
 */
int castfs_qsrc_scan_opts(const struct castfs_header *h,
			  const struct castfs_qsrc_opts *o,
			  struct castfs_qsrc *out, struct castfs_diag *d);

/*
 * castfs_qsrc_weight - the weight tensor FP8_BLOCK tensor @t (@qi its
 * castfs_qinfo) stands for: @t itself, or for a packed FP4 weight
 * (CASTFS_QRULE_NVFP4 / MXFP4) @tmp filled as the dequantized weight:
 * "M.weight" (a prefix of @t's name), shape @tmp_shape = [rows, 2 x
 * packed cols], BF16 (the dtype compressed-tensors decompresses to), @t's
 * data offsets. The result borrows @t's name and @tmp_shape. Pure;
 * thread-safe.
 */
const struct castfs_tensor *castfs_qsrc_weight(const struct castfs_tensor *t,
					       const struct castfs_qinfo *qi,
					       struct castfs_tensor *tmp,
					       uint64_t tmp_shape[2]);

/* castfs_qsrc_fini - release what castfs_qsrc_scan() made; safe on a
 * zeroed struct. */
void castfs_qsrc_fini(struct castfs_qsrc *q);

#endif
