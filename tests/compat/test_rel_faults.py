# SPDX-License-Identifier: MIT
"""Faults.

kill -9 of an unsupervised daemon (-o nosupervise; a supervised one is
restarted on the same connection, tests/compat/test_restart.py): the dead
mount answers ENOTCONN, `fusermount3 -u` clears it, and
a daemon restarted on the same mount point serves the same node ids for
the same names (files, views, directories, tensor trees, control files).

Source I/O errors: the source is a FUSE filesystem (tests/fuse/faultfs)
that fails reads reaching a given offset of files named *fault* with EIO,
the way a bad sector does, below an unmodified castfs. Reads that hit the
bad bytes get EIO, through the raw file and through views; reads that do
not, and other files, are served correctly; a checkpoint whose header
cannot be read is rejected with the reason; the daemon keeps running.

castfs pack's read-back: a source on faultfs whose byte changes between
the pack's read and the read-back (size and mtime unchanged) gets no pack
and, under --remove, is not deleted; --no-verify shows the difference.
"""
import errno
import json
import os
import signal
import struct
import subprocess
import time
import unittest

import castfs_testlib as tl
import rel_common as rc

FAULT_OFF = 65536


def faultfs_binary():
    top = os.environ.get("top_builddir",
                         os.path.join(os.path.dirname(__file__), "..", ".."))
    return os.path.join(top, "tests", "fuse", "faultfs")


def wait_mounted(mnt, proc, fstype):
    def up():
        if proc.poll() is not None:
            raise AssertionError("%s exited with %d" % (fstype, proc.returncode))
        with open("/proc/self/mountinfo") as f:
            return any(l.split()[4] == mnt and (" - %s " % fstype) in l
                       for l in f)
    rc.poll(up, 30, "%s to mount" % fstype)


def start_castfs(src, mnt):
    p = subprocess.Popen([tl.castfs_binary(), "-f", "-o", "nosupervise", src,
                          mnt],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_mounted(mnt, p, "fuse.castfs")
    return p


class KillAndRestart(unittest.TestCase):
    NAMES = ["m.safetensors", rc.view_name("m", "fp16"),
             rc.view_name("m", "nf4"), "sub", "sub/s.safetensors",
             os.path.join("sub", rc.view_name("s", "bf16")), "notes.txt",
             ".castfs", ".castfs/stats", "m.safetensors.tensors"]

    def test_kill_9_umount_restart_same_ids(self):
        with rc_tempdir() as top:
            src, mnt = os.path.join(top, "src"), os.path.join(top, "mnt")
            os.makedirs(os.path.join(src, "sub"))
            os.mkdir(mnt)
            t = rc.write_ckpt(os.path.join(src, "m.safetensors"), 1)
            rc.write_ckpt(os.path.join(src, "sub", "s.safetensors"), 2)
            with open(os.path.join(src, "notes.txt"), "w") as f:
                f.write("x\n")
            names = self.NAMES
            p = start_castfs(src, mnt)
            fd = -1
            try:
                ids = self.ids(mnt, names)
                fd = os.open(os.path.join(mnt, rc.view_name("m", "fp16")),
                             os.O_RDONLY)  # in use at the kill
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)
                with self.assertRaises(OSError) as cm:
                    os.listdir(mnt)
                self.assertEqual(cm.exception.errno, errno.ENOTCONN)
                with self.assertRaises(OSError) as cm:
                    os.pread(fd, 4096, 0)
                self.assertEqual(cm.exception.errno, errno.ENOTCONN)
                os.close(fd)
                fd = -1
                subprocess.run(["fusermount3", "-u", mnt], check=True,
                               timeout=60)
                self.assertFalse(tl._mounted(mnt))
                p = start_castfs(src, mnt)
                self.assertEqual(self.ids(mnt, names), ids)
                with open(os.path.join(mnt, rc.view_name("m", "fp16")),
                          "rb") as f:
                    self.assertEqual(f.read(), rc.view_bytes(t, "fp16"))
            finally:
                if fd >= 0:
                    os.close(fd)
                if tl._mounted(mnt):
                    subprocess.run(["fusermount3", "-u", "-z", mnt], timeout=60)
                p.wait(timeout=30)
            self.assertEqual(p.returncode, 0)

    def ids(self, mnt, names):
        out = {}
        for n in names:
            # Every name exists, the tensor tree included (it is built in:
            # a missing one is a failure, not a name to leave out).
            out[n] = os.stat(os.path.join(mnt, n)).st_ino
        self.assertGreaterEqual(len(out), len(names) - 1)
        self.assertEqual(len(out), len(names))
        self.assertEqual(len(set(out.values())), len(out), "ids collide")
        return out


