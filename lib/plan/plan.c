/* SPDX-License-Identifier: MIT */
/*
 * Building plans: collect output tensors (or raw extents), lay them out,
 * and freeze the result into an immutable struct castfs_plan.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckd.h"
#include "plan/plan_internal.h"

/*
 * Under AddressSanitizer an arena's chunks are poisoned but for the
 * pieces handed out, and each piece is followed by a redzone: an overflow
 * from one piece into the next is caught as it was when every piece was
 * its own allocation.
 */
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif
#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define ARENA_REDZONE 16u
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#define ARENA_REDZONE 0u
#endif

/* A chunk of memory owned by a plan; chained, freed together. */
struct arena_chunk {
	struct arena_chunk *next;
	max_align_t data[];
};

struct pb_tensor {
	struct castfs_producer p;
	enum castfs_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape;
	const char *name;
	size_t name_len;
	uint64_t nbytes;
	bool late; /* castfs_pb_mark_late() */
};

/* Chunks carved into pieces, freed together. */
struct arena {
	struct arena_chunk *head;
	uint8_t *at; /* the current chunk's free bytes */
	size_t left;
	size_t bytes; /* what the chunks take, malloc's headers included */
};

struct castfs_pb {
	/* What the finished plan keeps (castfs_pb_alloc(), extents' bytes,
	 * quantiser records), and what only the build reads: the output
	 * tensors' names and shapes, laid out into the header text by
	 * castfs_pb_finish() and not needed after it (a fifth of an nf4
	 * plan of many small tensors). */
	struct arena keep, tmp;
	struct castfs_extent *ext;
	size_t next, cap_ext;
	uint64_t size;
	struct pb_tensor *t;
	size_t nt, cap_t;
	struct castfs_meta_kv *meta;
	size_t nmeta, cap_meta;
	bool has_meta;
	struct castfs_qtensor *qt;
	size_t nqt, cap_qt;
	/* castfs_pb_share_meta(): where the source keeps its metadata text,
	 * and the reference this builder took (handed to the plan). */
	_Atomic(struct castfs_shared *) *meta_slot;
	struct castfs_shared *meta_text;
};

static void chunks_free(struct arena_chunk *c)
{
	while (c) {
		struct arena_chunk *next = c->next;

		free(c);
		c = next;
	}
}

static void arena_free(struct arena *a)
{
	chunks_free(a->head);
	*a = (struct arena){ 0 };
}

/* Small allocations are carved from chunks that grow with the builder
 * (1 KiB, doubling to 64 KiB): a plan of 100,000 quantised tensors makes
 * over a million of them, and a malloc each cost a third of its memory. */
#define ARENA_MIN 1024u
#define ARENA_MAX (64u << 10)
#define ARENA_ALIGN sizeof(max_align_t)
#define MALLOC_OVERHEAD 16u /* glibc's chunk header, for the accounting */

/* A new zeroed chunk of @n bytes in @a, or NULL. */
static void *arena_chunk_new(struct arena *a, size_t n)
{
	struct arena_chunk *c;

	if (n > SIZE_MAX - sizeof(*c) - MALLOC_OVERHEAD)
		return NULL;
	c = calloc(1, sizeof(*c) + n);
	if (!c)
		return NULL;
	c->next = a->head;
	a->head = c;
	a->bytes += sizeof(*c) + n + MALLOC_OVERHEAD;
	ARENA_POISON(c->data, n);
	return c->data;
}

static void *arena_alloc(struct arena *a, size_t n)
{
	size_t need = (CASTFS_MAX(n, 1) + ARENA_REDZONE + ARENA_ALIGN - 1) &
		      ~(ARENA_ALIGN - 1);
	size_t size;
	void *p;

	if (n > ARENA_MAX / 4) {
		p = arena_chunk_new(a, n); /* its own: the current stays */
		if (p)
			ARENA_UNPOISON(p, n);
		return p;
	}
	if (need > a->left) {
		size = CASTFS_MIN(CASTFS_MAX(a->bytes, ARENA_MIN), ARENA_MAX);
		size = CASTFS_MAX(size, need);
		a->at = arena_chunk_new(a, size);
		a->left = a->at ? size : 0;
		if (!a->at)
			return NULL;
	}
	p = a->at;
	a->at += need;
	a->left -= need;
	ARENA_UNPOISON(p, n);
	return p;
}

void *castfs_pb_alloc(struct castfs_pb *pb, size_t n)
{
	return arena_alloc(&pb->keep, n);
}

