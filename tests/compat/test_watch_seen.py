# SPDX-License-Identifier: MIT
"""The change watcher tells the kernel only about names it may hold
(docs/RELIABILITY.md, "Scale and resource bounds"): a name no lookup of
this daemon answered has no dentry in the kernel, so touching checkpoints
nobody looked up sends no notification at all, while a looked-up name and
its views still follow a change at once (the entry timeout is a day: a
missed notification would leave the old size for that long). A daemon
that took over the connection (a restart under the supervisor) tells the
kernel about every name, since the kernel may hold names the daemon
before it answered. The oracle is the source file itself (os.stat beside
the mount) and the safetensors library's own files."""
import json
import os
import signal
import struct
import time
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl
import rel_common as rc
from test_restart import wait_daemon

N = 200
SETTLE = 20.0  # seconds the watcher may take on a loaded machine


def blob(n):
    return save({"w": np.arange(n, dtype=np.float32)})


def name(i):
    return "c%04d.safetensors" % i


def settled(m, key, moved_from=None):
    """The counter @key once it stops moving (the watcher is done): first,
    when @moved_from is given, until it has moved past it (the watcher may
    not have started on a change yet), then until it holds for 0.3 s (10 ms
    apart, two equal readings were seen before the watcher woke up)."""
    if moved_from is not None:
        rc.poll(lambda: m.stats()[key] > moved_from, SETTLE,
                "the watcher to start on the change")
    last = [None, 0.0]

    def same():
        now, t = m.stats()[key], time.monotonic()
        if now != last[0]:
            last[0], last[1] = now, t
        return t - last[1] >= 0.3
    rc.poll(same, SETTLE, "the watcher to settle")
    return last[0]


class TestWatchSeen(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        for i in range(N):
            with open(os.path.join(self.src, name(i)), "wb") as f:
                f.write(blob(4))

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def follows(self, m, i, n):
        """Rewrite checkpoint @i with @n values; its file and fp8 view
        show the new size through names the kernel already holds."""
        p = os.path.join(self.src, name(i))
        with open(p, "wb") as f:
            f.write(blob(n))
        want = os.stat(p).st_size
        rc.poll(lambda: os.stat(m.join(name(i))).st_size == want, SETTLE,
                "%s to show its new size" % name(i))
        view = m.join(rc.view_name(name(i)[:-12], "fp8"))
        with open(view, "rb") as f:
            data = f.read()
        head = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
        self.assertEqual(head["w"]["shape"], [n])

    def test_names_nobody_looked_up_cost_nothing(self):
        with tl.Mount(self.src) as m:
            listed = os.listdir(m.path)  # parsed, no lookup
            self.assertIn(rc.view_name("c0000", "fp8"), listed)
            for i in range(3):  # these names the kernel holds
                os.stat(m.join(name(i)))
                os.stat(m.join(rc.view_name(name(i)[:-12], "fp8")))
            base = settled(m, "entry_invalidations_skipped")
            sent = m.stats()["entry_invalidations"]
            for i in range(N):
                os.utime(os.path.join(self.src, name(i)))
            skipped = settled(m, "entry_invalidations_skipped",
                              moved_from=base) - base
            sent = m.stats()["entry_invalidations"] - sent
            # Two held names for each of 3 files (a hash collision may
            # add one); every other name of the 200 was skipped.
            self.assertGreaterEqual(sent, 6)
            self.assertLess(sent, 12)
            self.assertGreater(skipped, 20 * N)
            for i in (0, 2):
                self.follows(m, i, 8 + i)
            # A name first looked up now (no dentry before) shows the
            # change too: it is a fresh lookup.
            self.follows(m, 50, 12)

    def test_a_restarted_daemon_tells_the_kernel_every_name(self):
        with tl.Mount(self.src) as m:
            for i in range(2):
                os.stat(m.join(name(i)))
                os.stat(m.join(rc.view_name(name(i)[:-12], "fp8")))
            sup = m.proc.pid
            os.kill(wait_daemon(sup), signal.SIGKILL)
            wait_daemon(sup)
            os.stat(m.join(".castfs", "stats"))  # the new one serves
            # The new daemon answered no lookup of these names: the
            # kernel holds them from the one it replaced.
            self.follows(m, 1, 16)
            self.assertGreater(m.stats()["entry_invalidations"], 0)
            self.assertEqual(m.stats()["entry_invalidations_skipped"], 0)


if __name__ == "__main__":
    tl.main()
