# SPDX-License-Identifier: MIT
"""Lookups of one directory run at once (FUSE_PARALLEL_DIROPS).

libfuse before 3.16 never passes FUSE_PARALLEL_DIROPS to the kernel
(libfuse#861), however the file system asks, so the kernel held one lock
per directory across every LOOKUP in it: one slow first lookup (a plan
built from a large header, a GGUF file's tokenizer parsed) held up every
other name of that directory, for every process and NFS client. castfs
adds the flag to its INIT reply (fs/fs_io.c).

The slow lookup is made deterministic with a lease: this process holds
a write lease on source a.safetensors, so the daemon's open of it (the
lookup of a.fp8.safetensors parses its header) waits until the lease is
given up. Meanwhile b.fp8.safetensors, in the same directory, must be
looked up and served. Without the flag it waits behind a's lookup, and
the test fails after WAIT_S.
"""
import fcntl
import os
import signal
import threading
import unittest

import castfs_testlib as tl
import rel_common as rc

# How long b's lookup may take while a's waits: generous for a loaded
# machine and the sanitizers, well under the kernel's lease-break-time
# (45 s), after which a's open would go on without the lease given up.
WAIT_S = 20.0


class ParallelLookups(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        cls.tensors = {n: rc.write_ckpt(os.path.join(cls.src,
                                                     n + ".safetensors"), i)
                       for i, n in enumerate("ab")}
        # A lease break signals its holder (SIGIO): only a wake-up here.
        cls.old = signal.signal(signal.SIGIO, lambda *a: None)

    @classmethod
    def tearDownClass(cls):
        signal.signal(signal.SIGIO, cls.old)
        cls.tmp.__exit__(None, None, None)

    def held_up(self, options):
        """Look a.fp8.safetensors up while its source's lease is held, then
        b.fp8.safetensors; returns whether b was served while a waited."""
        with tl.Mount(self.src, options=options) as m:
            m.daemon()
            fd = os.open(os.path.join(self.src, "a.safetensors"),
                         os.O_RDONLY)
            got, errs = {}, []

            def read(name):
                try:
                    with open(m.join(name + ".fp8.safetensors"), "rb") as f:
                        got[name] = f.read()
                except OSError as e:
                    errs.append(e)
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
                ta = threading.Thread(target=read, args=("a",))
                ta.start()
                # a's lookup has reached the daemon's open when the lease
                # is being broken: /proc/locks says so.
                rc.poll(lambda: lease_breaking(fd), 30, "the lease broken")
                tb = threading.Thread(target=read, args=("b",))
                tb.start()
                tb.join(WAIT_S)
                served = "b" in got and "a" not in got
            finally:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                os.close(fd)
            ta.join(60)
            tb.join(60)
        self.assertEqual(errs, [])
        for n in "ab":
            self.assertEqual(got[n], rc.view_bytes(self.tensors[n], "fp8"), n)
        return served

    def test_a_slow_lookup_holds_up_no_other_name(self):
        self.assertTrue(self.held_up([]),
                        "b's lookup waited for a's: no parallel dirops")

    def test_without_the_supervisor_too(self):
        self.assertTrue(self.held_up(["nosupervise"]),
                        "b's lookup waited for a's: no parallel dirops")


def lease_breaking(fd):
    """Whether the lease on open file @fd is being broken: its /proc/locks
    line reads LEASE BREAKING (or BREAKER)."""
    ino = os.fstat(fd).st_ino
    with open("/proc/locks") as f:
        for line in f:
            if "LEASE" in line and ":%d " % ino in line + " ":
                return "BREAK" in line
    return False


if __name__ == "__main__":
    tl.main()
