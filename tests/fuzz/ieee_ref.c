/* SPDX-License-Identifier: MIT */
/*
 * The outside oracle for casts (see ieee_ref.h). Every value goes through
 * float32, as docs/FORMATS.md says torch does (F64 by the C compiler's
 * double -> float conversion, IEEE round to nearest even); narrow targets
 * are encoded by a generic round-to-nearest-even on the exact value in
 * double, written here from the IEEE-754 definition of a binary format
 * with @ebits exponent bits and @mbits fraction bits.
 */
#include <math.h>
#include <string.h>

#include "ieee_ref.h"

/* A narrow binary format: F16, BF16, F8_E4M3 (fn: no Inf, all-ones
 * exponent is finite except the NaN fraction), F8_E5M2. */
struct fmt {
	int ebits, mbits, bias;
	bool fn; /* E4M3 "fn": no Inf, one NaN per sign */
};

static const struct fmt F16 = { 5, 10, 15, false };
static const struct fmt BF16 = { 8, 7, 127, false };
static const struct fmt E4M3 = { 4, 3, 7, true };
static const struct fmt E5M2 = { 5, 2, 15, false };

/* The castable dtypes: format (NULL for F64/F32) and width in bytes. */
static const struct castable {
	enum castfs_dtype t;
	const struct fmt *f;
	unsigned width;
} castable[] = {
	{ CASTFS_DTYPE_F64, NULL, 8 },	    { CASTFS_DTYPE_F32, NULL, 4 },
	{ CASTFS_DTYPE_F16, &F16, 2 },	    { CASTFS_DTYPE_BF16, &BF16, 2 },
	{ CASTFS_DTYPE_F8_E4M3, &E4M3, 1 }, { CASTFS_DTYPE_F8_E5M2, &E5M2, 1 },
};

static const struct castable *castable_of(enum castfs_dtype t)
{
	for (size_t i = 0; i < sizeof(castable) / sizeof(castable[0]); i++)
		if (castable[i].t == t)
			return &castable[i];
	return NULL;
}

static const struct fmt *fmt_of(enum castfs_dtype t)
{
	return castable_of(t)->f;
}

static unsigned width(enum castfs_dtype t)
{
	const struct castable *c = castable_of(t);

	return c ? c->width : 0;
}

static uint64_t load_le(const uint8_t *p, unsigned w)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < w; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void store_le(uint8_t *p, unsigned w, uint64_t v)
{
	for (unsigned i = 0; i < w; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float f32_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Widen narrow @x of format @f to float32 bits: exact; a NaN keeps its
 * sign and its fraction shifted to the top (FORMATS.md NaN policy). */
static uint32_t widen(const struct fmt *f, uint32_t x)
{
	uint32_t sign = (x >> (f->ebits + f->mbits)) & 1;
	uint32_t e = (x >> f->mbits) & ((1u << f->ebits) - 1);
	uint32_t m = x & ((1u << f->mbits) - 1);
	uint32_t emax = (1u << f->ebits) - 1;
	double v;

	if (e == emax && (!f->fn || m == (1u << f->mbits) - 1)) {
		if (m == 0)
			return sign << 31 | 0x7f800000u;
		/* torch widens F16, and E5M2 (the top byte of an F16), with a
		 * float multiply, which quiets a signalling NaN. */
		return sign << 31 | 0x7f800000u | m << (23 - f->mbits) |
		       (f == &F16 || f == &E5M2 ? 0x400000u : 0);
	}
	if (e == 0)
		v = ldexp((double)m, 1 - f->bias - f->mbits);
	else
		v = ldexp((double)(m | 1u << f->mbits),
			  (int)e - f->bias - f->mbits);
	return f32_bits((float)(sign ? -v : v));
}

/* The encoding of overflow (finite beyond the largest, or Inf). */
static uint32_t overflow(const struct fmt *f, uint32_t sign, bool saturate)
{
	uint32_t top = sign << (f->ebits + f->mbits);
	uint32_t emax = (1u << f->ebits) - 1;
	uint32_t mmax = (1u << f->mbits) - 1;

	if (f->fn) /* E4M3: 448 saturated, else the NaN */
		return top | emax << f->mbits | (saturate ? mmax - 1 : mmax);
	if (saturate) /* the largest finite */
		return top | (emax - 1) << f->mbits | mmax;
	return top | emax << f->mbits; /* Inf */
}

/* The largest finite value of @f. */
static double largest(const struct fmt *f)
{
	int emax = (1 << f->ebits) - 1 - f->bias;
	double frac = 2.0 - ldexp(1.0, -f->mbits);

	if (f->fn) /* the all-ones exponent is finite, fraction 1.11..10 */
		return ldexp(frac - ldexp(1.0, -f->mbits), emax);
	return ldexp(frac, emax - 1);
}

/* Round float32 bits @x to @f, nearest even. */
static uint32_t narrow(const struct fmt *f, uint32_t x, bool saturate)
{
	uint32_t sign = x >> 31;
	uint32_t top = sign << (f->ebits + f->mbits);
	double a = fabs((double)f32_of(x)), scaled, fl, r;
	int emin = 1 - f->bias, ex, e;
	uint64_t n, one = 1ull << f->mbits;

	if (isnan(a)) {
		if (f == &F16)
			return top | 0x7e00u | ((x & 0x7fffffu) >> 13);
		if (f == &BF16)
			return (x >> 16) | 0x40u;
		return top | 0x7fu; /* fp8: 0x7F with the sign */
	}
	if (isinf(a))
		return overflow(f, sign, saturate);
	if (a == 0)
		return top;
	(void)frexp(a, &ex);
	e = ex - 1 < emin ? emin : ex - 1;
	scaled = ldexp(a, f->mbits - e); /* exact: a has 24 bits at most */
	fl = floor(scaled);
	r = scaled - fl;
	n = (uint64_t)fl;
	if (r > 0.5 || (r == 0.5 && (n & 1)))
		n++;
	if (n == 2 * one) {
		n = one;
		e++;
	}
	if (ldexp((double)n, e - f->mbits) > largest(f))
		return overflow(f, sign, saturate);
	if (n < one)
		return top | (uint32_t)n;
	return top | (uint32_t)(e + f->bias) << f->mbits | (uint32_t)(n - one);
}

static uint32_t to_f32(enum castfs_dtype from, const uint8_t *p)
{
	if (from == CASTFS_DTYPE_F64) {
		uint64_t u = load_le(p, 8);
		double d;

		memcpy(&d, &u, 8);
		return f32_bits((float)d);
	}
	if (from == CASTFS_DTYPE_F32)
		return (uint32_t)load_le(p, 4);
	return widen(fmt_of(from), (uint32_t)load_le(p, width(from)));
}

bool ieee_ref_cast(enum castfs_dtype from, enum castfs_dtype to, bool saturate,
		   void *dst, const void *src, size_t n)
{
	unsigned sw = width(from), dw = width(to);
	const uint8_t *s = src;
	uint8_t *d = dst;

	if (!sw || !dw || (to == CASTFS_DTYPE_F64 && from != to))
		return false;
	if (from == to && !saturate) {
		memmove(d, s, n * sw);
		return true;
	}
	for (size_t i = 0; i < n; i++, s += sw, d += dw) {
		uint32_t f = to_f32(from, s);

		if (to == CASTFS_DTYPE_F64)
			memmove(d, s, 8);
		else if (to == CASTFS_DTYPE_F32)
			store_le(d, 4, f);
		else
			store_le(d, dw, narrow(fmt_of(to), f, saturate));
	}
	return true;
}
