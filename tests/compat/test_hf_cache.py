# SPDX-License-Identifier: MIT
"""A Hugging Face hub cache under castfs: snapshots are directories of
relative links to content-addressed blobs. Links that stay inside the
source root count as the files they reach, so a snapshot gets its
single-file views, tensor tree and model-directory views like a plain copy
of the model, and transformers loads SNAPSHOT.<view>/ unmodified; the
links themselves are still shown as links."""
import hashlib
import os
import shutil
import unittest

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import castfs_testlib as tl
import oracle

VIEWS = ("bf16", "fp16", "fp8", "nf4")


def hub_layout(root, model_dir):
    """Copy @model_dir into hub-cache form under @root; return the
    snapshot's path relative to @root."""
    repo = os.path.join(root, "models--castfs--tiny-llama")
    blobs = os.path.join(repo, "blobs")
    snap_rel = os.path.join("models--castfs--tiny-llama", "snapshots",
                            "0123456789abcdef")
    snap = os.path.join(root, snap_rel)
    os.makedirs(blobs)
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0123456789abcdef")
    for name in sorted(os.listdir(model_dir)):
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        sha = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, sha), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", sha),
                   os.path.join(snap, name))
    return snap_rel


class HubCache(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        plain = os.path.join(cls.src, "plain")
        model.save_pretrained(plain, max_shard_size="60KB")
        cls.snap = hub_layout(cls.src, plain)
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.mount.close()
        finally:
            cls.tmp.__exit__(None, None, None)

    def m(self, *parts):
        return self.mount.join(*parts)

    def test_links_stay_links(self):
        for name in os.listdir(os.path.join(self.src, self.snap)):
            p = self.m(self.snap, name)
            self.assertTrue(os.path.islink(p), name)
            self.assertEqual(os.readlink(p),
                             os.readlink(os.path.join(self.src, self.snap,
                                                      name)))

    def test_snapshot_views_equal_the_plain_copy(self):
        snap_parent, snap_name = os.path.split(self.snap)
        listing = os.listdir(self.m(snap_parent))
        shards = [n for n in os.listdir(self.m("plain"))
                  if n.endswith(".safetensors") and n.count(".") == 1]
        self.assertGreater(len(shards), 1)
        for view in VIEWS:
            self.assertIn("%s.%s" % (snap_name, view), listing)
            got_dir = self.m(self.snap + "." + view)
            ref_dir = self.m("plain." + view)
            self.assertEqual(sorted(os.listdir(got_dir)),
                             sorted(os.listdir(ref_dir)))
            for name in os.listdir(ref_dir):
                with open(os.path.join(got_dir, name), "rb") as a, \
                        open(os.path.join(ref_dir, name), "rb") as b:
                    got = a.read()
                    self.assertEqual(got, b.read(), (view, name))
                if name in shards:
                    # Not only the plain copy's view: the oracle's.
                    oracle.assert_same_file(
                        self, got, oracle.oracle_bytes(
                            os.path.join(self.src, "plain", name), view),
                        "%s.%s/%s" % (snap_name, view, name))
            # Single-file views and tensor trees of linked shards too.
            stem = shards[0][:-len(".safetensors")]
            for spelled in ("%s.%s.safetensors" % (stem, view),):
                with open(self.m(self.snap, spelled), "rb") as a, \
                        open(self.m("plain", spelled), "rb") as b:
                    self.assertEqual(a.read(), b.read())
        self.assertTrue(os.path.isdir(self.m(self.snap, shards[0] + ".tensors")))

    def test_transformers_loads_the_snapshot_view(self):
        ref = LlamaForCausalLM.from_pretrained(self.m("plain"))
        got = LlamaForCausalLM.from_pretrained(self.m(self.snap + ".fp16"))
        self.assertEqual(got.dtype, torch.float16)
        # zip() would stop at the shorter one: the key lists first.
        self.assertEqual(list(ref.state_dict()), list(got.state_dict()))
        for (k, a), (k2, b) in zip(ref.state_dict().items(),
                                   got.state_dict().items()):
            self.assertEqual(k, k2)
            self.assertTrue(torch.equal(a.to(torch.float16), b), k)


if __name__ == "__main__":
    tl.main()
