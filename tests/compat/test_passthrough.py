# SPDX-License-Identifier: MIT
"""Kernel passthrough of unconverted files (-o passthrough, fs/fs_pt.c).

With the option the kernel reads and maps an unconverted file from its
source itself: no READ reaches the daemon, and the bytes are the
source's. Views are still computed by the daemon. Every open of one file
shares its one backing file (the kernel refuses a second while one is
open), which is closed when the kernel forgets the node; under the
supervisor a file held open across daemon restarts can be opened again
(the journal of backing ids). Without the option nothing is passed
through. Needs root (the kernel's CAP_SYS_ADMIN check) and Linux >= 6.9
built with CONFIG_FUSE_PASSTHROUGH: elsewhere the cases are skipped (a
SKIP, never a pass)."""
import gzip
import json
import mmap
import os
import random
import re
import signal
import threading
import time
import unittest

import castfs_testlib as tl
import rel_common as rc


def unsupported():
    """Why this machine cannot pass files through, or None."""
    with open("/proc/self/status") as f:
        cap = int(re.search(r"CapEff:\s*([0-9a-f]+)", f.read()).group(1), 16)
    with open("/proc/self/uid_map") as f:
        init_ns = f.read().split() == ["0", "0", "4294967295"]
    if not (cap >> 21) & 1 or not init_ns:
        return ("the kernel lets only CAP_SYS_ADMIN of the initial user "
                "namespace register backing files")
    rel = os.uname().release
    m = re.match(r"(\d+)\.(\d+)", rel)
    if m and (int(m.group(1)), int(m.group(2))) < (6, 9):
        return "Linux %s has no FUSE passthrough (6.9)" % rel
    for path in ("/proc/config.gz", "/boot/config-" + rel):
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as f:
                text = f.read()
        except OSError:
            continue
        if "CONFIG_FUSE_PASSTHROUGH=y" not in text:
            return "kernel built without CONFIG_FUSE_PASSTHROUGH"
        return None
    return None  # no config to read: the cases decide


def raw_reads(m):
    """READs of unconverted files that reached the daemon."""
    return m.stats()["passthrough"]["reads"]


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


