/* SPDX-License-Identifier: MIT */
/*
 * FP8 block weights (and compressed-tensors FP4 packed weights) whose
 * scale sits in another shard of a model folder:
 * the header one output shard is planned from, its tensors pointing into
 * a composite source (common/reader.h, castfs_multi_reader).
 */
#ifndef CASTFS_QSRC_XSHARD_H
#define CASTFS_QSRC_XSHARD_H

#include <stddef.h>

#include "common/err.h"
#include "format/st_header.h"

/*
 * castfs_qsrc_xshard - the header of shard @k of the @n shards @hs as a
 * view of it must see it when FP8 block scales cross shards
 * (transformers' save_pretrained splits by size, so "P_scale_inv",
 * "M.scale", or a compressed-tensors FP4 "M.weight_scale" /
 * "M.weight_global_scale" / "M.input_global_scale" may land in another
 * shard than its weight): shard @k's
 * tensors, less the FP8 scales whose F8 weight is in another shard (they
 * belong to that shard's output), plus the FP8 scales of shard @k's F8
 * weights that lie in other shards. Every tensor's data offsets are
 * rewritten so that data_start (0) + begin is castfs_part_off(j, byte
 * of shard j), j its shard: a plan built from the result (castfs_view_plan
 * and friends, unchanged) reads part j of a castfs_multi_reader whose
 * part j is shard j. Tensors keep the order of their shards, then of
 * their offsets. Names, shapes and metadata are borrowed from @hs (keep
 * every @hs[j] alive while the result is used); free the result with
 * castfs_header_free(). The result carries a copy of the side data its
 * tensors have in their shards (compressed-tensors int4 weight_shape:
 * format/st_side.h), and compressed-tensors int4 companions
 * ("M.weight_scale", "M.weight_shape", "M.weight_zero_point" of an I32
 * "M.weight_packed") and bitsandbytes 4-bit companions ("P.absmax",
 * "P.quant_map", "P.nested_absmax", "P.nested_quant_map",
 * "P.quant_state.bitsandbytes__*" of a U8 weight "P", whose quant_state
 * JSON comes along as side data) follow their weight like the scales
 * above. @d is unused (kept for callers).
 *
 * Returns 0 with *@out set; -EINVAL when @k >= @n or @n is over
 * CASTFS_PART_MAX; -ENOMEM. On error *@out is untouched. Pure function
 * of @hs; thread-safe.
 */
int castfs_qsrc_xshard(const struct castfs_header *const *hs, size_t n,
		       size_t k, struct castfs_header **out,
		       struct castfs_diag *d);

/*
 * castfs_qsrc_xshard_all - every tensor of the @n shards @hs in one
 * header, offsets rewritten as castfs_qsrc_xshard() does (part j is
 * shard j) and metadata borrowed from @hs[0]: where an nvfp4 view finds
 * the fused siblings of a shard's weights in the other shards (struct
 * castfs_view fuse_h). Unlike castfs_qsrc_xshard(), the result owns
 * copies of its names and shapes: it is kept across requests
 * (ns/ns_mdxshard.c), and a shard's header may be freed and read again
 * under it. Keep @hs[0] alive while the result is used; @hs[1..] are
 * only read during the call. Free the result with castfs_header_free().
 * Returns 0 with *@out set; -EINVAL when @n is 0 or over
 * CASTFS_PART_MAX; -ENOMEM. Pure function of @hs; thread-safe.
 */
int castfs_qsrc_xshard_all(const struct castfs_header *const *hs, size_t n,
			   struct castfs_header **out);

#endif
