# SPDX-License-Identifier: MIT
"""READDIRPLUS: `ls -l` gets each entry's attributes with the listing
(docs/RELIABILITY.md, "Scale and resource bounds"), so a directory never
looked up costs no LOOKUP round trip per entry, and every entry so
returned is a lookup for the daemon as for the kernel:

- `ls -l` of a directory of 300 checkpoints (3,000 names with their
  views) answers only the first reply's by LOOKUP (/.castfs/stats), and each
  size it prints is right: a source file's is the source's (os.stat
  beside the mount), a view's is the length of its bytes read back; a
  second `ls -l` sends no LOOKUP, GETATTR or READDIR and at most two
  getxattr (not two per entry);
- checkpoints whose names only READDIRPLUS gave the kernel follow a
  rewrite (the watcher tells the kernel only about names a lookup of this
  daemon answered: without counting the entry, the old size stays a day);
- once the kernel forgets everything (drop_caches, root only), every node
  those listings made is forgotten too: each entry was counted once, and
  "." and ".." (which the kernel never counts) not at all, else the
  directory's node would stay."""
import json
import os
import subprocess
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl
import rel_common as rc

N = 300
SETTLE = 20.0


def blob(n):
    return save({"w": np.arange(n, dtype=np.float32)})


def name(i):
    return "c%04d.safetensors" % i


def requests(m, op):
    with open(m.join(".castfs", "stats")) as f:
        st = json.load(f)
    return st.get("requests", st)[op]


def live_nodes(m):
    with open(m.join(".castfs", "metrics")) as f:
        v = dict(line.split() for line in f
                 if line.startswith("castfs_nodes"))
    return int(v["castfs_nodes"]) - int(v["castfs_nodes_forgotten"])


def ls_l(path):
    """{name: size} as `ls -l` prints them."""
    out = subprocess.run(["ls", "-l", "--time-style=+", path], check=True,
                         capture_output=True, text=True).stdout
    sizes = {}
    for line in out.splitlines()[1:]:
        f = line.split(None, 5)
        sizes[f[5]] = int(f[4])
    return sizes


class TestReaddirplus(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        self.sub = os.path.join(self.src, "sub")
        os.mkdir(self.sub)
        for i in range(N):
            with open(os.path.join(self.sub, name(i)), "wb") as f:
                f.write(blob(4 + i % 7))

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def test_ls_l(self):
        with tl.Mount(self.src) as m:
            base = live_nodes(m)  # the root, /.castfs and its metrics
            with tl.caches_kept():
                self.listed_with_attributes(m)
            self.forgotten(m, base)

    def listed_with_attributes(self, m):
        before = requests(m, "lookup")
        sizes = ls_l(m.join("sub"))
        lookups = requests(m, "lookup") - before
        self.assertGreaterEqual(len(sizes), 10 * N)
        # ls -l looks up "sub" itself and the first reply's entries (a
        # listing's start is answered plain: `ls -f` looks nothing up).
        self.assertLess(lookups, len(sizes) // 2,
                        "%d LOOKUPs for %d entries" % (lookups, len(sizes)))
        for i in range(N):
            self.assertEqual(sizes[name(i)],
                             os.stat(os.path.join(self.sub, name(i))).st_size)
        for i in range(0, N, 37):
            view = rc.view_name(name(i)[:-12], "fp8")
            with open(m.join("sub", view), "rb") as f:
                self.assertEqual(sizes[view], len(f.read()))
        self.warm_ls_l_asks_nothing(m, sizes)
        # Rewritten: most came with READDIRPLUS (all but the first
        # reply's entries), never looked up.
        for i in range(0, N, 10):
            with open(os.path.join(self.sub, name(i)), "wb") as f:
                f.write(blob(1000))
        for i in range(0, N, 10):
            want = os.stat(os.path.join(self.sub, name(i))).st_size
            rc.poll(lambda: os.stat(m.join("sub", name(i))).st_size == want,
                    SETTLE, "%s to show its new size" % name(i))

    def warm_ls_l_asks_nothing(self, m, sizes):
        """A warm `ls -l` is answered by the kernel: the listing (cached),
        every entry's attributes, and the xattr probes, which ls stops
        after the first EOPNOTSUPP (docs/MOUNTING.md, "Extended
        attributes"). Only OPENDIR and the two probes reach the daemon."""
        ops = ("lookup", "getattr", "readdir", "getxattr", "listxattr")
        before = {op: requests(m, op) for op in ops}
        self.assertEqual(ls_l(m.join("sub")), sizes)
        asked = {op: requests(m, op) - before[op] for op in ops}
        self.assertLessEqual(asked.pop("getxattr"), 2, asked)
        self.assertEqual(asked, dict.fromkeys(asked, 0))

    def forgotten(self, m, base):
        if os.geteuid() != 0:
            self.skipTest("drop_caches needs root")
        now = None
        for _ in range(50):
            tl.drop_caches(2)
            now = live_nodes(m)
            if now <= base:
                break
        # "sub" too: a lookup counted for "." would keep it.
        self.assertEqual(now, base)


if __name__ == "__main__":
    tl.main()
