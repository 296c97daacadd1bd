/* SPDX-License-Identifier: MIT */
/*
 * The composite header of one output shard of a sharded FP8 block (or
 * compressed-tensors FP4) model: which tensors of which shard it reads
 * (its own, and its weights' scales from other shards) and where they are
 * in the composite source.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckd.h"
#include "common/reader.h"
#include "format/st_side.h"
#include "view/qsrc_xshard.h"

static bool has_suffix(const struct castfs_tensor *t, const char *suf,
		       size_t *base)
{
	size_t n = strlen(suf);

	if (t->name_len <= n || memcmp(t->name + t->name_len - n, suf, n))
		return false;
	*base = t->name_len - n;
	return true;
}

/* Tensor @base bytes of @t's name followed by @add, in @h; or NULL. */
static const struct castfs_tensor *find_join(const struct castfs_header *h,
					     const struct castfs_tensor *t,
					     size_t base, const char *add)
{
	size_t alen = strlen(add);
	char buf[512];

	if (base + alen > sizeof(buf))
		return NULL; /* no tensor name of a real model is this long */
	memcpy(buf, t->name, base);
	memcpy(buf + base, add, alen);
	return castfs_header_find(h, buf, base + alen);
}

/* If @t is a compressed-tensors companion of a "M.weight_packed" in @h
 * (U8 FP4: "M.weight_scale", "M.weight_global_scale",
 * "M.input_global_scale", qsrc_ct4.c; I32 int4: "M.weight_scale",
 * "M.weight_shape", "M.weight_zero_point", qsrc_ctw4.c), that weight;
 * else NULL. */
static const struct castfs_tensor *fp4_weight(const struct castfs_header *h,
					      const struct castfs_tensor *t)
{
	static const struct {
		const char *leaf;
		bool fp4, int4;
	} leaves[] = {
		{ ".weight_scale", true, true },
		{ ".weight_global_scale", true, false },
		{ ".input_global_scale", true, false },
		{ ".weight_shape", false, true },
		{ ".weight_zero_point", false, true },
	};
	const struct castfs_tensor *w;
	size_t base;

	for (size_t i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++) {
		if (!has_suffix(t, leaves[i].leaf, &base))
			continue;
		w = find_join(h, t, base, ".weight_packed");
		if (w && ((leaves[i].fp4 && w->dtype == CASTFS_DTYPE_U8) ||
			  (leaves[i].int4 && w->dtype == CASTFS_DTYPE_I32)))
			return w;
		return NULL;
	}
	return NULL;
}

/* If @t is a bitsandbytes 4-bit companion of a U8 weight "P" in @h
 * ("P.absmax", "P.quant_map", "P.nested_absmax", "P.nested_quant_map",
 * "P.quant_state.bitsandbytes__<type>": qsrc_bnb4.c), that weight; else
 * NULL. transformers' sharder splits them from their weight by size. */
static const struct castfs_tensor *bnb4_weight(const struct castfs_header *h,
					       const struct castfs_tensor *t)
{
	static const char *const leaves[] = { ".absmax", ".quant_map",
					      ".nested_absmax",
					      ".nested_quant_map" };
	static const char state[] = ".quant_state.bitsandbytes__";
	const struct castfs_tensor *w = NULL;
	const char *k;
	size_t base;

	for (size_t i = 0; !w && i < sizeof(leaves) / sizeof(leaves[0]); i++)
		if (has_suffix(t, leaves[i], &base))
			w = find_join(h, t, base, "");
	k = w ? NULL : memmem(t->name, t->name_len, state, sizeof(state) - 1);
	if (k)
		w = find_join(h, t, (size_t)(k - t->name), "");
	return w && w->dtype == CASTFS_DTYPE_U8 ? w : NULL;
}

/*
 * If @t is the FP8 scale of an F8 weight in @h, that weight; else NULL.
 * The names are the ones qsrc.c pairs: "P_scale_inv" for weight "P",
 * "M.scale" for F8 "M.weight", compressed-tensors FP8's "M.weight_scale"
 * and "M.input_scale" for F8 "M.weight"; and the companions of
 * compressed-tensors
 * FP4 packed weights (fp4_weight) and of bitsandbytes 4-bit weights
 * (bnb4_weight).
 */
