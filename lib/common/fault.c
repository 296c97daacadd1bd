/* SPDX-License-Identifier: MIT */
/* castfs_fault_call / castfs_fault_escape: see fault.h. */
#include <errno.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/fault.h"

struct fault_frame {
	sigjmp_buf jb;
	uintptr_t lo, hi;
	struct fault_frame *prev;
};

/* The calling thread's guarded calls, innermost first; read by its own
 * handler. */
static _Thread_local struct fault_frame *volatile fault_top;

int castfs_fault_call(const void *lo, size_t len, int (*fn)(void *arg),
		      void *arg)
{
	struct fault_frame fr;
	int rc;

	fr.lo = (uintptr_t)lo;
	fr.hi = fr.lo + len;
	fr.prev = fault_top;
	/* No signal mask saved: that would be a system call per call. The
	 * handler runs with SA_NODEFER, so no mask needs restoring. */
	if (sigsetjmp(fr.jb, 0)) {
		fault_top = fr.prev;
		atomic_signal_fence(memory_order_seq_cst);
		return -EIO;
	}
	fault_top = &fr;
	atomic_signal_fence(memory_order_seq_cst);
	rc = fn(arg);
	atomic_signal_fence(memory_order_seq_cst);
	fault_top = fr.prev;
	return rc;
}

bool castfs_fault_escape(const void *addr)
{
	uintptr_t a = (uintptr_t)addr;

	/* The innermost call whose range holds @addr, not just the innermost
	 * call: a narrower nested call must not leave its parent's range
	 * unguarded. Jumping past the inner calls abandons them too, as their
	 * contract allows. */
	for (struct fault_frame *f = fault_top; f; f = f->prev)
		if (a >= f->lo && a < f->hi)
			siglongjmp(f->jb, 1);
	return false;
}