static void *arena_dup(struct arena *a, const void *src, size_t n)
{
	/* One spare byte keeps copied strings NUL-terminated. */
	void *dst = arena_alloc(a, n + 1);

	if (dst && n)
		memcpy(dst, src, n);
	return dst;
}

static void *pb_dup(struct castfs_pb *pb, const void *src, size_t n)
{
	return arena_dup(&pb->keep, src, n);
}

/* Grow *@arr (of @size-byte items) so that it holds at least @need items. */
static int grow(void **arr, size_t *cap, size_t need, size_t size)
{
	size_t ncap = *cap ? *cap : 16;
	void *n;

	if (need <= *cap)
		return 0;
	while (ncap < need) {
		if (ncap > SIZE_MAX / 2 / size)
			return -ENOMEM;
		ncap *= 2;
	}
	n = realloc(*arr, ncap * size);
	if (!n)
		return -ENOMEM;
	*arr = n;
	*cap = ncap;
	return 0;
}

int castfs_pb_new(struct castfs_pb **out)
{
	struct castfs_pb *pb = calloc(1, sizeof(*pb));

	if (!pb)
		return -ENOMEM;
	*out = pb;
	return 0;
}

void castfs_pb_free(struct castfs_pb *pb)
{
	if (!pb)
		return;
	arena_free(&pb->keep);
	arena_free(&pb->tmp);
	free(pb->ext);
	free(pb->t);
	free(pb->meta);
	free(pb->qt);
	castfs_shared_put(pb->meta_text);
	free(pb);
}

/* Two extents can merge when the second continues the first's source. */
static bool extent_continues(const struct castfs_extent *a,
			     const struct castfs_extent *b)
{
	uint64_t src_elems;

	if (a->op != b->op || a->out_off + a->len != b->out_off)
		return false;
	if (a->op == CASTFS_OP_COPY)
		return a->src_off + a->len == b->src_off;
	if (a->op != CASTFS_OP_CAST || a->src_dtype != b->src_dtype ||
	    a->dst_dtype != b->dst_dtype || a->flags != b->flags)
		return false;
	src_elems = a->len / a->unit;
	return a->src_off + src_elems * (castfs_dtype_bits(a->src_dtype) / 8) ==
	       b->src_off;
}

static int pb_push_extent(struct castfs_pb *pb, const struct castfs_producer *p,
			  uint64_t out_off, uint64_t len)
{
	struct castfs_extent e = {
		.out_off = out_off,
		.len = len,
		.src_off = p->src_off,
		.qt = p->qt,
		.unit = p->unit ? p->unit : 1,
		.op = p->op,
		.src_dtype = p->src_dtype,
		.dst_dtype = p->dst_dtype,
		.flags = p->flags,
	};
	int rc;

	if (len == 0)
		return 0; /* empty tensors own no bytes */
	if (e.op == CASTFS_OP_CAST) {
		e.cvt = castfs_convert_get(e.src_dtype, e.dst_dtype, e.flags);
		if (!e.cvt)
			return -ENOTSUP;
	}
	if (e.op == CASTFS_OP_INTS || (p->mem && p->mem_kept)) {
		e.mem = p->mem; /* already the plan's, or static */
	} else if (p->mem) {
		e.mem = pb_dup(pb, p->mem, len);
		if (!e.mem)
			return -ENOMEM;
	}
	if (pb->next && extent_continues(&pb->ext[pb->next - 1], &e)) {
		pb->ext[pb->next - 1].len += len;
		return 0;
	}
	rc = grow((void **)&pb->ext, &pb->cap_ext, pb->next + 1,
		  sizeof(*pb->ext));
	if (rc)
		return rc;
	pb->ext[pb->next++] = e;
	return 0;
}

int castfs_pb_append(struct castfs_pb *pb, const struct castfs_producer *p,
		     uint64_t len)
{
	uint64_t end;
	int rc;

	if (castfs_ckd_add(&end, pb->size, len))
		return -EOVERFLOW;
	rc = pb_push_extent(pb, p, pb->size, len);
	if (rc)
		return rc;
	pb->size = end;
	return 0;
}

