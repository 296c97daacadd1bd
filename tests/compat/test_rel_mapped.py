# SPDX-License-Identifier: MIT
"""A source read through a mapping whose pages cannot all be read.

castfs reads a leased source's cast ranges through a mapping of it (no
pread copy; lib/common/reader.c). A page the kernel cannot supply there
must fail that read with EIO, never kill the daemon. The source here is
itself a file of another castfs mount: a packed checkpoint with one
corrupt frame, so the pages of that frame's range fail to read (EIO) and
every other page reads. The second daemon, mounted over the first, serves
the fp8 view of that file under a name of its own config (`m8`, based on
fp8: the first mount has no such view, so the second one computes it): the range over the bad frame fails with EIO,
the ranges around it equal torch's cast, a clean neighbour's whole view
equals torch's, and the daemon keeps serving. The second daemon holds a
read lease on the file (the condition for mapping it), checked in
/proc/locks.
"""
import errno
import json
import os
import shutil
import struct
import subprocess
import unittest

import torch
from safetensors.torch import save_file

import castfs_testlib as tl
from test_pack import seek_table

FRAME = 64 << 10


def header(path):
    """The safetensors header of @path and where its data starts."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def fp8_bytes(t):
    # castfs's fp8 view is torch's saturating cast (README: fp8)
    return t.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()


class MappedSource(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = tl.tempdir()
        src = cls.ctx.__enter__()
        torch.manual_seed(11)
        cls.w = (torch.randn(1024, 1024) * 0.05).bfloat16()
        save_file({"w": cls.w}, os.path.join(src, "bad.safetensors"))
        shutil.copy(os.path.join(src, "bad.safetensors"), os.path.join(src, "ok.safetensors"))
        r = subprocess.run([tl.castfs_binary(), "pack", "--no-progress", "--remove",
                            "--frame-size", "64K", os.path.join(src, "bad.safetensors")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        cls.bad_range = cls.damage_middle_frame(os.path.join(src, "bad.safetensors.zst"))
        cls.inner = tl.Mount(src)
        cls.wctx = tl.tempdir()
        cls.cfg = os.path.join(cls.wctx.__enter__(), "views.json")
        with open(cls.cfg, "w") as f:
            json.dump({"views": {"m8": {"base": "fp8"}}}, f)
        cls.outer = tl.Mount(cls.inner.path, options=["config=" + cls.cfg])

    @staticmethod
    def damage_middle_frame(path):
        """Flip a byte in the middle of a data frame half-way through the
        file; its decoded range is returned."""
        frames, _ = seek_table(path)
        k = len(frames) // 2
        coff = sum(c for c, _, _ in frames[:k])
        doff = sum(d for _, d, _ in frames[:k])
        with open(path, "r+b") as f:
            f.seek(coff + frames[k][0] // 2)
            b = f.read(1)
            f.seek(coff + frames[k][0] // 2)
            f.write(bytes([b[0] ^ 0xFF]))
        return doff, doff + frames[k][1]

    @classmethod
    def tearDownClass(cls):
        rc_outer = cls.outer.unmount()
        rc_inner = cls.inner.unmount()
        cls.ctx.__exit__(None, None, None)
        cls.wctx.__exit__(None, None, None)
        assert rc_outer == 0 and rc_inner == 0, (rc_outer, rc_inner)

    def test_inner_file_fails_only_the_bad_frame(self):
        """The premise: the first mount's file fails exactly there."""
        lo, hi = self.bad_range
        with open(self.inner.join("bad.safetensors"), "rb") as f:
            with self.assertRaises(OSError) as cm:
                os.pread(f.fileno(), 16, lo + 8)
            self.assertEqual(cm.exception.errno, errno.EIO)
            page = lo & ~4095
            self.assertEqual(len(os.pread(f.fileno(), FRAME, page - FRAME)), FRAME)

    def test_fp8_view_fails_the_bad_range_only(self):
        lo, hi = self.bad_range
        self.assertFalse(os.path.exists(self.inner.join("bad.m8.safetensors")))
        _, src_data = header(self.inner.join("ok.safetensors"))
        hdr, data = header(self.outer.join("bad.m8.safetensors"))
        self.assertEqual(hdr["w"]["dtype"], "F8_E4M3")
        want = fp8_bytes(self.w)
        # elements of the bad frame, and 256 KiB of the view either side
        e_lo, e_hi = (lo - src_data) // 2, (hi - src_data + 1) // 2
        fd = os.open(self.outer.join("bad.m8.safetensors"), os.O_RDONLY)
        try:
            self.assertIn("LEASE", open("/proc/locks").read())
            # view offsets of the bad elements' pages
            first, last = (data + e_lo) & ~4095, (data + e_hi + 4095) & ~4095
            with self.assertRaises(OSError) as cm:
                os.pread(fd, 1 << 20, first)
            self.assertEqual(cm.exception.errno, errno.EIO)
            before = max(data, first - (256 << 10))
            got = os.pread(fd, first - before, before)
            self.assertEqual(got, want[before - data:first - data])
            got = os.pread(fd, 256 << 10, last)
            self.assertEqual(got, want[last - data:last - data + (256 << 10)])
        finally:
            os.close(fd)

    def test_neighbour_and_daemon_keep_working(self):
        with open(self.outer.join("bad.m8.safetensors"), "rb") as f:
            with self.assertRaises(OSError) as cm:
                f.read()
            self.assertEqual(cm.exception.errno, errno.EIO)
        _, data = header(self.outer.join("ok.m8.safetensors"))
        with open(self.outer.join("ok.m8.safetensors"), "rb") as f:
            self.assertEqual(f.read()[data:], fp8_bytes(self.w))
        self.assertIsNone(self.outer.proc.poll())
        with open(self.outer.join(".castfs", "stats")) as f:
            json.load(f)


if __name__ == "__main__":
    tl.main()
