/* SPDX-License-Identifier: MIT */
/*
 * The layout every GGUF file castfs computes shares (view_gguf.c, and the
 * model-directory files of modeldir/modeldir_gguf.c): the header, then each
 * tensor's data padded with zeros to CASTFS_GGUF_ALIGN.
 */
#ifndef CASTFS_VIEW_GGUF_H
#define CASTFS_VIEW_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "plan/plan_build.h"

/* Append the producers of the data of tensor @i (without its padding). */
typedef int (*castfs_gguf_data_fn)(void *ctx, struct castfs_pb *pb, size_t i);

/*
 * castfs_view_gguf_assemble - finish the header in @w (KVs and the infos
 * of @n tensors, tensor i holding @nbytes[i] bytes of data) and make the
 * plan of the file: the header as one MEM extent, then for each tensor in
 * order what @add appends and the zeros padding it to CASTFS_GGUF_ALIGN.
 * @w stays the caller's. Returns 0 (the caller owns *@out), @add's error,
 * -EOVERFLOW or -ENOMEM. Thread-safe.
 */
int castfs_view_gguf_assemble(struct castfs_gguf_w *w, size_t n,
			      const uint64_t *nbytes, castfs_gguf_data_fn add,
			      void *ctx, struct castfs_plan **out);

#endif
