/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes LLM.int8 sources: an I8 "M.weight" with its F32 row
 * scales "M.SCB" (and transformers' "M.weight_format"), dequantized as
 * bitsandbytes' int8_vectorwise_dequant computes it (docs/FORMATS.md).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/st_side.h"

#include "view/qsrc_internal.h"

static int int8_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		       const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': bitsandbytes LLM.int8 %s; "
			       "castfs does not dequantize this layout: no "
			       "views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

static bool int_dtype(enum castfs_dtype dt)
{
	return dt == CASTFS_DTYPE_U8 || dt == CASTFS_DTYPE_I8 ||
	       dt == CASTFS_DTYPE_U16 || dt == CASTFS_DTYPE_I16 ||
	       dt == CASTFS_DTYPE_U32 || dt == CASTFS_DTYPE_I32 ||
	       dt == CASTFS_DTYPE_U64 || dt == CASTFS_DTYPE_I64;
}

/* Weight format tensor @fmt of SCB @s: 0 (read as side data), or the
 * reason why not. */
static int int8_format(const struct castfs_header *h,
		       const struct castfs_tensor *s,
		       const struct castfs_tensor *fmt, struct castfs_diag *d)
{
	size_t len = 0;
	const uint8_t *v = castfs_header_side(h, fmt, &len);
	uint64_t code = 0;

	if (fmt->nelems != 1 || !int_dtype(fmt->dtype) || !v || !len)
		return int8_reject(d, s,
				   "weight_format that is not one integer");
	for (size_t i = 0; i < len; i++)
		code |= (uint64_t)v[i]
			<< (8 * i); /* little-endian, any width */
	if (code != 0) {
		char why[64];

		snprintf(why, sizeof(why), "weight_format %llu (not 0, 'row')",
			 (unsigned long long)code);
		return int8_reject(d, s, why);
	}
	return 0;
}

/* SCB @s of module prefix @mod: pair it with the module's weight. */
static int int8_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		     const struct castfs_tensor *s, size_t mod,
		     struct castfs_diag *d)
{
	const struct castfs_tensor *w =
		castfs_qsrc_sibling(h, s, s->name_len - mod, "weight", NULL);
	const struct castfs_tensor *fmt;

	if (!w)
		return int8_reject(d, s, "SCB without its weight");
	if (w->dtype != CASTFS_DTYPE_I8 || w->ndim != 2 || w->nelems == 0 ||
	    s->dtype != CASTFS_DTYPE_F32 || s->ndim != 1 ||
	    s->shape[0] != w->shape[0] || w->shape[1] > UINT32_MAX)
		return int8_reject(d, s,
				   "row scale that is not F32 [rows] of a "
				   "2-D I8 weight");
	q->t[w - h->tensors] = (struct castfs_qinfo){
		.role = CASTFS_QR_FP8_BLOCK,
		.rule = CASTFS_QRULE_INT8,
		.scale = (uint32_t)(s - h->tensors),
		.brows = 1,
		.bcols = (uint32_t)w->shape[1],
	};
	q->t[s - h->tensors].role = CASTFS_QR_SCALE;
	/* transformers' weight_format: only 0, the row-major layout, is
	 * what castfs reads. Older bitsandbytes saved the tiled layouts of
	 * Turing/Ampere GPUs (1 col32, 2 col_turing, 3 col_ampere), whose
	 * bytes read row-major are other weights; bitsandbytes 0.50 refuses
	 * them (maybe_rearrange_weight). */
	fmt = castfs_qsrc_sibling(h, s, s->name_len - mod, "weight_format",
				  NULL);
	if (fmt) {
		int rc = int8_format(h, s, fmt, d);

		if (rc)
			return rc;
		q->t[fmt - h->tensors].role = CASTFS_QR_SCALE;
	}
	q->nfp8++;
	q->nint8++;
	return 0;
}

int castfs_qsrc_int8(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d)
{
	size_t mod;
	int rc = 0;

	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		if (castfs_qsrc_leaf(&h->tensors[i], "SCB", &mod))
			rc = int8_pair(h, q, &h->tensors[i], mod, d);
	}
	return rc;
}