int castfs_pb_add_tensor(struct castfs_pb *pb, const char *name,
			 size_t name_len, enum castfs_dtype dtype,
			 uint32_t ndim, const uint64_t *shape,
			 const struct castfs_producer *p)
{
	struct pb_tensor t = { .p = *p, .dtype = dtype, .ndim = ndim };
	uint64_t nelems;
	int rc;

	rc = castfs_shape_nelems(shape, ndim, &nelems);
	if (!rc)
		rc = castfs_tensor_nbytes(dtype, nelems, &t.nbytes);
	if (rc)
		return rc;
	t.name = arena_dup(&pb->tmp, name, name_len);
	t.shape = arena_dup(&pb->tmp, shape, ndim * sizeof(*shape));
	if (!t.name || !t.shape)
		return -ENOMEM;
	t.name_len = name_len;
	if (p->op == CASTFS_OP_CAST) {
		t.p.dst_dtype = (uint8_t)dtype;
		t.p.unit = castfs_dtype_bits(dtype) / 8;
	}
	rc = grow((void **)&pb->t, &pb->cap_t, pb->nt + 1, sizeof(*pb->t));
	if (rc)
		return rc;
	pb->t[pb->nt++] = t;
	return 0;
}

void castfs_pb_mark_late(struct castfs_pb *pb)
{
	if (pb->nt)
		pb->t[pb->nt - 1].late = true;
}

int castfs_pb_add_meta(struct castfs_pb *pb, const char *key, size_t key_len,
		       const char *value, size_t value_len)
{
	/* Borrowed, not copied: a source's __metadata__ may be tens of MB,
	 * and a copy per view stayed in every plan's arena. */
	struct castfs_meta_kv kv = {
		.key = key,
		.value = value,
		.key_len = key_len,
		.value_len = value_len,
	};
	int rc = grow((void **)&pb->meta, &pb->cap_meta, pb->nmeta + 1,
		      sizeof(*pb->meta));
	if (rc)
		return rc;
	pb->meta[pb->nmeta++] = kv;
	pb->has_meta = true;
	return 0;
}

int castfs_pb_add_qtensor(struct castfs_pb *pb, const struct castfs_qtensor *q,
			  uint32_t *idx)
{
	int rc = grow((void **)&pb->qt, &pb->cap_qt, pb->nqt + 1,
		      sizeof(*pb->qt));

	if (rc)
		return rc;
	if (pb->nqt >= UINT32_MAX)
		return -EOVERFLOW;
	pb->qt[pb->nqt] = *q;
	*idx = (uint32_t)pb->nqt++;
	return 0;
}

static int pb_freeze_qtensors(struct castfs_pb *pb, struct castfs_plan *p)
{
	if (!pb->nqt)
		return 0;
	p->qtensors = pb_dup(pb, pb->qt, pb->nqt * sizeof(*pb->qt));
	p->qstats = castfs_pb_alloc(pb, pb->nqt * sizeof(*p->qstats));
	p->qcache = castfs_pb_alloc(pb, sizeof(*p->qcache));
	if (p->qcache)
		p->qcache->qt =
			castfs_pb_alloc(pb, pb->nqt * sizeof(*p->qcache->qt));
	if (!p->qtensors || !p->qstats || !p->qcache || !p->qcache->qt)
		return -ENOMEM;
	for (size_t i = 0; i < pb->nqt; i++)
		pthread_mutex_init(&p->qstats[i].lock, NULL);
	pthread_mutex_init(&p->qcache->lock, NULL);
	p->nqt = pb->nqt;
	return 0;
}

int castfs_pb_finish_raw(struct castfs_pb *pb, struct castfs_plan **out)
{
	struct castfs_plan *p = calloc(1, sizeof(*p));
	int rc = -ENOMEM;

	if (!p)
		goto out_free_pb;
	rc = pb_freeze_qtensors(pb, p);
	if (rc)
		goto out_free_plan;
	p->size = pb->size;
	p->nextents = pb->next;
	p->extents = pb->ext;
	pb->ext = NULL;
	p->arena = pb->keep.head;
	p->arena_bytes = pb->keep.bytes;
	pb->keep = (struct arena){ 0 };
	p->meta_text = pb->meta_text;
	pb->meta_text = NULL;
	*out = p;
	castfs_pb_free(pb);
	return 0;

out_free_plan:
	free(p);
out_free_pb:
	castfs_pb_free(pb);
	return rc;
}

/*
 * Whether bytes made by @op need a pass over their whole tensor first
 * (bnb's double-quantisation statistics, NVFP4's global scale, ComfyUI's
 * per-tensor scale), or over much of it for a few bytes (a
 * compressed-tensors weight_scale: a 2-byte channel scale per row of the
 * weight): they go to the end of the file, so reading the header never
 * waits for one, and a sequential read meets the weight's codes first,
 * which keep their scales for it (docs/FORMATS.md). The codes that
 * depend on a tensor-wide scale stay in place: they are that tensor's
 * own bytes.
 */