static const struct castfs_tensor *scale_weight(const struct castfs_header *h,
						const struct castfs_tensor *t)
{
	const struct castfs_tensor *w = fp4_weight(h, t);
	size_t base;

	if (!w)
		w = bnb4_weight(h, t);
	if (w)
		return w;
	if (has_suffix(t, "_scale_inv", &base))
		w = find_join(h, t, base, "");
	else if (has_suffix(t, ".scale", &base) ||
		 has_suffix(t, ".weight_scale", &base) ||
		 has_suffix(t, ".input_scale", &base))
		w = find_join(h, t, base, ".weight");
	if (w && (w->dtype == CASTFS_DTYPE_F8_E4M3 ||
		  w->dtype == CASTFS_DTYPE_F8_E5M2))
		return w;
	return NULL;
}

/* Whether some shard other than @k holds @t's F8 weight. */
static bool weight_elsewhere(const struct castfs_header *const *hs, size_t n,
			     size_t k, const struct castfs_tensor *t)
{
	for (size_t j = 0; j < n; j++) {
		if (j != k && scale_weight(hs[j], t))
			return true;
	}
	return false;
}

/* As shard number: every tensor of every shard (castfs_qsrc_xshard_all). */
#define XS_ALL ((size_t)-1)

/* Whether tensor @t of shard @j belongs in the header of shard @k. */
static bool wanted(const struct castfs_header *const *hs, size_t n, size_t k,
		   size_t j, const struct castfs_tensor *t)
{
	if (k == XS_ALL)
		return true;
	if (j != k)
		return scale_weight(hs[k], t) != NULL;
	/* A scale whose weight is here stays (qsrc pairs it); one whose
	 * weight is in another shard goes with that shard's output. */
	return scale_weight(hs[k], t) || !weight_elsewhere(hs, n, k, t);
}

