/* SPDX-License-Identifier: MIT */
/*
 * Conversion kernels: every SIMD kernel against the scalar reference, bit for
 * bit, and the reference against values derived from the formats' definitions.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kernels/convert.h"
#include "unit.h"

#define NSRC 6
#define NDST 5
#define NPAIRS (NSRC * NDST * 2)
#define NSWEEP (4u << 20)

static const enum castfs_dtype srcs[NSRC] = {
	CASTFS_DTYPE_F64,  CASTFS_DTYPE_F32,	 CASTFS_DTYPE_F16,
	CASTFS_DTYPE_BF16, CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F8_E5M2,
};

static const enum castfs_dtype dsts[NDST] = {
	CASTFS_DTYPE_F32,     CASTFS_DTYPE_F16,	    CASTFS_DTYPE_BF16,
	CASTFS_DTYPE_F8_E4M3, CASTFS_DTYPE_F8_E5M2,
};

struct pair {
	enum castfs_dtype from, to;
	unsigned flags;
};

/* Loop index -> (source, target, flags); targets vary fastest. */
static struct pair pair_at(int i)
{
	struct pair p = { srcs[i / (NDST * 2)], dsts[(i / 2) % NDST],
			  (i & 1) ? CASTFS_CVT_SATURATE : 0 };
	return p;
}

static bool is_fp8(enum castfs_dtype dt)
{
	return dt == CASTFS_DTYPE_F8_E4M3 || dt == CASTFS_DTYPE_F8_E5M2;
}

static bool pair_supported(struct pair p)
{
	return !p.flags || is_fp8(p.to);
}

static size_t size_of(enum castfs_dtype dt)
{
	return castfs_dtype_bits(dt) / 8;
}

/* xorshift64*: fixed seeds make every run see the same inputs. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(p);
	return p;
}

static uint64_t load_elem(const uint8_t *p, size_t sz, size_t i)
{
	switch (sz) {
	case 1:
		return p[i];
	case 2:
		return castfs_load_le16(p + 2 * i);
	case 4:
		return castfs_load_le32(p + 4 * i);
	default:
		return castfs_load_le64(p + 8 * i);
	}
}

static void store_elem(uint8_t *p, size_t sz, size_t i, uint64_t v)
{
	switch (sz) {
	case 1:
		p[i] = (uint8_t)v;
		break;
	case 2:
		castfs_store_le16(p + 2 * i, (uint16_t)v);
		break;
	case 4:
		castfs_store_le32(p + 4 * i, (uint32_t)v);
		break;
	default:
		castfs_store_le64(p + 8 * i, v);
		break;
	}
}

/* The f32 value @f as a double, plus @low in the bits a float lacks. */
static uint64_t f64_near(uint32_t f, uint64_t low)
{
	return castfs_f64_bits(castfs_f32_from_bits(f)) + low;
}

/*
 * Inputs for @from: every pattern of the 8- and 16-bit types; for F32 every
 * bf16 pattern with four kinds of low halves (exact, tie, below tie,
 * random); for F64 random bits, and those F32 values as doubles exactly, at
 * a float rounding tie, or one above it.
 */
static uint8_t *make_inputs(enum castfs_dtype from, size_t *n)
{
	size_t sz = size_of(from),
	       count = sz <= 2 ? (size_t)1 << (8 * sz) : (size_t)1 << 18;
	uint8_t *buf = xmalloc(count * sz);
	uint64_t seed = 0x9e3779b97f4a7c15u;
	static const uint32_t low[4] = { 0, 0x8000, 0x7fff, 0 };
	static const uint64_t tie[3] = { 0, 1 << 28, (1 << 28) + 1 };

	for (size_t i = 0; i < count; i++) {
		uint32_t f = (uint32_t)(i & 0xffff) << 16 | low[i >> 16];
		uint64_t r = rng_next(&seed);

		if (i >> 16 == 3)
			f |= (uint32_t)r & 0xffff;
		if (sz <= 2)
			store_elem(buf, sz, i, i);
		else if (sz == 4)
			store_elem(buf, sz, i, f);
		else if (i % 3 == 0)
			store_elem(buf, sz, i, r);
		else
			store_elem(buf, sz, i, f64_near(f, tie[i / 3 % 3]));
	}
	*n = count;
	return buf;
}

/* First element where @a and @b differ, reported with its input. */
static void assert_same(const uint8_t *a, const uint8_t *b, const uint8_t *in,
			struct pair p, size_t n, const char *what)
{
	size_t dsz = size_of(p.to), ssz = size_of(p.from);

	if (memcmp(a, b, n * dsz) == 0)
		return;
	for (size_t i = 0; i < n; i++) {
		uint64_t x = load_elem(a, dsz, i), y = load_elem(b, dsz, i);

		if (x != y)
			ck_abort_msg("%s %s->%s%s: element %zu in %#llx: "
				     "scalar %#llx, got %#llx",
				     what, castfs_dtype_name(p.from),
				     castfs_dtype_name(p.to),
				     p.flags ? " sat" : "", i,
				     (unsigned long long)load_elem(in, ssz, i),
				     (unsigned long long)x,
				     (unsigned long long)y);
	}
}

