# SPDX-License-Identifier: MIT
"""-o noxattr (docs/MOUNTING.md): getxattr and listxattr answer ENOSYS
once, after which the kernel answers every extended-attribute call on the
mount itself. Without it the user.castfs.* attributes are served
(docs/TENSOR_TREE.md) and every other namespace answers EOPNOTSUPP, which
`ls -l` caches per device, so it costs no getxattr round trip per entry
either way. The
oracle is the kernel: the calls' errno and the requests the daemon counts
in /.castfs/stats."""
import errno
import json
import os
import subprocess
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl

N = 50


def getxattr_requests(m):
    with open(m.join(".castfs", "stats")) as f:
        return json.load(f)["requests"]["getxattr"]


def getxattr_errors(m):
    with open(m.join(".castfs", "stats")) as f:
        return json.load(f)["errors"]["getxattr"]


class TestNoXattr(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        data = save({"w": np.arange(4, dtype=np.float32)})
        for i in range(N):
            with open(os.path.join(cls.src, "c%03d.safetensors" % i),
                      "wb") as f:
                f.write(data)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.__exit__(None, None, None)

    def ls_l(self, m):
        subprocess.run(["ls", "-l", m.path], check=True,
                       stdout=subprocess.DEVNULL)

    def test_default_serves_attributes_and_ls_asks_once(self):
        """Names outside user. get EOPNOTSUPP, which ls caches per device
        (coreutils errno_unsupported): an `ls -l` of N * 10 entries asks
        security.selinux and system.posix_acl_access once each, not per
        entry (with ENODATA it asked 2 * N * 10 times)."""
        with tl.Mount(self.src) as m:
            self.assertEqual(
                os.getxattr(m.join("c000.fp8.safetensors"),
                            "user.castfs.view"), b"fp8")
            out = subprocess.run(
                ["getfattr", "--absolute-names", "-n", "user.castfs.view",
                 m.join("c000.fp8.safetensors")],
                check=True, capture_output=True, text=True).stdout
            self.assertIn('user.castfs.view="fp8"', out)
            for name in ("security.selinux", "system.posix_acl_access",
                         "trusted.x", "castfs.view"):
                with self.assertRaises(OSError) as e:
                    os.getxattr(m.join("c000.fp8.safetensors"), name)
                self.assertEqual(e.exception.errno, errno.EOPNOTSUPP, name)
            with self.assertRaises(OSError) as e:
                os.getxattr(m.join("c000.fp8.safetensors"), "user.nope")
            self.assertEqual(e.exception.errno, errno.ENODATA)
            entries = len(os.listdir(m.path))
            self.assertGreaterEqual(entries, N * 2)
            before = getxattr_requests(m)
            errors = getxattr_errors(m)
            self.ls_l(m)
            self.ls_l(m)
            # One selinux and one ACL probe per ls, for the whole listing.
            self.assertLessEqual(getxattr_requests(m) - before, 4)
            self.assertEqual(getxattr_errors(m), errors)

    def test_noxattr_stops_the_round_trips(self):
        with tl.Mount(self.src, options=["noxattr"]) as m:
            with self.assertRaises(OSError) as e:
                os.getxattr(m.join("c000.fp8.safetensors"),
                            "user.castfs.view")
            self.assertEqual(e.exception.errno, errno.EOPNOTSUPP)
            with self.assertRaises(OSError) as e:
                os.listxattr(m.join("c000.fp8.safetensors"))
            self.assertEqual(e.exception.errno, errno.EOPNOTSUPP)
            before = getxattr_requests(m)
            self.ls_l(m)
            self.ls_l(m)
            # The first ENOSYS was the last request of its kind.
            self.assertEqual(getxattr_requests(m), before)
            names = os.listdir(m.path)
            self.assertIn("c000.fp8.safetensors", names)

    def test_noxattr_enosys_is_no_error(self):
        """The ENOSYS of -o noxattr is the answer castfs chose, not an
        error: /.castfs/stats and /.castfs/metrics count the requests but
        no error (bug hunt: castfs_errors_total{errno="ENOSYS"})."""
        with tl.Mount(self.src, options=["noxattr"]) as m:
            p = m.join("c000.fp8.safetensors")
            for call in (lambda: os.getxattr(p, "user.castfs.view"),
                         lambda: os.listxattr(p)):
                with self.assertRaises(OSError):
                    call()
            self.ls_l(m)
            with open(m.join(".castfs", "stats")) as f:
                st = json.load(f)
            self.assertGreaterEqual(st["requests"]["getxattr"], 1)
            self.assertGreaterEqual(st["requests"]["listxattr"], 1)
            self.assertEqual(st["errors"]["getxattr"], 0)
            self.assertEqual(st["errors"]["listxattr"], 0)
            with open(m.join(".castfs", "metrics")) as f:
                metrics = f.read()
            self.assertNotIn('errno="ENOSYS"', metrics)


if __name__ == "__main__":
    tl.main()