static int by_name_cmp(const void *a, const void *b)
{
	const struct castfs_tensor *x = *(const struct castfs_tensor *const *)a;
	const struct castfs_tensor *y = *(const struct castfs_tensor *const *)b;
	size_t m = x->name_len < y->name_len ? x->name_len : y->name_len;
	int r = m ? memcmp(x->name, y->name, m) : 0;

	if (r)
		return r;
	return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Where a composite that owns its strings (XS_ALL) copies them: the next
 * free shape entry and byte of its block. Unset when it borrows them. */
struct xs_arena {
	bool own;
	uint64_t *dims;
	char *chars;
};

/* What a composite's block holds: its tensors and, when it owns them,
 * the shape entries and name bytes (NULs included) it copies. Sums of
 * sizes already in memory: uint64_t cannot overflow. */
struct xs_size {
	uint64_t m, ndims, nchars;
};

/* @n bytes of @s, NUL-terminated, copied into @a. */
static const char *arena_str(struct xs_arena *a, const char *s, size_t n)
{
	char *c = a->chars;

	memcpy(c, s, n);
	c[n] = '\0';
	a->chars += n + 1;
	return c;
}

/* Tensor @o, a copy of a shard's, takes its own name and shape from @a:
 * the shard's header may be freed while the composite lives. */
static void arena_tensor(struct xs_arena *a, struct castfs_tensor *o)
{
	if (!a->own)
		return;
	if (o->ndim) {
		memcpy(a->dims, o->shape, o->ndim * sizeof(*a->dims));
		o->shape = a->dims;
		a->dims += o->ndim;
	}
	o->name = arena_str(a, o->name, o->name_len);
}

/* Fill @h's tensors (@m counted) with the wanted ones, offsets rebased. */
static void fill(const struct castfs_header *const *hs, size_t n, size_t k,
		 struct castfs_header *h, struct xs_arena *a)
{
	size_t m = 0;

	for (size_t j = 0; j < n; j++) {
		for (size_t i = 0; i < hs[j]->ntensors; i++) {
			const struct castfs_tensor *t = &hs[j]->tensors[i];
			struct castfs_tensor *o = &h->tensors[m];

			if (!wanted(hs, n, k, j, t))
				continue;
			*o = *t;
			arena_tensor(a, o);
			o->begin = castfs_part_off(j, hs[j]->data_start +
							      t->begin);
			o->end = o->begin + (t->end - t->begin);
			h->by_name[m++] = o;
			if (o->end > h->data_len)
				h->data_len = o->end;
		}
	}
	h->ntensors = m;
	qsort(h->by_name, m, sizeof(*h->by_name), by_name_cmp);
}

/* The size of the composite of shard @k (XS_ALL: of them all, which owns
 * its names and shapes) of @hs. */
static void xs_count(const struct castfs_header *const *hs, size_t n, size_t k,
		     struct xs_size *sz)
{
	for (size_t j = 0; j < n; j++) {
		for (size_t i = 0; i < hs[j]->ntensors; i++) {
			const struct castfs_tensor *t = &hs[j]->tensors[i];

			if (!wanted(hs, n, k, j, t))
				continue;
			sz->m++;
			if (k != XS_ALL)
				continue;
			sz->ndims += t->ndim;
			sz->nchars += t->name_len + 1;
		}
	}
}

/* One block, as the parser lays it out (castfs_header_free() frees it):
 * header, tensors, shapes, by_name, then the names; @a's cursors set
 * to where the copies go. */
static int xs_alloc(const struct xs_size *sz, struct castfs_header **out,
		    struct xs_arena *a)
{
	const uint64_t m = sz->m ? sz->m : 1;
	uint64_t size = sizeof(struct castfs_header), t, d, p;
	struct castfs_header *h;

	_Static_assert(sizeof(struct castfs_header) % 8 == 0, "alignment");
	_Static_assert(sizeof(struct castfs_tensor) % 8 == 0, "alignment");
	if (castfs_ckd_mul(&t, m, sizeof(struct castfs_tensor)) ||
	    castfs_ckd_mul(&d, sz->ndims, sizeof(uint64_t)) ||
	    castfs_ckd_mul(&p, m, sizeof(void *)) ||
	    castfs_ckd_add(&size, size, t) || castfs_ckd_add(&size, size, d) ||
	    castfs_ckd_add(&size, size, p) ||
	    castfs_ckd_add(&size, size, sz->nchars) || size > SIZE_MAX)
		return -ENOMEM;
	h = calloc(1, (size_t)size);
	if (!h)
		return -ENOMEM;
	h->tensors = (struct castfs_tensor *)(h + 1);
	a->dims = (uint64_t *)(h->tensors + m);
	h->by_name = (const struct castfs_tensor **)(a->dims + sz->ndims);
	a->chars = (char *)(h->by_name + m);
	*out = h;
	return 0;
}

/* The composite header of shard @k (XS_ALL: of them all) of @hs. */
static int xs_build(const struct castfs_header *const *hs, size_t n, size_t k,
		    struct castfs_header **out)
{
	const struct castfs_header *meta = hs[k == XS_ALL ? 0 : k];
	struct xs_size sz = { 0 };
	struct xs_arena a = { .own = k == XS_ALL };
	struct castfs_header *h;
	int rc;

	xs_count(hs, n, k, &sz);
	rc = xs_alloc(&sz, &h, &a);
	if (rc)
		return rc;
	/* Borrowed even by XS_ALL: its keeper, the first shard's entry,
	 * outlives it, and metadata may be as large as the header limit. */
	h->has_metadata = meta->has_metadata;
	h->nmeta = meta->nmeta;
	h->meta = meta->meta;
	fill(hs, n, k, h, &a);
	/* int4 weights' true shapes: their weight_shape data, from the
	 * shards that hold them. */
	if (castfs_header_side_gather(
		    h, (const struct castfs_header *const *)hs, n)) {
		castfs_header_free(h);
		return -ENOMEM;
	}
	*out = h;
	return 0;
}

int castfs_qsrc_xshard(const struct castfs_header *const *hs, size_t n,
		       size_t k, struct castfs_header **out,
		       struct castfs_diag *d)
{
	(void)d;
	if (k >= n || n > CASTFS_PART_MAX)
		return -EINVAL;
	return xs_build(hs, n, k, out);
}

int castfs_qsrc_xshard_all(const struct castfs_header *const *hs, size_t n,
			   struct castfs_header **out)
{
	if (n == 0 || n > CASTFS_PART_MAX)
		return -EINVAL;
	return xs_build(hs, n, XS_ALL, out);
}
