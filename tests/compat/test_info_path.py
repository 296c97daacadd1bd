# SPDX-License-Identifier: MIT
"""A tensor tree's .info names the path it was reached by (issue 17):
two hard links of one checkpoint (what a Hugging Face cache's snapshots
are to their blob) are one identity, parsed once, yet
a.safetensors.tensors/ and b.safetensors.tensors/ are two directories
with their own inode numbers, and each .info (of the source's tree and
of a view's) names its own path. The oracle is the path itself and the
safetensors library's header of the file (the tensor's name)."""
import json
import os
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl


def info(m, *parts):
    p = m.join(*parts)
    with open(p) as f:
        text = f.read()
    # The size a stat gives is the text's (sizes known before a read).
    assert os.stat(p).st_size == len(text.encode())
    return text


class TestInfoPath(unittest.TestCase):
    def setUp(self):
        self.tmp = tl.tempdir()
        src = self.tmp.__enter__()
        os.mkdir(os.path.join(src, "blobs"))
        blob = os.path.join(src, "blobs", "x.safetensors")
        with open(blob, "wb") as f:
            f.write(save({"w": np.arange(4, dtype=np.float32)}))
        os.link(blob, os.path.join(src, "a.safetensors"))
        os.link(blob, os.path.join(src, "b.safetensors"))
        self.src = src

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def check(self, m, order):
        for stem in order:
            text = info(m, stem + ".safetensors.tensors", "w.info")
            self.assertIn('file: %s\n' % json.dumps(stem + ".safetensors"),
                          text)
            text = info(m, stem + ".fp8.safetensors.tensors", "w.info")
            self.assertIn('file: %s\n' % json.dumps(stem + ".fp8.safetensors"),
                          text)
            self.assertIn('source: "w" in %s' % json.dumps(
                stem + ".safetensors"), text)
        # The blob's own path, reached third, names itself too.
        text = info(m, "blobs", "x.safetensors.tensors", "w.info")
        self.assertIn('file: "blobs/x.safetensors"\n', text)

    def test_each_link_names_its_path(self):
        with tl.Mount(self.src) as m:
            self.check(m, ["a", "b"])
        with tl.Mount(self.src) as m:
            self.check(m, ["b", "a"])

    def test_trees_of_two_links_are_two_directories(self):
        with tl.Mount(self.src) as m:
            ia = os.stat(m.join("a.safetensors.tensors")).st_ino
            ib = os.stat(m.join("b.safetensors.tensors")).st_ino
            self.assertNotEqual(ia, ib)
            # The listing's inode numbers are the lookups'.
            for stem in ("a", "b"):
                listed = {e.name: e.inode() for e in os.scandir(m.path)}
                tree = stem + ".safetensors.tensors"
                self.assertEqual(listed[tree], os.stat(m.join(tree)).st_ino)
                for e in os.scandir(m.join(tree)):
                    self.assertEqual(e.inode(),
                                     os.stat(m.join(tree, e.name)).st_ino,
                                     e.name)


if __name__ == "__main__":
    tl.main()
