# SPDX-License-Identifier: MIT
"""Derived names past NAME_MAX (255 bytes) under a real mount: a view, a
tensor tree, a DIR.<view>/ or an index's variant spelling whose name
would not fit is not listed, its lookup answers ENAMETOOLONG, and
/.castfs/refused names the source, the view and the length, where such
sources used to have no views and no reason anywhere. A name of exactly
255 bytes is listed and served; a short-named neighbour keeps all its
views.

A DIR.<q>.gguf of exactly 255 bytes names a source X.safetensors of 257,
which cannot be: its lookup answered ENAMETOOLONG, though it was listed.

Oracles: the name lengths computed here from the source names and the
views the short neighbour lists; each served view against oracle.py
(torch's .to() written by safetensors' own writer) or torch's cast of
the source tensors; for DIR.q8_0.gguf, gguf-py's reading of it against
that of a short-named copy (whose bytes test_gguf_llm checks).
"""
import errno
import json
import os
import shutil
import unittest

import torch
from safetensors.torch import load_file, save_file

import castfs_testlib as tl
import oracle
from gguf import GGUFReader
from test_gguf_llm import make_model as make_llm

NAME_MAX = 255
ST = ".safetensors"
# The single-file views whose names are exactly 255 bytes next to it.
EDGE = "b" * (NAME_MAX - len(".fp8" + ST)) + ST  # 251 bytes
LONG = "a" * 240 + ST  # 252: X.fp8.safetensors would be 256
TREE_EDGE = "c" * (NAME_MAX - len(".tensors") - len(ST)) + ST  # 247
SHORT = "short" + ST
FOLDER = "m" * 250  # FOLDER.fp16 is 255 bytes, FOLDER.fp8_e5m2 259
NEIGHBOUR = "neighbour"
SHARD_STEM = "s" * (250 - len("-00001-of-00002" + ST))
SHARDS = tuple(SHARD_STEM + "-%05d-of-00002%s" % (i, ST) for i in (1, 2))
INDEX = "model.safetensors.index.json"
SHARDED = "sharded"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "torch_dtype": "bfloat16"}


def tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model.layers.0.mlp.up_proj.weight":
            torch.randn(64, 64, generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.randn(64, generator=g).to(
                torch.bfloat16)}


def make_model(folder, seed):
    os.mkdir(folder)
    save_file(tensors(seed), os.path.join(folder, "model" + ST),
              metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)


def make_sharded(folder):
    os.mkdir(folder)
    t = tensors(5)
    wmap = {}
    for (k, v), shard in zip(sorted(t.items()), SHARDS):
        save_file({k: v}, os.path.join(folder, shard),
                  metadata={"format": "pt"})
        wmap[k] = shard
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)


def suffix_views(names, stem, ext):
    """The views @names show as "@stem.<view>@ext"."""
    head, out = stem + ".", set()
    for n in names:
        if n.startswith(head) and n.endswith(ext) and len(n) > len(head + ext):
            out.add(n[len(head):len(n) - len(ext)])
    return out