/* Runs @in through the scalar kernel and @isa's, and compares. */
static void compare_isa(enum castfs_isa isa, struct pair p, const uint8_t *in,
			size_t n)
{
	castfs_convert_fn ref, fn;
	uint8_t *a = xmalloc(n * size_of(p.to)),
		*b = xmalloc(n * size_of(p.to));

	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, p.from, p.to, p.flags);
	fn = castfs_convert_get_isa(isa, p.from, p.to, p.flags);
	ck_assert_ptr_nonnull(ref);
	ck_assert_ptr_nonnull(fn);
	ref(a, in, n);
	fn(b, in, n);
	assert_same(a, b, in, p, n, castfs_isa_name(isa));
	free(a);
	free(b);
}

/* Loop index over (ISA, pair); false where the ISA cannot run here. */
static bool isa_pair_at(int i, enum castfs_isa *isa, struct pair *p)
{
	*isa = (enum castfs_isa)(i / NPAIRS);
	*p = pair_at(i % NPAIRS);
	if (!castfs_isa_available(*isa)) {
		ck_assert_ptr_null(
			castfs_convert_get_isa(*isa, p->from, p->to, p->flags));
		return false;
	}
	return true;
}

/* An ISA this CPU cannot run hands out no kernel at all. */
START_TEST(test_kernels__unavailable_isa_has_no_kernels)
{
	enum castfs_isa isa;
	struct pair p;

	if (isa_pair_at(_i, &isa, &p))
		return; /* available: the tests above check its kernels */
	ck_assert_ptr_null(castfs_convert_get_isa(isa, p.from, p.to, p.flags));
}
END_TEST

START_TEST(test_kernels__isa_matches_scalar_on_all_patterns)
{
	enum castfs_isa isa;
	struct pair p;
	uint8_t *in;
	size_t n;

	if (!isa_pair_at(_i, &isa, &p))
		return;
	if (!pair_supported(p)) {
		ck_assert_ptr_null(
			castfs_convert_get_isa(isa, p.from, p.to, p.flags));
		return;
	}
	in = make_inputs(p.from, &n);
	compare_isa(isa, p, in, n);
	free(in);
}
END_TEST

/* Half uniform bit patterns, half magnitudes near the fp8/f16 range. */
START_TEST(test_kernels__isa_matches_scalar_on_random_f32)
{
	enum castfs_isa isa = (enum castfs_isa)(_i / (NDST * 2));
	struct pair p = pair_at(NDST * 2 + _i % (NDST * 2)); /* F32 source */
	uint64_t seed = 0x2545f4914f6cdd1du;
	uint8_t *in;

	ck_assert_int_eq(p.from, CASTFS_DTYPE_F32);
	if (!castfs_isa_available(isa) || !pair_supported(p))
		return;
	in = xmalloc(NSWEEP * 4);
	for (size_t i = 0; i < NSWEEP; i++) {
		uint32_t r = (uint32_t)(rng_next(&seed) >> 32);

		if (i & 1) /* biased exponent 96..159 */
			r = (r & 0x807fffff) | (96 + (r >> 23 & 63)) << 23;
		castfs_store_le32(in + 4 * i, r);
	}
	compare_isa(isa, p, in, NSWEEP);
	free(in);
}
END_TEST

/*
 * n = 0..67 at every source and destination offset 0..3: the SIMD body,
 * the scalar tail, unaligned access, and no write outside [0, n).
 */
START_TEST(test_kernels__isa_handles_odd_lengths_and_alignment)
{
	enum castfs_isa isa;
	struct pair p;
	uint8_t in[3 + 67 * 8], a[3 + 67 * 4 + 16], b[sizeof(a)];
	uint64_t seed = 42;
	castfs_convert_fn ref, fn;

	if (!isa_pair_at(_i, &isa, &p) || !pair_supported(p))
		return;
	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (uint8_t)rng_next(&seed);
	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, p.from, p.to, p.flags);
	fn = castfs_convert_get_isa(isa, p.from, p.to, p.flags);
	for (size_t n = 0; n <= 67; n++) {
		for (unsigned off = 0; off < 16; off++) {
			unsigned so = off & 3, d = off >> 2;

			memset(a, 0xa5, sizeof(a));
			memset(b, 0xa5, sizeof(b));
			ref(a + d, in + so, n);
			fn(b + d, in + so, n);
			ck_assert_msg(memcmp(a, b, sizeof(a)) == 0,
				      "%s %s->%s%s: n=%zu src+%u dst+%u differ",
				      castfs_isa_name(isa),
				      castfs_dtype_name(p.from),
				      castfs_dtype_name(p.to),
				      p.flags ? " sat" : "", n, so, d);
		}
	}
}
END_TEST

/* Value encoding of the formats, from their definitions alone. */
struct fmt {
	int ebits, mbits;
	bool fn; /* e4m3fn: no Inf, only all-ones is NaN */
};

static const struct fmt fmts[CASTFS_DTYPE_COUNT] = {
	[CASTFS_DTYPE_F64] = { 11, 52, false },
	[CASTFS_DTYPE_F32] = { 8, 23, false },
	[CASTFS_DTYPE_F16] = { 5, 10, false },
	[CASTFS_DTYPE_BF16] = { 8, 7, false },
	[CASTFS_DTYPE_F8_E4M3] = { 4, 3, true },
	[CASTFS_DTYPE_F8_E5M2] = { 5, 2, false },
};

