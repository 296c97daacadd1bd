/* SPDX-License-Identifier: MIT */
/*
 * bitsandbytes pre-quantized 4-bit weights as a quantized source: what
 * transformers' save_pretrained writes for a load_in_4bit model (bnb's
 * QuantState.as_dict(packed=True)). The true shape, blocksize and dtype
 * are in the DATA of "P.quant_state.bitsandbytes__<type>", read as side
 * data when the header was (format/st_side.h); every other fact is
 * checked against the header, so a lying blob is refused, never served
 * (docs/FORMATS.md, "bitsandbytes 4-bit sources").
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "format/st_side.h"
#include "quant/quant.h"
#include "view/qsrc_internal.h"

static const char state_key[] = ".quant_state.bitsandbytes__";

static int q4_reject(struct castfs_diag *d, const struct castfs_tensor *t,
		     const char *why)
{
	return castfs_diag_set(d, -ENOTSUP,
			       "tensor '%.*s': bitsandbytes 4-bit %s; castfs "
			       "does not dequantize this layout: no views",
			       (int)(t->name_len > 120 ? 120 : t->name_len),
			       t->name, why);
}

/* A JSON integer in [lo, hi] into *@out. */
static bool json_uint(const cJSON *o, const char *key, uint64_t lo, uint64_t hi,
		      uint64_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	double x;

	if (!cJSON_IsNumber(v))
		return false;
	x = v->valuedouble;
	if (!(x >= (double)lo && x <= (double)hi) || x != floor(x))
		return false;
	*out = (uint64_t)x;
	return true;
}

static bool json_str_is(const cJSON *o, const char *key, const char *want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

static bool blocksize_ok(uint64_t b)
{
	/* dequantize_4bit's list: 32 ... 4096, powers of two */
	return b >= 32 && b <= 4096 && (b & (b - 1)) == 0;
}

/* "dtype": the dtype the weight dequantizes to. */
static bool state_dtype(const cJSON *o, struct castfs_q4src *s)
{
	if (json_str_is(o, "dtype", "bfloat16"))
		s->dtype = CASTFS_DTYPE_BF16;
	else if (json_str_is(o, "dtype", "float16"))
		s->dtype = CASTFS_DTYPE_F16;
	else if (json_str_is(o, "dtype", "float32"))
		s->dtype = CASTFS_DTYPE_F32;
	else
		return false;
	return true;
}

/* "shape": 1 to CASTFS_Q4SRC_NDIM positive integers. */
static bool state_shape(const cJSON *o, struct castfs_q4src *s)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "shape"), *v;
	uint64_t n = 1;

	if (!cJSON_IsArray(a))
		return false;
	s->ndim = 0;
	cJSON_ArrayForEach(v, a) {
		double x = cJSON_IsNumber(v) ? v->valuedouble : -1;

		if (s->ndim == CASTFS_Q4SRC_NDIM || !(x >= 1 && x <= 0x1p40) ||
		    x != floor(x))
			return false;
		s->shape[s->ndim++] = (uint64_t)x;
		if (__builtin_mul_overflow(n, (uint64_t)x, &n) ||
		    n > (1ull << 48))
			return false;
	}
	s->nelems = n;
	return s->ndim > 0;
}

/* "nested_*": double quantisation, as QuantState.from_dict reads it. */
static bool state_nested(const cJSON *o, struct castfs_q4src *s)
{
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "nested_offset");
	uint64_t nb;

	s->nested = cJSON_GetObjectItemCaseSensitive(o, "nested_blocksize");
	if (!s->nested)
		return !off;
	if (!json_uint(o, "nested_blocksize", 1, 1u << 20, &nb) ||
	    !json_str_is(o, "nested_dtype", "float32") || !cJSON_IsNumber(off))
		return false;
	s->nested_blocksize = (uint32_t)nb;
	/* torch.tensor(float(v)): the double rounded to fp32 */
	s->offset = (float)off->valuedouble;
	return isfinite(s->offset);
}

/*
 * Whether object @o has a key twice: Python's json.loads (bitsandbytes)
 * keeps the last, cJSON finds the first, so such a blob could mean two
 * things. Objects of more than 64 members are refused the same way.
 */
