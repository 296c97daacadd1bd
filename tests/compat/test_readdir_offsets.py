# SPDX-License-Identifier: MIT
"""Directory offsets name the entry a listing goes on after, not a
position (docs/RELIABILITY.md, "Scale and resource bounds"). A reader
part-way through a listing when the directory changes (find, tar or
rsync while a download runs) gets every entry that was there throughout,
once; a telldir() cookie taken before a change seeks to the same place
after it. Before stop 46 the offsets were positions: the listing made
again once the directory changed went on at the same position, and the
entry there was skipped (a bug hunt: find missed files). The oracle is
the source directory's own listing."""
import ctypes
import os
import struct
import unittest

import castfs_testlib as tl
import rel_common as rc

SETTLE = 20.0  # seconds the watcher may take on a loaded machine
SYS_GETDENTS64 = 217  # x86_64
libc = ctypes.CDLL(None, use_errno=True)


def getdents(fd, size):
    """One getdents64 call on @fd with a @size-byte buffer: [(name, off)]."""
    buf = ctypes.create_string_buffer(size)
    n = libc.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    out, at = [], 0
    while at < n:
        _, off, reclen = struct.unpack_from("<QqH", buf.raw, at)
        name = buf.raw[at + 19:at + reclen].split(b"\0", 1)[0]
        out.append((os.fsdecode(name), off))
        at += reclen
    return out


def read_rest(fd):
    names = []
    while True:
        got = getdents(fd, 4096)
        if not got:
            return names
        names += [n for n, _ in got]


class Offsets(unittest.TestCase):
    N = 60

    def setUp(self):
        self.ctx = tl.tempdir()
        self.src = self.ctx.__enter__()
        for i in range(self.N):
            with open(os.path.join(self.src, "f%02d.txt" % i), "w") as f:
                f.write("x")
        self.m = tl.Mount(self.src)
        # Listed once: the kernel keeps the listing (FOPEN_CACHE_DIR).
        self.names = os.listdir(self.m.path)

    def tearDown(self):
        self.m.close()
        self.ctx.__exit__(None, None, None)

    def remove_and_wait(self, name):
        os.unlink(os.path.join(self.src, name))
        rc.poll(lambda: name not in os.listdir(self.m.path), SETTLE,
                "the listing to drop %s" % name)

    def test_reader_part_way_through(self):
        fd = os.open(self.m.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            first = [n for n, _ in getdents(fd, 600)]
            mine = [n for n in first if n.endswith(".txt")]
            self.assertGreater(len(mine), 1, first)
            self.assertLess(len(first), len(self.names))
            # An entry before where the reader is goes.
            self.remove_and_wait(mine[0])
            got = first + read_rest(fd)
        finally:
            os.close(fd)
        for name in set(self.names) - {mine[0]}:
            self.assertEqual(got.count(name), 1, (name, got))

    def test_telldir_cookie_after_a_change(self):
        fd = os.open(self.m.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            whole = []
            while True:
                got = getdents(fd, 4096)
                if not got:
                    break
                whole += got
        finally:
            os.close(fd)
        names = [n for n, _ in whole]
        k = len(whole) // 2
        before = [n for n in names[:k] if n.endswith(".txt")]
        self.remove_and_wait(before[0])
        fd = os.open(self.m.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.lseek(fd, whole[k][1], os.SEEK_SET)  # seekdir(telldir())
            self.assertEqual(getdents(fd, 4096)[0][0], names[k + 1])
        finally:
            os.close(fd)


if __name__ == "__main__":
    tl.main()
