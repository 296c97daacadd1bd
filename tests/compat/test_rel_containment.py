# SPDX-License-Identifier: MIT
"""Read-only and containment: every mutating system call gets
EROFS on every kind of entry; nothing is ever written inside the source
tree (hashed before and after); symbolic links are shown as links, and
castfs never opens what a link leaving the root points to (watched with
inotify), while a link inside the root gives the views of its target;
permissions
mirror the source and are enforced for other users, who see nothing at
all without allow_other."""
import ctypes
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import castfs_testlib as tl
import rel_common as rc

NOBODY = 65534


class Inotify:
    """Just enough inotify (ctypes) to see whether anything opens a file."""
    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        if self.fd < 0 or self.libc.inotify_add_watch(
                self.fd, path.encode(), self.IN_OPEN | self.IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), "inotify")

    def events(self):
        names = []
        try:
            buf = os.read(self.fd, 65536)
        except BlockingIOError:
            return names
        while buf:
            _, mask, _, n = struct.unpack_from("iIII", buf)
            names.append((mask, buf[16:16 + n].rstrip(b"\0").decode()))
            buf = buf[16 + n:]
        return names

    def close(self):
        os.close(self.fd)


def as_nobody(code, *args):
    """Run python @code as uid/gid 65534 without groups; returns its JSON."""
    out = subprocess.run(
        ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
         "--clear-groups", sys.executable, "-c", code] + list(args),
        capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


PROBE = r"""
import errno, json, os, sys
res = {}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as f:
                f.read(16)
        res[p] = "ok"
    except OSError as e:
        res[p] = errno.errorcode[e.errno]
print(json.dumps(res))
"""


