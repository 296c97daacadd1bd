# SPDX-License-Identifier: MIT
"""The malformed-checkpoint corpus under a real mount: every
broken file next to valid ones is shown as itself (byte for byte), has no
views, is listed in /.castfs/rejected with its precise reason, and the
valid checkpoints' views keep reading correctly at the same time, from
other threads; the daemon survives and exits cleanly."""
import errno
import json
import os
import shutil
import threading
import unittest

import castfs_testlib as tl
import rel_common as rc

MALFORMED = os.path.join(os.environ.get("top_srcdir", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")),
    "tests", "data", "malformed")
LISTED = ["fp32", "fp16", "bf16", "fp8", "fp8_e5m2", "nf4", "fp4", "int8"]


def expected_cases():
    cases = []
    with open(os.path.join(MALFORMED, "EXPECTED")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, err, phrase = line.rstrip("\n").split(" ", 2)
            cases.append((name, err, phrase))
    return cases


class Malformed(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        cls.cases = expected_cases()
        for name, _, _ in cls.cases:
            shutil.copy(os.path.join(MALFORMED, name), cls.src)
        os.mkdir(os.path.join(cls.src, "sub"))
        cls.good = {
            "good": rc.write_ckpt(os.path.join(cls.src, "good.safetensors"), 1),
            "sub/deep": rc.write_ckpt(
                os.path.join(cls.src, "sub", "deep.safetensors"), 2),
        }
        cls.digest = rc.tree_digest(cls.src)
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc_ = cls.mount.unmount()
        same = rc.tree_digest(cls.src) == cls.digest
        cls.tmp.__exit__(None, None, None)
        assert rc_ == 0, "castfs exited with %d" % rc_
        assert same, "the source tree changed"

    def test_corpus_is_big_enough(self):
        self.assertGreaterEqual(len({c[0] for c in self.cases}), 40)

    def read_good_views(self, rounds, errors):
        try:
            for _ in range(rounds):
                for stem, tensors in self.good.items():
                    for view in rc.CAST_VIEWS:
                        with open(self.mount.join(rc.view_name(stem, view)),
                                  "rb") as f:
                            if f.read() != rc.view_bytes(tensors, view):
                                errors.append("%s %s differs" % (stem, view))
        except Exception as e:  # reported by the main thread
            errors.append(repr(e))

    def check_one(self, name, err, phrase, rejected, listing):
        self.assertIn(name, listing)
        with open(os.path.join(self.src, name), "rb") as f:
            want = f.read()
        with open(self.mount.join(name), "rb") as f:
            self.assertEqual(f.read(), want, "pass-through bytes")
        stem = name[:-len(".safetensors")]
        for view in LISTED + ["fp8_nan", "nf4_nodq"]:
            vn = rc.view_name(stem, view)
            self.assertNotIn(vn, listing)
            with self.assertRaises(OSError) as cm:
                os.stat(self.mount.join(vn))
            self.assertEqual(cm.exception.errno, errno.ENOENT, vn)
        with self.assertRaises(FileNotFoundError):
            os.stat(self.mount.join(name + ".tensors"))
        entry = rejected.get(name)
        self.assertIsNotNone(entry, "not in /.castfs/rejected")
        self.assertEqual(entry["error"], os.strerror(getattr(errno, err)))
        self.assertIn(phrase, entry["reason"])

    def test_each_rejected_with_its_reason_while_good_views_read(self):
        errors = []
        readers = [threading.Thread(target=self.read_good_views,
                                    args=(5, errors)) for _ in range(3)]
        for t in readers:
            t.start()
        listing = set(os.listdir(self.mount.path))
        with open(self.mount.join(".castfs", "rejected")) as f:
            rejected = {e["path"]: e for e in json.load(f)}
        for name, err, phrase in self.cases:
            with self.subTest(file=name):
                self.check_one(name, err, phrase, rejected, listing)
        for t in readers:
            t.join(timeout=300)
            self.assertFalse(t.is_alive(), "reader stuck")
        self.assertEqual(errors, [])
        # Exactly the broken files are rejected, the good ones are not.
        self.assertEqual(set(rejected), {c[0] for c in self.cases})
        for view in LISTED:
            self.assertIn(rc.view_name("good", view), listing)
        self.assertIsNone(self.mount.proc.poll(), "daemon died")

    def test_rejection_is_logged(self):
        os.listdir(self.mount.path)
        out = self.mount.output()
        for name, _, _ in self.cases:
            self.assertIn("%s: rejected: " % name, out)


if __name__ == "__main__":
    tl.main()
