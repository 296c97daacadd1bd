/* SPDX-License-Identifier: MIT */
/*
 * The threads of castfs pack's coding (zst_pack.c), its read-back
 * (zst_verify.c) and castfs unpack (zst_unpack.c), the places lib/ starts
 * threads: a CLI run, never the daemon.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "common/compiler.h"
#include "source/zst_internal.h"

/* At most this many threads run a pipeline. */
#define ZST_MAX_THREADS 16u

/*
 * @run(@arg) on @n threads (0 or 1: this one only; at most
 * ZST_MAX_THREADS), this one among them, returning once all have
 * returned. @run takes work from @arg until none is left, so helpers that
 * fail to start only leave theirs to the others.
 */
static void run_threads(void *(*run)(void *), void *arg, unsigned n)
{
	pthread_t t[ZST_MAX_THREADS];
	unsigned started = 0;
	sigset_t all, old;

	n = CASTFS_MIN(n, ZST_MAX_THREADS);
	/* Signals stay the caller's: helpers block them all (a SIGINT taken
	 * by a helper would not interrupt what the caller waits in). */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	/* Helpers that fail to start leave their work to this thread. */
	while (started + 1 < n &&
	       pthread_create(&t[started], NULL, run, arg) == 0)
		started++;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	run(arg);
	for (unsigned i = 0; i < started; i++)
		pthread_join(t[i], NULL);
}

/* A pipeline's shared state: items are numbered in the order taken. */
struct pipe {
	const struct zst_pipe_ops *ops;
	void *ctx;
	pthread_mutex_t lock;
	pthread_cond_t turn; /* @committed moved, or an item failed */
	size_t taken; /* items taken: the next one's number */
	size_t committed; /* items committed: the next one to commit */
	size_t bad; /* the lowest item that failed; SIZE_MAX: none */
	unsigned slots; /* threads that got a slot */
	int rc; /* its error */
	struct castfs_diag d; /* its reason */
};

/* Under p->lock: keep failure @rc of item @id if it lies before the one
 * kept, and wake the threads waiting for their turn. */
static void pipe_fail_locked(struct pipe *p, size_t id, int rc,
			     const struct castfs_diag *d)
{
	if (id < p->bad) {
		p->bad = id;
		p->rc = rc;
		p->d = *d;
	}
	pthread_cond_broadcast(&p->turn);
}

/*
 * Under p->lock: work on item @id in @slot (unlocked, beside the other
 * threads), wait for its turn, and commit it (unlocked: no other thread
 * commits until @committed moves). 0 also when an earlier item failed
 * meanwhile, and this one is dropped.
 */
static int pipe_item_locked(struct pipe *p, void *slot, size_t id,
			    struct castfs_diag *d)
{
	int rc;

	pthread_mutex_unlock(&p->lock);
	rc = p->ops->work(p->ctx, slot, d);
	pthread_mutex_lock(&p->lock);
	while (!rc && p->committed != id && id < p->bad)
		pthread_cond_wait(&p->turn, &p->lock);
	if (rc || id >= p->bad)
		return rc;
	pthread_mutex_unlock(&p->lock);
	rc = p->ops->commit(p->ctx, slot, d);
	pthread_mutex_lock(&p->lock);
	return rc;
}

/* One thread: items until none is left below the lowest failure, so the
 * failure reported is the first in order, whatever the threads' timing. */
static void *pipe_thread(void *arg)
{
	struct pipe *p = arg;
	struct castfs_diag d = { { 0 } };
	void *slot = calloc(1, p->ops->slot_size);
	bool have = slot && p->ops->slot_init(p->ctx, slot) == 0;

	pthread_mutex_lock(&p->lock);
	/* A thread without a slot takes no item: the others do them. */
	p->slots += have;
	while (have && p->taken < p->bad && p->ops->take(p->ctx, slot)) {
		size_t id = p->taken++;
		int rc;

		castfs_diag_clear(&d);
		rc = pipe_item_locked(p, slot, id, &d);
		if (rc) {
			pipe_fail_locked(p, id, rc, &d);
		} else if (id < p->bad) {
			p->committed++;
			pthread_cond_broadcast(&p->turn);
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (have)
		p->ops->slot_free(p->ctx, slot);
	free(slot);
	return NULL;
}

int zst_pipe_run(const struct zst_pipe_ops *ops, void *ctx, unsigned threads,
		 struct castfs_diag *d)
{
	struct pipe p = { .ops = ops, .ctx = ctx, .bad = SIZE_MAX };

	pthread_mutex_init(&p.lock, NULL);
	pthread_cond_init(&p.turn, NULL);
	run_threads(pipe_thread, &p, threads);
	pthread_cond_destroy(&p.turn);
	pthread_mutex_destroy(&p.lock);
	if (p.bad != SIZE_MAX) {
		if (p.d.msg[0])
			castfs_diag_set(d, p.rc, "%s", p.d.msg);
		return p.rc;
	}
	/* No thread got a slot, so no item was taken. */
	return p.slots ? 0 : -ENOMEM;
}
