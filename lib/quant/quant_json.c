/* SPDX-License-Identifier: MIT */
/*
 * The quant_state JSON of a 4-bit tensor, byte for byte as bitsandbytes'
 * pack_dict_to_tensor (Python's json.dumps) writes it, with nested_offset
 * in a fixed-width field so that the file layout never depends on data.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant_internal.h"

/* Up to 17 significant digits and a decimal exponent: d[0].d[1]... e. */
struct q_decimal {
	char d[18];
	int n;
	int e;
};

/* @dec as "DDDDe<exp>": no decimal point, so no locale can misread it. */
static double q_decimal_value(const struct q_decimal *dec)
{
	char s[40];

	snprintf(s, sizeof(s), "%.*se%d", dec->n, dec->d, dec->e - dec->n + 1);
	return strtod(s, NULL);
}

/* @v (> 0, finite) correctly rounded to @prec significant digits. */
static void q_decimal_round(struct q_decimal *dec, double v, int prec)
{
	char s[48];
	const char *p;

	/* The decimal point may be any locale's: keep digits, then 'e'. */
	snprintf(s, sizeof(s), "%.*e", prec - 1, v);
	dec->n = 0;
	for (p = s; *p && *p != 'e' && *p != 'E'; p++) {
		if (*p >= '0' && *p <= '9')
			dec->d[dec->n++] = *p;
	}
	dec->d[dec->n] = '\0';
	dec->e = *p ? atoi(p + 1) : 0;
}

/* One unit up in the last digit (9.99 -> 10.0 moves the exponent). */
static void q_decimal_next(struct q_decimal *dec)
{
	int i = dec->n - 1;

	while (i >= 0 && dec->d[i] == '9')
		dec->d[i--] = '0';
	if (i >= 0) {
		dec->d[i]++;
		return;
	}
	dec->d[0] = '1';
	dec->e++;
}

/*
 * The shortest decimal that reads back as @v, the closest one of that
 * length: Python's repr. The correctly rounded candidate is the closest;
 * just above a power of two, where the rounding interval is narrower
 * below, the next one up may be the only candidate that reads back.
 */
static void q_shortest(struct q_decimal *dec, double v)
{
	for (int prec = 1; prec <= 17; prec++) {
		q_decimal_round(dec, v, prec);
		if (q_decimal_value(dec) == v)
			break;
		if (q_decimal_value(dec) < v) {
			struct q_decimal up = *dec;

			q_decimal_next(&up);
			if (q_decimal_value(&up) == v) {
				*dec = up;
				break;
			}
		}
	}
	while (dec->n > 1 && dec->d[dec->n - 1] == '0')
		dec->d[--dec->n] = '\0';
}

/* Python's float_repr_style "short": fixed for 1e-4 <= |v| < 1e16. */
static int q_decimal_format(char *buf, size_t cap, const struct q_decimal *dec,
			    bool neg)
{
	char s[64], *p = s;
	int decpt = dec->e + 1, n = dec->n;

	if (neg)
		*p++ = '-';
	if (decpt <= -4 || decpt > 16)
		return snprintf(buf, cap, "%s%c%s%se%c%02d", neg ? "-" : "",
				dec->d[0], n > 1 ? "." : "", dec->d + 1,
				dec->e < 0 ? '-' : '+', abs(dec->e));
	if (decpt <= 0) {
		/* 0.000ddd */
		*p++ = '0';
		*p++ = '.';
		memset(p, '0', (size_t)-decpt);
		p += -decpt;
		memcpy(p, dec->d, (size_t)n);
		p += n;
	} else if (decpt >= n) {
		/* ddd000.0 */
		memcpy(p, dec->d, (size_t)n);
		p += n;
		memset(p, '0', (size_t)(decpt - n));
		p += decpt - n;
		memcpy(p, ".0", 2);
		p += 2;
	} else {
		/* dd.ddd */
		memcpy(p, dec->d, (size_t)decpt);
		p += decpt;
		*p++ = '.';
		memcpy(p, dec->d + decpt, (size_t)(n - decpt));
		p += n - decpt;
	}
	*p = '\0';
	return snprintf(buf, cap, "%s", s);
}

int castfs_q_pyfloat(char *buf, size_t cap, double v)
{
	struct q_decimal dec;
	int len;

	if (isnan(v))
		len = snprintf(buf, cap, "NaN");
	else if (isinf(v))
		len = snprintf(buf, cap, "%sInfinity", v < 0 ? "-" : "");
	else if (v == 0.0)
		len = snprintf(buf, cap, "%s0.0", signbit(v) ? "-" : "");
	else {
		q_shortest(&dec, fabs(v));
		len = q_decimal_format(buf, cap, &dec, v < 0);
	}
	if (len < 0 || (size_t)len >= cap)
		return -ENOSPC;
	return len;
}

int castfs_q4_state_json(char *buf, size_t cap,
			 const struct castfs_q4_state *st, size_t *num_off)
{
	const char *qt = st->qtype == CASTFS_Q_FP4 ? "fp4" : "nf4";
	int len;

	/* The keys in the order of QuantState.as_dict(). */
	len = snprintf(buf, cap,
		       "{\"quant_type\": \"%s\", \"blocksize\": %" PRIu32
		       ", \"dtype\": \"%s\", \"shape\": [%" PRIu64 ", %" PRIu64
		       "]%s",
		       qt, st->blocksize, st->dtype, st->rows, st->cols,
		       st->nested ? ", \"nested_blocksize\": 256, "
				    "\"nested_dtype\": \"float32\", "
				    "\"nested_offset\": " :
				    "");
	if (len < 0 || (size_t)len + CASTFS_Q4_OFFSET_WIDTH + 1 >= cap)
		return -ENOSPC;
	*num_off = st->nested ? (size_t)len : 0;
	if (st->nested) {
		memset(buf + len, ' ', CASTFS_Q4_OFFSET_WIDTH);
		len += CASTFS_Q4_OFFSET_WIDTH;
	}
	buf[len++] = '}';
	return len;
}

void castfs_q4_state_offset(char field[CASTFS_Q4_OFFSET_WIDTH], float offset)
{
	char s[40];
	int len = castfs_q_pyfloat(s, sizeof(s), offset);

	/* A float32 as a double needs at most 23: "-0.000" + 17 digits. */
	if (len < 0 || len > (int)CASTFS_Q4_OFFSET_WIDTH)
		len = 0;
	memset(field, ' ', CASTFS_Q4_OFFSET_WIDTH);
	memcpy(field, s, (size_t)len);
}
