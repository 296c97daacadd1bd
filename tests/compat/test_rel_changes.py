# SPDX-License-Identifier: MIT
"""Changing sources: a checkpoint truncated, rewritten in place
(with or without O_TRUNC), replaced by rename, deleted, or created
while mounted and being read by threads (pread) and processes (mmap).
Every read is compared with the old or the new reference: readers get
whole old content, whole new content, or an error (EIO/ESTALE on reads,
SIGBUS for a mapped page that cannot be read), never a mix; reopening gives
the new content; listings and lookups follow within a bounded wait without
remounting; the daemon keeps running and exits cleanly."""
import errno
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import unittest

import castfs_testlib as tl
import rel_common as rc

OK_READ_ERRORS = {errno.EIO, errno.ESTALE}
OK_OPEN_ERRORS = {errno.EIO, errno.ESTALE, errno.ENOENT}
SETTLE = 10.0  # seconds the watcher may take (it takes milliseconds)

MMAP_READER = r"""
import hashlib, mmap, os, sys, time
path, until = sys.argv[1], float(sys.argv[2])
while time.time() < until:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        print("E%d" % e.errno, flush=True)
        continue
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            print("H" + hashlib.sha256(b"").hexdigest(), flush=True)
            continue
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            print("H" + hashlib.sha256(m[:]).hexdigest(), flush=True)
    except OSError as e:
        print("E%d" % e.errno, flush=True)
    finally:
        os.close(fd)
"""


def sha(b):
    return hashlib.sha256(b).hexdigest()


class Readers:
    """pread threads and mmap processes reading @paths until stopped."""

    def __init__(self, mount, refs, threads=3, procs=2):
        self.mount, self.refs = mount, refs  # name -> [bytes, ...]
        self.stop = threading.Event()
        self.problems, self.counts = [], {"ok": 0, "err": 0, "sigbus": 0}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.pread_loop, args=(i,))
                        for i in range(threads)]
        self.nprocs = procs
        self.mmap_threads = [threading.Thread(target=self.mmap_loop, args=(n,))
                             for n in list(refs)[:procs]]

    def start(self):
        for t in self.threads + self.mmap_threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads + self.mmap_threads:
            t.join(timeout=120)
            assert not t.is_alive(), "reader stuck"

    def note(self, kind, problem=None):
        with self.lock:
            self.counts[kind] += 1
            if problem:
                self.problems.append(problem)

    def read_once(self, name, rng, flags):
        """Open, read all in random chunks; each chunk must come from one
        version, the same for the whole open."""
        refs = self.refs[name]
        try:
            fd = os.open(self.mount.join(name), os.O_RDONLY | flags)
        except OSError as e:
            return self.note("err", None if e.errno in OK_OPEN_ERRORS
                             else "open %s: %s" % (name, e))
        try:
            size = os.fstat(fd).st_size
            cands = [r for r in refs if len(r) == size]
            if not cands:
                return self.note("ok", "%s: size %d matches no version"
                                 % (name, size))
            off = 0
            while off < size:
                n = rng.randrange(1, 300000)
                data = os.pread(fd, n, off)
                if not data:
                    return self.note("ok", "%s: early EOF at %d" % (name, off))
                cands = [r for r in cands if r[off:off + len(data)] == data]
                if not cands:
                    return self.note("ok", "%s: MIXED bytes at %d" % (name, off))
                off += len(data)
            self.note("ok")
        except OSError as e:
            self.note("err", None if e.errno in OK_READ_ERRORS
                      else "read %s: %s" % (name, e))
        finally:
            os.close(fd)

    def pread_loop(self, i):
        rng = random.Random(i)
        names = list(self.refs)
        # O_DIRECT readers bypass the page cache: every read reaches the
        # daemon, which must detect the change; the others read cached
        # pages of the version they opened.
        flags = os.O_DIRECT if i % 2 == 0 else 0
        while not self.stop.is_set():
            self.read_once(rng.choice(names), rng, flags)

    def mmap_loop(self, name):
        good = {"H" + sha(r) for r in self.refs[name]}
        while not self.stop.is_set():
            p = subprocess.Popen([sys.executable, "-c", MMAP_READER,
                                  self.mount.join(name), str(time.time() + 0.5)],
                                 stdout=subprocess.PIPE, text=True)
            out, _ = p.communicate(timeout=120)
            for line in out.split():
                if line in good:
                    self.note("ok")
                elif line[0] == "E" and int(line[1:]) in OK_OPEN_ERRORS:
                    self.note("err")
                else:
                    self.note("ok", "mmap %s: %s" % (name, line[:20]))
            if p.returncode == -signal.SIGBUS:
                self.note("sigbus")  # a mapped page that could not be read
            elif p.returncode != 0:
                self.note("ok", "mmap reader exit %d" % p.returncode)