static struct fmt fmt_of(enum castfs_dtype dt)
{
	return fmts[dt];
}

static int fmt_bias(struct fmt f)
{
	return (1 << (f.ebits - 1)) - 1;
}

static double fmt_max(struct fmt f)
{
	int top = (1 << f.ebits) - 1, bias = fmt_bias(f);

	if (f.fn) /* top exponent is finite, minus the NaN mantissa */
		return ldexp(2.0 - ldexp(1.0, 1 - f.mbits), top - bias);
	return ldexp(2.0 - ldexp(1.0, -f.mbits), top - 1 - bias);
}

static double decode(uint64_t bits, struct fmt f)
{
	uint64_t mmask = (UINT64_C(1) << f.mbits) - 1;
	uint64_t emax = (UINT64_C(1) << f.ebits) - 1;
	uint64_t e = bits >> f.mbits & emax, m = bits & mmask;
	bool neg = bits >> (f.ebits + f.mbits) & 1;
	double v;

	if (e == emax && (!f.fn || m == mmask))
		v = f.fn || m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp((double)m, 1 - fmt_bias(f) - f.mbits);
	else
		v = ldexp((double)(m | (mmask + 1)),
			  (int)e - fmt_bias(f) - f.mbits);
	return copysign(v, neg ? -1.0 : 1.0);
}

/*
 * |x| rounded to nearest, ties to even, at the precision of @f; exponent
 * unbounded above, subnormal spacing below. rint() is ties-to-even.
 */
static double round_ideal(double ax, struct fmt f)
{
	int e;
	double ulp;

	if (ax == 0 || !isfinite(ax))
		return ax;
	frexp(ax, &e);
	e = e - 1 < 1 - fmt_bias(f) ? 1 - fmt_bias(f) : e - 1;
	ulp = ldexp(1.0, e - f.mbits);
	return rint(ax / ulp) * ulp;
}

/* What torch's x.to(@to) is: round once; overflow to Inf, or NaN (fn). */
static double expect(double x, enum castfs_dtype to, bool sat)
{
	struct fmt f = fmt_of(to);
	double r = fabs(x);

	if (isnan(x))
		return x;
	if (sat)
		r = fmin(r, fmt_max(f));
	r = round_ideal(r, f);
	if (r > fmt_max(f))
		r = f.fn ? NAN : INFINITY;
	return copysign(r, x);
}

static bool same_value(double want, double got)
{
	if (signbit(want) != signbit(got))
		return false;
	return isnan(want) ? isnan(got) : want == got;
}

/* The scalar reference against expect() on every input of the pair. */
START_TEST(test_kernels__scalar_rounds_as_ieee_defines)
{
	struct pair p = pair_at(_i);
	struct fmt fs = fmt_of(p.from), fd = fmt_of(p.to);
	size_t n, ssz = size_of(p.from), dsz = size_of(p.to);
	castfs_convert_fn ref;
	uint8_t *in, *out;

	if (!pair_supported(p))
		return;
	ref = castfs_convert_get_isa(CASTFS_ISA_SCALAR, p.from, p.to, p.flags);
	in = make_inputs(p.from, &n);
	out = xmalloc(n * dsz);
	ref(out, in, n);
	for (size_t i = 0; i < n; i++) {
		double x = decode(load_elem(in, ssz, i), fs), want, got;

		/* torch rounds double to float first */
		if (p.from == CASTFS_DTYPE_F64)
			x = expect(x, CASTFS_DTYPE_F32, false);
		want = expect(x, p.to, p.flags);
		got = decode(load_elem(out, dsz, i), fd);
		if (!same_value(want, got))
			ck_abort_msg("%s->%s%s: in %#llx (%a): want %a, got %a",
				     castfs_dtype_name(p.from),
				     castfs_dtype_name(p.to),
				     p.flags ? " sat" : "",
				     (unsigned long long)load_elem(in, ssz, i),
				     x, want, got);
	}
	free(in);
	free(out);
}
END_TEST

#define F64 CASTFS_DTYPE_F64
#define F32 CASTFS_DTYPE_F32
#define F16 CASTFS_DTYPE_F16
#define BF16 CASTFS_DTYPE_BF16
#define E4M3 CASTFS_DTYPE_F8_E4M3
#define E5M2 CASTFS_DTYPE_F8_E5M2
#define SAT CASTFS_CVT_SATURATE

