/* SPDX-License-Identifier: MIT */
/* Diagnostic messages stored on a caller-owned handle (libarchive style). */
#include <stdarg.h>
#include <stdio.h>

#include "common/err.h"

int castfs_diag_set(struct castfs_diag *d, int rc, const char *fmt, ...)
{
	va_list ap;

	if (!d || d->msg[0])
		return rc;
	va_start(ap, fmt);
	vsnprintf(d->msg, sizeof(d->msg), fmt, ap);
	va_end(ap);
	return rc;
}

void castfs_diag_clear(struct castfs_diag *d)
{
	if (d)
		d->msg[0] = '\0';
}
