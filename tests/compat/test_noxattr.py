# SPDX-License-Identifier: MIT
"""-o noxattr (docs/MOUNTING.md): getxattr and listxattr answer ENOSYS
once, after which the kernel answers every extended-attribute call on the
mount itself, so `ls -l` costs no getxattr round trip per entry. Without
it the user.castfs.* attributes are served (docs/TENSOR_TREE.md). The
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

    def test_default_serves_attributes_and_ls_asks_per_entry(self):
        with tl.Mount(self.src) as m:
            self.assertEqual(
                os.getxattr(m.join("c000.fp8.safetensors"),
                            "user.castfs.view"), b"fp8")
            before = getxattr_requests(m)
            self.ls_l(m)
            self.assertGreaterEqual(getxattr_requests(m) - before, N)

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


if __name__ == "__main__":
    tl.main()
