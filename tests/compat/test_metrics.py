# SPDX-License-Identifier: MIT
"""/.castfs/metrics: the counters of /.castfs/stats in the Prometheus text
exposition format 0.0.4, checked by prometheus_client's parser (the
reference implementation's Python client) and by a strict line checker
written from the format's specification; and getxattr's ENODATA (every
`ls -l` probes security.selinux and the ACLs) counted as an answer."""
import errno
import json
import math
import os
import re
import time
import unittest

import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import save_file

import castfs_testlib as tl

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s)(?:,%s)*\})? (\S+)$" % (NAME, LABEL, LABEL))
COMMENT = re.compile(r"^# (HELP|TYPE) (%s) (.+)$" % NAME)
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def strict_parse(text):
    """Series -> value, failing on anything the exposition format does not
    allow: a sample before its family's TYPE, a family split in two, a
    second HELP or TYPE, a duplicate series, a bad name, label or value."""
    assert text.endswith("\n"), "the last line ends with a newline"
    types, helps, done, series = {}, set(), set(), {}
    current = None
    for line in text.split("\n")[:-1]:
        assert line.strip(), "no empty lines here"
        m = COMMENT.match(line)
        if m:
            kind, name, rest = m.groups()
            assert name not in done, "family %s split" % name
            if kind == "HELP":
                assert name not in helps, "second HELP of " + name
                helps.add(name)
            else:
                assert name not in types and rest in TYPES, line
                types[name] = rest
            if current and current != name:
                done.add(current)
            current = name
            continue
        assert not line.startswith("#"), line
        m = SAMPLE.match(line)
        assert m, "bad sample line %r" % line
        name, labels, value = m.groups()
        fam = name
        if types.get(current) == "histogram":
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
        assert fam == current and fam in types and fam in helps, \
            "sample %s outside its family (TYPE/HELP first)" % name
        if types[fam] == "counter":
            assert name.endswith("_total"), name
        v = float(value)  # "+Inf", "NaN" and numbers only
        assert not math.isnan(v) and v >= 0, line
        key = name + (labels or "")
        assert key not in series, "duplicate series " + key
        series[key] = v
    return series, types


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src_ctx = tl.tempdir()
        cls.src = s = cls.src_ctx.__enter__()
        t = {"model.layers.0.mlp.up_proj.weight": torch.randn(512, 256).to(torch.bfloat16),
             "model.norm.weight": torch.randn(256)}
        save_file(t, os.path.join(s, "m.safetensors"), metadata={"format": "pt"})
        cls.mnt = tl.Mount(s, options=["views=fp8:bf16"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.src_ctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def metrics(self):
        with open(self.mnt.join(".castfs", "metrics")) as f:
            text = f.read()
        series, types = strict_parse(text)
        # The reference parser reads the same text into the same values.
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        n = 0
        for fam in fams.values():
            for smp in fam.samples:
                labels = ",".join('%s="%s"' % kv for kv in sorted(smp.labels.items()))
                key = smp.name + ("{%s}" % labels if labels else "")
                ours = {re.sub(r"\{(.*)\}", lambda m: "{%s}" % ",".join(
                    sorted(m.group(1).split(","))), k): v for k, v in series.items()}
                self.assertEqual(ours[key], smp.value, key)
                n += 1
        self.assertEqual(n, len(series))
        return series, types

    @staticmethod
    def drop_cache(path):
        """With keep_cache, pages an earlier read left would be served
        without castfs: drop them so that the read reaches the daemon."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def test_families_and_types(self):
        s, types = self.metrics()
        want = {"castfs_uptime_seconds": "gauge",
                "castfs_requests_total": "counter",
                "castfs_request_errors_total": "counter",
                "castfs_errors_total": "counter",
                "castfs_opens_total": "counter",
                "castfs_open_files": "gauge",
                "castfs_reads_total": "counter",
                "castfs_read_bytes_total": "counter",
                "castfs_conversion_cpu_seconds_total": "counter",
                "castfs_read_request_bytes": "histogram",
                "castfs_cache_hits_total": "counter",
                "castfs_cache_misses_total": "counter"}
        for name, t in want.items():
            self.assertEqual(types.get(name), t, name)
        for v in ("fp8", "bf16", "nf4"):  # every view, listed or not
            self.assertIn('castfs_read_bytes_total{kind="view",view="%s"}' % v, s)
        self.assertIn('castfs_read_bytes_total{kind="passthrough"}', s)
        self.assertNotIn('castfs_conversion_cpu_seconds_total{kind="passthrough"}', s)
        for c in ("headers", "plans", "tensor_trees", "zst_frames"):
            self.assertIn('castfs_cache_hits_total{cache="%s"}' % c, s)
            self.assertIn('castfs_cache_misses_total{cache="%s"}' % c, s)
        self.assertEqual(s['castfs_read_request_bytes_bucket{le="+Inf"}'],
                         s["castfs_read_request_bytes_count"])

    def test_view_read_moves_bytes_and_cpu(self):
        key = 'castfs_%s{kind="view",view="fp8"}'
        self.drop_cache(self.mnt.join("m.fp8.safetensors"))
        before, _ = self.metrics()
        with open(self.mnt.join("m.fp8.safetensors"), "rb") as f:
            n = len(f.read())
        after, _ = self.metrics()
        self.assertEqual(n, os.stat(self.mnt.join("m.fp8.safetensors")).st_size)
        d = lambda k: after[key % k] - before[key % k]
        self.assertEqual(d("read_bytes_total"), n)
        self.assertGreaterEqual(d("reads_total"), 1)
        self.assertEqual(d("opens_total"), 1)
        self.assertGreater(d("conversion_cpu_seconds_total"), 0)
        self.assertEqual(after[key % "read_bytes_total"],
                         json.loads(open(self.mnt.join(".castfs", "stats")).read())
                         ["views"]["fp8"]["bytes"])
        hist = 'castfs_read_request_bytes_bucket{le="+Inf"}'
        self.assertGreaterEqual(after[hist] - before[hist], 1)

    def test_open_files(self):
        key = 'castfs_open_files{kind="view",view="bf16"}'
        base = self.metrics()[0][key]
        fds = [os.open(self.mnt.join("m.bf16.safetensors"), os.O_RDONLY) for _ in range(3)]
        try:
            self.assertEqual(self.metrics()[0][key], base + 3)
        finally:
            for fd in fds:
                os.close(fd)
        # release is asynchronous to close(2): wait for the daemon's count.
        self.assertTrue(wait_for(lambda: self.metrics()[0][key] == base))

    def test_errors_by_errno(self):
        key = 'castfs_errors_total{errno="ENOENT"}'
        before = self.metrics()[0]
        for _ in range(2):
            with self.assertRaises(FileNotFoundError):
                os.stat(self.mnt.join("no-such-file-%d" % _))
        after = self.metrics()[0]
        self.assertEqual(after[key] - before.get(key, 0), 2)
        lk = 'castfs_request_errors_total{op="lookup"}'
        self.assertEqual(after[lk] - before[lk], 2)

    def test_getxattr_enodata_is_not_an_error(self):
        """`ls -l` asks security.selinux and the ACLs of every name; "no
        such attribute" is the answer, counted as a request only."""
        path = self.mnt.join("m.fp8.safetensors")
        before = self.metrics()[0]
        sb = json.loads(open(self.mnt.join(".castfs", "stats")).read())
        for name in ("security.selinux", "system.posix_acl_access"):
            with self.assertRaises(OSError) as cm:
                os.getxattr(path, name)
            # No user. prefix: no such namespace (docs/MOUNTING.md).
            self.assertEqual(cm.exception.errno, errno.EOPNOTSUPP)
        after = self.metrics()[0]
        sa = json.loads(open(self.mnt.join(".castfs", "stats")).read())
        rq, er = 'castfs_requests_total{op="getxattr"}', 'castfs_request_errors_total{op="getxattr"}'
        self.assertGreaterEqual(after[rq] - before[rq], 1)
        self.assertEqual(after[er], before[er])
        for e in ("ENODATA", "EOPNOTSUPP"):
            k = 'castfs_errors_total{errno="%s"}' % e
            self.assertEqual(after.get(k, 0), before.get(k, 0))
        self.assertGreaterEqual(sa["requests"]["getxattr"] - sb["requests"]["getxattr"], 1)
        self.assertEqual(sa["errors"]["getxattr"], sb["errors"]["getxattr"])

    def test_strict_checker_can_fail(self):
        """The checker refuses what the format forbids."""
        good = "# HELP a_total x\n# TYPE a_total counter\na_total 1\n"
        strict_parse(good)
        for bad in (good[:-1], "a_total 1\n", good + "a_total 2\n",
                    good.replace("a_total 1", 'a_total{l="x} 1'),
                    good + "# HELP b x\n# TYPE b gauge\nb 1\na_total{x=\"1\"} 1\n",
                    good.replace("a_total 1", "a_total one")):
            with self.assertRaises((AssertionError, ValueError), msg=bad):
                strict_parse(bad)


if __name__ == "__main__":
    tl.main()