/* Hand-derived: the value in the comment, its neighbours, the tie rule. */
static const struct vector {
	enum castfs_dtype from, to;
	unsigned flags;
	uint64_t in;
	uint32_t want;
} vectors[] = {
	/* bf16 -> e4m3: ties between codes go to the even code */
	{ BF16, E4M3, 0, 0x3f80, 0x38 }, /* 1.0 */
	{ BF16, E4M3, 0, 0x3f88, 0x38 }, /* 1.0625: tie 1.0 / 1.125 */
	{ BF16, E4M3, 0, 0x3f89, 0x39 }, /* just above that tie */
	{ BF16, E4M3, 0, 0x3f98, 0x3a }, /* 1.1875: tie 1.125 / 1.25 */
	{ BF16, E4M3, 0, 0x3a80, 0x00 }, /* 2^-10: half the least subnormal */
	{ BF16, E4M3, 0, 0xba80, 0x80 }, /* -2^-10 keeps its sign */
	{ BF16, E4M3, 0, 0x3b00, 0x01 }, /* 2^-9 */
	{ BF16, E4M3, 0, 0x3b40, 0x02 }, /* 1.5 * 2^-9: tie 1 / 2 units */
	{ BF16, E4M3, 0, 0x3c70, 0x08 }, /* 15 * 2^-10: tie 0x07 / 0x08 */
	{ BF16, E4M3, 0, 0x43e0, 0x7e }, /* 448, the largest finite */
	{ BF16, E4M3, 0, 0x43e8, 0x7e }, /* 464: tie 448 / 480, even */
	{ BF16, E4M3, 0, 0x43e9, 0x7f }, /* 466 rounds to 480: NaN */
	{ BF16, E4M3, 0, 0x43f0, 0x7f }, /* 480 */
	{ BF16, E4M3, 0, 0xc3f0, 0xff }, /* -480 */
	{ BF16, E4M3, 0, 0x7f80, 0x7f }, /* +Inf */
	{ BF16, E4M3, 0, 0xff80, 0xff }, /* -Inf */
	{ BF16, E4M3, 0, 0x7fc0, 0x7f }, /* NaN */
	{ BF16, E4M3, 0, 0xffc0, 0xff }, /* -NaN */
	{ BF16, E4M3, 0, 0x7f81, 0x7f }, /* signalling NaN */
	{ BF16, E4M3, 0, 0x8000, 0x80 }, /* -0 */
	{ BF16, E4M3, 0, 0x0001, 0x00 }, /* bf16 subnormal */
	{ BF16, E4M3, 0, 0x8001, 0x80 },
	{ BF16, E4M3, SAT, 0x43e8, 0x7e }, /* 464 */
	{ BF16, E4M3, SAT, 0x43e9, 0x7e }, /* 466 */
	{ BF16, E4M3, SAT, 0x43f0, 0x7e }, /* 480 */
	{ BF16, E4M3, SAT, 0x4780, 0x7e }, /* 65536 */
	{ BF16, E4M3, SAT, 0x7f80, 0x7e }, /* +Inf */
	{ BF16, E4M3, SAT, 0xff80, 0xfe }, /* -Inf */
	{ BF16, E4M3, SAT, 0x7fc0, 0x7f }, /* NaN stays NaN */
	{ BF16, E4M3, SAT, 0xffc0, 0xff },
	/* bf16 -> e5m2 */
	{ BF16, E5M2, 0, 0x3f80, 0x3c }, /* 1.0 */
	{ BF16, E5M2, 0, 0x3f90, 0x3c }, /* 1.125: tie 1.0 / 1.25 */
	{ BF16, E5M2, 0, 0x3fb0, 0x3e }, /* 1.375: tie 1.25 / 1.5 */
	{ BF16, E5M2, 0, 0x4760, 0x7b }, /* 57344, the largest finite */
	{ BF16, E5M2, 0, 0x476f, 0x7b }, /* 61184, below the tie */
	{ BF16, E5M2, 0, 0x4770, 0x7c }, /* 61440: tie 57344 / Inf */
	{ BF16, E5M2, 0, 0x4780, 0x7c }, /* 65536 */
	{ BF16, E5M2, 0, 0xc780, 0xfc },
	{ BF16, E5M2, 0, 0x7f80, 0x7c }, /* +Inf */
	{ BF16, E5M2, 0, 0xff80, 0xfc },
	{ BF16, E5M2, 0, 0x7fc0, 0x7f }, /* NaN */
	{ BF16, E5M2, 0, 0xffc0, 0xff },
	{ BF16, E5M2, 0, 0x3700, 0x00 }, /* 2^-17: tie 0 / 2^-16 */
	{ BF16, E5M2, 0, 0x37c0, 0x02 }, /* 1.5 * 2^-16 */
	{ BF16, E5M2, 0, 0x3780, 0x01 }, /* 2^-16 */
	{ BF16, E5M2, 0, 0x3880, 0x04 }, /* 2^-14, the least normal */
	{ BF16, E5M2, SAT, 0x4770, 0x7b }, /* 61440 */
	{ BF16, E5M2, SAT, 0x4780, 0x7b },
	{ BF16, E5M2, SAT, 0x7f80, 0x7b },
	{ BF16, E5M2, SAT, 0xff80, 0xfb },
	{ BF16, E5M2, SAT, 0x7fc0, 0x7f },
	{ BF16, E5M2, SAT, 0xffc0, 0xff },
	/* f16 -> fp8 */
	{ F16, E4M3, 0, 0x7bff, 0x7f }, /* 65504 */
	{ F16, E4M3, SAT, 0x7bff, 0x7e },
	{ F16, E5M2, 0, 0x7bff, 0x7c },
	{ F16, E5M2, SAT, 0x7bff, 0x7b },
	{ F16, E4M3, 0, 0x7c00, 0x7f }, /* +Inf */
	{ F16, E5M2, 0, 0x7c00, 0x7c },
	{ F16, E4M3, 0, 0x3c40, 0x38 }, /* 1.0625 */
	{ F16, E4M3, 0, 0x0001, 0x00 }, /* 2^-24 */
	{ F16, E5M2, 0, 0x0001, 0x00 },
	{ F16, E5M2, 0, 0x0100, 0x01 }, /* 2^-16 */
	{ F16, E5M2, 0, 0x0180, 0x02 }, /* 1.5 * 2^-16 */
	{ F16, E5M2, 0, 0x0080, 0x00 }, /* 2^-17 */
	{ F16, E4M3, 0, 0x7e00, 0x7f }, /* NaN */
	{ F16, E4M3, 0, 0xfe00, 0xff },
	{ F16, E5M2, 0, 0x7e00, 0x7f },
	/* f32 -> fp8 */
	{ F32, E4M3, 0, 0x43e80000, 0x7e }, /* 464 */
	{ F32, E4M3, 0, 0x43e80001, 0x7f }, /* nextafter(464, Inf) */
	{ F32, E4M3, SAT, 0x43e80001, 0x7e },
	{ F32, E4M3, 0, 0x43efffff, 0x7f }, /* just below 480 */
	{ F32, E4M3, 0, 0x43f00000, 0x7f }, /* 480 */
	{ F32, E4M3, 0, 0x3f880000, 0x38 }, /* 1.0625 */
	{ F32, E4M3, 0, 0x3f880001, 0x39 },
	{ F32, E4M3, 0, 0x00000001, 0x00 }, /* f32 subnormal */
	{ F32, E4M3, 0, 0x80000001, 0x80 },
	{ F32, E4M3, 0, 0x3a800000, 0x00 }, /* 2^-10 */
	{ F32, E4M3, 0, 0x3a800001, 0x01 },
	{ F32, E4M3, 0, 0x7f800001, 0x7f }, /* signalling NaN */
	{ F32, E4M3, 0, 0xff800001, 0xff },
	{ F32, E5M2, 0, 0x47600000, 0x7b }, /* 57344 */
	{ F32, E5M2, 0, 0x476fffff, 0x7b }, /* below 61440 */
	{ F32, E5M2, 0, 0x47700000, 0x7c }, /* 61440 */
	{ F32, E5M2, SAT, 0x47700000, 0x7b },
	{ F32, E5M2, 0, 0x477fe000, 0x7c }, /* 65504 */
	{ F32, E5M2, 0, 0x477ff000, 0x7c }, /* 65520 */
	{ F32, E5M2, SAT, 0x477ff000, 0x7b },
	{ F32, E5M2, 0, 0x7f800000, 0x7c }, /* +Inf */
	{ F32, E5M2, SAT, 0x7f800000, 0x7b },
	{ F32, E5M2, SAT, 0xff800000, 0xfb },
	{ F32, E5M2, 0, 0x7fc00000, 0x7f },
	/* f32 -> f16 */
	{ F32, F16, 0, 0x477fe000, 0x7bff }, /* 65504 */
	{ F32, F16, 0, 0x477fefff, 0x7bff }, /* below 65520 */
	{ F32, F16, 0, 0x477ff000, 0x7c00 }, /* 65520: tie 65504 / Inf */
	{ F32, F16, 0, 0x7f800000, 0x7c00 },
	{ F32, F16, 0, 0x33000000, 0x0000 }, /* 2^-25: tie 0 / 2^-24 */
	{ F32, F16, 0, 0x33000001, 0x0001 },
	{ F32, F16, 0, 0x33800000, 0x0001 }, /* 2^-24 */
	{ F32, F16, 0, 0x33c00000, 0x0002 }, /* 1.5 * 2^-24 */
	{ F32, F16, 0, 0xb3000000, 0x8000 },
	{ F32, F16, 0, 0x38800000, 0x0400 }, /* 2^-14 */
	{ F32, F16, 0, 0x387fc000, 0x03ff }, /* the largest subnormal */
	{ F32, F16, 0, 0x387fe000, 0x0400 }, /* tie 0x3ff / 0x400 */
	{ F32, F16, 0, 0x3f801000, 0x3c00 }, /* 1 + 2^-11 */
	{ F32, F16, 0, 0x3f803000, 0x3c02 }, /* 1 + 3 * 2^-11 */
	{ F32, F16, 0, 0x7fc00000, 0x7e00 }, /* NaNs: quiet, top payload */
	{ F32, F16, 0, 0xffc00000, 0xfe00 },
	{ F32, F16, 0, 0x7f800001, 0x7e00 },
	{ F32, F16, 0, 0x7fa00000, 0x7f00 },
	{ F32, F16, 0, 0x7f802000, 0x7e01 },
	/* f32 -> bf16 */
	{ F32, BF16, 0, 0x3f808000, 0x3f80 }, /* tie, even below */
	{ F32, BF16, 0, 0x3f818000, 0x3f82 }, /* tie, even above */
	{ F32, BF16, 0, 0x3f808001, 0x3f81 },
	{ F32, BF16, 0, 0x7f7fffff, 0x7f80 }, /* FLT_MAX rounds to Inf */
	{ F32, BF16, 0, 0x7f7f7fff, 0x7f7f },
	{ F32, BF16, 0, 0x7f7f8000, 0x7f80 },
	{ F32, BF16, 0, 0x00008000, 0x0000 }, /* subnormals are kept */
	{ F32, BF16, 0, 0x00018000, 0x0002 },
	{ F32, BF16, 0, 0x00010000, 0x0001 },
	{ F32, BF16, 0, 0x80010000, 0x8001 },
	{ F32, BF16, 0, 0x7f800001, 0x7fc0 }, /* NaNs: quiet, top payload */
	{ F32, BF16, 0, 0xffa00000, 0xffe0 },
	{ F32, BF16, 0, 0x7fc00000, 0x7fc0 },
	{ F32, BF16, 0, 0xffffffff, 0xffff },
	/* widening */
	{ F16, F32, 0, 0x0001, 0x33800000 },
	{ F16, F32, 0, 0x03ff, 0x387fc000 },
	{ F16, F32, 0, 0x3c00, 0x3f800000 },
	{ F16, F32, 0, 0x8000, 0x80000000 },
	{ F16, F32, 0, 0x7c00, 0x7f800000 },
	{ F16, F32, 0, 0xfc00, 0xff800000 },
	{ F16, F32, 0, 0x7e00, 0x7fc00000 },
	{ F16, F32, 0, 0x7d00, 0x7fe00000 }, /* signalling NaN made quiet */
	{ F16, F32, 0, 0x7c01, 0x7fc02000 },
	{ BF16, F32, 0, 0x0001, 0x00010000 },
	{ BF16, F32, 0, 0x7f81, 0x7f810000 }, /* a plain shift, as torch */
	{ E4M3, F32, 0, 0x01, 0x3b000000 }, /* 2^-9 */
	{ E4M3, F32, 0, 0x07, 0x3c600000 }, /* 7 * 2^-9 */
	{ E4M3, F32, 0, 0x08, 0x3c800000 }, /* 2^-6 */
	{ E4M3, F32, 0, 0x38, 0x3f800000 },
	{ E4M3, F32, 0, 0x7e, 0x43e00000 },
	{ E4M3, F32, 0, 0xfe, 0xc3e00000 },
	{ E4M3, F32, 0, 0x80, 0x80000000 },
	{ E4M3, F32, 0, 0x7f, 0x7ff00000 }, /* NaN, payload 111 kept */
	{ E4M3, F32, 0, 0xff, 0xfff00000 },
	{ E5M2, F32, 0, 0x01, 0x37800000 }, /* 2^-16 */
	{ E5M2, F32, 0, 0x7b, 0x47600000 },
	{ E5M2, F32, 0, 0x7c, 0x7f800000 },
	{ E5M2, F32, 0, 0xfc, 0xff800000 },
	{ E5M2, F32, 0, 0x7d, 0x7fe00000 },
	{ E5M2, F32, 0, 0x7e, 0x7fc00000 },
	{ E5M2, F32, 0, 0x7f, 0x7fe00000 },
	{ E5M2, F32, 0, 0xff, 0xffe00000 },
	/* between the 16-bit types and from fp8 */
	{ BF16, F16, 0, 0x3f81, 0x3c08 }, /* 1 + 2^-7 */
	{ BF16, F16, 0, 0x0001, 0x0000 },
	{ BF16, F16, 0, 0x477f, 0x7bf8 }, /* 65280 */
	{ BF16, F16, 0, 0x4780, 0x7c00 }, /* 65536 */
	{ BF16, F16, 0, 0x7fc0, 0x7e00 },
	{ BF16, F16, 0, 0xff81, 0xfe08 },
	{ F16, BF16, 0, 0x7bff, 0x4780 }, /* 65504 rounds up */
	{ F16, BF16, 0, 0x3c01, 0x3f80 }, /* 1 + 2^-10 */
	{ F16, BF16, 0, 0x3c04, 0x3f80 }, /* 1 + 2^-8: tie */
	{ F16, BF16, 0, 0x3c0c, 0x3f82 }, /* 1 + 3 * 2^-8: tie */
	{ F16, BF16, 0, 0x0001, 0x3380 },
	{ F16, BF16, 0, 0x7e00, 0x7fc0 },
	{ F16, BF16, 0, 0x7d00, 0x7fe0 },
	{ E4M3, F16, 0, 0x7f, 0x7f80 },
	{ E4M3, F16, 0, 0x01, 0x1800 },
	{ E4M3, F16, 0, 0x7e, 0x5f00 },
	{ E5M2, F16, 0, 0x7d, 0x7f00 },
	{ E5M2, F16, 0, 0x7c, 0x7c00 },
	{ E5M2, F16, 0, 0x01, 0x0100 },
	{ E4M3, BF16, 0, 0x7f, 0x7ff0 },
	{ E4M3, BF16, 0, 0x01, 0x3b00 },
	{ E4M3, BF16, 0, 0x7e, 0x43e0 },
	{ E5M2, BF16, 0, 0x7d, 0x7fe0 },
	{ E5M2, BF16, 0, 0x7b, 0x4760 },
	{ E5M2, BF16, 0, 0x01, 0x3780 },
	{ E4M3, E5M2, 0, 0x39, 0x3c }, /* 1.125: tie */
	{ E4M3, E5M2, 0, 0x3b, 0x3e }, /* 1.375: tie */
	{ E4M3, E5M2, 0, 0x3d, 0x3e }, /* 1.625: tie */
	{ E4M3, E5M2, 0, 0x7e, 0x5f }, /* 448 */
	{ E4M3, E5M2, 0, 0x01, 0x18 }, /* 2^-9 */
	{ E4M3, E5M2, 0, 0x7f, 0x7f },
	{ E5M2, E4M3, 0, 0x7b, 0x7f }, /* 57344 */
	{ E5M2, E4M3, SAT, 0x7b, 0x7e },
	{ E5M2, E4M3, 0, 0x7c, 0x7f }, /* Inf */
	{ E5M2, E4M3, SAT, 0x7c, 0x7e },
	{ E5M2, E4M3, SAT, 0xfc, 0xfe },
	{ E5M2, E4M3, 0, 0x01, 0x00 }, /* 2^-16 */
	{ E5M2, E4M3, 0, 0x18, 0x01 }, /* 2^-9 */
	{ E5M2, E4M3, 0, 0x14, 0x00 }, /* 2^-10: tie */
	{ E5M2, E4M3, 0, 0x15, 0x01 }, /* 1.25 * 2^-10 */
	{ E5M2, E4M3, 0, 0x3c, 0x38 },
	{ E5M2, E4M3, 0, 0x7e, 0x7f },
	{ E5M2, E5M2, SAT, 0x7c, 0x7b }, /* Inf clamps */
	{ E5M2, E5M2, SAT, 0xfc, 0xfb },
	{ E5M2, E5M2, SAT, 0x7d, 0x7f },
	{ E5M2, E5M2, SAT, 0x01, 0x01 },
	{ E4M3, E4M3, SAT, 0x7f, 0x7f },
	{ E4M3, E4M3, SAT, 0xfe, 0xfe },
	/* identity copies keep every bit */
	{ BF16, BF16, 0, 0x7f81, 0x7f81 },
	{ F16, F16, 0, 0x7d00, 0x7d00 },
	{ E5M2, E5M2, 0, 0x7d, 0x7d },
	{ F32, F32, 0, 0x7f800001, 0x7f800001 },
	/* f64: torch rounds to float first, then to the target */
	{ F64, F32, 0, 0x3ff0000010000000, 0x3f800000 }, /* 1 + 2^-24 */
	{ F64, F32, 0, 0x3ff0000010001000, 0x3f800001 },
	{ F64, BF16, 0, 0x3ff0100000400000, 0x3f80 }, /* 1+2^-8+2^-30 */
	{ F64, E4M3, 0, 0x3ff1000000001000, 0x38 }, /* 1+2^-4+2^-40 */
	{ F64, F16, 0, 0x3ff0020000001000, 0x3c00 }, /* 1+2^-11+2^-40 */
	{ F64, E5M2, 0, 0x3ff2000000001000, 0x3c }, /* 1+2^-3+2^-40 */
	{ F64, E4M3, 0, 0x407d000000000001, 0x7e }, /* 464 + ulp */
	{ F64, F32, 0, 0x7e37e43c8800759c, 0x7f800000 }, /* 1e300 */
	{ F64, E4M3, 0, 0x7e37e43c8800759c, 0x7f },
	{ F64, E4M3, SAT, 0x7e37e43c8800759c, 0x7e },
	{ F64, F32, 0, 0x7ff8000000000000, 0x7fc00000 },
	{ F64, F32, 0, 0xfff8000000000000, 0xffc00000 },
	{ F64, F32, 0, 0x7ff0000000000001, 0x7fc00000 },
	{ F64, F32, 0, 0x7ff4000000000000, 0x7fe00000 },
	{ F64, F32, 0, 0x0000000000000001, 0x00000000 },
	{ F64, F32, 0, 0x8000000000000001, 0x80000000 },
	{ F64, F32, 0, 0x36a0000000000000, 0x00000001 }, /* 2^-149 */
	{ F64, F32, 0, 0x3690000000000000, 0x00000000 }, /* 2^-150: tie */
	{ F64, F32, 0, 0x36a8000000000000, 0x00000002 }, /* 1.5 * 2^-149 */
	{ F64, F32, 0, 0x47effffff0000000, 0x7f800000 }, /* FLT_MAX tie */
	{ F64, F32, 0, 0x47efffffefffffff, 0x7f7fffff },
};

