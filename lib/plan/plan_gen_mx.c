/* SPDX-License-Identifier: MIT */
/*
 * The gpt-oss MXFP4 dequantizer, exactly as transformers'
 * convert_moe_packed_tensors() computes it on CPU: the low nibble of code
 * byte b is element 2b, the high nibble element 2b + 1; each E2M1 value
 * times 2^(scale - 127) in one fp32 multiply (torch.ldexp), then the
 * view's cast; each [rows, cols] matrix transposed to [cols, rows].
 *
 * Output row h (source column h) needs a few bytes of every source row,
 * so a round reads, per slab of source rows, the one span from its first
 * row's needed bytes to its last row's: only whole rows in between, no
 * more than the rows the range needs.
 */
#include <errno.h>

#include "common/bytes.h"
#include "common/compiler.h"
#include "kernels/convert.h"
#include "plan/plan_internal.h"

/* Output elements per round: their fp32 values use MX_F32 bytes of the
 * scratch, the code slab MX_CODES, the scale slab the rest. */
#define MX_CHUNK (64u << 10)
#define MX_F32 (MX_CHUNK * 4u)
#define MX_CODES (1u << 20)
/* Elements per MXFP4 block: one scale byte, 16 code bytes. */
#define CASTFS_MX_GROUP 32u

_Static_assert(MX_F32 + MX_CODES + (256u << 10) <= CASTFS_SCRATCH_LEN,
	       "the slabs of a round fit the scratch");

/* E2M1, as transformers' FP4_VALUES (sign is bit 3). */
static const float fp4_value[16] = {
	+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
	-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/*
 * E2M1 code @c times 2^(@b - 127), exactly as torch.ldexp computes it:
 * the exact product, rounded once by the view's cast. The product of a
 * 2-bit significand and a power of two is exact in fp32 from 2^-149 to
 * the top of its range, so one fp32 multiply is exact: 0 is the
 * subnormal 2^-127, and 0xFF is 2^128 (transformers subtracts 127 from
 * the integer byte: not the NaN of float8_e8m0fnu), which fp32 lacks, so
 * it is taken as (2 x value) x 2^127, finite for the halves (as torch).
 */
static float mx_value(uint8_t c, uint8_t b)
{
	if (b == 0)
		return fp4_value[c] * castfs_f32_from_bits(0x00400000u);
	if (b == 0xFF)
		return fp4_value[c] * 2.0f * castfs_f32_from_bits(0x7F000000u);
	return fp4_value[c] * castfs_f32_from_bits((uint32_t)b << 23);
}

/* The geometry of one round: matrix @m, its output elements [in, in+n). */
struct mx_round {
	uint64_t m, in, n;
	uint64_t h0, h1; /* output rows (source columns) touched */
	uint64_t b0, nb; /* code bytes of a source row it needs */
	uint64_t s0, ns; /* scale bytes of a source row it needs */
};

static void mx_round_init(const struct castfs_qtensor *q, uint64_t k,
			  uint64_t n, struct mx_round *r)
{
	uint64_t mat = q->rows * q->cols;

	r->m = k / mat;
	r->in = k % mat;
	r->n = n;
	r->h0 = r->in / q->rows;
	r->h1 = (r->in + n - 1) / q->rows;
	r->b0 = r->h0 / 2;
	r->nb = r->h1 / 2 + 1 - r->b0;
	r->s0 = r->h0 / CASTFS_MX_GROUP;
	r->ns = r->h1 / CASTFS_MX_GROUP + 1 - r->s0;
}

/* Fill the outputs of source rows [@j0, @j1) from their slabs. */
static void mx_fill(const struct castfs_qtensor *q, const struct mx_round *r,
		    uint64_t j0, uint64_t j1, const uint8_t *codes,
		    const uint8_t *scales, float *f)
{
	uint64_t rb = q->cols / 2, sb = q->cols / CASTFS_MX_GROUP;

	for (uint64_t j = j0; j < j1; j++) {
		const uint8_t *c = codes + (j - j0) * rb - r->b0;
		const uint8_t *s = scales + (j - j0) * sb - r->s0;

		for (uint64_t h = r->h0; h <= r->h1; h++) {
			uint64_t o = h * q->rows + j;
			uint8_t byte;

			if (o < r->in || o >= r->in + r->n)
				continue;
			byte = c[h / 2];
			f[o - r->in] = mx_value(h & 1 ? byte >> 4 : byte & 15,
						s[h / CASTFS_MX_GROUP]);
		}
	}
}

/* One round: the fp32 values of output elements [k, k + n) of a matrix. */
static int mx_round(const struct castfs_reader *src,
		    const struct castfs_qtensor *q, uint64_t k, uint64_t n,
		    float *f, uint8_t *codes, uint8_t *scales, size_t slen)
{
	uint64_t rb = q->cols / 2, sb = q->cols / CASTFS_MX_GROUP;
	uint64_t j0 = 0, jend = q->rows, per;
	struct mx_round r;

	mx_round_init(q, k, n, &r);
	if (r.h0 == r.h1) { /* part of one output row: only its rows */
		j0 = r.in % q->rows;
		jend = (r.in + n - 1) % q->rows + 1;
	}
	/* Rows per slab: the plan bounded rb by MX_CODES / 2. */
	per = CASTFS_MIN(1 + (MX_CODES - r.nb) / rb, 1 + (slen - r.ns) / sb);
	while (j0 < jend) {
		uint64_t j1 = CASTFS_MIN(jend, j0 + per);
		uint64_t row = r.m * q->rows + j0;
		int rc = castfs_reader_read(src, codes,
					    (size_t)((j1 - 1 - j0) * rb + r.nb),
					    q->src_off + row * rb + r.b0);

		if (!rc)
			rc = castfs_reader_read(
				src, scales,
				(size_t)((j1 - 1 - j0) * sb + r.ns),
				q->scale_off + row * sb + r.s0);
		if (rc)
			return rc;
		mx_fill(q, &r, j0, j1, codes, scales, f);
		j0 = j1;
	}
	return 0;
}

int castfs_gen_deq_mxfp4(const struct castfs_read_env *env,
			 const struct castfs_extent *e, uint64_t first,
			 uint64_t count, uint8_t *dst)
{
	const struct castfs_qtensor *q = &env->plan->qtensors[e->qt];
	uint64_t mat = q->rows * q->cols, k = first;
	uint8_t *codes = env->s->buf + MX_F32;
	uint8_t *scales = codes + MX_CODES;
	float *f = (float *)(void *)env->s->buf;
	castfs_convert_fn enc;

	enc = castfs_convert_get(CASTFS_DTYPE_F32, e->dst_dtype, e->flags);
	if (!enc)
		return -ENOTSUP; /* unreachable: the plan checked the pair */
	while (count) {
		uint64_t n = CASTFS_MIN(CASTFS_MIN(count, (uint64_t)MX_CHUNK),
					mat - k % mat);
		int rc = mx_round(env->src, q, k, n, f, codes, scales,
				  env->s->len - MX_F32 - MX_CODES);

		if (rc)
			return rc;
		enc(dst, f, (size_t)n);
		dst += n * e->unit;
		k += n;
		count -= n;
	}
	return 0;
}

uint64_t castfs_mxfp4_src_off(const struct castfs_qtensor *q, uint64_t k)
{
	uint64_t mat = q->rows * q->cols, in;

	k = CASTFS_MIN(k, q->nelems - 1);
	in = k % mat;
	return q->src_off +
	       ((k / mat * q->rows + in % q->rows) * q->cols + in / q->rows) /
		       2;
}
