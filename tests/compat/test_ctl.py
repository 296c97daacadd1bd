# SPDX-License-Identifier: MIT
"""The control directory /.castfs: stats, config, rejected, version."""
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

import torch
from safetensors.torch import save_file

import castfs_testlib as tl

HERE = os.path.dirname(os.path.abspath(__file__))
MALFORMED = os.path.join(HERE, "..", "data", "malformed")


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Control(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src_ctx = tl.tempdir()
        cls.src = s = cls.src_ctx.__enter__()
        t = {"model.layers.0.mlp.up_proj.weight": torch.randn(64, 32).to(torch.bfloat16),
             "model.norm.weight": torch.randn(32)}
        save_file(t, os.path.join(s, "m.safetensors"), metadata={"format": "pt"})
        os.makedirs(os.path.join(s, "deep", "er"))
        # Rejected files nobody lists before /.castfs/rejected is read.
        shutil.copy(os.path.join(MALFORMED, "size-mismatch.safetensors"),
                    os.path.join(s, "deep", "er", "bad.safetensors"))
        shutil.copy(os.path.join(MALFORMED, "truncated-data.safetensors"),
                    os.path.join(s, "truncated.safetensors"))
        with open(os.path.join(s, "notes.txt"), "w") as f:
            f.write("not a checkpoint\n")
        cls.mnt = tl.Mount(s, options=["views=fp8:bf16"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.src_ctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def ctl(self, name):
        return read(self.mnt.join(".castfs", name))

    def stats(self):
        return json.loads(self.ctl("stats"))

    def test_listing(self):
        self.assertIn(".castfs", os.listdir(self.mnt.path))
        self.assertEqual(sorted(os.listdir(self.mnt.join(".castfs"))),
                         ["config", "metrics", "refused", "rejected", "stats", "version"])
        self.assertTrue(os.path.isdir(self.mnt.join(".castfs")))

    def test_stats_layout(self):
        s = self.stats()
        for key in ("uptime_s", "requests", "errors", "views", "passthrough",
                    "tensor_files", "other_files", "totals", "conversions",
                    "cache_hits", "headers_parsed", "plans_built"):
            self.assertIn(key, s)
        self.assertGreaterEqual(s["uptime_s"], 0)
        for op in ("lookup", "getattr", "open", "read", "readdir", "getxattr"):
            self.assertIn(op, s["requests"])
            self.assertIn(op, s["errors"])
        for v in ("fp8", "bf16", "nf4"):  # every view, listed or not
            self.assertEqual(sorted(s["views"][v]), ["bytes", "opens", "reads"])
        self.assertEqual(sorted(s["cache_hits"]), ["headers", "plans", "tensor_trees"])

    def read_moves(self, path, bucket):
        """Read @path whole between two stats; the bucket moves by its size.
        The file's pages are dropped from the kernel's cache first: with
        keep_cache a file an earlier test read would be served without
        castfs, and the exact deltas would depend on the order of tests."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        before = self.stats()
        data = read(path)
        after = self.stats()
        b, a = bucket(before), bucket(after)
        self.assertEqual(a["bytes"] - b["bytes"], len(data), path)
        self.assertGreaterEqual(a["reads"] - b["reads"], 1)
        self.assertEqual(a["opens"] - b["opens"], 1)
        self.assertGreaterEqual(after["requests"]["read"] - before["requests"]["read"], 1)
        return before, after, len(data)

    def test_stats_move_with_view_reads(self):
        before, after, n = self.read_moves(self.mnt.join("m.fp8.safetensors"),
                                           lambda s: s["views"]["fp8"])
        self.assertEqual(after["conversions"]["bytes"] - before["conversions"]["bytes"], n)
        self.assertEqual(after["views"]["bf16"], before["views"]["bf16"])
        # totals count the read of the view and that of the first stats
        # (whose snapshot was taken at its open), under other_files.
        moved = after["totals"]["bytes"] - before["totals"]["bytes"]
        other = after["other_files"]["bytes"] - before["other_files"]["bytes"]
        self.assertEqual(moved, n + other)
        self.assertGreater(other, 0)

    def test_stats_move_on_every_read_of_a_file(self):
        """The same file read twice: both reads reach castfs and count (the
        deltas do not need a cold cache or a test order)."""
        for _ in range(2):
            self.read_moves(self.mnt.join("m.bf16.safetensors"),
                            lambda s: s["views"]["bf16"])

    def test_stats_move_with_other_reads(self):
        self.read_moves(self.mnt.join("m.safetensors"), lambda s: s["passthrough"])
        self.read_moves(self.mnt.join("m.bf16.safetensors.tensors", "model", "norm",
                                      "weight.npy"), lambda s: s["tensor_files"])
        self.read_moves(self.mnt.join("m.safetensors.tensors", "model", "norm",
                                      "weight.info"), lambda s: s["tensor_files"])

    def test_stats_count_errors_and_cache_hits(self):
        before = self.stats()
        with self.assertRaises(FileNotFoundError):
            os.stat(self.mnt.join("no-such-file"))
        os.stat(self.mnt.join("m.fp8.safetensors"))
        os.listdir(self.mnt.join("m.safetensors.tensors", "model"))
        after = self.stats()
        self.assertGreater(after["errors"]["lookup"], before["errors"]["lookup"])
        self.assertGreater(after["totals"]["errors"], before["totals"]["errors"])
        self.assertGreater(after["cache_hits"]["headers"], before["cache_hits"]["headers"])

    def test_config(self):
        c = json.loads(self.ctl("config"))
        self.assertEqual(c["source"], os.path.realpath(self.src))
        self.assertEqual(c["mountpoint"], self.mnt.path)
        listed = {v["name"] for v in c["views"] if v.get("listed")}
        self.assertEqual(listed, {"fp8", "bf16"})
        self.assertIn("nf4", {v["name"] for v in c["views"]})

    def test_rejected(self):
        r = json.loads(self.ctl("rejected"))
        by_path = {e["path"]: e for e in r}
        self.assertEqual(sorted(by_path), ["deep/er/bad.safetensors", "truncated.safetensors"])
        self.assertIn("data_offsets", by_path["deep/er/bad.safetensors"]["reason"])
        self.assertIn("tensor 'w'", by_path["deep/er/bad.safetensors"]["reason"])
        self.assertEqual(by_path["truncated.safetensors"]["error"], os.strerror(errno.EINVAL))
        # A rejected file stays visible as itself, without views.
        names = os.listdir(self.mnt.path)
        self.assertIn("truncated.safetensors", names)
        self.assertNotIn("truncated.fp8.safetensors", names)
        self.assertNotIn("truncated.safetensors.tensors", names)
        s = self.stats()
        self.assertGreaterEqual(s["headers_rejected"], 2)
        # ... and the daemon's log (stderr with -f) says what and where.
        log = self.mnt.output()
        self.assertIn("deep/er/bad.safetensors: rejected: tensor 'w': data_offsets", log)

    def test_version(self):
        v = self.ctl("version").decode()
        out = subprocess.run([tl.castfs_binary(), "--version"], capture_output=True,
                             text=True, check=True).stdout
        self.assertTrue(v.endswith("\n"))
        self.assertEqual(v.split()[:2], out.split()[:2])
        self.assertEqual(v.split()[0], "castfs")

    def test_tree_wide_files_for_the_daemons_user(self):
        """rejected and refused name files anywhere in the tree and quote
        their headers: under allow_other another user (nobody here) reads
        neither (a bug hunt: the names and header bytes of files in a 0700
        directory), and still reads the counters."""
        # Where nobody may reach the mount and its root (mkdtemp: 0700).
        os.chmod(self.src, 0o755)
        top = tempfile.mkdtemp(prefix="castfs-mnt-")
        os.chmod(top, 0o755)
        os.mkdir(os.path.join(top, "mnt"))
        try:
            self.check_tree_wide_files(os.path.join(top, "mnt"))
        finally:
            os.chmod(self.src, 0o700)
            shutil.rmtree(top, ignore_errors=True)

    def check_tree_wide_files(self, mountpoint):
        with tl.Mount(self.src, options=["allow_other"],
                      mountpoint=mountpoint) as m:
            for name, ok in (("rejected", False), ("refused", False),
                             ("stats", True), ("version", True)):
                st = os.stat(m.join(".castfs", name))
                r = subprocess.run(
                    ["setpriv", "--reuid=65534", "--regid=65534",
                     "--clear-groups", "cat", m.join(".castfs", name)],
                    capture_output=True, text=True)
                self.assertEqual(r.returncode == 0, ok, (name, r.stderr))
                if not ok:
                    self.assertIn("Permission denied", r.stderr)
                    self.assertEqual(stat.S_IMODE(st.st_mode), 0o400)
                    self.assertEqual(st.st_uid, os.geteuid())
            # The daemon's user reads them whole.
            self.assertIn("deep/er/bad.safetensors",
                          read(m.join(".castfs", "rejected")).decode())

    def test_control_files_read_only(self):
        for name in ("stats", "config", "rejected", "version", "metrics", "refused"):
            with self.assertRaises(OSError) as cm:
                os.open(self.mnt.join(".castfs", name), os.O_WRONLY)
            self.assertEqual(cm.exception.errno, errno.EROFS)


if __name__ == "__main__":
    tl.main()
