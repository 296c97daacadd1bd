# SPDX-License-Identifier: MIT
"""Generated files exist once per identity (issue 17): a tensor tree's
.info, .npy and __metadata__.json are made on first need and shared by
every stat and open, and a large directory's listing is made once and
shared by every handle that opens it. Before, each open made its own copy:
with a tensor of a million dimensions (valid safetensors: a shape is any
list), 30 opens of its .info grew the daemon by 137 MB.

The file is written by hand (numpy cannot make an array of more than 64
dimensions); what the .info must say is taken from the JSON the test
wrote, not from castfs."""
import json
import os
import struct
import sys
import unittest

import numpy as np
from safetensors.numpy import save_file

import castfs_testlib as tl

NDIM = 1_000_000
OPENS = 40
FLAT = 30_000  # tensors of one flat file: 90,001 names in its tree's root
HANDLES = 20




def write_wide(path):
    """One F32 tensor "wide" of shape [1] * NDIM (one element) and a
    small one beside it."""
    hdr = {"wide": {"dtype": "F32", "shape": [1] * NDIM,
                    "data_offsets": [0, 4]},
           "small": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
           "__metadata__": {"format": "pt"}}
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<3f", 1.5, 2.0, -3.0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


Env = tl.ModuleSource()


def populate(src):
    write_wide(os.path.join(src, "w.safetensors"))
    save_file({"t%05d" % i: np.full((1,), i, dtype=np.float32)
               for i in range(FLAT)},
              os.path.join(src, "flat.safetensors"))


def setUpModule():
    Env.start(populate)


def tearDownModule():
    Env.stop()


class TestGeneratedShared(unittest.TestCase):
    def test_many_opens_share_one_copy(self):
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            pid = m.proc.pid
            info = m.join("w.safetensors.tensors", "wide.info")
            npy = m.join("w.safetensors.tensors", "wide.npy")
            size = os.stat(info).st_size
            with open(info, "rb") as f:
                first = f.read()
            # The size is that of the text, and the text names the shape
            # the file holds.
            self.assertEqual(len(first), size)
            self.assertGreater(size, 2 * NDIM)
            self.assertIn(b"[" + b", ".join([b"1"] * 4), first)
            before = tl.rss_mb(pid)
            files = [open(info, "rb") for _ in range(OPENS)]
            files += [open(npy, "rb") for _ in range(OPENS)]
            try:
                for f in files[:OPENS]:
                    os.posix_fadvise(f.fileno(), 0, 0,
                                     os.POSIX_FADV_DONTNEED)
                    self.assertEqual(f.read(), first)
                npy_bytes = files[OPENS].read()
                self.assertEqual(len(npy_bytes), os.stat(npy).st_size)
                # .npy: magic, then a header naming the shape, then the
                # element (1.5) as float32.
                self.assertEqual(npy_bytes[:6], b"\x93NUMPY")
                self.assertEqual(npy_bytes[-4:], struct.pack("<f", 1.5))
                for f in files[OPENS + 1:]:
                    self.assertEqual(f.read(), npy_bytes)
                held = tl.rss_mb(pid)
            finally:
                for f in files:
                    f.close()
            sys.stderr.write(".info %d bytes; RSS %.1f MB before %d opens "
                             "of it and of the .npy, %.1f MB with them\n"
                             % (size, before, OPENS, held))
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
                # One more copy each would be 2 x 40 x ~3 MB = 240 MB.
                self.assertLess(held - before, 4 * size / 2**20 + 16)
            # The neighbour and the daemon are fine.
            with open(m.join("w.safetensors.tensors", "small.raw"),
                      "rb") as f:
                self.assertEqual(f.read(), struct.pack("<2f", 2.0, -3.0))

    def test_open_handles_share_one_listing(self):
        want = {"t%05d.%s" % (i, ext) for i in range(FLAT)
                for ext in ("info", "npy", "raw")} | {"__metadata__.json"}
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            pid = m.proc.pid
            root = m.join("flat.safetensors.tensors")
            self.assertEqual(set(os.listdir(root)), want)
            before = tl.rss_mb(pid)
            fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)
                   for _ in range(HANDLES)]
            try:
                held = tl.rss_mb(pid)
                # Every handle lists the same names.
                for fd in fds[:3]:
                    self.assertEqual(set(os.listdir(fd)), want)
            finally:
                for fd in fds:
                    os.close(fd)
            sys.stderr.write("RSS %.1f MB before %d handles of a %d-entry "
                             "directory, %.1f MB with them\n"
                             % (before, HANDLES, len(want), held))
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
                # A listing of 90,001 names is about 5 MB: one per handle
                # would be 100 MB.
                self.assertLess(held - before, 16)
            self.assertEqual(set(os.listdir(root)), want)


if __name__ == "__main__":
    tl.main()
