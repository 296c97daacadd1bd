/* SPDX-License-Identifier: MIT */
/*
 * Read leases on source files (fcntl F_SETLEASE): the kernel makes a
 * writer's open(2) or truncate(2) wait until castfs gives the lease back,
 * and signals castfs first. The signal handler marks the fd broken; the
 * lease is given back once no read of that fd is in flight. Every read
 * that ends after the mark is refused, so no reply ever mixes the bytes of
 * two versions — even for a same-size rewrite within one timestamp tick,
 * which size and mtime alone cannot see.
 *
 * Leases need CAP_LEASE or the file's ownership, and a filesystem that
 * supports them; where they fail, castfs falls back on size and mtime.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/fault.h"
#include "fs.h"

enum { LEASE_NONE, LEASE_HELD, LEASE_BROKEN };

/* Per fd; touched by the signal handler, so lock-free atomics only. */
struct lease_slot {
	atomic_int state;
	atomic_int inflight;
};

static struct lease_slot *slots;
static size_t nslots;

static int lease_signal(void)
{
	return SIGRTMIN + 3;
}

static void give_back(int fd)
{
	/* Failure means there was no lease left to give back. */
	(void)fcntl(fd, F_SETLEASE, F_UNLCK);
}

static void on_lease_break(int sig, siginfo_t *si, void *uc)
{
	int fd = si->si_fd, saved = errno;
	struct lease_slot *s;

	(void)sig;
	(void)uc;
	if (fd < 0 || (size_t)fd >= nslots)
		return;
	s = &slots[fd];
	if (atomic_load(&s->state) == LEASE_NONE)
		return; /* a late signal for an fd no longer watched */
	atomic_store(&s->state, LEASE_BROKEN);
	/* Readers still in flight give it back as they leave. */
	if (atomic_load(&s->inflight) == 0)
		give_back(fd);
	errno = saved;
}

static int lease_watch(void *ctx, int fd)
{
	struct lease_slot *s;
	int err;

	(void)ctx;
	if (fd < 0 || (size_t)fd >= nslots)
		return -EMFILE;
	s = &slots[fd];
	atomic_store(&s->inflight, 0);
	atomic_store(&s->state, LEASE_HELD);
	if (fcntl(fd, F_SETSIG, lease_signal()) == 0 &&
	    fcntl(fd, F_SETLEASE, F_RDLCK) == 0)
		return 0;
	err = errno;
	atomic_store(&s->state, LEASE_NONE);
	/* EAGAIN: someone has it open for writing right now. */
	return -err;
}

static bool lease_leave(void *ctx, int fd)
{
	struct lease_slot *s = &slots[fd];
	int left = atomic_fetch_sub(&s->inflight, 1) - 1;

	(void)ctx;
	if (atomic_load(&s->state) != LEASE_BROKEN)
		return true;
	if (left == 0)
		give_back(fd);
	return false;
}

static bool lease_enter(void *ctx, int fd)
{
	struct lease_slot *s = &slots[fd];

	/* Count first, then look: the handler stores first, then counts. */
	atomic_fetch_add(&s->inflight, 1);
	if (atomic_load(&s->state) != LEASE_BROKEN)
		return true;
	lease_leave(ctx, fd);
	return false;
}

static void lease_unwatch(void *ctx, int fd)
{
	(void)ctx;
	atomic_store(&slots[fd].state, LEASE_NONE);
	give_back(fd);
}

static const struct castfs_source_guard lease_guard = {
	.watch = lease_watch,
	.enter = lease_enter,
	.leave = lease_leave,
	.unwatch = lease_unwatch,
};

/*
 * A leased source may be read through a mapping (castfs_fd_reader_map);
 * a page the kernel cannot supply there (an I/O error, or a lease that
 * ran out while a read was in flight) ends that read with EIO. Any other
 * SIGBUS is a bug: the default action then, from the same instruction.
 */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (castfs_fault_escape(si->si_addr))
		return; /* not reached: escape unwinds */
	signal(sig, SIG_DFL);
}

static int fault_route(void)
{
	/* SA_NODEFER: escaping unwinds the handler without restoring the
	 * mask, so SIGBUS must not be blocked while it runs. */
	struct sigaction sa = { .sa_sigaction = on_sigbus,
				.sa_flags = SA_SIGINFO | SA_NODEFER };

	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL);
}

const struct castfs_source_guard *castfs_fs_lease_init(void)
{
	struct sigaction sa = { .sa_sigaction = on_lease_break,
				.sa_flags = SA_SIGINFO | SA_RESTART };
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return NULL;
	nslots = rl.rlim_cur < (1u << 20) ? (size_t)rl.rlim_cur : 1u << 20;
	slots = calloc(nslots, sizeof(*slots));
	if (!slots)
		return NULL;
	sigemptyset(&sa.sa_mask);
	if (sigaction(lease_signal(), &sa, NULL) < 0 || fault_route() < 0) {
		free(slots);
		slots = NULL;
		return NULL;
	}
	return &lease_guard;
}