/*
 * Each vector through each available ISA, repeated 64 times so that SIMD
 * bodies see it as well as the scalar tail.
 */
START_TEST(test_kernels__known_values)
{
	const struct vector *v = &vectors[_i];
	size_t ssz = size_of(v->from), dsz = size_of(v->to);
	uint8_t in[64 * 8], out[64 * 4];

	for (size_t i = 0; i < 64; i++)
		store_elem(in, ssz, i, v->in);
	for (int isa = 0; isa < CASTFS_ISA_COUNT; isa++) {
		castfs_convert_fn fn;

		if (!castfs_isa_available((enum castfs_isa)isa))
			continue;
		fn = castfs_convert_get_isa((enum castfs_isa)isa, v->from,
					    v->to, v->flags);
		ck_assert_ptr_nonnull(fn);
		fn(out, in, 64);
		for (size_t i = 0; i < 64; i++)
			ck_assert_msg(load_elem(out, dsz, i) == v->want,
				      "%s %s->%s%s %#llx: want %#x, got %#llx",
				      castfs_isa_name((enum castfs_isa)isa),
				      castfs_dtype_name(v->from),
				      castfs_dtype_name(v->to),
				      v->flags ? " sat" : "",
				      (unsigned long long)v->in, v->want,
				      (unsigned long long)load_elem(out, dsz,
								    i));
	}
}
END_TEST