class Passthrough(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.why = unsupported()
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        cls.ckpt = os.path.join(cls.src, "m.safetensors")
        cls.tensors = rc.write_ckpt(cls.ckpt, seed=3, scale=64)
        cls.other = os.path.join(cls.src, "tokenizer.json")
        with open(cls.other, "wb") as f:
            f.write(json.dumps({"vocab": list(range(50000))}).encode())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.__exit__(None, None, None)

    def setUp(self):
        if self.why:
            raise unittest.SkipTest(self.why)

    def test_unconverted_files_bypass_the_daemon(self):
        rng = random.Random(5)
        with tl.Mount(self.src, options=["passthrough"]) as m:
            for name in ("m.safetensors", "tokenizer.json"):
                with self.subTest(name=name):
                    want = open(os.path.join(self.src, name), "rb").read()
                    with open(m.join(name), "rb") as f:
                        self.assertEqual(f.read(), want)
                    tl.check_ranges(self, m.join(name), want, rng, count=40)
                    with open(m.join(name), "rb") as f:
                        with mmap.mmap(f.fileno(), 0,
                                       prot=mmap.PROT_READ) as mm:
                            self.assertEqual(mm[:], want)
            s = m.stats()
            self.assertEqual(raw_reads(m), 0)
            self.assertGreaterEqual(s["passthrough_opens"], 6)
            self.assertEqual(s["passthrough_backing_opened"], 2)
            # Views are the daemon's: the same bytes as without the
            # option, read through it.
            view = open(m.join("m.fp8.safetensors"), "rb").read()
            self.assertEqual(view, rc.view_bytes(self.tensors, "fp8"))
            self.assertGreater(m.stats()["views"]["fp8"]["reads"], 0)

    def test_o_direct_reads_come_to_the_daemon(self):
        """An O_DIRECT open of a passed-through file reads through the
        daemon, any length at any offset: the source's own O_DIRECT
        rules (aligned lengths on ext4) would fail odd ones with EINVAL.
        Its maps still go to the source."""
        want = open(self.ckpt, "rb").read()
        with tl.Mount(self.src, options=["passthrough"]) as m:
            fd = os.open(m.join("m.safetensors"), os.O_RDONLY | os.O_DIRECT)
            try:
                self.assertEqual(os.pread(fd, 1000, 12345),
                                 want[12345:13345])
                with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
                    self.assertEqual(mm[:4096], want[:4096])
            finally:
                os.close(fd)
            self.assertGreater(raw_reads(m), 0)
            self.assertEqual(m.stats()["passthrough_opens"], 1)

    def test_without_the_option_nothing_is_passed_through(self):
        with tl.Mount(self.src) as m:
            want = open(self.ckpt, "rb").read()
            with open(m.join("m.safetensors"), "rb") as f:
                self.assertEqual(f.read(), want)
            self.assertGreater(raw_reads(m), 0)
            self.assertEqual(m.stats()["passthrough_opens"], 0)

    def test_many_opens_share_one_backing_file(self):
        want = open(self.ckpt, "rb").read()
        errors = []
        with tl.Mount(self.src, options=["passthrough"]) as m:
            held = os.open(m.join("m.safetensors"), os.O_RDONLY)

            def opener(seed):
                r = random.Random(seed)
                try:
                    for _ in range(20):
                        fd = os.open(m.join("m.safetensors"), os.O_RDONLY)
                        off = r.randrange(len(want))
                        got = os.pread(fd, 4096, off)
                        os.close(fd)
                        if got != want[off:off + 4096]:
                            errors.append("bytes at %d" % off)
                except OSError as e:
                    errors.append(str(e))

            threads = [threading.Thread(target=opener, args=(i,))
                       for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            os.close(held)
            self.assertEqual(errors, [])
            s = m.stats()
            self.assertEqual(s["passthrough_opens"], 161)
            self.assertEqual(s["passthrough_backing_opened"], 1)
            self.assertEqual(raw_reads(m), 0)

    def test_forgotten_nodes_close_their_backing_files(self):
        """300 files (the table grows past its first 256 slots), then
        deleted: the watcher drops the names, the kernel forgets the
        nodes, and no source is held open behind them any more; written
        again, they pass through again (slots reused)."""
        d = os.path.join(self.src, "many")
        os.mkdir(d)
        names = ["f%03d.json" % i for i in range(300)]

        def write_all(tag):
            for n in names:
                with open(os.path.join(d, n), "w") as f:
                    f.write('{"%s": "%s"}' % (tag, n))

        def read_all(m, tag):
            for n in names:
                with open(m.join("many", n)) as f:
                    self.assertEqual(f.read(), '{"%s": "%s"}' % (tag, n))

        write_all("a")
        try:
            with tl.Mount(self.src, options=["passthrough"]) as m:
                read_all(m, "a")
                self.assertEqual(m.stats()["passthrough_backing_opened"], 300)
                self.assertEqual(m.stats()["passthrough_backing_closed"], 0)
                for n in names:
                    os.unlink(os.path.join(d, n))
                self.assertTrue(wait_for(
                    lambda: m.stats()["passthrough_backing_closed"] == 300),
                    "backing files of forgotten nodes stayed open: %d" %
                    m.stats()["passthrough_backing_closed"])
                write_all("b")
                read_all(m, "b")
                self.assertEqual(m.stats()["passthrough_backing_opened"], 600)
                self.assertEqual(raw_reads(m), 0)
        finally:
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            os.rmdir(d)

    def test_open_again_across_restarts(self):
        want = open(self.ckpt, "rb").read()
        with tl.Mount(self.src, options=["passthrough"]) as m:
            held = os.open(m.join("m.safetensors"), os.O_RDONLY)
            try:
                for round_ in range(2):
                    old = m.daemon()
                    os.kill(old, signal.SIGKILL)
                    self.assertTrue(wait_for(
                        lambda: m.daemon() != old), "no new daemon")
                    self.assertEqual(os.pread(held, 4096, 8192),
                                     want[8192:8192 + 4096])
                    # Before the journal: EIO, the new daemon giving the
                    # node a second backing file.
                    fd = os.open(m.join("m.safetensors"), os.O_RDONLY)
                    try:
                        self.assertEqual(os.pread(fd, 4096, 65536),
                                         want[65536:65536 + 4096])
                    finally:
                        os.close(fd)
                    self.assertEqual(
                        m.stats()["passthrough_backing_opened"], 0, round_)
            finally:
                os.close(held)

    def test_a_rewritten_source_reads_as_the_source(self):
        """The lease guarantee (test_rel_lease) is the daemon's: a
        passed-through file reads what its source holds, as a bind mount
        would (README, "-o passthrough")."""
        path = os.path.join(self.src, "w.safetensors")
        rc.write_ckpt(path, seed=6)
        with tl.Mount(self.src, options=["passthrough"]) as m:
            fd = os.open(m.join("w.safetensors"), os.O_RDONLY)
            try:
                old = os.pread(fd, 64, 8)
                with open(path, "r+b") as w:
                    w.seek(8)
                    w.write(bytes(64))
                self.assertNotEqual(old, bytes(64))
                self.assertEqual(os.pread(fd, 64, 8), bytes(64))
            finally:
                os.close(fd)


if __name__ == "__main__":
    tl.main()
