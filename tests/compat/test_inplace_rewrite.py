# SPDX-License-Identifier: MIT
"""A source rewritten in place with its size kept and its mtime put back
(what `rsync --inplace -t` does) is a new version (stop 42, a bug hunt).

castfs took (device, inode, size, mtime) for a file's identity: such a
rewrite kept the views' node ids, so the kernel kept the old version's
cached pages beside the new bytes (one read returned both versions
mixed), and after a daemon restart a file opened on the old version
read the new bytes without an error. The identity now holds the ctime
too, which no writer can put back.

For a held reader with a live daemon, and across a daemon killed while
the file is rewritten: a fresh open reads the new version whole (the
fp16 view against safetensors' writer of the new tensor, the file
itself against its bytes), and the file opened on the old version reads
the old bytes or fails, never the new ones.
"""
import os
import signal
import time
import unittest

import torch
from safetensors.torch import save, save_file

import castfs_testlib as tl
import rel_common as rc


MD = {"format": "pt"}


def version(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4096, 1024, generator=g)}  # 16 MiB of F32


class InPlace(unittest.TestCase):
    def setUp(self):
        self.ctx = tl.tempdir()
        self.src = self.ctx.__enter__()
        self.addCleanup(self.ctx.__exit__, None, None, None)
        self.path = os.path.join(self.src, "m.safetensors")
        self.old, self.new = version(1), version(2)
        save_file(self.old, self.path, metadata=MD)
        self.want = {
            name: {"m.safetensors": save(t, MD),
                   "m.fp16.safetensors": rc.view_bytes(t, "fp16")}
            for name, t in (("old", self.old), ("new", self.new))}
        self.assertEqual(len(self.want["old"]["m.safetensors"]),
                         len(self.want["new"]["m.safetensors"]))

    def rewrite(self):
        """The new version into the same inode, its mtime put back."""
        st = os.stat(self.path)
        time.sleep(0.01)  # a ctime the old one cannot have
        with open(self.path, "r+b") as f:
            f.write(self.want["new"]["m.safetensors"])
        os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.assertEqual(os.stat(self.path).st_mtime_ns, st.st_mtime_ns)

    def held(self, m):
        """Both files opened and partly read (2 MiB in the page cache)."""
        fds = {}
        for name in self.want["old"]:
            fd = os.open(m.join(name), os.O_RDONLY)
            self.addCleanup(os.close, fd)
            self.assertEqual(os.pread(fd, 2 << 20, 0),
                             self.want["old"][name][:2 << 20])
            fds[name] = fd
        return fds

    def check(self, m, fds):
        for name, fd in fds.items():
            off = 8 << 20
            try:
                got = os.pread(fd, 4 << 20, off)
            except OSError:
                continue  # the version it opened is gone: an error is right
            self.assertEqual(got, self.want["old"][name][off:off + len(got)],
                             "%s opened on the old version read others"
                             % name)
        for name, want in self.want["new"].items():
            with open(m.join(name), "rb") as f:
                got = f.read()
            self.assertEqual(len(got), len(want), name)
            self.assertTrue(got == want, "%s: not the new version whole"
                            % name)

    def test_live_daemon(self):
        m = tl.Mount(self.src)
        self.addCleanup(m.unmount)  # after the fds close (LIFO)
        fds = self.held(m)
        self.rewrite()
        time.sleep(1)  # the watcher's turn
        self.check(m, fds)

    def test_across_a_restart(self):
        m = tl.Mount(self.src)
        self.addCleanup(m.unmount)  # after the fds close (LIFO)
        fds = self.held(m)
        d = m.daemon()
        os.kill(d, signal.SIGKILL)
        self.rewrite()  # while no daemon holds a lease on it
        rc.poll(lambda: m.daemon() != d or None, 30, "a new daemon")
        self.check(m, fds)

if __name__ == "__main__":
    tl.main()