START_TEST(test_kernels__get_rejects_unsupported)
{
	ck_assert_ptr_null(castfs_convert_get(F32, F64, 0));
	ck_assert_ptr_null(castfs_convert_get(CASTFS_DTYPE_I8, F32, 0));
	ck_assert_ptr_null(castfs_convert_get(F32, CASTFS_DTYPE_I32, 0));
	ck_assert_ptr_null(
		castfs_convert_get(CASTFS_DTYPE_F4, CASTFS_DTYPE_F4, 0));
	ck_assert_ptr_null(castfs_convert_get(F32, F16, SAT));
	ck_assert_ptr_null(castfs_convert_get(BF16, BF16, SAT));
	ck_assert_ptr_null(castfs_convert_get(BF16, E4M3, 2));
	ck_assert_ptr_null(castfs_convert_get(CASTFS_DTYPE_INVALID, F32, 0));
	ck_assert_ptr_null(
		castfs_convert_get_isa(CASTFS_ISA_COUNT, F32, F16, 0));
	ck_assert_ptr_nonnull(castfs_convert_get(F64, F64, 0));
	ck_assert_ptr_nonnull(castfs_convert_get(BF16, E4M3, SAT));
}
END_TEST

START_TEST(test_kernels__isa_names_round_trip)
{
	for (int i = 0; i < CASTFS_ISA_COUNT; i++) {
		const char *name = castfs_isa_name((enum castfs_isa)i);

		ck_assert_ptr_nonnull(name);
		ck_assert_int_eq(castfs_isa_from_name(name), i);
	}
	ck_assert_ptr_null(castfs_isa_name(CASTFS_ISA_COUNT));
	ck_assert_int_eq(castfs_isa_from_name("neon"), CASTFS_ISA_COUNT);
	ck_assert_int_eq(castfs_isa_from_name(NULL), CASTFS_ISA_COUNT);
	ck_assert(castfs_isa_available(CASTFS_ISA_SCALAR));
}
END_TEST

