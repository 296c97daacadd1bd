/* SPDX-License-Identifier: MIT */
/*
 * Reading a mapped source without trusting it: a call made through
 * castfs_fault_call() returns -EIO when it touches a page of its range that
 * the kernel cannot supply (SIGBUS: an I/O error under the mapping, or a
 * file shortened beneath it), instead of killing the process. The process
 * installs a SIGBUS handler that calls castfs_fault_escape() (fs/ does).
 */
#ifndef CASTFS_FAULT_H
#define CASTFS_FAULT_H

#include <stdbool.h>
#include <stddef.h>

/*
 * castfs_fault_call - run @fn(@arg) so that a SIGBUS at an address in
 * [@lo, @lo + @len) ends it: -EIO then, else @fn's result. Per thread.
 * Nestable, with any ranges: a fault ends the innermost call whose range
 * holds it, and every call nested in that one. @fn must hold no lock and
 * own no allocation across its touches of the range, nor across the
 * guarded calls it makes: it is abandoned mid-way (as by longjmp) on a
 * fault.
 */
int castfs_fault_call(const void *lo, size_t len, int (*fn)(void *arg),
		      void *arg);

/*
 * castfs_fault_escape - for a SIGBUS handler: when @addr (si_addr) lies in
 * the range of one of the calling thread's castfs_fault_call()s, unwind to
 * the innermost such call and do not return. Returns false otherwise (the fault is someone
 * else's: the handler should let it kill the process). Async-signal-safe.
 */
bool castfs_fault_escape(const void *addr);

#endif
