/* SPDX-License-Identifier: MIT */
/*
 * gpt-oss MXFP4 experts as a quantized source: pair each
 * "P_blocks" (U8 [E, R, G, 16], two E2M1 codes a byte) with its
 * "P_scales" (E8M0 bytes [E, R, G], one per 32 elements), for the two
 * tensors transformers dequantizes, "gate_up_proj" and "down_proj" of
 * a "*.experts" module (docs/FORMATS.md, "gpt-oss MXFP4").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "view/qsrc_internal.h"
#include "view/view_internal.h"

/* The longest source row castfs_gen_deq_mxfp4() reads at once (bytes of
 * codes), so that one row always fits its scratch. */
#define MX_ROW_MAX (512u << 10)

static bool name_ends(const struct castfs_tensor *t, const char *suf)
{
	size_t n = strlen(suf);

	return t->name_len >= n &&
	       memcmp(t->name + t->name_len - n, suf, n) == 0;
}

/* The "P_scales" tensor of "P_blocks" @t, or NULL. */
static const struct castfs_tensor *mx_scales(const struct castfs_header *h,
					     const struct castfs_tensor *t,
					     int *err)
{
	size_t base = t->name_len - strlen("_blocks");
	const struct castfs_tensor *s;
	char *buf = malloc(base + sizeof("_scales"));

	if (!buf) {
		*err = -ENOMEM;
		return NULL;
	}
	memcpy(buf, t->name, base);
	memcpy(buf + base, "_scales", sizeof("_scales"));
	s = castfs_header_find(h, buf, base + strlen("_scales"));
	free(buf);
	return s;
}

/* Whether @b and @s have the shapes convert_moe_packed_tensors takes. */
static bool mx_pair_ok(const struct castfs_tensor *b,
		       const struct castfs_tensor *s)
{
	if (b->ndim != 4 || b->shape[3] != CASTFS_MX_BLOCK / 2 ||
	    b->nelems == 0)
		return false;
	if (s->dtype != CASTFS_DTYPE_U8 && s->dtype != CASTFS_DTYPE_F8_E8M0)
		return false;
	if (s->ndim != 3)
		return false;
	for (uint32_t i = 0; i < 3; i++) {
		if (s->shape[i] != b->shape[i])
			return false;
	}
	return b->shape[2] * (CASTFS_MX_BLOCK / 2) <= MX_ROW_MAX;
}

static int mx_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		     const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': %s; castfs does not dequantize "
			       "this layout: no views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

int castfs_qsrc_mxfp4(const struct castfs_header *h, struct castfs_qsrc *q,
		      size_t i, struct castfs_diag *d)
{
	const struct castfs_tensor *t = &h->tensors[i], *s;
	int err = 0;

	if (t->dtype != CASTFS_DTYPE_U8 ||
	    !(name_ends(t, ".experts.gate_up_proj_blocks") ||
	      name_ends(t, ".experts.down_proj_blocks")))
		return 1;
	s = mx_scales(h, t, &err);
	if (err)
		return err;
	if (!s)
		return 1; /* not MXFP4: the checks of other layouts decide */
	if (!mx_pair_ok(t, s))
		return mx_reject(d, t,
				 "MXFP4 (gpt-oss) blocks whose shape or "
				 "scales are not [E, R, G, 16] with E8M0 "
				 "scales [E, R, G]");
	q->t[i] = (struct castfs_qinfo){
		.role = CASTFS_QR_MXFP4,
		.scale = (uint32_t)(s - h->tensors),
	};
	q->t[s - h->tensors].role = CASTFS_QR_SCALE;
	q->nmxfp4++;
	return 0;
}

/* Whether @t is named as one of gpt-oss's MXFP4 expert tensors. */
static bool mx_named(const struct castfs_tensor *t)
{
	static const char *const names[] = { ".experts.gate_up_proj_blocks",
					     ".experts.down_proj_blocks",
					     ".experts.gate_up_proj_scales",
					     ".experts.down_proj_scales" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (name_ends(t, names[i]))
			return true;
	}
	return false;
}

int castfs_qsrc_mx_orphans(const struct castfs_header *h,
			   const struct castfs_qsrc *q, struct castfs_diag *d)
{
	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (q->t[i].role == CASTFS_QR_PLAIN &&
		    t->dtype == CASTFS_DTYPE_U8 && mx_named(t))
			return mx_reject(
				d, t,
				"MXFP4 (gpt-oss) blocks or scales "
				"without their partner in this file "
				"(castfs pairs them within one shard)");
	}
	return 0;
}