/* The one CASTFS_ISA rule every dispatch asks (common/isa.h): the level
 * named is the highest allowed; unset, every level is. */
START_TEST(test_kernels__isa_env_caps_levels)
{
	enum castfs_isa forced = castfs_isa_from_name(getenv("CASTFS_ISA"));

	ck_assert_int_eq(castfs_isa_forced(), forced);
	for (int i = 0; i < CASTFS_ISA_COUNT; i++)
		ck_assert_int_eq(castfs_isa_allows((enum castfs_isa)i),
				 forced == CASTFS_ISA_COUNT ||
					 i <= (int)forced);
}
END_TEST

/* CASTFS_ISA wins when set (main() skipped us otherwise), else the best. */
START_TEST(test_kernels__selects_env_or_best_isa)
{
	const char *env = getenv("CASTFS_ISA");
	enum castfs_isa want = CASTFS_ISA_SCALAR;

	for (int i = 0; i < CASTFS_ISA_COUNT; i++) {
		if (castfs_isa_available((enum castfs_isa)i))
			want = (enum castfs_isa)i;
	}
	if (env)
		want = castfs_isa_from_name(env);
	ck_assert_str_eq(castfs_isa_name(castfs_isa_selected()),
			 castfs_isa_name(want));
	ck_assert_ptr_eq(castfs_convert_get(BF16, E4M3, 0),
			 castfs_convert_get_isa(want, BF16, E4M3, 0));
}
END_TEST

