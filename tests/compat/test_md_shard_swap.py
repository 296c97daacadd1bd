# SPDX-License-Identifier: MIT
"""Shards of a model folder replaced while its DIR.nvfp4/ is read (stop
41, found by a bug hunt).

Under ASan it also found a use-after-free the plain build does not show:
the nvfp4 fuse entry, kept in the first shard's checkpoint entry, borrowed
the tensor names of every shard's header, and a forgotten shard's header
was freed and parsed again under it (castfs_qsrc_leaf reading a freed name
from castfs_view_plan_opts -> fuses_quantized). The entry now owns copies
(castfs_qsrc_xshard_all()).

An nvfp4 shard reads its fused siblings (gate/up, q/k/v: one global scale)
from the other shards the index names. A lookup made while a shard was
being replaced by rename found the shard's identity missing from the
index's and took it for "a file no index names": its view alone, the
group cut at the shard boundary, up_proj served unquantised while
config.json's ignore list does not name it. The node kept that plan after
the source was quiet. Now a shard the index names by path but with
another identity is a shard being replaced (ESTALE), never a file alone.

Each round swaps every shard between two versions (copy, rename) while
readers read the view; once the source is quiet, every file of
DIR.nvfp4/ equals the same file of a fresh mount of that version.
"""
import errno
import json
import os
import shutil
import threading
import time
import unittest

import torch
import transformers as T

from gguf import GGUFReader

import castfs_testlib as tl

ROUNDS_S = float(os.environ.get("CASTFS_SWAP_SECONDS", "6"))


def build(path, seed):
    torch.manual_seed(seed)
    m = T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256))
    # one big weight a shard: gate_proj and up_proj in different shards
    m.to(torch.bfloat16).save_pretrained(path, max_shard_size="300KB")


def files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))


class ShardSwap(unittest.TestCase):
    def test_nvfp4_after_shards_replaced(self):
        with tl.tempdir() as root:
            v = [os.path.join(root, "v%d" % i) for i in (1, 2)]
            for i, d in enumerate(v):
                build(d, 40 + i)
            src = os.path.join(root, "src")
            ref = os.path.join(root, "ref")
            shutil.copytree(v[0], os.path.join(src, "llama"))
            shutil.copytree(v[1], os.path.join(ref, "llama"))
            shards = files(v[0])
            self.assertGreater(len(shards), 4)
            stop = []

            def swapper():
                cur = 0
                while not stop:
                    cur = 1 - cur
                    for s in shards:
                        tmp = os.path.join(src, "llama", ".swap")
                        shutil.copyfile(os.path.join(v[cur], s), tmp)
                        os.rename(tmp, os.path.join(src, "llama", s))
                    time.sleep(0.05)
                if cur != 1:  # end on the second version
                    for s in shards:
                        tmp = os.path.join(src, "llama", ".swap")
                        shutil.copyfile(os.path.join(v[1], s), tmp)
                        os.rename(tmp, os.path.join(src, "llama", s))

            with tl.Mount(src) as m, tl.Mount(ref) as r:
                view = m.join("llama.nvfp4")
                t = threading.Thread(target=swapper)
                t.start()
                deadline = time.monotonic() + ROUNDS_S
                try:
                    while time.monotonic() < deadline:
                        for f in ["model.safetensors.index.json"] + shards:
                            try:
                                os.stat(os.path.join(view, f))
                                with open(os.path.join(view, f), "rb") as g:
                                    g.read()
                            except OSError:
                                pass  # a swap under way: an error is fine
                finally:
                    stop.append(1)
                    t.join()
                time.sleep(1)
                for f in ["model.safetensors.index.json", "config.json"] + \
                        shards:
                    with self.subTest(file=f):
                        with open(os.path.join(view, f), "rb") as g, \
                                open(r.join("llama.nvfp4", f), "rb") as h:
                            self.assertEqual(g.read(), h.read(), f)


def rope_theta(c):
    return c.get("rope_theta", c.get("rope_parameters", {}).get("rope_theta"))


