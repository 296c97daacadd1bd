/* SPDX-License-Identifier: MIT */
/*
 * Plain-cast views (fp32, fp16, bf16, fp8, ...): every tensor the rules
 * select is cast element-wise to the view's dtype; the rest is copied.
 */
#include <errno.h>
#include <string.h>

#include "kernels/convert.h"
#include "view/view_internal.h"

/* The producer of tensor @t in @v: a cast, or a byte-for-byte copy. */
static int cast_producer(const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *t,
			 struct castfs_producer *p, enum castfs_dtype *dtype)
{
	unsigned flags = v->cvt_flags;

	*p = (struct castfs_producer){
		.op = CASTFS_OP_COPY,
		.src_off = h->data_start + t->begin,
	};
	*dtype = t->dtype;
	if (!castfs_view_converts(v, t) || t->dtype == v->dtype)
		return 0;
	if (v->dtype != CASTFS_DTYPE_F8_E4M3 &&
	    v->dtype != CASTFS_DTYPE_F8_E5M2)
		flags &= ~(unsigned)CASTFS_CVT_SATURATE;
	if (!castfs_convert_get(t->dtype, v->dtype, flags))
		return -ENOTSUP;
	p->op = CASTFS_OP_CAST;
	p->src_dtype = (uint8_t)t->dtype;
	p->flags = (uint8_t)flags;
	*dtype = v->dtype;
	return 0;
}

/* Older transformers crash on a missing __metadata__: always write one. */
int castfs_view_add_copy(struct castfs_pb *pb, const struct castfs_header *h,
			 const struct castfs_tensor *t)
{
	const struct castfs_producer p = {
		.op = CASTFS_OP_COPY,
		.src_off = h->data_start + t->begin,
	};

	return castfs_pb_add_tensor(pb, t->name, t->name_len, t->dtype, t->ndim,
				    t->shape, &p);
}

int castfs_view_copy_metadata(struct castfs_pb *pb,
			      const struct castfs_header *h)
{
	static const char fmt_key[] = "format";
	static const char comfy_key[] = "_quantization_metadata";
	int rc;

	/* Every view of @h writes the same pairs: a large __metadata__ is
	 * then held once by their plans (st_header.h, meta_text). */
	castfs_pb_share_meta(pb, h->meta_text);
	if (!castfs_header_meta(h, fmt_key)) {
		rc = castfs_pb_add_meta(pb, fmt_key, sizeof(fmt_key) - 1, "pt",
					2);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < h->nmeta; i++) {
		const struct castfs_meta_kv *kv = &h->meta[i];

		/* ComfyUI's list of quantized layers: every view dequantizes
		 * them (or the file has none), and ComfyUI would look for
		 * their scales (view/qsrc_comfy.c). */
		if (kv->key_len == sizeof(comfy_key) - 1 &&
		    !memcmp(kv->key, comfy_key, sizeof(comfy_key) - 1))
			continue;
		rc = castfs_pb_add_meta(pb, kv->key, kv->key_len, kv->value,
					kv->value_len);
		if (rc)
			return rc;
	}
	return 0;
}

int castfs_view_cast_add(struct castfs_pb *pb, const struct castfs_view *v,
			 const struct castfs_header *h,
			 const struct castfs_tensor *t, struct castfs_diag *d)
{
	struct castfs_producer p;
	enum castfs_dtype dt;
	int rc = cast_producer(v, h, t, &p, &dt);

	if (rc)
		return castfs_diag_set(d, rc, "tensor '%s': no %s -> %s kernel",
				       t->name, castfs_dtype_name(t->dtype),
				       castfs_dtype_name(v->dtype));
	return castfs_pb_add_tensor(pb, t->name, t->name_len, dt, t->ndim,
				    t->shape, &p);
}

int castfs_view_plan_cast(const struct castfs_view *v,
			  const struct castfs_header *h,
			  struct castfs_plan **out, struct castfs_diag *d)
{
	return castfs_view_build(v, h, castfs_view_cast_add, out, d);
}
