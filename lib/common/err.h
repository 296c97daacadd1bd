/* SPDX-License-Identifier: MIT */
/*
 * Error detail. Functions return 0 or a negative errno; the human-readable
 * reason goes into an optional caller-owned struct castfs_diag.
 */
#ifndef CASTFS_ERR_H
#define CASTFS_ERR_H

#include "common/compiler.h"

struct castfs_diag {
	char msg[256];
};

/*
 * castfs_diag_set - record why an operation failed.
 * @d: diagnostic to fill, or NULL (then nothing is recorded).
 * @rc: the negative errno the caller is about to return.
 *
 * Returns @rc so that callers can write "return castfs_diag_set(d, -EINVAL, ...)".
 * Only the first message is kept: the innermost cause is the most precise.
 */
int castfs_diag_set(struct castfs_diag *d, int rc, const char *fmt, ...)
	CASTFS_PRINTF(3, 4);

/* castfs_diag_clear - empty @d (NULL is accepted). */
void castfs_diag_clear(struct castfs_diag *d);

#endif
