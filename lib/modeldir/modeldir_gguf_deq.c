/* SPDX-License-Identifier: MIT */
/*
 * The weights of a model folder as its GGUF file reads them: a quantized
 * shard (FP8 block, compressed-tensors, bitsandbytes) as its bf16 view
 * (view/view_gguf_deq.c), so that DIR.<q>.gguf of a quantized folder is
 * DIR.<q>.gguf of the bf16 model it dequantizes to; a plain one as stored.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/reader.h"
#include "modeldir/modeldir.h"
#include "modeldir/modeldir_internal.h"
#include "view/qsrc.h"
#include "view/qsrc_xshard.h"
#include "view/view_gguf.h"

void castfs_md_gguf_deq_fini(struct castfs_md_gguf_deq *q)
{
	for (size_t k = 0; k < q->n; k++) {
		castfs_gguf_deq_free(q->g[k]);
		castfs_header_free(q->comp[k]);
	}
	free(q->g);
	free(q->comp);
	free(q->h);
	*q = (struct castfs_md_gguf_deq){ 0 };
}

/*
 * Plain shard @k whose composite header @c dropped companions of weights
 * in other shards (they are read with those): @c with shard @k's own
 * offsets back, read as stored. A tensor of another shard in a plain
 * composite (a companion of an unquantized weight) is refused.
 */
static int plain_rebase(const struct castfs_header *hk, size_t k,
			struct castfs_header *c, struct castfs_diag *d)
{
	uint64_t base = castfs_part_off(k, hk->data_start);

	for (size_t i = 0; i < c->ntensors; i++) {
		struct castfs_tensor *t = &c->tensors[i];

		if (t->begin >> CASTFS_PART_SHIFT != k)
			return castfs_diag_set(d, -ENOTSUP,
					       "GGUF: tensor '%s' pairs with "
					       "an unquantized weight of "
					       "another shard",
					       t->name);
		t->begin -= base;
		t->end -= base;
	}
	c->data_start = hk->data_start;
	c->data_len = hk->data_len;
	return 0;
}

/*
 * Shard @k of a sharded folder: through its composite header, whose
 * offsets are the composite source's and which holds the FP8 scales,
 * compressed-tensors companions and bitsandbytes 4-bit quant_state /
 * absmax of its weights that lie in other shards, with their side data
 * (view/qsrc_xshard.h).
 */
static int shard_deq(const struct castfs_md_gguf_src *s, size_t k,
		     const struct castfs_qsrc_opts *o,
		     struct castfs_md_gguf_deq *q, struct castfs_diag *d)
{
	int rc = castfs_qsrc_xshard(s->h, s->nh, k, &q->comp[k], d);

	if (!rc)
		rc = castfs_gguf_deq_new(q->comp[k], o, &q->g[k], d);
	if (rc || q->g[k])
		return rc;
	if (q->comp[k]->ntensors != s->h[k]->ntensors)
		return plain_rebase(s->h[k], k, q->comp[k], d);
	castfs_header_free(q->comp[k]); /* plain: read as stored */
	q->comp[k] = NULL;
	return 0;
}

int castfs_md_gguf_deq(const struct castfs_md_gguf_src *s, bool strict,
		       struct castfs_md_gguf_deq *q, struct castfs_diag *d)
{
	struct castfs_qsrc_opts o = s->qopts ? *s->qopts :
					       (struct castfs_qsrc_opts){ 0 };
	int rc = 0;

	o.flags = strict ? CASTFS_QSRC_STRICT : 0;
	*q = (struct castfs_md_gguf_deq){ 0 };
	q->h = calloc(s->nh ? s->nh : 1, sizeof(*q->h));
	q->g = calloc(s->nh ? s->nh : 1, sizeof(*q->g));
	q->comp = calloc(s->nh ? s->nh : 1, sizeof(*q->comp));
	if (!q->h || !q->g || !q->comp) {
		castfs_md_gguf_deq_fini(q);
		return -ENOMEM;
	}
	q->n = s->nh;
	for (size_t k = 0; !rc && k < s->nh; k++) {
		if (s->nh == 1)
			rc = castfs_gguf_deq_new(s->h[0], &o, &q->g[0], d);
		else
			rc = shard_deq(s, k, &o, q, d);
		q->h[k] = q->g[k]    ? q->g[k]->h :
			  q->comp[k] ? q->comp[k] :
				       s->h[k];
		q->nquant += q->g[k] != NULL;
	}
	if (rc)
		castfs_md_gguf_deq_fini(q);
	return rc;
}