static bool has_dup(const cJSON *o)
{
	const cJSON *a, *b;
	int n = 0;

	for (a = o->child; a; a = a->next) {
		if (++n > 64 || !a->string)
			return true;
		for (b = a->next; b; b = b->next) {
			if (b->string && strcmp(a->string, b->string) == 0)
				return true;
		}
	}
	return false;
}

/* The quant_state JSON @js (@len bytes) of a weight of @type into @s. */
static const char *state_parse(const uint8_t *js, size_t len,
			       enum castfs_qtype type, struct castfs_q4src *s)
{
	cJSON *o = castfs_qsrc_json_loads(js, len);
	const char *why = NULL;
	uint64_t bs = 0;

	if (!cJSON_IsObject(o))
		why = "quant_state that is not a JSON object";
	else if (has_dup(o))
		why = "quant_state with a key twice (or over 64 keys)";
	else if (!json_str_is(o, "quant_type",
			      type == CASTFS_Q_NF4 ? "nf4" : "fp4"))
		why = "quant_state whose quant_type is not its name's";
	else if (!json_uint(o, "blocksize", 1, 4096, &bs) || !blocksize_ok(bs))
		why = "quant_state with a blocksize bitsandbytes refuses";
	else if (!state_dtype(o, s))
		why = "quant_state dtype other than bfloat16/float16/float32";
	else if (!state_shape(o, s))
		why = "quant_state without a valid shape";
	else if (!state_nested(o, s))
		why = "quant_state with invalid nested_* fields";
	s->qtype = (uint8_t)type;
	s->blocksize = (uint32_t)bs;
	cJSON_Delete(o);
	return why;
}

/* Tensor "P" + @leaf of @h, where @p (@plen bytes) is P. */
static const struct castfs_tensor *comp(const struct castfs_header *h,
					const char *p, size_t plen,
					const char *leaf, int *err)
{
	size_t n = strlen(leaf);
	char *buf = malloc(plen + n + 1);
	const struct castfs_tensor *t;

	if (!buf) {
		*err = -ENOMEM;
		return NULL;
	}
	memcpy(buf, p, plen);
	memcpy(buf + plen, leaf, n + 1);
	t = castfs_header_find(h, buf, plen + n);
	free(buf);
	return t;
}

static bool is_vec(const struct castfs_tensor *t, enum castfs_dtype dt,
		   uint64_t n)
{
	return t && t->dtype == dt && t->ndim == 1 && t->shape[0] == n;
}

/* Mark companion @t of a 4-bit weight as folded into it. */
static void fold(const struct castfs_header *h, struct castfs_qsrc *q,
		 const struct castfs_tensor *t)
{
	if (t)
		q->t[t - h->tensors].role = CASTFS_QR_SCALE;
}

/* Check the companions of weight @w (name @p) against @s and fold them. */
static const char *q4_companions(const struct castfs_header *h,
				 struct castfs_qsrc *q, const char *p,
				 size_t plen, struct castfs_q4src *s, int *err)
{
	uint64_t nblk = s->nelems / s->blocksize + !!(s->nelems % s->blocksize);
	const struct castfs_tensor *abs = comp(h, p, plen, ".absmax", err);
	const struct castfs_tensor *map = comp(h, p, plen, ".quant_map", err);
	const struct castfs_tensor *nabs =
		comp(h, p, plen, ".nested_absmax", err);
	const struct castfs_tensor *nmap =
		comp(h, p, plen, ".nested_quant_map", err);

	if (*err)
		return NULL;
	if (!is_vec(map, CASTFS_DTYPE_F32, 16))
		return "weight whose quant_map is not F32 [16]";
	if (!is_vec(abs, s->nested ? CASTFS_DTYPE_U8 : CASTFS_DTYPE_F32, nblk))
		return "weight whose absmax does not fit its shape and "
		       "blocksize";
	if (s->nested && (!is_vec(nabs, CASTFS_DTYPE_F32,
				  nblk / s->nested_blocksize +
					  !!(nblk % s->nested_blocksize)) ||
			  !is_vec(nmap, CASTFS_DTYPE_F32, 256)))
		return "weight whose nested_absmax or nested_quant_map does "
		       "not fit its absmax";
	if (!s->nested && (nabs || nmap))
		return "weight with nested_* tensors but no nested quant_state";
	s->absmax = (uint32_t)(abs - h->tensors);
	s->nested_absmax = s->nested ? (uint32_t)(nabs - h->tensors) : 0;
	s->nested_quant_map = s->nested ? (uint32_t)(nmap - h->tensors) : 0;
	fold(h, q, abs);
	fold(h, q, map);
	fold(h, q, nabs);
	fold(h, q, nmap);
	return NULL;
}