class rc_tempdir:
    def __enter__(self):
        self.cm = tl.tempdir()
        return self.cm.__enter__()

    def __exit__(self, *a):
        return self.cm.__exit__(*a)


class SourceIOErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(faultfs_binary(), os.X_OK):
            raise unittest.SkipTest("faultfs not built")
        cls.tmp = tl.tempdir()
        top = cls.tmp.__enter__()
        cls.real, cls.fmnt = os.path.join(top, "real"), os.path.join(top, "fmnt")
        os.makedirs(cls.real)
        os.makedirs(cls.fmnt)
        cls.good = rc.write_ckpt(os.path.join(cls.real, "good.safetensors"), 1, 8)
        cls.bad = rc.write_ckpt(os.path.join(cls.real, "fault.safetensors"), 2, 16)
        # A header longer than FAULT_OFF: its checkpoint cannot be read.
        from safetensors.torch import save_file
        save_file(rc.make_tensors(3), os.path.join(cls.real, "faulthdr.safetensors"),
                  metadata={"format": "pt", "pad": "x" * (FAULT_OFF + 100)})
        with open(os.path.join(cls.real, "fault.safetensors"), "rb") as f:
            cls.bad_bytes = f.read()
        assert len(cls.bad_bytes) > 4 * FAULT_OFF
        cls.fproc = subprocess.Popen([faultfs_binary(), cls.real, cls.fmnt,
                                      str(FAULT_OFF), "-f"])
        wait_mounted(cls.fmnt, cls.fproc, "fuse.faultfs")
        cls.mount = tl.Mount(cls.fmnt)

    @classmethod
    def tearDownClass(cls):
        code = cls.mount.unmount()
        subprocess.run(["fusermount3", "-u", cls.fmnt], timeout=60)
        cls.fproc.wait(timeout=30)
        cls.tmp.__exit__(None, None, None)
        assert code == 0, "castfs exited with %d" % code

    def pread(self, name, n, off):
        fd = os.open(self.mount.join(name), os.O_RDONLY | os.O_DIRECT)
        try:
            return os.pread(fd, n, off)
        finally:
            os.close(fd)

    def eio(self, name, n, off):
        with self.assertRaises(OSError) as cm:
            self.pread(name, n, off)
        self.assertEqual(cm.exception.errno, errno.EIO, "%s @%d" % (name, off))

    def test_raw_reads_that_hit_the_fault_get_eio(self):
        b = self.bad_bytes
        self.assertEqual(self.pread("fault.safetensors", 4096, 0), b[:4096])
        self.assertEqual(self.pread("fault.safetensors", 100, FAULT_OFF - 100),
                         b[FAULT_OFF - 100:FAULT_OFF])
        self.eio("fault.safetensors", 200, FAULT_OFF - 100)
        self.eio("fault.safetensors", 4096, 3 * FAULT_OFF)
        with self.assertRaises(OSError) as cm:
            with open(self.mount.join("fault.safetensors"), "rb") as f:
                f.read()
        self.assertEqual(cm.exception.errno, errno.EIO)

    def test_view_reads_that_hit_the_fault_get_eio(self):
        want = rc.view_bytes(self.bad, "fp32")  # same layout as the source
        name = rc.view_name("fault", "fp32")
        self.assertEqual(os.stat(self.mount.join(name)).st_size, len(want))
        # The header and "ids" (copied from the start of the source's data)
        # read fine; the rest of the view is computed from faulty bytes.
        hlen = 8 + struct.unpack("<Q", want[:8])[0]
        end = hlen + json.loads(want[8:hlen])["ids"]["data_offsets"][1]
        self.assertEqual(self.pread(name, end, 0), want[:end])
        self.eio(name, 4096, len(want) - 4096)
        for view in ("fp16", "bf16", "nf4"):
            with self.subTest(view=view):
                size = os.stat(self.mount.join(rc.view_name("fault", view))).st_size
                with self.assertRaises(OSError) as cm:
                    with open(self.mount.join(rc.view_name("fault", view)),
                              "rb") as f:
                        f.read()
                self.assertEqual(cm.exception.errno, errno.EIO)
                self.assertGreater(size, 0)

    def test_unreadable_header_is_rejected_with_the_reason(self):
        names = os.listdir(self.mount.path)
        self.assertIn("faulthdr.safetensors", names)
        self.assertNotIn(rc.view_name("faulthdr", "fp16"), names)
        with open(self.mount.join(".castfs", "rejected")) as f:
            rej = {e["path"]: e for e in json.load(f)}
        self.assertEqual(rej["faulthdr.safetensors"]["error"],
                         os.strerror(errno.EIO))

    def test_other_files_unaffected_and_daemon_alive(self):
        for _ in range(3):
            self.eio("fault.safetensors", 4096, 3 * FAULT_OFF)
            for view in rc.CAST_VIEWS:
                with open(self.mount.join(rc.view_name("good", view)), "rb") as f:
                    self.assertEqual(f.read(), rc.view_bytes(self.good, view))
        self.assertIsNone(self.mount.proc.poll())


