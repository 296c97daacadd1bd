/* SPDX-License-Identifier: MIT */
/*
 * Side data: the bytes of a few small tensors read at parse time
 * (format/st_side.h; docs/ARCHITECTURE.md, "The small-data read").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/st_side.h"

/* One tensor's bytes, at off in the block. */
struct side_ent {
	uint32_t tensor; /* index in h->tensors */
	uint32_t off, len;
};

struct castfs_side {
	size_t n;
	struct side_ent *ent; /* ascending tensor index */
	uint8_t *bytes;
};

static bool has_suffix(const struct castfs_tensor *t, const char *suf,
		       size_t *at)
{
	size_t n = strlen(suf);

	if (t->name_len < n || memcmp(t->name + t->name_len - n, suf, n))
		return false;
	*at = t->name_len - n;
	return true;
}

/* "P.quant_state.bitsandbytes__<type>": <type> is a short word. */
static bool bnb_state(const struct castfs_tensor *t)
{
	static const char key[] = ".quant_state.bitsandbytes__";
	const char *p;

	if (t->dtype != CASTFS_DTYPE_U8 || t->ndim != 1)
		return false;
	p = memmem(t->name, t->name_len, key, sizeof(key) - 1);
	if (!p)
		return false;
	p += sizeof(key) - 1;
	return p < t->name + t->name_len &&
	       !memchr(p, '.', (size_t)(t->name + t->name_len - p));
}

bool castfs_side_wanted(const struct castfs_tensor *t)
{
	size_t at;

	if (bnb_state(t))
		return true;
	/* ComfyUI's per-layer JSON, {"format": "float8_e4m3fn", ...} */
	if (t->dtype == CASTFS_DTYPE_U8 && t->ndim == 1 &&
	    has_suffix(t, ".comfy_quant", &at))
		return true;
	/* bitsandbytes' int8 layout code: 0 is row-major, others tiled. */
	if (t->nelems == 1 && t->end - t->begin <= 8 &&
	    has_suffix(t, "weight_format", &at))
		return true;
	return (t->dtype == CASTFS_DTYPE_I64 || t->dtype == CASTFS_DTYPE_I32) &&
	       t->ndim == 1 && t->nelems <= 8 &&
	       has_suffix(t, ".weight_shape", &at);
}

/* The tensors to read, within the bounds: their entries and bytes. */
static size_t side_plan(const struct castfs_header *h, struct side_ent *ent,
			uint64_t *bytes)
{
	uint64_t total = 0;
	size_t n = 0;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		uint64_t len = t->end - t->begin;

		if (!castfs_side_wanted(t) || len > CASTFS_SIDE_MAX ||
		    total + len > CASTFS_SIDE_TOTAL)
			continue;
		if (ent)
			ent[n] = (struct side_ent){ .tensor = (uint32_t)i,
						    .off = (uint32_t)total,
						    .len = (uint32_t)len };
		total += len;
		n++;
	}
	*bytes = total;
	return n;
}

static int side_read(const struct castfs_header *h,
		     const struct castfs_reader *r, struct castfs_side *s,
		     struct castfs_diag *d)
{
	for (size_t i = 0; i < s->n; i++) {
		const struct side_ent *e = &s->ent[i];
		const struct castfs_tensor *t = &h->tensors[e->tensor];
		int rc = castfs_reader_read(r, s->bytes + e->off, e->len,
					    h->data_start + t->begin);

		if (rc)
			return castfs_diag_set(
				d, rc, "tensor '%.*s': its data cannot be read",
				(int)(t->name_len > 120 ? 120 : t->name_len),
				t->name);
	}
	return 0;
}

int castfs_header_read_side(struct castfs_header *h,
			    const struct castfs_reader *r,
			    struct castfs_diag *d)
{
	uint64_t total;
	size_t n = side_plan(h, NULL, &total);
	struct castfs_side *s;
	int rc;

	if (!n)
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->n = n;
	s->ent = calloc(n, sizeof(*s->ent));
	s->bytes = malloc(total ? (size_t)total : 1);
	if (!s->ent || !s->bytes) {
		castfs_side_free(s);
		return -ENOMEM;
	}
	side_plan(h, s->ent, &total);
	rc = side_read(h, r, s, d);
	if (rc) {
		castfs_side_free(s);
		return rc;
	}
	castfs_side_free(h->side);
	h->side = s;
	return 0;
}

const uint8_t *castfs_header_side(const struct castfs_header *h,
				  const struct castfs_tensor *t, size_t *len)
{
	const struct castfs_side *s = h->side;
	size_t idx = (size_t)(t - h->tensors), lo = 0, hi = s ? s->n : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->ent[mid].tensor < idx)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == (s ? s->n : 0) || s->ent[lo].tensor != idx)
		return NULL;
	*len = s->ent[lo].len;
	return s->bytes + s->ent[lo].off;
}

/* The side data, in its own shard, of tensor @i of composite @h. */
static const uint8_t *gather_src(const struct castfs_header *h, size_t i,
				 const struct castfs_header *const *hs,
				 size_t n, size_t *len)
{
	const struct castfs_tensor *t = &h->tensors[i], *st;
	uint64_t j = t->begin >> CASTFS_PART_SHIFT;

	if (j >= n || !castfs_side_wanted(t))
		return NULL;
	st = castfs_header_find(hs[j], t->name, t->name_len);
	return st ? castfs_header_side(hs[j], st, len) : NULL;
}

int castfs_header_side_gather(struct castfs_header *h,
			      const struct castfs_header *const *hs, size_t n)
{
	struct castfs_side *s;
	size_t cnt = 0, total = 0, len = 0;
	const uint8_t *p;

	for (size_t i = 0; i < h->ntensors; i++) {
		if (gather_src(h, i, hs, n, &len)) {
			cnt++;
			total += len;
		}
	}
	if (!cnt)
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s || !(s->ent = calloc(cnt, sizeof(*s->ent))) ||
	    !(s->bytes = malloc(total))) {
		castfs_side_free(s);
		return -ENOMEM;
	}
	total = 0;
	for (size_t i = 0; i < h->ntensors; i++) {
		p = gather_src(h, i, hs, n, &len);
		if (!p)
			continue;
		s->ent[s->n++] = (struct side_ent){ .tensor = (uint32_t)i,
						    .off = (uint32_t)total,
						    .len = (uint32_t)len };
		memcpy(s->bytes + total, p, len);
		total += len;
	}
	castfs_side_free(h->side);
	h->side = s;
	return 0;
}

void castfs_side_free(struct castfs_side *s)
{
	if (!s)
		return;
	free(s->ent);
	free(s->bytes);
	free(s);
}
