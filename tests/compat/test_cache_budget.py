# SPDX-License-Identifier: MIT
"""Memory is given back: the checkpoint cache keeps parsed headers, plans
and tensor trees only while something uses them or within its budget
(-o cache_mb), and the daemon returns what it evicts to the system
(docs/RELIABILITY.md, "Scale and resource bounds"). Before this, three
100,000-tensor files left the daemon at about 300 MB after the kernel had
forgotten every node; the goal is within twice its idle size.

The kernel is made to forget the mount's nodes with
`echo 2 > /proc/sys/vm/drop_caches` (root only; skipped otherwise). The
files are written by the safetensors library, and the views read after an
eviction are compared with torch's cast."""
import json
import os
import sys
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from safetensors.numpy import save_file

import castfs_testlib as tl
import rel_common as rc

NBIG = 3
NTENSORS = 100_000
STATTED = 40_000
KEPT_FORGOTTEN = 32768  # NS_FORGOTTEN_MAX: nodes kept for NFS handles
SMALL_SCALE = 64  # 1.6 MB of fp32 weights
DROP = "/proc/sys/vm/drop_caches"
THREADS = 4  # the daemon's worker pool, fixed so idle means the same here and in CI



def memory(m):
    """The daemon's own account of what it holds (/.castfs/stats)."""
    with open(m.join(".castfs/stats")) as f:
        return json.load(f)["memory"]


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))



def forget_all():
    tl.drop_caches(2)


def settle_rss(pid, cond, timeout=15.0):
    """RSS once @cond holds for it, or the last value after @timeout."""
    deadline = time.time() + timeout
    while True:
        now = tl.rss_mb(pid)
        if cond(now) or time.time() > deadline:
            return now
        time.sleep(0.2)


def use(m, stem):
    """What a loader does with a checkpoint: look up its views, read the
    head of two of them (plans built), list its tensor tree."""
    for view in ("bf16", "fp16"):
        with open(m.join(rc.view_name(stem, view)), "rb") as f:
            f.read(1 << 20)
    os.listdir(m.join(stem + ".safetensors.tensors"))


def warm_workers(m):
    """Idle means the daemon's whole worker pool exists and has served a
    read: each worker keeps its own request, output and scratch buffers
    (about 4 MB), and libfuse starts workers only as concurrent requests
    need them. Without this, idle was measured with one worker and the
    pool the big files' work started counted as memory not given back."""
    names = [rc.view_name("small", v) for v in ("bf16", "fp16")]

    def read(i):
        with open(m.join(names[i % 2]), "rb") as f:
            # Else the page cache answers and no request reaches a worker.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while f.read(1 << 20):
                pass
    with ThreadPoolExecutor(4 * THREADS) as ex:
        list(ex.map(read, range(16 * THREADS)))


Env = tl.ModuleSource()