static bool pb_op_late(enum castfs_op op)
{
	return op == CASTFS_OP_Q4_QABSMAX || op == CASTFS_OP_Q4_NESTED_ABSMAX ||
	       op == CASTFS_OP_Q4_STATE || op == CASTFS_OP_CT_GSCALE ||
	       op == CASTFS_OP_CT_SCALE;
}

void castfs_pb_share_meta(struct castfs_pb *pb,
			  _Atomic(struct castfs_shared *) *slot)
{
	pb->meta_slot = slot;
}

/* Where a header's "__metadata__" object begins: after the 8 length
 * bytes and '{"__metadata__":' (it is written first). */
#define META_AT (8 + 1 + sizeof("\"__metadata__\":") - 1)

/*
 * The metadata object text of @pb's pairs, alone: the header of no tensors
 * less its prefix, its closing '}' and its padding. A new reference, or
 * NULL (out of memory, or a header the emitter refuses).
 */
static struct castfs_shared *meta_text_new(const struct castfs_pb *pb)
{
	struct castfs_shared *s = NULL;
	uint8_t *hdr;
	size_t len, end;

	if (castfs_header_emit(NULL, 0, true, pb->meta, pb->nmeta, &hdr, &len,
			       NULL))
		return NULL;
	end = len;
	while (end > META_AT && hdr[end - 1] == ' ')
		end--;
	if (end > META_AT + 1) /* drop the header's closing '}' */
		s = castfs_shared_new(hdr + META_AT, end - 1 - META_AT);
	free(hdr);
	return s;
}

/*
 * A reference to the source's metadata text when @hdr (a view's header)
 * holds it at META_AT, building and publishing it on first use; NULL when
 * not worth sharing or not found, and the header is then kept whole. The
 * bytes are compared, never assumed: the file is @hdr whichever way.
 */
static struct castfs_shared *meta_text_of(struct castfs_pb *pb,
					  const uint8_t *hdr, size_t hdr_len)
{
	struct castfs_shared *cur, *mine;

	if (!pb->meta_slot || !pb->has_meta ||
	    hdr_len < META_AT + CASTFS_META_SHARE_MIN)
		return NULL;
	cur = atomic_load_explicit(pb->meta_slot, memory_order_acquire);
	if (!cur) {
		mine = meta_text_new(pb);
		if (!mine)
			return NULL;
		cur = NULL;
		if (atomic_compare_exchange_strong_explicit(
			    pb->meta_slot, &cur, mine, memory_order_acq_rel,
			    memory_order_acquire))
			cur = mine; /* published: the slot holds our reference */
		else
			castfs_shared_put(mine); /* another builder won */
	}
	if (cur->len < CASTFS_META_SHARE_MIN || cur->len > hdr_len - META_AT ||
	    memcmp(hdr + META_AT, cur->bytes, cur->len))
		return NULL;
	return castfs_shared_get(cur);
}

/* Append header @hdr as MEM extents: its metadata object borrowed from
 * the shared text when there is one (the plan keeps a reference), the
 * rest copied into the plan. */
static int pb_append_header(struct castfs_pb *pb, const uint8_t *hdr,
			    size_t hdr_len)
{
	struct castfs_shared *m = meta_text_of(pb, hdr, hdr_len);
	int rc;

	if (!m)
		return castfs_pb_append(
			pb,
			&(struct castfs_producer){ .op = CASTFS_OP_MEM,
						   .mem = hdr },
			hdr_len);
	castfs_shared_put(pb->meta_text);
	pb->meta_text = m;
	rc = castfs_pb_append(pb,
			      &(struct castfs_producer){ .op = CASTFS_OP_MEM,
							 .mem = hdr },
			      META_AT);
	if (!rc)
		rc = castfs_pb_append(
			pb,
			&(struct castfs_producer){ .op = CASTFS_OP_MEM,
						   .mem = m->bytes,
						   .mem_kept = true },
			m->len);
	if (!rc)
		rc = castfs_pb_append(pb,
				      &(struct castfs_producer){
					      .op = CASTFS_OP_MEM,
					      .mem = hdr + META_AT + m->len },
				      hdr_len - META_AT - m->len);
	return rc;
}

