# SPDX-License-Identifier: MIT
"""Read leases on sources: a writer that opens a source while castfs serves
it makes castfs refuse every later read of the open file, even when the
writer changes nothing that size or mtime would show; a source open for
writing is not served until the writer closes it."""
import errno
import os
import threading
import unittest

import castfs_testlib as tl
import rel_common as rc


class Leases(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        self.path = os.path.join(self.src, "c.safetensors")
        self.tensors = rc.write_ckpt(self.path, seed=1)
        self.mount = tl.Mount(self.src)

    def tearDown(self):
        try:
            self.mount.close()
        finally:
            self.tmp.__exit__(None, None, None)

    def open_for_writing_in_thread(self):
        """Open the source O_WRONLY (no write, no truncate) from another
        thread: the open itself breaks castfs's lease."""
        done = threading.Event()
        fds = []

        def writer():
            fds.append(os.open(self.path, os.O_WRONLY))
            done.set()

        t = threading.Thread(target=writer)
        t.start()
        self.assertTrue(done.wait(30), "the writer's open never returned")
        t.join()
        return fds[0]

    def check_open_file_refused(self, name, expected):
        fd = os.open(self.mount.join(name), os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 64, 0), expected[:64])
            st = os.stat(self.path)
            wfd = self.open_for_writing_in_thread()
            try:
                # Nothing changed: same size, same mtime...
                self.assertEqual(os.stat(self.path).st_mtime_ns, st.st_mtime_ns)
                self.assertEqual(os.stat(self.path).st_size, st.st_size)
                # ...yet reads that reach castfs are refused. Drop the
                # kernel's cached pages so that the read reaches it.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                with self.assertRaises(OSError) as cm:
                    os.pread(fd, 64, len(expected) - 64)
                self.assertEqual(cm.exception.errno, errno.EIO)
            finally:
                os.close(wfd)
        finally:
            os.close(fd)

    def test_writer_open_breaks_views_and_passthrough(self):
        for name, expected in (
                ("c.fp16.safetensors", rc.view_bytes(self.tensors, "fp16")),
                ("c.safetensors", open(self.path, "rb").read())):
            with self.subTest(name=name):
                self.check_open_file_refused(name, expected)

    def test_source_open_for_writing_is_not_served(self):
        view = self.mount.join("c.bf16.safetensors")
        wfd = os.open(self.path, os.O_WRONLY)
        try:
            with self.assertRaises(OSError) as cm:
                os.open(view, os.O_RDONLY)
            self.assertEqual(cm.exception.errno, errno.ESTALE)
        finally:
            os.close(wfd)
        # The writer is gone: the same name serves the exact bytes again.
        with open(view, "rb") as f:
            self.assertEqual(f.read(), rc.view_bytes(self.tensors, "bf16"))


if __name__ == "__main__":
    tl.main()