Suite *unit_suite(void)
{
	Suite *s = suite_create("kernels");
	TCase *tc = tcase_create("api");
	TCase *ref = tcase_create("reference");
	TCase *simd = tcase_create("simd");

	tcase_add_test(tc, test_kernels__get_rejects_unsupported);
	tcase_add_test(tc, test_kernels__isa_names_round_trip);
	tcase_add_test(tc, test_kernels__isa_env_caps_levels);
	tcase_add_test(tc, test_kernels__selects_env_or_best_isa);
	suite_add_tcase(s, tc);
	tcase_add_loop_test(ref, test_kernels__known_values, 0,
			    (int)(sizeof(vectors) / sizeof(vectors[0])));
	tcase_add_loop_test(ref, test_kernels__scalar_rounds_as_ieee_defines, 0,
			    NPAIRS);
	suite_add_tcase(s, ref);
	/* Only ISAs this CPU runs; the runner reports the others skipped. */
	unit_add_isa_loop(
		simd, test_kernels__isa_matches_scalar_on_all_patterns, NPAIRS);
	unit_add_isa_loop(simd, test_kernels__isa_matches_scalar_on_random_f32,
			  NDST * 2);
	unit_add_isa_loop(simd,
			  test_kernels__isa_handles_odd_lengths_and_alignment,
			  NPAIRS);
	tcase_add_loop_test(simd, test_kernels__unavailable_isa_has_no_kernels,
			    0, CASTFS_ISA_COUNT * NPAIRS);
	suite_add_tcase(s, simd);
	return s;
}