def populate(src):
    # Big enough in data that serving it uses every buffer a read uses.
    rc.write_ckpt(os.path.join(src, "small.safetensors"), 1, SMALL_SCALE)
    for k in range(NBIG):
        save_file({"layers.%d.w%d" % (i // 10, i % 10):
                   np.full((2,), i + k, dtype=np.float32)
                   for i in range(NTENSORS)},
                  os.path.join(src, "big%d.safetensors" % k))


def setUpModule():
    if not os.access(DROP, os.W_OK):
        raise unittest.SkipTest("cannot make the kernel forget (not root)")
    Env.start(populate)


def tearDownModule():
    Env.stop()


class TestCacheBudget(unittest.TestCase):
    def check_small_view(self, m):
        """The small checkpoint's bf16 view, whole, equals torch's."""
        want = rc.view_bytes(rc.make_tensors(1, SMALL_SCALE), "bf16")
        with open(m.join(rc.view_name("small", "bf16")), "rb") as f:
            self.assertEqual(f.read(), want)

    def test_1_forgotten_checkpoints_are_given_back(self):
        with tl.Mount(Env.src, options=["nosupervise",
                                        "threads=%d" % THREADS]) as m:
            pid = m.proc.pid
            # Idle: the threads and buffers serving these requests exist.
            use(m, "small")
            warm_workers(m)
            self.check_small_view(m)
            forget_all()
            idle = settle_rss(pid, lambda r: False, timeout=1.0)
            workers = threads(pid)
            # No other test's drop_caches meanwhile (make check runs two
            # at once): the kernel would forget the files before the peak
            # is read (a CI run saw 62 MB against 261 alone).
            with tl.caches_kept():
                for k in range(NBIG):
                    use(m, "big%d" % k)
                peak = tl.rss_mb(pid)
                held = memory(m)
            forget_all()
            after = settle_rss(pid, lambda r: r <= 2 * idle)
            freed = memory(m)
            # The kernel forgets nodes when it gets to them: on a loaded
            # machine (or under ASan, whose RSS never settles) ask again.
            deadline = time.time() + 15
            while (freed["cache_bytes"] > freed["cache_budget_bytes"]
                   and time.time() < deadline):
                forget_all()
                time.sleep(0.5)
                freed = memory(m)
            sys.stderr.write("threads: %d idle, %d after\n"
                             % (workers, threads(pid)))
            sys.stderr.write("RSS idle %.1f MB, after %d files of %d tensors "
                             "%.1f MB, after the kernel forgot them %.1f MB\n"
                             % (idle, NBIG, NTENSORS, peak, after))
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
                # The files did cost memory (else the test shows nothing):
                # their parsed headers, which the kernel's nodes keep
                # (since stop 42 their plans are given back past the
                # budget; 91 MB measured, 140 before; 50-58 MB since stop
                # 45's leaner header parse, which a bound of 50 failed by
                # 0.03 MB), well above twice the idle RSS below...
                self.assertGreater(peak, max(idle + 30, 3 * idle))
                # ...and it came back.
                self.assertLessEqual(after, 2 * idle)
            with self.subTest("cache accounting"):
                # The cache held the parsed files past its budget, and
                # once they were forgotten no more than its budget.
                self.assertGreater(held["cache_bytes"],
                                   held["cache_budget_bytes"])
                self.assertLessEqual(freed["cache_bytes"],
                                     freed["cache_budget_bytes"])
                self.assertEqual(freed["cache_budget_bytes"], 64 << 20)
            with self.subTest("node table"):
                # What `ls -lR` does: a node for each of 40,000 tensor
                # files, past the 32,768 forgotten nodes kept for NFS
                # handles; forgotten, the table frees all but those.
                # No other test's drop_caches until the count is read
                # (make check runs two at once): the kernel would forget
                # them early, and a sweep free them.
                tree = m.join("big0.safetensors.tensors", "layers")
                with tl.caches_kept():
                    for i in range(STATTED // 10):
                        for j in range(10):
                            os.lstat(os.path.join(tree, str(i),
                                                  "w%d.npy" % j))
                    self.assertGreater(memory(m)["nodes"], STATTED)
                forget_all()
                deadline = time.time() + 15
                while (memory(m)["nodes"] > KEPT_FORGOTTEN + 64
                       and time.time() < deadline):
                    time.sleep(0.2)
                self.assertLessEqual(memory(m)["nodes"], KEPT_FORGOTTEN + 64)
            # What was evicted is parsed again, exactly.
            self.check_small_view(m)
            use(m, "big0")

    def test_2_unused_entries_stay_within_the_budget(self):
        # A listing parses every header but keeps no node: with a 16 MB
        # budget each entry is past it on its own, so all but the most
        # recently used one go as soon as the listing is done.
        with tl.Mount(Env.src, options=["nosupervise", "cache_mb=16"]) as m:
            pid = m.proc.pid
            use(m, "small")
            forget_all()
            idle = settle_rss(pid, lambda r: False, timeout=1.0)
            names = sorted(os.listdir(m.path))
            listed = tl.rss_mb(pid)
            self.assertEqual(sorted(os.listdir(m.path)), names)
            self.assertIn(rc.view_name("big2", "bf16"), names)
            sys.stderr.write("RSS idle %.1f MB, after listing %d files of "
                             "%d tensors with cache_mb=16: %.1f MB\n"
                             % (idle, NBIG, NTENSORS, listed))
            # Kept, the three would be 200-300 MB (test_1); one costs
            # 65-90 MB.
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
                self.assertLess(listed, idle + 16 + 110)
            self.check_small_view(m)

    def test_3_held_entries_give_back_their_plans(self):
        """`ls -l` of every view of the big files: the kernel holds a
        node for each (for its entry timeout, a day), so their entries
        cannot be evicted; until stop 42 their plans, one per view, were
        kept too, beyond any budget (a bug hunt: 2.2 GB for four such
        files with cache_mb=16). Past the budget, an entry only nodes
        hold now gives back its plans, and keeps its parsed header."""
        with tl.Mount(Env.src, options=["nosupervise", "cache_mb=16"]) as m:
            with tl.caches_kept():  # the kernel must hold the nodes
                names = sorted(n for n in os.listdir(m.path)
                               if n.startswith("big"))
                for n in names:
                    os.stat(m.join(n))
                self.check_small_view(m)  # a charge: the cache trims
                mem = memory(m)
            sys.stderr.write("after ls -l of %d names: cache %.0f MB "
                             "(budget %.0f MB), %d entries\n"
                             % (len(names), mem["cache_bytes"] / 1e6,
                                mem["cache_budget_bytes"] / 1e6,
                                mem["cache_entries"]))
            self.assertGreater(len(names), 3 * NBIG)
            # The headers the nodes keep (test_1: 20-30 MB of cost each)
            # and one entry's plans at most (the most recent stays
            # whole): several views' plans of every file were 4x that.
            self.assertLess(mem["cache_bytes"], 400 << 20)
            # What was given back is built again, exactly.
            self.check_small_view(m)
            use(m, "big1")


if __name__ == "__main__":
    tl.main()
