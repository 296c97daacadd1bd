# SPDX-License-Identifier: MIT
"""A long shape in a tensor tree's generated files is made per read range
(issue 17): the .info and .npy of a tensor with a million dimensions (valid
safetensors: a shape is any list) have their sizes known from the parsed
header, a stat makes none of their text, and a read makes only the bytes
it asks for. Before, a stat of each made and kept the whole text (~6 MB
for the .info, ~3 MB for the .npy header).

The oracles are numpy and torch (np.load of the .npy of a 64-dimension
tensor, the most numpy loads, equals torch's tensor), safetensors (the
shape a .info states is the one safe_open reads) and json (the shape
lines parse as JSON lists)."""
import io
import json
import os
import struct
import sys
import unittest

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import castfs_testlib as tl

NDIM = 1_000_000
WIDE = 3
# numpy's most dimensions; also the length from which a shape is made per
# range (tensor_files.c), so these .npy files take that path.
DEEP = [1] * 30 + [2] + [1] * 31 + [3, 2]


def write_wide(path):
    """F32 tensors wide0..wide2 of a million dimensions (one has a 3 in
    the middle, so three elements) and a small one beside them."""
    hdr, data, off = {}, b"", 0
    for i in range(WIDE):
        shape = [1] * NDIM
        if i == 1:
            shape[NDIM // 2] = 3
        n = 3 if i == 1 else 1
        vals = struct.pack("<%df" % n, *[1.5 + i + k for k in range(n)])
        hdr["wide%d" % i] = {"dtype": "F32", "shape": shape,
                             "data_offsets": [off, off + len(vals)]}
        data += vals
        off += len(vals)
    hdr["small"] = {"dtype": "F32", "shape": [2],
                    "data_offsets": [off, off + 8]}
    data += struct.pack("<2f", 2.0, -3.0)
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


Env = tl.ModuleSource()


def populate(s):
    write_wide(os.path.join(s, "w.safetensors"))
    g = torch.Generator().manual_seed(3)
    save_file({"deep": torch.randn(DEEP, generator=g).to(torch.bfloat16),
               "deep_f32": torch.randn(DEEP, generator=g),
               "deep_i8": torch.randint(-128, 127, DEEP, generator=g,
                                        dtype=torch.int8)},
              os.path.join(s, "d.safetensors"))


def setUpModule():
    Env.start(populate)


def tearDownModule():
    Env.stop()


def info_lines(text):
    """The .info's "key: value" lines as a dict."""
    out = {}
    for line in text.decode().splitlines():
        k, _, v = line.partition(": ")
        out[k] = v
    return out


def read_ranges(path, size, step):
    """The file read back in odd ranges, the kernel's copy dropped first,
    so that each range reaches the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        parts, off = [], 0
        while off < size:
            parts.append(os.pread(fd, step, off))
            off += step
        return b"".join(parts)
    finally:
        os.close(fd)


class TestGeneratedRange(unittest.TestCase):
    def test_npy_of_many_dimensions_loads_as_torch(self):
        want = load_file(os.path.join(Env.src, "d.safetensors"))
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            for name in want:
                with self.subTest(name):
                    path = m.join("d.safetensors.tensors", name + ".npy")
                    got = np.load(path)
                    ref = want[name]
                    if ref.dtype == torch.bfloat16:
                        ref = ref.float()
                    self.assertEqual(got.shape, tuple(DEEP))
                    np.testing.assert_array_equal(got, ref.numpy())
                    size = os.stat(path).st_size
                    with open(path, "rb") as f:
                        whole = f.read()
                    self.assertEqual(len(whole), size)
                    self.assertEqual(read_ranges(path, size, 37), whole)
            info = m.join("d.safetensors.tensors", "deep.info")
            with open(info, "rb") as f:
                lines = info_lines(f.read())
            self.assertEqual(json.loads(lines["shape"]), DEEP)

    def test_info_states_the_header_shape(self):
        with safe_open(os.path.join(Env.src, "w.safetensors"), "np") as f:
            shape = f.get_slice("wide1").get_shape()
        self.assertEqual(len(shape), NDIM)
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            path = m.join("w.safetensors.tensors", "wide1.info")
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                text = f.read()
            self.assertEqual(len(text), size)
            lines = info_lines(text)
            self.assertEqual(json.loads(lines["shape"]), shape)
            # "npy: <f4 [1, ...], the bytes as stored; N bytes, data at H"
            npy = lines["npy"]
            dims = npy[npy.index("["):npy.index("]") + 1]
            self.assertEqual(json.loads(dims), shape)
            self.assertEqual(read_ranges(path, size, 4093), text)
            npy_path = m.join("w.safetensors.tensors", "wide1.npy")
            self.assertIn("%d bytes, data at" % os.stat(npy_path).st_size,
                          npy)
            with open(npy_path, "rb") as f:
                data = f.read()
            self.assertEqual(data[-12:], struct.pack("<3f", 2.5, 3.5, 4.5))
            # numpy's header, read as numpy reads it (it cannot load the
            # array: more than 64 dimensions).
            fp = io.BytesIO(data)
            version = np.lib.format.read_magic(fp)
            self.assertEqual(version, (2, 0))
            hdr_shape, fortran, dtype = \
                np.lib.format.read_array_header_2_0(fp,
                                                    max_header_size=2**30)
            self.assertEqual(list(hdr_shape), shape)
            self.assertEqual((fortran, dtype), (False, np.dtype("<f4")))

    def test_stat_and_read_make_no_whole_text(self):
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            pid = m.proc.pid
            root = m.join("w.safetensors.tensors")
            names = ["wide%d.%s" % (i, ext) for i in range(WIDE)
                     for ext in ("info", "npy")]
            self.assertLessEqual(set(names), set(os.listdir(root)))
            with open(os.path.join(root, "small.raw"), "rb") as f:
                self.assertEqual(f.read(), struct.pack("<2f", 2.0, -3.0))
            before = tl.rss_mb(pid)
            sizes = [os.stat(os.path.join(root, n)).st_size for n in names]
            stat = tl.rss_mb(pid)
            total = 0
            for n, size in zip(names, sizes):
                total += len(read_ranges(os.path.join(root, n), size,
                                         1 << 20))
            read = tl.rss_mb(pid)
            self.assertEqual(total, sum(sizes))
            sys.stderr.write("%d files of %.1f MB: RSS %.1f MB, %.1f after "
                             "stat, %.1f after reading them\n"
                             % (len(names), total / 2**20, before, stat,
                                read))
            if tl.sanitizer(pid):
                self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
            # Held whole they are 26 MB: main's daemon grew by 18 MB on
            # the stats alone, by 20 MB with the reads. Per range: an
            # index of 32 KB a shape, and read buffers.
            self.assertLess(stat - before, 4)
            self.assertLess(read - before, 12)


if __name__ == "__main__":
    tl.main()
