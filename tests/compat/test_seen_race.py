# SPDX-License-Identifier: MIT
"""A name created in the source while its lookup is under way is told to
the kernel (the watcher's seen-name filter).

The watcher reports a changed name to the kernel only when a lookup of
this daemon answered it (ns_name_seen()): the kernel holds no dentry of
any other. A lookup marked its name seen after it had looked at the
source, so a change in between was filtered out, and the lookup's answer
then stayed in the kernel for the day-long entry timeout. The window is
as old as the filter (a bug hunt of FUSE_PARALLEL_DIROPS found it: the
directory's other lookups and listings now go on meanwhile and show the
change, beside the stale answer that contradicts them).

Deterministic with a lease: this process holds a write lease on source
a.safetensors, so the lookup of the view a.fp8.safetensors waits in the
daemon's open of it. Meanwhile a real file a.fp8.safetensors is created
in the source (a real file shadows a view of its name) and the watcher
handles the event. Once the lease is given up the lookup answers the
view; the watcher must have told the kernel to drop that answer, so that
the name then reads as the real file.
"""
import fcntl
import os
import signal
import threading
import unittest

import castfs_testlib as tl
import rel_common as rc
from test_parallel_dirops import lease_breaking

REAL = b"a real file that shadows the view of its name\n"


class SeenRace(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        self.tensors = rc.write_ckpt(os.path.join(self.src, "a.safetensors"),
                                     1)
        self.old = signal.signal(signal.SIGIO, lambda *a: None)

    def tearDown(self):
        signal.signal(signal.SIGIO, self.old)
        self.tmp.__exit__(None, None, None)

    def test_a_name_created_during_its_lookup_is_invalidated(self):
        name = "a.fp8.safetensors"
        with tl.Mount(self.src) as m:
            m.daemon()
            fd = os.open(os.path.join(self.src, "a.safetensors"),
                         os.O_RDONLY)
            errs = []

            def look():
                try:
                    os.stat(m.join(name))
                except OSError as e:
                    errs.append(e)
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
                t = threading.Thread(target=look)
                t.start()
                # The lookup waits in the daemon's open of the source.
                rc.poll(lambda: lease_breaking(fd), 30, "the lease broken")
                before = handled(m)
                with open(os.path.join(self.src, name), "wb") as f:
                    f.write(REAL)
                # The watcher took the new name's event (sent or skipped:
                # a sent one waits in the kernel for the lookup).
                rc.poll(lambda: handled(m) > before, 30,
                        "the watcher to handle the new file")
            finally:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                os.close(fd)
            t.join(60)
            self.assertEqual(errs, [])
            # The listing the kernel gets now has the real file; so must
            # the name.
            rc.poll(lambda: read(m.join(name)) == REAL, 10,
                    "the name to read as the real file")
            self.assertEqual(os.stat(m.join(name)).st_size, len(REAL))


def handled(m):
    """Entry invalidations the watcher sent or skipped so far."""
    s = m.stats()
    return s["entry_invalidations"] + s["entry_invalidations_skipped"]


def read(path):
    with open(path, "rb") as f:
        return f.read()


if __name__ == "__main__":
    tl.main()