/* Lay the tensors out through the emitter, then add their extents. */
static int pb_layout(struct castfs_pb *pb, struct castfs_diag *d)
{
	struct castfs_emit_tensor *et;
	uint8_t *hdr;
	size_t hdr_len;
	uint64_t data_start;
	int rc;

	et = calloc(pb->nt ? pb->nt : 1, sizeof(*et));
	if (!et)
		return -ENOMEM;
	for (size_t i = 0; i < pb->nt; i++) {
		et[i] = (struct castfs_emit_tensor){
			.name = pb->t[i].name,
			.name_len = pb->t[i].name_len,
			.dtype = pb->t[i].dtype,
			.ndim = pb->t[i].ndim,
			.shape = pb->t[i].shape,
			.nbytes = pb->t[i].nbytes,
			.cookie = (uint32_t)i,
			.late = pb->t[i].late || pb_op_late(pb->t[i].p.op),
		};
	}
	rc = castfs_header_emit(et, pb->nt, pb->has_meta, pb->meta, pb->nmeta,
				&hdr, &hdr_len, d);
	if (rc)
		goto out_free_et;
	rc = pb_append_header(pb, hdr, hdr_len);
	free(hdr);
	data_start = pb->size;
	for (size_t i = 0; !rc && i < pb->nt; i++) {
		const struct pb_tensor *t = &pb->t[et[i].cookie];

		if (data_start + et[i].begin != pb->size) {
			rc = -EINVAL; /* the emitter must pack back to back */
			break;
		}
		rc = castfs_pb_append(pb, &t->p, t->nbytes);
	}
out_free_et:
	free(et);
	return rc;
}

int castfs_pb_finish_safetensors(struct castfs_pb *pb, struct castfs_plan **out,
				 struct castfs_diag *d)
{
	int rc;

	if (pb->next) {
		castfs_pb_free(pb);
		return -EINVAL; /* raw extents and tensors do not mix */
	}
	rc = pb_layout(pb, d);
	if (rc) {
		castfs_pb_free(pb);
		return rc;
	}
	return castfs_pb_finish_raw(pb, out);
}

void castfs_plan_free(struct castfs_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nqt; i++) {
		pthread_mutex_destroy(&p->qstats[i].lock);
		free(p->qstats[i].nested_absmax);
		free(p->qstats[i].qc);
		free(p->qstats[i].qc_valid);
		castfs_q4_groups_free(p->qstats[i].groups);
	}
	if (p->qcache)
		pthread_mutex_destroy(&p->qcache->lock);
	castfs_shared_put(p->meta_text);
	chunks_free(p->arena);
	free(p->extents);
	free(p);
}

size_t castfs_plan_find(const struct castfs_plan *p, uint64_t off)
{
	size_t lo = 0, hi = p->nextents;

	/* The last extent whose start is <= off. */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->extents[mid].out_off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

const char *castfs_op_name(enum castfs_op op)
{
	static const char *const names[CASTFS_OP_COUNT] = {
		[CASTFS_OP_MEM] = "mem",
		[CASTFS_OP_COPY] = "copy",
		[CASTFS_OP_CAST] = "cast",
		[CASTFS_OP_Q4_CODES] = "q4-codes",
		[CASTFS_OP_Q4_ABSMAX] = "q4-absmax",
		[CASTFS_OP_Q4_QABSMAX] = "q4-absmax-dq",
		[CASTFS_OP_Q4_NESTED_ABSMAX] = "q4-nested-absmax",
		[CASTFS_OP_Q4_STATE] = "q4-state",
		[CASTFS_OP_I8_CODES] = "int8-codes",
		[CASTFS_OP_I8_SCB] = "int8-scb",
		[CASTFS_OP_DEQ_FP8] = "dequant-fp8",
		[CASTFS_OP_F8_CODES] = "fp8-codes",
		[CASTFS_OP_I4_PACKED] = "int4-packed",
		[CASTFS_OP_CT_SCALE] = "ct-scale",
		[CASTFS_OP_CT_GSCALE] = "ct-global-scale",
		[CASTFS_OP_GGUF_BLOCKS] = "gguf-blocks",
		[CASTFS_OP_DEQ_MXFP4] = "dequant-mxfp4",
		[CASTFS_OP_DEQ_Q4] = "dequant-bnb4",
		[CASTFS_OP_DEQ_W4] = "dequant-int4",
		[CASTFS_OP_DEQ_BF16] = "dequant-bf16",
		[CASTFS_OP_INTS] = "ints",
	};

	if ((unsigned)op >= CASTFS_OP_COUNT)
		return "?";
	return names[op];
}
