/* SPDX-License-Identifier: MIT */
/*
 * Side data: the bytes of the few small tensors whose DATA a quantized
 * layout needs to know its true shape (bitsandbytes' quant_state JSON,
 * compressed-tensors' weight_shape), read once at parse time under the
 * same identity checks as the header and attached to it, so that the
 * quantized-source scan stays a pure function of the parsed header.
 */
#ifndef CASTFS_ST_SIDE_H
#define CASTFS_ST_SIDE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/reader.h"
#include "format/st_header.h"

/* The most bytes read of one tensor, and of all the tensors of a file. */
#define CASTFS_SIDE_MAX 4096u
#define CASTFS_SIDE_TOTAL (256u << 10)

/*
 * castfs_side_wanted - whether the data of @t is side data: a U8
 * "*.quant_state.bitsandbytes__<type>" blob, a U8 1-D "*.comfy_quant"
 * (ComfyUI's layer JSON), a one-element
 * "*weight_format" of at most 8 bytes, or an I64/I32 1-D
 * "*.weight_shape" of at most 8 elements. Pure; thread-safe.
 */
bool castfs_side_wanted(const struct castfs_tensor *t);

/*
 * castfs_header_read_side - read through @r (the source @h was parsed
 * from) the data of every tensor of @h castfs_side_wanted() accepts, each
 * of at most CASTFS_SIDE_MAX bytes, CASTFS_SIDE_TOTAL in all (in data
 * order: the tensors past the bound are not read, and
 * castfs_header_side() says so), and attach it to @h (freed by
 * castfs_header_free()). Call once, before @h is shared. Returns 0,
 * -ENOMEM or the reader's error (-EIO, with @d set); on error @h is
 * unchanged.
 */
int castfs_header_read_side(struct castfs_header *h,
			    const struct castfs_reader *r,
			    struct castfs_diag *d);

/*
 * castfs_header_side - the side data of tensor @t of @h: its bytes and
 * their number in *@len, valid until castfs_header_free(); NULL when
 * none was read (not wanted, over the bounds, or @h read without
 * castfs_header_read_side()). Thread-safe.
 */
const uint8_t *castfs_header_side(const struct castfs_header *h,
				  const struct castfs_tensor *t, size_t *len);

/*
 * castfs_header_side_gather - attach to composite header @h (tensors whose
 * offsets are castfs_part_off(j, byte of @hs[j]), as view/qsrc_xshard.h
 * builds it) a copy of the side data each of its tensors has in its own
 * shard @hs[j] (found by name). Call once, before @h is shared; @hs are
 * only read. Returns 0 or -ENOMEM (@h unchanged). Thread-safe for
 * distinct @h.
 */
int castfs_header_side_gather(struct castfs_header *h,
			      const struct castfs_header *const *hs, size_t n);

/* castfs_side_free - release side data; NULL is accepted. */
void castfs_side_free(struct castfs_side *s);

#endif
