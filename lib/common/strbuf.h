/* SPDX-License-Identifier: MIT */
/* A growing text buffer whose allocation failure is sticky, checked once. */
#ifndef CASTFS_STRBUF_H
#define CASTFS_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "common/compiler.h"

/* Zero-initialise; the text is always NUL-terminated once non-empty. */
struct castfs_strbuf {
	char *p;
	size_t len, cap;
	bool oom; /* an allocation failed: later writes do nothing */
};

/* castfs_sb_put - append @n bytes of @s (NULs allowed). */
void castfs_sb_put(struct castfs_strbuf *b, const void *s, size_t n);

/* castfs_sb_puts - append the string @s. */
void castfs_sb_puts(struct castfs_strbuf *b, const char *s);

/* castfs_sb_printf - append printf(@fmt, ...). */
void castfs_sb_printf(struct castfs_strbuf *b, const char *fmt, ...)
	CASTFS_PRINTF(2, 3);

/*
 * castfs_sb_take - hand the text (malloc'ed, NUL-terminated, "" when
 * nothing was written) to the caller in *@out, its length in *@len (may be
 * NULL), and empty @b. Returns 0, or -ENOMEM when any write failed (then
 * the text is freed and *@out untouched).
 */
int castfs_sb_take(struct castfs_strbuf *b, char **out, size_t *len);

/* castfs_sb_fini - free the text; @b may be reused. */
void castfs_sb_fini(struct castfs_strbuf *b);

#endif
