/* SPDX-License-Identifier: MIT */
/* Quantized sources: the layout scanners qsrc.c calls (view/ only). */
#ifndef CASTFS_QSRC_INTERNAL_H
#define CASTFS_QSRC_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "view/qsrc.h"

/*
 * castfs_qsrc_json_loads - @js (@len bytes, a tensor's data) parsed as
 * Python's bytes.decode() then json.loads() read it: well-formed UTF-8,
 * one value, only JSON whitespace around it; NULL where Python raises (or
 * without memory). Free with cJSON_Delete(). Thread-safe.
 */
cJSON *castfs_qsrc_json_loads(const uint8_t *js, size_t len);

/*
 * castfs_qsrc_sibling - the tensor of @h named like @t less its last
 * @strip bytes, plus @add ("M.weight_scale" -> "M.weight"), or NULL. On
 * -ENOMEM NULL and *@err set (when @err is not NULL). Thread-safe.
 */
const struct castfs_tensor *castfs_qsrc_sibling(const struct castfs_header *h,
						const struct castfs_tensor *t,
						size_t strip, const char *add,
						int *err);

/* castfs_qsrc_leaf - whether the last dotted component of @t's name is
 * @leaf (or the name is @leaf); *@mod: the bytes before it. */
bool castfs_qsrc_leaf(const struct castfs_tensor *t, const char *leaf,
		      size_t *mod);

/*
 * castfs_qsrc_comfy - pair the ComfyUI scaled fp8 weights of @h in @q
 * (@q->t zeroed, one per tensor): the legacy form (a "scaled_fp8" marker,
 * "M.scale_weight" per layer, "M.scale_input" dropped) and the
 * "comfy_quant" form ("M.weight_scale", "M.input_scale", "M.comfy_quant"
 * dropped). Tensors of other layouts are left PLAIN. Returns 0, -ENOTSUP
 * (a ComfyUI layer castfs does not dequantize: @d says which) or -ENOMEM.
 * Thread-safe.
 */
int castfs_qsrc_comfy(const struct castfs_header *h, struct castfs_qsrc *q,
		      struct castfs_diag *d);

/*
 * castfs_qsrc_int8 - pair the bitsandbytes LLM.int8 weights of @h in @q:
 * an I8 "M.weight" [rows, cols] with its F32 "M.SCB" [rows]
 * ("M.weight_format" dropped). Returns 0, -ENOTSUP (an SCB that does not
 * fit: @d says which) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_int8(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d);

/*
 * castfs_qsrc_ct4 - pair the compressed-tensors FP4 weights of @h in @q:
 * every U8 "M.weight_packed" [rows, cols / 2] with its "M.weight_scale"
 * (F8_E4M3 [rows, cols / 16] and F32 "M.weight_global_scale" [1]:
 * NVFP4; U8 [rows, cols / 32] and no global scale: MXFP4); an F32
 * "M.input_global_scale" [1] (an activation's) is dropped. With
 * @q->flags' XSHARD, a weight whose scale (or NVFP4 global scale) is
 * missing is counted in @q->nxshard (view/qsrc_xshard.h). Returns 0,
 * -ENOTSUP (a packed weight castfs does not dequantize exactly: @d says
 * which and why) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_ct4(const struct castfs_header *h, struct castfs_qsrc *q,
		    struct castfs_diag *d);

/*
 * castfs_qsrc_mx_orphans - under CASTFS_QSRC_MX, refuse a gpt-oss
 * MXFP4 expert tensor ("*.experts.{gate_up,down}_proj_{blocks,scales}",
 * U8) left unpaired by castfs_qsrc_mxfp4(): its partner is in another
 * shard, and served as stored it would load as no weight at all.
 * Returns 0 or -ENOTSUP with the reason in @d.
 */
int castfs_qsrc_mx_orphans(const struct castfs_header *h,
			   const struct castfs_qsrc *q, struct castfs_diag *d);

/*
 * castfs_qsrc_ct4_orphans - refuse a "weight_global_scale" or
 * "input_global_scale" of @h, and with @strict (a directory whose
 * config.json declares a quantized layout: CASTFS_QSRC_STRICT) a
 * "weight_scale", that no weight of this file claimed in @q: its weight
 * lives in another shard, and alone it would be served as a plain tensor.
 * With @q->flags' XSHARD (a shard of an indexed folder), an FP4 companion
 * (global scales, an F8_E4M3 or U8 weight_scale) is counted in
 * @q->nxshard instead: its weight may be in another shard. Returns 0 or
 * -ENOTSUP (@d says which). Thread-safe.
 */
int castfs_qsrc_ct4_orphans(const struct castfs_header *h,
			    struct castfs_qsrc *q, bool strict,
			    struct castfs_diag *d);

/*
 * castfs_qsrc_bnb4 - pair the bitsandbytes 4-bit weights of @h in @q: a
 * U8 "P" with "P.absmax", "P.quant_map", "P.quant_state.bitsandbytes__nf4"
 * (or __fp4: its JSON, read as side data, holds the true shape) and, with
 * double quantisation, "P.nested_absmax" and "P.nested_quant_map".
 * Returns 0, -ENOTSUP (a quant_state or companion castfs does not
 * dequantize exactly: @d says which) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_bnb4(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d);

/*
 * castfs_qsrc_ctw4 - pair the compressed-tensors pack-quantized int4
 * weights of @h in @q: an I32 "M.weight_packed" with its
 * "M.weight_scale" (per channel or group), "M.weight_shape" (side
 * data) and, asymmetric, "M.weight_zero_point" (I32 [ceil(rows / 8),
 * groups]: packed along the rows). Returns 0, -ENOTSUP (g_idx, a zero
 * point, shape or scale that does not fit, or against @q->flags'
 * W4SYM/W4ASYM: @d says which) or -ENOMEM. Thread-safe.
 */
int castfs_qsrc_ctw4(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d);

#endif