class Changes(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()
        self.path = os.path.join(self.src, "c.safetensors")
        self.old = rc.write_ckpt(self.path, 10, scale=16)
        self.mount = tl.Mount(self.src)

    def tearDown(self):
        code = self.mount.unmount()
        self.tmp.__exit__(None, None, None)
        self.assertEqual(code, 0, "castfs exit status")

    def refs(self, *versions):
        """name -> acceptable full contents, one per version (file bytes
        or tensors)."""
        out = {"c.safetensors": [], rc.view_name("c", "fp16"): [],
               rc.view_name("c", "bf16"): []}
        for v in versions:
            if isinstance(v, bytes):
                out["c.safetensors"].append(v)
                continue
            from safetensors.torch import save
            out["c.safetensors"].append(save(v, metadata={"format": "pt"}))
            for view in ("fp16", "bf16"):
                out[rc.view_name("c", view)].append(rc.view_bytes(v, view))
        return out

    def run_readers(self, refs, change):
        r = Readers(self.mount, refs)
        r.start()
        rc.poll(lambda: r.counts["ok"] >= 5, 60, "readers to start")
        change()
        time.sleep(1.0)  # readers keep going across the change (duration)
        r.finish()
        print("%s: %d whole reads, %d errors, %d SIGBUS" % (
            self.id().split(".")[-1], r.counts["ok"], r.counts["err"],
            r.counts["sigbus"]), file=sys.stderr)
        self.assertEqual(r.problems, [])
        self.assertIsNone(self.mount.proc.poll(), "daemon died")
        return r

    def read(self, name):
        with open(self.mount.join(name), "rb") as f:
            return f.read()

    def settles_to(self, name, want):
        def now():
            try:
                return self.read(name) == want
            except OSError:
                return False
        rc.poll(now, SETTLE, "%s to show the new content" % name)
        for _ in range(3):  # and stays there
            self.assertEqual(self.read(name), want)

    def gone(self, name):
        def now():
            try:
                os.stat(self.mount.join(name))
                return False
            except FileNotFoundError:
                return True
        rc.poll(now, SETTLE, "%s to disappear" % name)
        self.assertNotIn(name, os.listdir(self.mount.path))

    def rewrite_in_place(self, mode):
        from safetensors.torch import save
        new = rc.make_tensors(11, scale=16)
        data = save(new, metadata={"format": "pt"})
        ino = os.stat(self.path).st_ino
        refs = self.refs(self.old, new)

        def change():
            # Same inode, same size; written in pieces, so that readers
            # meet the file half old, half new.
            with open(self.path, mode) as f:
                for i in range(0, len(data), 65536):
                    f.write(data[i:i + 65536])
                    f.flush()
        self.run_readers(refs, change)
        self.assertEqual(os.stat(self.path).st_ino, ino, "not in place")
        for name, versions in refs.items():
            self.settles_to(name, versions[1])

    def test_rewrite_in_place_truncating(self):
        self.rewrite_in_place("wb")

    def test_overwrite_in_place_same_size(self):
        self.rewrite_in_place("r+b")

    def test_replace_by_rename(self):
        new = rc.make_tensors(12, scale=8)
        refs = self.refs(self.old, new)

        def change():
            rc.write_ckpt(self.path + ".tmp", 12, scale=8)
            os.rename(self.path + ".tmp", self.path)
        self.run_readers(refs, change)
        for name, versions in refs.items():
            self.settles_to(name, versions[1])

    def test_truncate(self):
        with open(self.path, "rb") as f:
            whole = f.read()
        refs = self.refs(self.old)
        refs["c.safetensors"].append(whole[:len(whole) // 2])
        self.run_readers(refs, lambda: os.truncate(self.path, len(whole) // 2))
        self.settles_to("c.safetensors", whole[:len(whole) // 2])
        for view in ("fp16", "bf16", "fp32"):
            self.gone(rc.view_name("c", view))  # rejected: no views
        with open(self.mount.join(".castfs", "rejected")) as f:
            self.assertIn("c.safetensors", f.read())

    def read_fd(self, fd):
        """The whole file behind @fd, read by castfs now: the kernel's
        cached pages of it are dropped first."""
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        out, off = [], 0
        while True:
            b = os.pread(fd, 1 << 20, off)
            if not b:
                return b"".join(out)
            out.append(b)
            off += len(b)

    def test_old_opens_read_old_bytes_after_rename_and_delete(self):
        """docs/RELIABILITY.md: files opened before the source is replaced
        by rename, then deleted, keep reading the old bytes, whole."""
        refs = self.refs(self.old)
        fds = {n: os.open(self.mount.join(n), os.O_RDONLY) for n in refs}
        try:
            for n, fd in fds.items():
                self.assertEqual(self.read_fd(fd), refs[n][0], n)
            rc.write_ckpt(self.path + ".tmp", 13, scale=8)
            os.rename(self.path + ".tmp", self.path)
            for n, fd in fds.items():
                self.assertEqual(self.read_fd(fd), refs[n][0],
                                 "%s after rename" % n)
            os.unlink(self.path)
            for n, fd in fds.items():
                self.assertEqual(self.read_fd(fd), refs[n][0],
                                 "%s after delete" % n)
        finally:
            for fd in fds.values():
                os.close(fd)

    def test_delete(self):
        refs = self.refs(self.old)
        self.run_readers(refs, lambda: os.unlink(self.path))
        for name in list(refs) + [rc.view_name("c", "fp8")]:
            self.gone(name)

    def test_new_files_and_directories_appear(self):
        self.assertNotIn("n.safetensors", os.listdir(self.mount.path))
        with self.assertRaises(FileNotFoundError):
            os.stat(self.mount.join(rc.view_name("n", "fp16")))
        t = rc.write_ckpt(os.path.join(self.src, "n.safetensors"), 13)
        os.makedirs(os.path.join(self.src, "d", "e"))
        t2 = rc.write_ckpt(os.path.join(self.src, "d", "e", "m.safetensors"), 14)
        rc.poll(lambda: rc.view_name("n", "fp16") in os.listdir(self.mount.path),
                SETTLE, "the new views to be listed")
        self.settles_to(rc.view_name("n", "fp16"), rc.view_bytes(t, "fp16"))
        self.settles_to(os.path.join("d", "e", rc.view_name("m", "bf16")),
                        rc.view_bytes(t2, "bf16"))
        # A rewrite deep in a directory made after mounting is seen too.
        stale = os.stat(self.mount.join("d", "e", rc.view_name("m", "bf16")))
        t3 = rc.write_ckpt(os.path.join(self.src, "d", "e", "m.safetensors"),
                           15, scale=2)
        self.settles_to(os.path.join("d", "e", rc.view_name("m", "bf16")),
                        rc.view_bytes(t3, "bf16"))
        self.assertNotEqual(os.stat(self.mount.join(
            "d", "e", rc.view_name("m", "bf16"))).st_ino, stale.st_ino)

    def test_permission_changes_follow(self):
        view = self.mount.join(rc.view_name("c", "fp16"))
        for mode, shown in ((0o644, 0o444), (0o600, 0o400), (0o640, 0o440)):
            os.chmod(self.path, mode)
            for p in (self.mount.join("c.safetensors"), view):
                rc.poll(lambda: os.stat(p).st_mode & 0o777 == shown, SETTLE,
                        "mode %o on %s" % (shown, p))

    def test_stat_follows_without_reading(self):
        # Attributes cached for a day must still follow the source: the
        # watcher invalidates the entries, not a timeout.
        before = os.stat(self.mount.join(rc.view_name("c", "fp16")))
        rc.write_ckpt(self.path, 16, scale=2)
        rc.poll(lambda: os.stat(self.mount.join(rc.view_name("c", "fp16")))
                .st_size != before.st_size, SETTLE, "the new size")
        os.unlink(self.path)
        self.gone("c.safetensors")
        self.gone(rc.view_name("c", "fp16"))


if __name__ == "__main__":
    tl.main()