class NameMax(unittest.TestCase):
    def setUp(self):
        self._tmp = tl.tempdir()
        self.src = self._tmp.__enter__()
        for i, name in enumerate((LONG, EDGE, TREE_EDGE, SHORT)):
            save_file(tensors(i), os.path.join(self.src, name),
                      metadata={"format": "pt"})
        make_model(os.path.join(self.src, FOLDER), 10)
        make_model(os.path.join(self.src, NEIGHBOUR), 11)
        make_sharded(os.path.join(self.src, SHARDED))

    def tearDown(self):
        self._tmp.__exit__(None, None, None)

    def refused(self, m):
        with open(m.join(".castfs", "refused")) as f:
            return json.load(f)

    def assert_name_refused(self, refused, path, view, name):
        want = "name too long: %s would be %d bytes, past NAME_MAX %d" % (
            name, len(name), NAME_MAX)
        got = [r for r in refused if r["path"] == path and view in r["views"]]
        self.assertEqual(len(got), 1, (path, view, refused))
        self.assertEqual(got[0]["reason"], want)

    def assert_listed_or_refused(self, m, names, refused, path, view, name):
        """@name, view @view of source @path: listed when it fits
        NAME_MAX, else absent and said in /.castfs/refused."""
        if len(name) <= NAME_MAX:
            self.assertIn(name, names)
            return
        self.assert_absent(m, names, name)
        self.assert_name_refused(refused, path, view, name)

    def assert_absent(self, m, names, name):
        self.assertNotIn(name, names)
        with self.assertRaises(OSError) as cm:
            os.stat(m.join(name))
        self.assertEqual(cm.exception.errno, errno.ENAMETOOLONG, name)

    def assert_view(self, m, src, name, view):
        with open(m.join(name), "rb") as f:
            got = f.read()
        oracle.assert_same_file(self, got, oracle.oracle_bytes(src, view),
                                name)

    def file_views(self, m):
        """The views the short neighbour lists: those every checkpoint of
        these dtypes would have."""
        views = suffix_views(os.listdir(m.path), SHORT[:-len(ST)], ST)
        self.assertIn("fp8", views)
        self.assertIn("fp8_e5m2", views)
        return views

    def test_single_files(self):
        with tl.Mount(self.src) as m:
            # Asked first: the walk finds them without a listing.
            refused = self.refused(m)
            names = os.listdir(m.path)
            views = self.file_views(m)
            src = os.path.join(self.src, SHORT)
            self.assert_view(m, src, SHORT[:-len(ST)] + ".fp8" + ST, "fp8")
            self.assertIn(SHORT + ".tensors", names)
            self.assertEqual([r for r in refused if r["path"] == SHORT], [])
            for name in (LONG, EDGE, TREE_EDGE):
                stem = name[:-len(ST)]
                self.assertIn(name, names)
                for v in views:
                    self.assert_listed_or_refused(m, names, refused, name, v,
                                                  stem + "." + v + ST)
                self.assert_listed_or_refused(m, names, refused, name,
                                              "tensors", name + ".tensors")
            # Exactly 255 bytes: listed and served.
            edge = EDGE[:-len(ST)] + ".fp8" + ST
            self.assertEqual(len(edge), NAME_MAX)
            self.assert_view(m, os.path.join(self.src, EDGE), edge, "fp8")
            tree = TREE_EDGE + ".tensors"
            self.assertEqual(len(tree), NAME_MAX)
            self.assertIn("model", os.listdir(m.join(tree)))
            self.assertEqual(refused, self.refused(m))

    def test_model_folders(self):
        with tl.Mount(self.src) as m:
            refused = self.refused(m)
            names = os.listdir(m.path)
            views = suffix_views(names, NEIGHBOUR, "")
            self.assertIn("fp8_e5m2", views)
            self.assertIn("fp16", views)
            self.assertEqual([r for r in refused if r["path"] == NEIGHBOUR
                              and "too long" in r["reason"]], [])
            for v in views:
                self.assert_listed_or_refused(m, names, refused, FOLDER, v,
                                              FOLDER + "." + v)
            # DIR.fp16 is exactly 255 bytes: listed and served.
            edge = FOLDER + ".fp16"
            self.assertEqual(len(edge), NAME_MAX)
            want = tensors(10)
            got = load_file(m.join(edge, "model" + ST))
            self.assertEqual(sorted(got), sorted(want))
            for k, t in want.items():
                self.assertTrue(torch.equal(got[k], t.to(torch.float16)), k)
            del got  # its mmap would keep the mount busy

    def test_index_variants(self):
        """An index's variant spelling names its shards' views: one whose
        shard names would pass NAME_MAX is not listed, and said."""
        with tl.Mount(self.src) as m:
            refused = self.refused(m)
            names = os.listdir(m.join(SHARDED))
            stem = INDEX[:-len(".json")]
            vix = suffix_views(names, stem, ".json")
            self.assertIn("model.safetensors.index.fp16.json", names)
            self.assertIn("fp16", vix)
            longest = max(len(s) for s in SHARDS)
            path = SHARDED + "/" + INDEX
            for v in ("fp32", "fp16", "bf16", "fp8", "fp8_e5m2"):
                n = longest + 1 + len(v)
                if n <= NAME_MAX:
                    self.assertIn(v, vix)
                    continue
                self.assertNotIn(v, vix)
                got = [r for r in refused
                       if r["path"] == path and v in r["views"]]
                self.assertEqual(len(got), 1, (v, refused))
                self.assertEqual(
                    got[0]["reason"],
                    "name too long: its shards' files in this view would "
                    "be up to %d bytes, past NAME_MAX %d" % (n, NAME_MAX))
            # The fp16 spelling names shard views of exactly 255 bytes.
            with open(m.join(SHARDED, "model.safetensors.index.fp16.json")) \
                    as f:
                wmap = json.load(f)["weight_map"]
            t = tensors(5)
            for k, shard in wmap.items():
                self.assertEqual(len(shard), NAME_MAX)
                got = load_file(m.join(SHARDED, shard))
                self.assertTrue(torch.equal(got[k], t[k].to(torch.float16)))
                del got  # its mmap would keep the mount busy


def gguf_tensors(path):
    """(name, type, bytes) of each tensor of GGUF file @path, read by
    gguf-py; its mmap gone on return (it would keep the mount busy)."""
    r = GGUFReader(path)
    out = [(t.name, int(t.tensor_type), bytes(t.data)) for t in r.tensors]
    del r
    return out


class GGUFNameMax(unittest.TestCase):
    """DIR.<q>.gguf of a causal-LM folder, listed with -o views=."""

    def test_gguf_folder(self):
        q = ".q8_0.gguf"
        edge, long = "h" * (NAME_MAX - len(q)), "g" * (NAME_MAX + 1 - len(q))
        with tl.tempdir() as src:
            make_llm(os.path.join(src, "llm"), "llama")
            for name in (edge, long):
                shutil.copytree(os.path.join(src, "llm"),
                                os.path.join(src, name))
            with tl.Mount(src, options=["views=fp8:q8_0.gguf"]) as m:
                refused = self.refused(m)
                names = os.listdir(m.path)
                self.assertIn("llm" + q, names)
                self.assertIn(edge + q, names)
                self.assertNotIn(long + q, names)
                with self.assertRaises(OSError) as cm:
                    os.stat(m.join(long + q))
                self.assertEqual(cm.exception.errno, errno.ENAMETOOLONG)
                # The 255-byte name serves the same tensors as the
                # short-named copy (gguf-py reads both).
                self.assertEqual(gguf_tensors(m.join(edge + q)),
                                 gguf_tensors(m.join("llm" + q)))
                got = [r for r in refused if r["path"] == long]
                want = "name too long: %s would be %d bytes, past " \
                       "NAME_MAX %d" % (long + q, NAME_MAX + 1, NAME_MAX)
                self.assertEqual(got, [{"path": long, "views": ["q8_0.gguf"],
                                        "reason": want}])
                self.assertEqual([r for r in refused
                                  if r["path"] in ("llm", edge)], [])

    def refused(self, m):
        with open(m.join(".castfs", "refused")) as f:
            return json.load(f)


if __name__ == "__main__":
    tl.main()