/* The 4-bit type a quant_state name @t ends with; -1 if unknown. */
static int state_type(const struct castfs_tensor *t, size_t *plen)
{
	const char *k =
		memmem(t->name, t->name_len, state_key, sizeof(state_key) - 1);
	const char *ty;
	size_t n;

	if (!k)
		return -2;
	*plen = (size_t)(k - t->name);
	ty = k + sizeof(state_key) - 1;
	n = (size_t)(t->name + t->name_len - ty);
	if (n == 3 && memcmp(ty, "nf4", 3) == 0)
		return CASTFS_Q_NF4;
	if (n == 3 && memcmp(ty, "fp4", 3) == 0)
		return CASTFS_Q_FP4;
	return -1;
}

/* Q4XS: hold @t (if any) of @h: only its composite header is served. */
static void q4_hold(const struct castfs_header *h, struct castfs_qsrc *q,
		    const struct castfs_tensor *t)
{
	if (t && q->t[t - h->tensors].role == CASTFS_QR_PLAIN)
		q->t[t - h->tensors].role = CASTFS_QR_SCALE;
}

/*
 * Q4XS: whether weight @w of quant_state @t (weight name @plen bytes of
 * it, nested per @s) lacks a companion here; then @w, @t and the
 * companions here are held and counted in nxshard.
 */
static bool q4_elsewhere(const struct castfs_header *h, struct castfs_qsrc *q,
			 const struct castfs_tensor *w,
			 const struct castfs_tensor *t, size_t plen,
			 const struct castfs_q4src *s, int *err)
{
	static const char *const leaves[] = { ".absmax", ".quant_map",
					      ".nested_absmax",
					      ".nested_quant_map" };
	const struct castfs_tensor *c[4];
	bool missing = false;

	if (!(q->flags & CASTFS_QSRC_Q4XS))
		return false;
	for (int i = 0; i < 4; i++) {
		c[i] = comp(h, t->name, plen, leaves[i], err);
		missing |= !c[i] && (i < 2 || s->nested);
	}
	if (*err || !missing)
		return false;
	q4_hold(h, q, w);
	q4_hold(h, q, t);
	for (int i = 0; i < 4; i++)
		q4_hold(h, q, c[i]);
	q->nxshard++;
	return true;
}

/* Quant_state tensor @t: pair its weight into @q (its slot @s). */
static int q4_pair(const struct castfs_header *h, struct castfs_qsrc *q,
		   const struct castfs_tensor *t, struct castfs_q4src *s,
		   struct castfs_diag *d)
{
	size_t plen = 0, len = 0;
	int type = state_type(t, &plen), err = 0;
	const struct castfs_tensor *w;
	const uint8_t *js;
	const char *why;

