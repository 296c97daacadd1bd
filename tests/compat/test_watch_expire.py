# SPDX-License-Identifier: MIT
"""The watcher expires, rather than drops, the names of a file whose
attributes alone changed (touch, chmod: IN_ATTRIB only; docs/RELIABILITY.md
"Scale and resource bounds"): the next use looks them up again. Both sides
of that shortcut are checked through names the kernel holds (entry and
attribute timeouts are a day, so nothing here can pass by expiring):
- a touch or chmod shows at once on the file and on its views;
- a rewrite that keeps the size, the header and even the mtime (restored
  with utime, as coarse timestamps or a careful copier would leave it)
  still serves the new bytes: its node id stays the same, so a merely
  expired name would keep the kernel's page cache of the old bytes.
The oracles are the source file (os.stat beside the mount, its bytes) and
the views torch and the safetensors writer make of the new tensors
(rel_common.view_bytes)."""
import os
import stat
import unittest

import castfs_testlib as tl
import rel_common as rc

SETTLE = 20.0  # seconds the watcher may take on a loaded machine
STEM = "m"
VIEWS = ("fp16", "bf16")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def read_now(path):
    """The bytes at @path, or None while a read fails (a read the daemon
    answers from a source being rewritten fails with EIO: retried)."""
    try:
        return read(path)
    except OSError:
        return None


class TestWatchExpire(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        self.path = os.path.join(self.src, STEM + ".safetensors")
        self.tensors = rc.write_ckpt(self.path, 1)

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def names(self):
        return [STEM + ".safetensors"] + [rc.view_name(STEM, v)
                                          for v in VIEWS]

    def hold(self, m):
        """Look up the file and its views and read them whole: the kernel
        then holds their names, attributes and pages."""
        for n in self.names():
            os.stat(m.join(n))
            read(m.join(n))

    def test_a_touch_and_a_chmod_show_on_held_names(self):
        with tl.Mount(self.src) as m:
            self.hold(m)
            os.utime(self.path, ns=(1_500_000_000_123_456_789,) * 2)
            want = os.stat(self.path).st_mtime_ns
            for n in self.names():
                rc.poll(lambda: os.stat(m.join(n)).st_mtime_ns == want,
                        SETTLE, "%s to show the new mtime" % n)
            os.chmod(self.path, 0o600)
            for n in self.names():
                rc.poll(lambda: stat.S_IMODE(os.stat(m.join(n)).st_mode) ==
                        0o400, SETTLE, "%s to show the new mode" % n)
            self.assertEqual(read(m.join(self.names()[0])), read(self.path))
            for v in VIEWS:
                self.assertEqual(read(m.join(rc.view_name(STEM, v))),
                                 rc.view_bytes(self.tensors, v))

    def test_a_rewrite_keeping_size_and_mtime_serves_new_bytes(self):
        with tl.Mount(self.src) as m:
            self.hold(m)
            old = os.stat(self.path)
            new = rc.write_ckpt(self.path + ".tmp", 2)
            data = read(self.path + ".tmp")
            os.unlink(self.path + ".tmp")
            self.assertEqual(len(data), old.st_size)  # same header too
            # In place (same inode), then the old times back.
            with open(self.path, "r+b") as f:
                f.write(data)
            os.utime(self.path, ns=(old.st_atime_ns, old.st_mtime_ns))
            self.assertEqual(os.stat(self.path).st_mtime_ns, old.st_mtime_ns)
            rc.poll(lambda: read_now(m.join(self.names()[0])) == data, SETTLE,
                    "the file to serve its new bytes")
            for v in VIEWS:
                want = rc.view_bytes(new, v)
                rc.poll(lambda: read_now(m.join(rc.view_name(STEM, v))) == want,
                        SETTLE, "the %s view to serve the new bytes" % v)


if __name__ == "__main__":
    tl.main()
