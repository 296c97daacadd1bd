/* SPDX-License-Identifier: MIT */
/*
 * The layout every GGUF file castfs computes shares (view_gguf.c, and the
 * model-directory files of modeldir/modeldir_gguf.c): the header, then each
 * tensor's data padded with zeros to CASTFS_GGUF_ALIGN.
 */
#ifndef CASTFS_VIEW_GGUF_H
#define CASTFS_VIEW_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "format/st_header.h"
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

/* One tensor of the bf16 view of a quantized source, for the GGUF builders. */
struct castfs_gguf_deq_ent {
	uint64_t src_off; /* kept tensor: the source offset of its bytes */
	bool deq; /* a dequantized weight: the bf16 plan's qtensor @qt */
	uint8_t op; /* its dequantizer: DEQ_FP8, DEQ_Q4 or DEQ_W4 */
	uint32_t qt;
};

/* The bf16 view of a quantized source, as the GGUF builders read it. */
struct castfs_gguf_deq {
	struct castfs_plan *plan; /* the bf16 view: its dequantizer records */
	struct castfs_header *h; /* its tensors: names, shapes, dtypes */
	struct castfs_gguf_deq_ent *ent; /* ent[i] for h->tensors[i] */
};

struct castfs_qsrc_opts;

/*
 * castfs_gguf_deq_new - the bf16 view of checkpoint @h (quantized layout
 * options @o, may be NULL; of its flags only CASTFS_QSRC_STRICT is kept)
 * for a GGUF builder: its header, whose tensors
 * the builder converts instead of @h's (scales and other companions gone,
 * weights BF16 with their true shapes), and per tensor where its bytes
 * are (castfs_gguf_deq_ent()). A plain checkpoint gives 0 and *@out NULL.
 * @h must outlive *@out (names are copied, offsets are @h's source's).
 * Returns 0 (the caller owns *@out: castfs_gguf_deq_free()); -ENOTSUP
 * for a layout the GGUF quantisers do not read (gpt-oss MXFP4; @d says
 * so) or one castfs refuses; -EINVAL, -ENOMEM. Thread-safe.
 */
int castfs_gguf_deq_new(const struct castfs_header *h,
			const struct castfs_qsrc_opts *o,
			struct castfs_gguf_deq **out, struct castfs_diag *d);

/* castfs_gguf_deq_free - release @g; NULL is accepted. */
void castfs_gguf_deq_free(struct castfs_gguf_deq *g);

/* castfs_gguf_deq_ent - where tensor @t (of g->h) comes from. */
const struct castfs_gguf_deq_ent *
castfs_gguf_deq_ent(const struct castfs_gguf_deq *g,
		    const struct castfs_tensor *t);

/*
 * castfs_gguf_deq_add_qt - add to @pb the dequantizer of weight @t (of
 * g->h, ent->deq) and then @q (its qtype, blocksize: 1 for
 * CASTFS_OP_DEQ_BF16, rows and cols set by the caller) made to read it:
 * deq_op set, src_dtype BF16 and src_off 0, so that element k is BF16
 * byte 2k of a virtual source (a producer's src_off; permuted rows start
 * inside it). *@idx is @q's index. Returns 0, -EINVAL (@t is no
 * dequantized weight) or -ENOMEM.
 */
int castfs_gguf_deq_add_qt(struct castfs_pb *pb,
			   const struct castfs_gguf_deq *g,
			   const struct castfs_tensor *t,
			   struct castfs_qtensor *q, uint32_t *idx);

#endif