	if (type < 0)
		return q4_reject(d, t, "quant_state of an unknown quant_type");
	w = castfs_header_find(h, t->name, plen);
	if (!w && (q->flags & CASTFS_QSRC_Q4XS)) {
		q4_hold(h, q, t); /* its weight may be in another shard */
		q->nxshard++;
		return 0;
	}
	if (!w)
		return q4_reject(d, t, "quant_state without its weight");
	if (w->dtype != CASTFS_DTYPE_U8 || q->t[w - h->tensors].role)
		return q4_reject(d, w,
				 "weight stored in another dtype than U8 "
				 "(bnb_4bit_quant_storage) or paired twice");
	js = castfs_header_side(h, t, &len);
	if (!js)
		return q4_reject(d, t,
				 "quant_state not read (not U8 1-D, or over "
				 "the 4 KiB / 256 KiB side-data bounds)");
	why = state_parse(js, len, (enum castfs_qtype)type, s);
	if (!why && w->nelems != s->nelems / 2 + s->nelems % 2)
		why = "weight whose packed size is not its quant_state shape";
	if (!why && q4_elsewhere(h, q, w, t, plen, s, &err))
		return 0;
	if (!why && !err)
		why = q4_companions(h, q, t->name, plen, s, &err);
	if (err)
		return err;
	if (why)
		return q4_reject(d, w, why);
	q->t[w - h->tensors] = (struct castfs_qinfo){
		.role = CASTFS_QR_BNB4,
		.scale = (uint32_t)q->nbnb4,
	};
	q->t[t - h->tensors].role = CASTFS_QR_SCALE;
	q->nbnb4++;
	return 0;
}

/* Whether @t is "P" + a 4-bit companion leaf whose weight P is not in @h
 * or not paired with a quant_state here (its state is elsewhere). */
static bool q4_orphan(const struct castfs_header *h,
		      const struct castfs_qsrc *q,
		      const struct castfs_tensor *t)
{
	static const char *const leaves[] = { ".absmax", ".quant_map",
					      ".nested_absmax",
					      ".nested_quant_map" };
	const struct castfs_tensor *w;

	for (size_t i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++) {
		size_t n = strlen(leaves[i]);

		if (t->name_len <= n ||
		    memcmp(t->name + t->name_len - n, leaves[i], n))
			continue;
		w = castfs_header_find(h, t->name, t->name_len - n);
		return !w || q->t[w - h->tensors].role != CASTFS_QR_BNB4;
	}
	return false;
}

/*
 * Q4XS: after pairing, hold what may be half of a module in another
 * shard: companions without their weight here, and U8 [n, 1] "*.weight"
 * tensors (bitsandbytes' packed 4-bit shape) without a quant_state here.
 * A weight that is truly plain U8 [n, 1] is thus never served from such
 * a folder's shard alone: its composite header says what it is.
 */
static void q4_orphans(const struct castfs_header *h, struct castfs_qsrc *q)
{
	static const char wleaf[] = ".weight";
	const size_t wn = sizeof(wleaf) - 1;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];
		bool packed = t->dtype == CASTFS_DTYPE_U8 && t->ndim == 2 &&
			      t->shape[1] == 1 && t->name_len > wn &&
			      !memcmp(t->name + t->name_len - wn, wleaf, wn);

		if (q->t[i].role != CASTFS_QR_PLAIN ||
		    !(packed || q4_orphan(h, q, t)))
			continue;
		q->t[i].role = CASTFS_QR_SCALE;
		q->nxshard++;
	}
}

/* Pair every quant_state of @h with its weight (q4_pair). */
static int q4_pairs(const struct castfs_header *h, struct castfs_qsrc *q,
		    struct castfs_diag *d)
{
	size_t n = 0;
	int rc = 0;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		n += memmem(t->name, t->name_len, state_key,
			    sizeof(state_key) - 1) != NULL;
	}
	if (!n)
		return 0;
	q->q4 = calloc(n, sizeof(*q->q4));
	if (!q->q4)
		return -ENOMEM;
	for (size_t i = 0; !rc && i < h->ntensors; i++) {
		const struct castfs_tensor *t = &h->tensors[i];

		if (memmem(t->name, t->name_len, state_key,
			   sizeof(state_key) - 1) &&
		    q->t[i].role == CASTFS_QR_PLAIN)
			rc = q4_pair(h, q, t, &q->q4[q->nbnb4], d);
	}
	return rc;
}

int castfs_qsrc_bnb4(const struct castfs_header *h, struct castfs_qsrc *q,
		     struct castfs_diag *d)
{
	int rc = q4_pairs(h, q, d);

	if (!rc && (q->flags & CASTFS_QSRC_Q4XS))
		q4_orphans(h, q);
	return rc;
}