class PackReadBack(unittest.TestCase):
    """castfs pack reads the pack back against the source before it takes
    its name: a source whose bytes changed under it (faultfs's *flip*
    file: byte FLIP_OFF inverted from the second read covering it on,
    size and mtime unchanged) gets no pack, and --remove keeps it."""
    FLIP_OFF = 3 * 65536 + 5

    def setUp(self):
        if not os.access(faultfs_binary(), os.X_OK):
            self.fail("faultfs not built")
        self.tmp = tl.tempdir()
        top = self.tmp.__enter__()
        self.real, self.fmnt = os.path.join(top, "real"), os.path.join(top, "fmnt")
        self.work = os.path.join(top, "work")
        for d in (self.real, self.fmnt, self.work):
            os.makedirs(d)
        # bf16 weights well past FLIP_OFF: the header is read alone first.
        import torch
        from safetensors.torch import save_file
        g = torch.Generator().manual_seed(41)
        save_file({"w": (torch.randn(512, 512, generator=g) * 0.02)
                   .to(torch.bfloat16)},
                  os.path.join(self.real, "flip.safetensors"))
        with open(os.path.join(self.real, "flip.safetensors"), "rb") as f:
            self.orig = f.read()
        self.assertGreater(len(self.orig), 2 * self.FLIP_OFF)
        # The same bytes, and an fstat that then shows a later mtime.
        with open(os.path.join(self.real, "flip-moved.safetensors"), "wb") as f:
            f.write(self.orig)
        # No attribute cache: pack's fstat of its source reaches faultfs.
        self.fproc = subprocess.Popen([faultfs_binary(), self.real, self.fmnt,
                                       str(self.FLIP_OFF), "-f", "-o",
                                       "attr_timeout=0"])
        wait_mounted(self.fmnt, self.fproc, "fuse.faultfs")
        # pack writes beside its argument: a link in a writable directory.
        self.src = os.path.join(self.work, "m.safetensors")
        os.symlink(os.path.join(self.fmnt, "flip.safetensors"), self.src)

    def tearDown(self):
        subprocess.run(["fusermount3", "-u", self.fmnt], timeout=60)
        self.fproc.wait(timeout=30)
        self.tmp.__exit__(None, None, None)

    def pack(self, *opts, src=None):
        return subprocess.run([tl.castfs_binary(), "pack", "--no-progress",
                               "--remove"] + list(opts) + [src or self.src],
                              capture_output=True, text=True, timeout=120)

    def test_visibly_changed_source_said_changed(self):
        # The read-back differs, and the source's mtime moved: the reason
        # given is the change, not the offset.
        src = os.path.join(self.work, "n.safetensors")
        os.symlink(os.path.join(self.fmnt, "flip-moved.safetensors"), src)
        r = self.pack(src=src)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("changed while being packed", r.stderr)
        self.assertNotIn("other bytes", r.stderr)
        self.assertEqual(sorted(os.listdir(self.work)),
                         ["m.safetensors", "n.safetensors"])

    def test_changed_source_gets_no_pack_and_is_kept(self):
        for opts in ([], ["--grouped"]):
            r = self.pack(*opts)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("other bytes than the original from byte %d"
                          % self.FLIP_OFF, r.stderr)
            self.assertTrue(os.path.islink(self.src), opts)
            self.assertEqual(os.listdir(self.work), ["m.safetensors"], opts)
        with open(os.path.join(self.real, "flip.safetensors"), "rb") as f:
            self.assertEqual(f.read(), self.orig)

    def test_without_the_read_back_the_difference_is_kept(self):
        r = self.pack("--no-verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.lexists(self.src))
        out = os.path.join(self.work, "m.safetensors")
        r = subprocess.run([tl.castfs_binary(), "unpack", "--no-progress",
                            out + ".zst"], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            got = f.read()
        # The pack holds the bytes of the first read; a second read of
        # the source differs in one byte, which a read-back would have
        # seen.
        self.assertTrue(got == self.orig)
        fd = os.open(os.path.join(self.fmnt, "flip.safetensors"), os.O_RDONLY)
        try:
            first = os.pread(fd, len(got), 0)
            now = os.pread(fd, len(got), 0)
        finally:
            os.close(fd)
        self.assertTrue(first == got)
        self.assertEqual([i for i in range(len(got)) if got[i] != now[i]],
                         [self.FLIP_OFF])


if __name__ == "__main__":
    tl.main()
