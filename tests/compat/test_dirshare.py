# SPDX-License-Identifier: MIT
"""A source directory's listing is made once per directory state and
shared by every handle open on it (issue 17; docs/RELIABILITY.md, "Scale
and resource bounds"). Twenty handles of a directory of 3,000 checkpoints
each start their listing before any ends (so that the kernel, whose cache
is not complete yet, sends each one's READDIR to the daemon), then read it
to the end. Before, each handle's first READDIR made its own listing: the
daemon grew by twenty listings. A checkpoint added while they are open
shows in a new handle's listing; the old handles see every name they would
have and nothing that is not a name of the directory. The oracle is the
source directory (the names written, safetensors' own files) and the
first listing."""
import os
import sys
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl
import rel_common as rc

COUNT = 3000
HANDLES = 20
SETTLE = 20.0  # seconds the watcher may take on a loaded machine
# A listing of 30,001 entries is about 2 MB of the daemon's (main's build:
# 40 MB more for 20 handles); one shared, and the headers parsed, 5.5 MB.
LIMIT_MB = 16




def drain(it):
    return [e.name for e in it]


Env = tl.ModuleSource()


def populate(src):
    data = save({"w": np.arange(2, dtype=np.float32)})
    for i in range(COUNT):
        with open(os.path.join(src, "m%05d.safetensors" % i), "wb") as f:
            f.write(data)


def setUpModule():
    Env.start(populate)


def tearDownModule():
    Env.stop()


class TestDirShare(unittest.TestCase):
    def test_handles_share_one_listing(self):
        sources = {"m%05d.safetensors" % i for i in range(COUNT)}
        with tl.caches_kept(), \
                tl.Mount(Env.src, options=["nosupervise"]) as m:
            pid = m.proc.pid
            os.stat(m.join("."))
            before = tl.rss_mb(pid)
            fds = [os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
                   for _ in range(HANDLES)]
            its = [os.scandir(fd) for fd in fds]
            try:
                # Each handle's first getdents before any ends.
                firsts = [[next(it).name] for it in its]
                lists = [f + drain(it) for f, it in zip(firsts, its)]
                held = tl.rss_mb(pid)
            finally:
                for it in its:
                    it.close()
                for fd in fds:
                    os.close(fd)
            one = lists[0]
            sys.stderr.write("RSS %.1f MB before %d handles of %d entries, "
                             "%.1f MB with them\n"
                             % (before, HANDLES, len(one), held))
            # Complete: every source checkpoint, its tensor tree, no
            # name twice; and every handle the same.
            self.assertEqual(len(one), len(set(one)))
            self.assertLessEqual(sources, set(one))
            self.assertLessEqual({s + ".tensors" for s in sources}, set(one))
            for names in lists[1:]:
                self.assertEqual(names, one)
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
                self.assertLess(held - before, LIMIT_MB)

    def test_added_file_while_open(self):
        with tl.caches_kept(), \
                tl.Mount(Env.src, options=["nosupervise"]) as m:
            fds = [os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
                   for _ in range(HANDLES)]
            its = [os.scandir(fd) for fd in fds]
            added = os.path.join(Env.src, "zz_new.safetensors")
            try:
                # The daemon's listing, kept for the open handles: a new
                # handle must not be given it once the directory changed.
                firsts = [[next(it).name] for it in its]
                old = set(firsts[0] + drain(its[0]))
                firsts[0] = list(old)
                with open(added, "wb") as f:
                    f.write(save({"v": np.ones(3, dtype=np.float32)}))
                rc.poll(lambda: "zz_new.safetensors" in os.listdir(m.path),
                        SETTLE, "the new checkpoint listed")
                new = set(os.listdir(m.path))
                lists = [f + drain(it) for f, it in zip(firsts, its)]
            finally:
                for it in its:
                    it.close()
                for fd in fds:
                    os.close(fd)
                os.unlink(added)
            self.assertIn("zz_new.safetensors.tensors", new)
            self.assertLessEqual(old, new)
            for names in lists:
                # Every name it would have listed, and nothing that is
                # not a name of the directory (an old handle may or may
                # not see the new file, as on any filesystem).
                self.assertLessEqual(old, set(names))
                self.assertLessEqual(set(names), new)


if __name__ == "__main__":
    tl.main()
