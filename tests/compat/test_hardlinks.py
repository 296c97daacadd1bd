# SPDX-License-Identifier: MIT
"""Views of a hard-linked source (stop 41, found by a bug hunt).

A view's inode number comes from its source's identity, so the views of
two hard links of one file are one inode under two names; they said
st_nlink 1, and rsync -H, tar and du took them for two files. A view
reports its source's link count; a file linked once stays at 1.
"""
import os
import unittest

import torch
from safetensors.torch import save_file

import castfs_testlib as tl


class HardLinks(unittest.TestCase):
    def test_views_of_hard_links(self):
        with tl.tempdir() as src:
            save_file({"w": torch.randn(8, 8)},
                      os.path.join(src, "real.safetensors"))
            os.link(os.path.join(src, "real.safetensors"),
                    os.path.join(src, "hard.safetensors"))
            save_file({"w": torch.randn(8, 8)},
                      os.path.join(src, "alone.safetensors"))
            with tl.Mount(src) as m:
                for view in ("", ".bf16", ".fp8", ".nf4"):
                    with self.subTest(view=view):
                        a = os.stat(m.join("real%s.safetensors" % view))
                        b = os.stat(m.join("hard%s.safetensors" % view))
                        c = os.stat(m.join("alone%s.safetensors" % view))
                        self.assertEqual(a.st_ino, b.st_ino)
                        self.assertEqual((a.st_nlink, b.st_nlink), (2, 2))
                        self.assertNotEqual(c.st_ino, a.st_ino)
                        self.assertEqual(c.st_nlink, 1)
                        with open(m.join("real%s.safetensors" % view),
                                  "rb") as f, \
                                open(m.join("hard%s.safetensors" % view),
                                     "rb") as g:
                            self.assertEqual(f.read(), g.read())


if __name__ == "__main__":
    tl.main()
