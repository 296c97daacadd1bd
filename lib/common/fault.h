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
 * [@lo, @lo + @len) ends it: -EIO then, else @fn's result. Nestable; per
 * thread. @fn must hold no lock and own no allocation across its touches
 * of the range: it is abandoned mid-way (as by longjmp) on a fault.
 */
int castfs_fault_call(const void *lo, size_t len, int (*fn)(void *arg),
		      void *arg);

/*
 * castfs_fault_escape - for a SIGBUS handler: when @addr (si_addr) lies in
 * the range of the calling thread's innermost castfs_fault_call(), unwind
 * to it and do not return. Returns false otherwise (the fault is someone
 * else's: the handler should let it kill the process). Async-signal-safe.
 */
bool castfs_fault_escape(const void *addr);

#endif
