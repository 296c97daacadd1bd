# SPDX-License-Identifier: MIT
"""Concurrency stress: threads and processes read many views by
random ranges at once, with pread (half of them O_DIRECT, so that every
read reaches the daemon) and mmap, for a bounded time
(CASTFS_STRESS_SECONDS, 30 by default), and compare every byte read with
a reference computed independently: torch's .to() laid out by the official
safetensors writer for cast views; for bitsandbytes views, a whole read
taken once before the load starts. Run it against a ThreadSanitizer or
ASan build by pointing CASTFS at that daemon: any report makes the daemon
exit non-zero, which fails the test."""
import json
import mmap
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import castfs_testlib as tl
import rel_common as rc

SECONDS = float(os.environ.get("CASTFS_STRESS_SECONDS", "30"))
THREADS, PROCS = 4, 3
QUANT_VIEWS = ("nf4", "int8")


# Each reader goes on past the deadline until it has made this many reads
# (a loaded machine must not make the test fail for lack of reads), within
# a generous hard limit.
MIN_READS = 30
HARD_LIMIT = 300


def worker(mnt, refdir, names, seed, until, use_mmap):
    """Read random ranges of random files until @until and at least
    MIN_READS reads (or HARD_LIMIT s past @until); returns counts."""
    rng = random.Random(seed)
    refs = {}
    stats = {"reads": 0, "bytes": 0, "bad": []}
    while time.time() < until or (stats["reads"] < MIN_READS and
                                  time.time() < until + HARD_LIMIT):
        name = rng.choice(names)
        if name not in refs:
            with open(os.path.join(refdir, name.replace("/", "%")), "rb") as f:
                refs[name] = f.read()
        ref = refs[name]
        flags = os.O_DIRECT if (not use_mmap and rng.random() < 0.5) else 0
        fd = os.open(os.path.join(mnt, name), os.O_RDONLY | flags)
        try:
            size = os.fstat(fd).st_size
            if size != len(ref):
                stats["bad"].append("%s: size %d != %d" % (name, size, len(ref)))
                continue
            m = mmap.mmap(fd, size, prot=mmap.PROT_READ) if use_mmap else None
            for _ in range(rng.randrange(1, 20)):
                off = rng.randrange(0, size + 16)
                n = rng.choice((1, 2, 3, 7, 4096, rng.randrange(1, 1 << 21)))
                data = m[off:off + n] if m else os.pread(fd, n, off)
                want = ref[off:off + n]
                stats["reads"] += 1
                stats["bytes"] += len(data)
                if data != want:
                    stats["bad"].append("%s [%d,+%d): %d bytes differ" % (
                        name, off, n, sum(a != b for a, b in zip(data, want))
                        + abs(len(data) - len(want))))
            if m:
                m.close()
        finally:
            os.close(fd)
    return stats


class Stress(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        top = cls.tmp.__enter__()
        cls.src, cls.refdir = os.path.join(top, "src"), os.path.join(top, "ref")
        os.makedirs(os.path.join(cls.src, "sub"))
        os.makedirs(cls.refdir)
        ckpts = {"a": rc.write_ckpt(os.path.join(cls.src, "a.safetensors"), 1, 8),
                 "b": rc.write_ckpt(os.path.join(cls.src, "b.safetensors"), 2, 24),
                 "sub/c": rc.write_ckpt(
                     os.path.join(cls.src, "sub", "c.safetensors"), 3, 2)}
        cls.mount = tl.Mount(cls.src)
        cls.names = []
        for stem, tensors in ckpts.items():
            refs = {stem + ".safetensors": open(os.path.join(
                cls.src, stem + ".safetensors"), "rb").read()}
            for view in rc.CAST_VIEWS:
                refs[rc.view_name(stem, view)] = rc.view_bytes(tensors, view)
            for view in QUANT_VIEWS:  # no independent oracle: read once, idle
                with open(cls.mount.join(rc.view_name(stem, view)), "rb") as f:
                    refs[rc.view_name(stem, view)] = f.read()
            for name, data in refs.items():
                with open(os.path.join(cls.refdir, name.replace("/", "%")),
                          "wb") as f:
                    f.write(data)
                cls.names.append(name)
        cls.digest = rc.tree_digest(cls.src)

    @classmethod
    def tearDownClass(cls):
        code = cls.mount.unmount()
        same = rc.tree_digest(cls.src) == cls.digest
        cls.tmp.__exit__(None, None, None)
        assert code == 0, "castfs exited with %d (sanitizer report?)" % code
        assert same, "the source tree changed"

    def test_many_readers_always_read_the_reference(self):
        until = time.time() + SECONDS
        results = []
        lock = threading.Lock()

        def run_thread(i):
            r = worker(self.mount.path, self.refdir, self.names, i, until, False)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=run_thread, args=(i,))
                   for i in range(THREADS)]
        procs = [subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker",
             self.mount.path, self.refdir, json.dumps(self.names),
             str(100 + i), str(until), str(i % 2)],
            stdout=subprocess.PIPE, text=True) for i in range(PROCS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SECONDS + HARD_LIMIT + 300)
            self.assertFalse(t.is_alive(), "reader thread stuck")
        for p in procs:
            out, _ = p.communicate(timeout=SECONDS + HARD_LIMIT + 300)
            self.assertEqual(p.returncode, 0, "reader process failed")
            results.append(json.loads(out))
        bad = [b for r in results for b in r["bad"]]
        reads = sum(r["reads"] for r in results)
        total = sum(r["bytes"] for r in results)
        print("stress: %d readers, %.0f s, %d reads, %.1f MiB compared, "
              "%d mismatches" % (THREADS + PROCS, SECONDS, reads,
                                 total / 2 ** 20, len(bad)), file=sys.stderr)
        self.assertEqual(bad[:10], [])
        self.assertGreater(reads, 100)
        self.assertTrue(all(r["reads"] >= MIN_READS for r in results),
                        [r["reads"] for r in results])
        self.assertIsNone(self.mount.proc.poll(), "daemon died")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mnt, refdir, names, seed, until, use_mmap = sys.argv[2:8]
        print(json.dumps(worker(mnt, refdir, json.loads(names), int(seed),
                                float(until), use_mmap == "1")))
    else:
        tl.main()
