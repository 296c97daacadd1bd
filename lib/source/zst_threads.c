/* SPDX-License-Identifier: MIT */
/*
 * The threads of castfs pack's coding (zst_pack.c) and read-back
 * (zst_verify.c), the places lib/ starts threads: a CLI run, never the
 * daemon.
 */
#include <pthread.h>

#include "common/compiler.h"
#include "source/zst_internal.h"

void zst_run_threads(void *(*run)(void *), void *arg, unsigned n)
{
	pthread_t t[ZST_MAX_THREADS];
	unsigned started = 0;

	n = CASTFS_MIN(n, ZST_MAX_THREADS);
	/* Helpers that fail to start leave their work to this thread. */
	while (started + 1 < n &&
	       pthread_create(&t[started], NULL, run, arg) == 0)
		started++;
	run(arg);
	for (unsigned i = 0; i < started; i++)
		pthread_join(t[i], NULL);
}
