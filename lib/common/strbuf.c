/* SPDX-License-Identifier: MIT */
/* A growing text buffer for the JSON and text files castfs generates. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"

/* Room for @n more bytes and the NUL. */
static bool sb_reserve(struct castfs_strbuf *b, size_t n)
{
	size_t cap = b->cap ? b->cap : 256;
	char *p;

	if (b->oom)
		return false;
	if (b->len + n + 1 <= b->cap)
		return true;
	while (cap < b->len + n + 1) {
		if (cap > SIZE_MAX / 2) {
			b->oom = true;
			return false;
		}
		cap *= 2;
	}
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void castfs_sb_put(struct castfs_strbuf *b, const void *s, size_t n)
{
	if (!sb_reserve(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void castfs_sb_puts(struct castfs_strbuf *b, const char *s)
{
	castfs_sb_put(b, s, strlen(s));
}

void castfs_sb_printf(struct castfs_strbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !sb_reserve(b, (size_t)n)) {
		b->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

int castfs_sb_take(struct castfs_strbuf *b, char **out, size_t *len)
{
	if (!b->oom)
		sb_reserve(b, 0); /* "" when nothing was written */
	if (b->oom) {
		castfs_sb_fini(b);
		return -ENOMEM;
	}
	*out = b->p;
	if (len)
		*len = b->len;
	*b = (struct castfs_strbuf){ 0 };
	return 0;
}

void castfs_sb_fini(struct castfs_strbuf *b)
{
	free(b->p);
	*b = (struct castfs_strbuf){ 0 };
}