class BeingWritten(unittest.TestCase):
    """Files of a model folder open for writing (a bug hunt, stop 45).

    A shard looked up while a writer held it open (nothing written) was a
    plain file of the view: the source's bf16 shard under DIR.nf4/'s name,
    served byte for byte, with no error, while the view's config.json
    describes nf4. And a config.json half rewritten in place was read as
    it stood: DIR.<view>/config.json and the GGUF's KVs held the new
    max_position_embeddings with the old rope_theta, a config that never
    existed, kept by every handle opened meanwhile. Now both are refused
    (ESTALE) until the writer is done, as the source itself is."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.root = cls._tmp.__enter__()
        cls.v1 = os.path.join(cls.root, "v1")
        build(cls.v1, 40)
        cls.shard = files(cls.v1)[0]

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def fresh(self, name):
        src = os.path.join(self.root, name)
        shutil.copytree(self.v1, os.path.join(src, "llama"))
        return src

    def test_shard_open_for_writing_is_not_passed_through(self):
        raw = open(os.path.join(self.v1, self.shard), "rb").read()
        for view in ("nf4", "fp8", "int8", "fp8_dynamic"):
            with self.subTest(view=view):
                src = self.fresh("shard-" + view)
                with tl.Mount(src) as m:  # nothing looked up yet
                    name = m.join("llama." + view, self.shard)
                    w = open(os.path.join(src, "llama", self.shard), "r+b")
                    try:
                        with self.assertRaises(OSError) as cm:
                            os.stat(name)
                        self.assertEqual(cm.exception.errno, errno.ESTALE)
                    finally:
                        w.close()
                    with open(name, "rb") as f:
                        got = f.read()
                    self.assertNotEqual(got, raw)
                    self.assertEqual(got[8:9], b"{")

    def test_moe_shard_while_config_is_written(self):
        # A shard looked up or opened while config.json was open for
        # writing was planned with no keep rules (the config unreadable
        # counted as "none"): a Mixtral's experts quantised, while the
        # config.json the loader had read says they are kept.
        torch.manual_seed(3)
        moe = T.MixtralForCausalLM(T.MixtralConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            num_local_experts=4, num_experts_per_tok=2))
        src = os.path.join(self.root, "moe")
        moe.to(torch.bfloat16).save_pretrained(os.path.join(src, "mix"))
        del moe
        with tl.Mount(src) as m:
            name = m.join("mix.nf4", "model.safetensors")
            with open(name, "rb") as f:
                want = f.read()
        with tl.Mount(src) as m:
            os.stat(m.join("mix.nf4"))  # the folder, not its files
            name = m.join("mix.nf4", "model.safetensors")
            cfg = os.path.join(src, "mix", "config.json")
            with open(cfg, "r+b") as w:  # the same text, written anew
                w.write(open(cfg, "rb").read())
                w.flush()
                for op in (os.stat, lambda p: open(p, "rb").read()):
                    try:
                        got = op(name)
                    except OSError as e:
                        self.assertEqual(e.errno, errno.ESTALE)
                        continue
                    if isinstance(got, bytes):
                        self.assertEqual(got, want)
                    else:
                        self.assertEqual(got.st_size, len(want))
            with open(name, "rb") as f:
                self.assertEqual(f.read(), want)

    def test_ct_config_while_index_is_written(self):
        # The index names the files transformers loads; one being written
        # counted as unreadable, which keeps every weights file: a stray
        # consolidated.safetensors then put its modules in the
        # compressed-tensors config's ignore list.
        src = self.fresh("ctidx")
        d = os.path.join(src, "llama")
        from safetensors.torch import save_file
        # widths no multiple of w4a16's group: the ignore list's kind
        save_file({"layers.0.attention.wq.weight":
                   torch.ones(200, 200, dtype=torch.bfloat16)},
                  os.path.join(d, "consolidated.safetensors"))
        with tl.Mount(src) as m:
            with open(m.join("llama.w4a16", "config.json"), "rb") as f:
                want = f.read()
        self.assertNotIn(b"layers.0.attention", want)
        with tl.Mount(src) as m:
            os.stat(m.join("llama.w4a16"))
            idx = os.path.join(d, "model.safetensors.index.json")
            with open(idx, "r+b") as w:  # the same text, written anew
                w.write(open(idx, "rb").read())
                w.flush()
                try:
                    with open(m.join("llama.w4a16", "config.json"),
                              "rb") as f:
                        self.assertEqual(f.read(), want)
                except OSError as e:
                    self.assertEqual(e.errno, errno.ESTALE)
            with open(m.join("llama.w4a16", "config.json"), "rb") as f:
                self.assertEqual(f.read(), want)

    def test_fp8_block_shard_while_config_is_written(self):
        # A shard's header parsed while its folder's config.json was open
        # for writing took the config for one that declares nothing: FP8
        # blocks of 64 read by the default of 128 (refused: its views
        # vanished, ENOENT). Now ESTALE meanwhile, and right after.
        import test_quant_src as q
        bs, qc = q.BS, q.QC
        q.BS, q.QC = 64, dict(q.QC, weight_block_size=[64, 64])
        try:
            src = os.path.join(self.root, "fp8b")
            q.write_llama(os.path.join(src, "ds"), 256, 384, 4, 2, "300KB")
        finally:
            q.BS, q.QC = bs, qc
        d = os.path.join(src, "ds")
        names = [f.replace(".safetensors", ".bf16.safetensors")
                 for f in files(d)]
        with tl.Mount(src) as m:
            want = {n: open(m.join("ds", n), "rb").read() for n in names}
        cfg = os.path.join(d, "config.json")
        with tl.Mount(src) as m:
            with open(cfg, "r+b") as w:  # the same text, written anew
                w.write(open(cfg, "rb").read())
                w.flush()
                for n in names:
                    try:
                        self.assertEqual(open(m.join("ds", n), "rb").read(),
                                         want[n])
                    except OSError as e:
                        self.assertEqual(e.errno, errno.ESTALE, n)
            for n in names:
                self.assertEqual(open(m.join("ds", n), "rb").read(), want[n])

    def test_config_half_rewritten_is_not_read(self):
        src = self.fresh("config")
        cfg = os.path.join(src, "llama", "config.json")
        a = json.load(open(cfg))
        b = dict(a, max_position_embeddings=2 * a["max_position_embeddings"])
        if "rope_theta" in b:
            b["rope_theta"] = rope_theta(a) + 1
        else:
            b["rope_parameters"] = dict(a["rope_parameters"],
                                        rope_theta=rope_theta(a) + 1)
        ta = json.dumps(a, indent=2).encode()
        tb = json.dumps(b, indent=2).encode()
        self.assertEqual(len(ta), len(tb))
        with open(cfg, "wb") as f:
            f.write(ta)
        cut = tb.index(b"rope_theta") - 20  # one edit before, one after
        self.assertNotEqual(ta[:cut], tb[:cut])
        whole = {(a["max_position_embeddings"], rope_theta(a)),
                 (b["max_position_embeddings"], rope_theta(b))}
        with tl.Mount(src) as m:
            with open(cfg, "r+b") as w:
                w.write(tb[:cut])
                w.flush()
                # the parent still lists (the folder's views may be
                # left out meanwhile)
                self.assertIn("llama", os.listdir(m.path))
                for view in ("fp8", "nf4", "fp8_dynamic"):
                    with self.subTest(view=view):
                        try:
                            c = json.load(open(m.join("llama." + view,
                                                      "config.json")))
                        except OSError as e:
                            # refused while written, not gone: ENOENT
                            # would tell a loader there is no model
                            self.assertEqual(e.errno, errno.ESTALE)
                            continue
                        self.assertIn((c["max_position_embeddings"],
                                       rope_theta(c)), whole)
                try:
                    r = GGUFReader(m.join("llama.q8_0.gguf"))
                    kv = (int(r.fields["llama.context_length"].contents()),
                          float(r.fields["llama.rope.freq_base"].contents()))
                    del r
                    self.assertIn(kv, whole)
                except OSError:
                    pass
                w.write(tb[cut:])
            deadline = time.monotonic() + 30
            while True:  # the watcher sees the writer close
                c = json.load(open(m.join("llama.nf4", "config.json")))
                if c["max_position_embeddings"] != \
                        a["max_position_embeddings"] or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            self.assertEqual((c["max_position_embeddings"], rope_theta(c)),
                             (b["max_position_embeddings"], rope_theta(b)))


if __name__ == "__main__":
    tl.main()