class Containment(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.top = cls.tmp.__enter__()
        os.chmod(cls.top, 0o755)
        cls.src = os.path.join(cls.top, "src")
        cls.outside = os.path.join(cls.top, "outside")
        os.makedirs(os.path.join(cls.src, "sub"))
        os.makedirs(cls.outside)
        os.chmod(cls.src, 0o755)
        cls.tensors = rc.write_ckpt(os.path.join(cls.src, "m.safetensors"), 3)
        rc.write_ckpt(os.path.join(cls.src, "sub", "s.safetensors"), 4)
        rc.write_ckpt(os.path.join(cls.outside, "secret.safetensors"), 5)
        with open(os.path.join(cls.src, "notes.txt"), "w") as f:
            f.write("hello\n")
        os.symlink(os.path.join(cls.outside, "secret.safetensors"),
                   os.path.join(cls.src, "out.safetensors"))
        os.symlink("../outside/secret.safetensors",
                   os.path.join(cls.src, "dotdot.safetensors"))
        os.symlink("sub/../m.safetensors", os.path.join(cls.src, "in.safetensors"))
        os.symlink(cls.outside, os.path.join(cls.src, "outdir"))
        # Permissions: private to root, shared, and a private directory.
        cls.private = os.path.join(cls.src, "private.safetensors")
        rc.write_ckpt(cls.private, 6)
        os.chmod(cls.private, 0o600)
        os.chmod(os.path.join(cls.src, "m.safetensors"), 0o644)
        os.chmod(os.path.join(cls.src, "sub", "s.safetensors"), 0o644)
        os.makedirs(os.path.join(cls.src, "closed"))
        os.chmod(os.path.join(cls.src, "closed"), 0o700)
        os.chown(os.path.join(cls.src, "notes.txt"), 1234, 5678)
        cls.digest = rc.tree_digest(cls.top)
        cls.mount = tl.Mount(cls.src, options=["allow_other"])
        os.chmod(cls.mount.tmp, 0o755)

    @classmethod
    def tearDownClass(cls):
        code = cls.mount.unmount()
        after = rc.tree_digest(cls.top)
        cls.tmp.__exit__(None, None, None)
        assert code == 0, "castfs exited with %d" % code
        assert after == cls.digest, "the source tree changed"

    def m(self, *p):
        return self.mount.join(*p)

    def erofs(self, fn, *args):
        with self.assertRaises(OSError) as cm:
            fn(*args)
        self.assertEqual(errno.errorcode[cm.exception.errno], "EROFS",
                         "%s%r" % (fn.__name__, args))

    def test_every_mutation_is_erofs(self):
        files = [self.m("m.safetensors"), self.m(rc.view_name("m", "fp16")),
                 self.m("notes.txt"), self.m(".castfs", "stats")]
        dirs = [self.m(), self.m("sub"), self.m(".castfs")]
        if os.path.isdir(self.m("m.safetensors.tensors")):
            dirs.append(self.m("m.safetensors.tensors"))
        for p in files:
            with self.subTest(path=p):
                for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC,
                              os.O_WRONLY | os.O_APPEND):
                    self.erofs(os.open, p, flags)
                self.erofs(os.truncate, p, 0)
                self.erofs(os.chmod, p, 0o777)
                self.erofs(os.chown, p, 1, 1)
                self.erofs(os.utime, p, (1, 1))
                self.erofs(os.setxattr, p, "user.x", b"1")
                self.erofs(os.removexattr, p, "user.castfs.view")
                self.erofs(os.unlink, p)
                self.erofs(os.rename, p, p + ".new")
                self.erofs(os.link, p, p + ".lnk")
        for d in dirs:
            with self.subTest(path=d):
                self.erofs(os.open, os.path.join(d, "new"),
                           os.O_WRONLY | os.O_CREAT, 0o644)
                self.erofs(os.mkdir, os.path.join(d, "newdir"))
                self.erofs(os.symlink, "x", os.path.join(d, "newlink"))
                self.erofs(os.mknod, os.path.join(d, "fifo"), 0o600 | 0o010000)
                self.erofs(os.chmod, d, 0o777)
                self.erofs(os.setxattr, d, "user.x", b"1")
        self.erofs(os.rmdir, self.m("sub"))
        self.erofs(os.rename, self.m("sub"), self.m("sub2"))
        # fallocate and shared writable maps need a writable fd, which no
        # open gives; on a read-only one they are refused.
        fd = os.open(self.m("m.safetensors"), os.O_RDONLY)
        try:
            with self.assertRaises(OSError) as cm:
                os.posix_fallocate(fd, 0, 4096)
            self.assertIn(cm.exception.errno, (errno.EBADF, errno.EROFS))
            with self.assertRaises(OSError):
                os.write(fd, b"x")
        finally:
            os.close(fd)

    def test_statfs_says_read_only(self):
        st = os.statvfs(self.m())
        self.assertTrue(st.f_flag & os.ST_RDONLY)

    def test_links_are_links_never_followed_out_of_the_root(self):
        ino = Inotify(self.outside)
        try:
            self.assertEqual(ino.events(), [])
            names = os.listdir(self.m())
            for link, target in (("out", os.path.join(self.outside,
                                                      "secret.safetensors")),
                                 ("dotdot", "../outside/secret.safetensors"),
                                 ("in", "sub/../m.safetensors")):
                p = self.m(link + ".safetensors")
                self.assertTrue(os.path.islink(p), link)
                self.assertEqual(os.readlink(p), target)
                if link == "in":
                    continue  # stays inside the root: checked below
                for view in ("fp16", "bf16", "nf4"):
                    vn = rc.view_name(link, view)
                    self.assertNotIn(vn, names)
                    with self.assertRaises(FileNotFoundError):
                        os.stat(self.m(vn))
                with self.assertRaises(FileNotFoundError):
                    os.stat(p + ".tensors")
            # A link that stays inside the root has the views of the file
            # it reaches (how the Hugging Face cache stores checkpoints).
            for view in ("fp16", "bf16"):
                vn = rc.view_name("in", view)
                self.assertIn(vn, names)
                with open(self.m(vn), "rb") as f:
                    got = f.read()
                with open(self.m(rc.view_name("m", view)), "rb") as f:
                    self.assertEqual(got, f.read())
            self.assertTrue(os.path.islink(self.m("outdir")))
            with self.assertRaises(FileNotFoundError):
                os.stat(self.m("outdir", rc.view_name("secret", "fp16")))
            with open(self.m(".castfs", "rejected")) as f:
                self.assertNotIn("secret", f.read())
            self.assertEqual(ino.events(), [], "castfs opened the target")
            # Control: the kernel resolves links in the reader's own
            # namespace; that access shows up, so the watch works.
            with open(self.m("out.safetensors"), "rb") as f:
                f.read(8)
            self.assertIn("secret.safetensors",
                          [n for _, n in ino.events()])
            # "../outside" resolves next to the mount point: nothing there.
            with self.assertRaises(FileNotFoundError):
                open(self.m("dotdot.safetensors"), "rb")
        finally:
            ino.close()

    def test_permissions_mirror_the_source(self):
        for rel in ("m.safetensors", "private.safetensors", "notes.txt",
                    "sub", "closed"):
            s, g = os.lstat(os.path.join(self.src, rel)), os.lstat(self.m(rel))
            self.assertEqual(g.st_mode, s.st_mode & ~0o222, rel)
            self.assertEqual((g.st_uid, g.st_gid), (s.st_uid, s.st_gid), rel)
        v = os.stat(self.m(rc.view_name("private", "fp16")))
        self.assertEqual(v.st_mode & 0o777, 0o400)

    def test_permissions_enforced_for_other_users(self):
        paths = {
            "m.safetensors": "ok", rc.view_name("m", "fp16"): "ok",
            "sub": "ok", "private.safetensors": "EACCES",
            rc.view_name("private", "fp16"): "EACCES",
            rc.view_name("private", "nf4"): "EACCES",
            "closed": "EACCES",
        }
        got = as_nobody(PROBE, *[self.m(p) for p in paths])
        self.assertEqual(got, {self.m(p): r for p, r in paths.items()})

    def test_other_users_see_nothing_without_allow_other(self):
        with tl.Mount(self.src) as m2:
            os.chmod(m2.tmp, 0o755)
            got = as_nobody(PROBE, m2.join(), m2.join("m.safetensors"))
            self.assertEqual(set(got.values()), {"EACCES"}, got)
            self.assertEqual(as_nobody(PROBE, m2.join("m.safetensors")),
                             {m2.join("m.safetensors"): "EACCES"})
            # root (the mounting user) still reads it.
            with open(m2.join("m.safetensors"), "rb") as f:
                self.assertEqual(len(f.read(8)), 8)


if __name__ == "__main__":
    tl.main()
