# SPDX-License-Identifier: MIT
"""DIR.<q>.gguf of a SHARDED causal-LM folder (model.safetensors.index.json
and model-0000k-of-0000n.safetensors): the same tiny Llama saved by
transformers once as one model.safetensors and once with
save_pretrained(max_shard_size=...), both mounted.

Oracles, none of them castfs:
- gguf.quants.quantize of the source tensors (permuted with
  convert_hf_to_gguf's formula, test_gguf_llm.expected_tensors) for every
  tensor of the sharded folder's f16 / q8_0 / q4_0 files;
- the tensor order convert_hf_to_gguf.py writes (f16, bf16, q8_0),
  computed here from the files themselves: the shards in sorted name order
  (get_model_part_names), each shard's tensors by name (gguf-py's
  SafetensorsLocal sorts them); for the files only llama-quantize makes,
  its loader's order (by layer, then name);
- the single-file folder's file (tested against the same oracles in
  test_gguf_llm.py and test_gguf_kquant.py): every KV and every tensor's
  type, shape and bytes equal, for the K-quant mix too;
- llama.cpp (llama-cpp-python) loads the sharded q8_0 / f16 files: its
  logits equal, bit for bit, those of the single-file folder's file, and
  are within test_gguf_llamacpp's tolerance of transformers';
- llama.cpp's llama_model_quantize (what llama-quantize runs) of the
  sharded bfloat16 folder's bf16 file: the folder's q4_0 / q4_k_m /
  q5_k_m / q6_k files equal its output byte for byte (tensor order
  included), and so do the single-file folder's.
A shard rewritten while the file is open fails the next read with EIO
(the daemon keeps serving the other files); a removed shard takes the
file away with a reason in /.castfs/refused; an index castfs refuses
(a shard named by a path, a tensor mapped to the wrong shard) gives no
file and a reason.
"""
import errno
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

import llama_cpp
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants
from safetensors import safe_open

import castfs_testlib as tl
import ggml_oracle
from test_gguf_llm import NAMES, expected_tensors, make_model
from test_gguf_llamacpp import LOGIT_TOL

VIEWS = ("f16", "q8_0", "q4_0", "q4_k_m", "q6_k")
ORACLE_VIEWS = {"f16": QT.F16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
INDEX = "model.safetensors.index.json"
TEXTS = ("config.json", "tokenizer.json", "tokenizer_config.json")
SETTLE = 10.0  # seconds the watcher may take (it takes milliseconds)
PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, n, rest = hf.split(".", 3)
    return "blk.%s.%s" % (n, NAMES[rest])


def convert_order(folder):
    """convert_hf_to_gguf.py's tensor order for @folder."""
    parts = sorted(f for f in os.listdir(folder)
                   if f.startswith("model") and f.endswith(".safetensors"))
    order = []
    for p in parts:
        with safe_open(os.path.join(folder, p), "pt") as f:
            order += [gguf_name(k) for k in sorted(f.keys())]
    return order


def name_layer(name):
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def quantize_order(names):
    """llama-quantize's order (llama_model_loader's weight_name_comparer,
    llama.cpp src/llama-model-loader.h): by layer, tensors of no layer
    first, then by name."""
    return sorted(names, key=lambda n: (name_layer(n), n))


# The files only llama-quantize makes (convert_hf_to_gguf.py writes f16,
# bf16 and q8_0 itself).
QUANTIZE_MADE = ("q4_0", "q4_k_m", "q5_k_m", "q6_k")


def fields(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = f.contents()
    return out


def build_src(src):
    """The tiny Llama saved in @src as one/ (one file) and sharded/ (three
    or more shards); the model and the sorted shard names."""
    os.mkdir(src)
    one = os.path.join(src, "one")
    model = make_model(one, "llama")
    sharded = os.path.join(src, "sharded")
    os.mkdir(sharded)
    model.save_pretrained(sharded, max_shard_size="200KB")
    for f in TEXTS:
        shutil.copy(os.path.join(one, f), sharded)
    with open(os.path.join(sharded, INDEX)) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    assert len(shards) >= 3, shards
    assert not os.path.exists(os.path.join(sharded, "model.safetensors"))
    return model, shards


class ShardedGGUF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        cls.model, cls.shards = build_src(cls.src)
        cls.sharded = os.path.join(cls.src, "sharded")
        # without its tokenizer: no GGUF file, ENOENT as for one file
        notok = os.path.join(cls.src, "notok")
        shutil.copytree(cls.sharded, notok)
        os.unlink(os.path.join(notok, "tokenizer.json"))
        cls.mount = tl.Mount(cls.src, options=[
            "views=" + ":".join(v + ".gguf" for v in VIEWS)])

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def path(self, folder, view):
        return self.mount.join("%s.%s.gguf" % (folder, view))

    def test_listed_not_refused(self):
        names = os.listdir(self.mount.path)
        for v in VIEWS:
            self.assertIn("sharded.%s.gguf" % v, names)
        with open(self.mount.join(".castfs", "refused")) as f:
            refused = json.load(f)
        self.assertEqual([r for r in refused if r["path"] == "sharded"], [])

    def test_no_tokenizer_enoent(self):
        """A sharded folder without tokenizer.json has no GGUF file: its
        names answer ENOENT, as the one-file folder's do (they answered
        ESTALE, a node made for the shards that could never build; bug
        hunt)."""
        names = os.listdir(self.mount.path)
        for v in VIEWS:
            self.assertNotIn("notok.%s.gguf" % v, names)
            with self.assertRaises(FileNotFoundError):
                os.stat(self.path("notok", v))

    def test_tensors_equal_the_reference(self):
        for view, qt in ORACLE_VIEWS.items():
            exp = expected_tensors(self.model, "llama", view)
            r = GGUFReader(self.path("sharded", view))
            self.assertEqual(sorted(t.name for t in r.tensors), sorted(exp))
            for t in r.tensors:
                want_qt, data = exp[t.name]
                self.assertEqual(t.tensor_type, want_qt, (view, t.name))
                self.assertEqual(list(reversed(t.shape.tolist())),
                                 list(data.shape), t.name)
                self.assertEqual(np.asarray(t.data).tobytes(),
                                 quants.quantize(data, want_qt).tobytes(),
                                 (view, t.name))

    def test_order_is_the_tools(self):
        """convert_hf_to_gguf.py's order for the files it writes,
        llama-quantize's for the others (whatever the input's order)."""
        want = convert_order(self.sharded)
        want_one = convert_order(os.path.join(self.src, "one"))
        # the shards really reorder: not the single file's name order
        self.assertNotEqual(want, want_one)
        self.assertNotEqual(quantize_order(want), want)
        for view in VIEWS:
            quant = view in QUANTIZE_MADE
            r = GGUFReader(self.path("sharded", view))
            self.assertEqual([t.name for t in r.tensors],
                             quantize_order(want) if quant else want, view)
            r1 = GGUFReader(self.path("one", view))
            self.assertEqual([t.name for t in r1.tensors],
                             quantize_order(want_one) if quant else want_one)

    def test_same_as_single_file(self):
        for view in VIEWS:
            with self.subTest(view=view):
                a = GGUFReader(self.path("one", view))
                b = GGUFReader(self.path("sharded", view))
                fa, fb = fields(a), fields(b)
                self.assertEqual(list(fa), list(fb))
                if view in QUANTIZE_MADE:
                    self.assertEqual(list(fa)[-2:], [
                        "general.quantization_version", "general.file_type"])
                for k in fa:
                    self.assertEqual(fa[k], fb[k], k)
                ta = {t.name: t for t in a.tensors}
                for t in b.tensors:
                    u = ta[t.name]
                    self.assertEqual(t.tensor_type, u.tensor_type, t.name)
                    self.assertEqual(t.shape.tolist(), u.shape.tolist())
                    self.assertEqual(np.asarray(t.data).tobytes(),
                                     np.asarray(u.data).tobytes(), t.name)
                self.assertEqual(os.path.getsize(self.path("one", view)),
                                 os.path.getsize(self.path("sharded", view)))

    def texts_read(self):
        with open(self.mount.join(".castfs", "stats")) as f:
            return json.load(f)["texts_read"]

    def test_index_read_once(self):
        """The index is read and parsed once per identity, not at every
        lookup and open of the file (counted by /.castfs/stats)."""
        p = self.path("sharded", "q8_0")
        with open(p, "rb") as f:
            whole = f.read()
        os.listdir(self.mount.path)  # the first builds every view once
        before = self.texts_read()
        for _ in range(5):
            self.assertIn("sharded.q8_0.gguf", os.listdir(self.mount.path))
            with open(p, "rb") as f:
                self.assertEqual(f.read(64), whole[:64])
        self.assertEqual(self.texts_read(), before)

    def test_random_ranges(self):
        """Any range of the file is the bytes of a whole read."""
        p = self.path("sharded", "q8_0")
        with open(p, "rb") as f:
            whole = f.read()
        tl.check_ranges(self, p, whole, count=100)

    def test_convert_and_info(self):
        """castfs convert DIR writes the mounted bytes; castfs info
        DIR.<q>.gguf prints the mounted file's header."""
        out = os.path.join(self.tmp, "out.gguf")
        for view in ("f16", "q4_k_m"):
            subprocess.run([tl.castfs_binary(), "convert", self.sharded,
                            "--view", view, "-o", out, "--no-progress"],
                           check=True)
            with open(out, "rb") as a, open(self.path("sharded", view),
                                            "rb") as b:
                self.assertEqual(a.read(), b.read(), view)
        info = [subprocess.run([tl.castfs_binary(), "info", p],
                               capture_output=True, text=True, check=True)
                .stdout.split("\n", 1)[1]
                for p in (self.sharded + ".q8_0.gguf",
                          self.path("sharded", "q8_0"))]
        self.assertEqual(info[0], info[1])
        self.assertIn("blk.0.attn_q.weight", info[0])

    def logits(self, path):
        llm = llama_cpp.Llama(path, n_ctx=64, logits_all=True, verbose=False,
                              seed=0, n_threads=2)
        try:
            llm.eval(PROMPT)
            return np.array(llm.scores[:len(PROMPT)])
        finally:
            llm.close()

    def test_llama_cpp(self):
        with torch.no_grad():
            want = self.model(torch.tensor([PROMPT])).logits[0].numpy()
        for view in ("f16", "q8_0"):
            got = self.logits(self.path("sharded", view))
            ref = self.logits(self.path("one", view))
            self.assertTrue(np.array_equal(got, ref), view)
            err = np.abs(got - want).max()
            print("sharded %s: max |logit difference| %.4f" % (view, err),
                  file=sys.stderr)
            self.assertLess(err, LOGIT_TOL[view], view)


class QuantizeSharded(unittest.TestCase):
    """The K-quant and Q4_0 files of a sharded bfloat16 folder are, byte
    for byte, what llama.cpp's llama_model_quantize (llama-quantize) makes
    of the folder's bf16 file: tensor order, KV order, type mix and blocks.
    The 8-layer width-256 Llama of test_gguf_kquant (whole super-blocks,
    the quantisers' corner cases), saved whole and in four shards."""

    @classmethod
    def setUpClass(cls):
        from test_gguf_kquant import make_model as make_kmodel
        from transformers import AutoModelForCausalLM
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        src = os.path.join(cls.tmp, "src")
        os.mkdir(src)
        one = os.path.join(src, "one")
        make_kmodel(one, "llama", 256, 8, torch.bfloat16)
        m = AutoModelForCausalLM.from_pretrained(one, dtype=torch.bfloat16)
        sharded = os.path.join(src, "sharded")
        os.mkdir(sharded)
        m.save_pretrained(sharded, max_shard_size="3MB")
        for f in TEXTS:
            shutil.copy(os.path.join(one, f), sharded)
        assert len([f for f in os.listdir(sharded)
                    if f.endswith(".safetensors")]) >= 3
        cls.mount = tl.Mount(src, options=[
            "views=bf16.gguf:" + ":".join(v + ".gguf"
                                          for v in QUANTIZE_MADE)])

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def test_llama_quantize_bytes(self):
        for view in QUANTIZE_MADE:
            with self.subTest(view=view):
                out = os.path.join(self.tmp, "lq.gguf")
                ggml_oracle.llama_quantize(
                    self.mount.join("sharded.bf16.gguf"), out, view)
                with open(out, "rb") as f:
                    want = f.read()
                for d in ("sharded", "one"):
                    with open(self.mount.join("%s.%s.gguf" % (d, view)),
                              "rb") as f:
                        self.assertEqual(f.read(), want, (d, view))


def wait_for(pred):
    deadline = time.time() + SETTLE
    while not pred():
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


class ShardChanges(unittest.TestCase):
    """Changes to shards under a mount of their own."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.orig = os.path.join(cls.tmp, "orig")
        _, cls.shards = build_src(cls.orig)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def setUp(self):
        self.src = os.path.join(self.tmp, "src")
        shutil.rmtree(self.src, ignore_errors=True)
        shutil.copytree(self.orig, self.src)
        self.sharded = os.path.join(self.src, "sharded")
        self.mount = tl.Mount(self.src, options=["views=q8_0.gguf"])

    def tearDown(self):
        rc = self.mount.unmount()
        shutil.rmtree(self.src, ignore_errors=True)
        self.assertEqual(rc, 0)

    def refused(self):
        """The GGUF refusals of sharded/ (the DIR.<view>/ views of a
        folder have their own)."""
        with open(self.mount.join(".castfs", "refused")) as f:
            return [r for r in json.load(f) if r["path"] == "sharded" and
                    "q8_0.gguf" in r["views"]]

    def test_rewritten_shard_fails_reads(self):
        p = self.mount.join("sharded.q8_0.gguf")
        size = os.path.getsize(p)
        fd = os.open(p, os.O_RDONLY)
        # No read-ahead: a request for the last page still in flight when
        # the shard is rewritten completes (its bytes are consistent) and
        # leaves that page in the page cache, where the read below would
        # find it (1 run in 3 under ThreadSanitizer).
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        try:
            self.assertEqual(len(os.pread(fd, 4096, 0)), 4096)
            # rewrite the last shard in place, same bytes but a new mtime
            last = os.path.join(self.sharded, self.shards[-1])
            with open(last, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(data)
            os.utime(last, ns=(time.time_ns(), time.time_ns() + 10**9))
            with self.assertRaises(OSError) as cm:
                os.pread(fd, 4096, (size - 1) // 4096 * 4096)
            self.assertIn(cm.exception.errno, (errno.EIO, errno.ESTALE))
        finally:
            os.close(fd)
        # the daemon serves the others, and the folder's new file
        with open(self.mount.join("one.q8_0.gguf"), "rb") as f:
            self.assertGreater(len(f.read()), 0)
        self.assertTrue(wait_for(lambda: self.reads_whole(p, size)))

    def reads_whole(self, p, size):
        try:
            with open(p, "rb") as f:
                return len(f.read()) == size
        except OSError:
            return False

    def test_removed_shard(self):
        p = self.mount.join("sharded.q8_0.gguf")
        self.assertTrue(os.path.exists(p))
        os.unlink(os.path.join(self.sharded, self.shards[1]))

        def gone():
            try:
                open(p, "rb").close()
                return False
            except OSError as e:
                return e.errno in (errno.ENOENT, errno.ESTALE, errno.EIO)
        self.assertTrue(wait_for(gone))
        self.assertNotIn("sharded.q8_0.gguf", os.listdir(self.mount.path))
        r = self.refused()
        self.assertEqual(len(r), 1, r)
        self.assertIn("missing", r[0]["reason"])
        self.assertIn(self.shards[1], r[0]["reason"])
        with open(self.mount.join("one.q8_0.gguf"), "rb") as f:
            self.assertGreater(len(f.read()), 0)

    def test_packed_shard(self):
        """A shard packed as X.safetensors.zst (frames of 64 KiB, so that
        reads cut frames) stands in for it: the same bytes."""
        p = self.mount.join("sharded.q8_0.gguf")
        with open(p, "rb") as f:
            want = f.read()
        self.mount.unmount()
        shard = os.path.join(self.sharded, self.shards[1])
        r = subprocess.run([tl.castfs_binary(), "pack", "--no-progress",
                            "--frame-size", "64K", "--remove", shard],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(shard))
        self.mount = tl.Mount(self.src, options=["views=q8_0.gguf"])
        p = self.mount.join("sharded.q8_0.gguf")
        with open(p, "rb") as f:
            self.assertEqual(f.read(), want)
        tl.check_ranges(self, p, want, count=50)

    def test_rejected_shard(self):
        """A shard that is no valid safetensors file (cut short) is in
        /.castfs/rejected, and the folder has no GGUF file."""
        p = self.mount.join("sharded.q8_0.gguf")
        self.assertTrue(os.path.exists(p))
        shard = os.path.join(self.sharded, self.shards[2])
        with open(shard, "r+b") as f:
            f.truncate(100)
        self.assertTrue(wait_for(lambda: not os.path.exists(p)))
        self.assertNotIn("sharded.q8_0.gguf", os.listdir(self.mount.path))
        with open(self.mount.join(".castfs", "rejected")) as f:
            rejected = [r["path"] for r in json.load(f)]
        self.assertIn("sharded/" + self.shards[2], rejected)

    def rewrite_index(self, fn):
        ip = os.path.join(self.sharded, INDEX)
        with open(ip) as f:
            ix = json.load(f)
        fn(ix["weight_map"])
        with open(ip + ".tmp", "w") as f:
            json.dump(ix, f)
        os.rename(ip + ".tmp", ip)

    def assert_refused(self, words):
        p = self.mount.join("sharded.q8_0.gguf")
        self.assertTrue(wait_for(lambda: not os.path.exists(p)))
        self.assertNotIn("sharded.q8_0.gguf", os.listdir(self.mount.path))
        r = self.refused()
        self.assertEqual(len(r), 1, r)
        self.assertIn(words, r[0]["reason"])

    def test_tensor_mapped_to_wrong_shard(self):
        def wrong(wm):
            k = sorted(wm)[0]
            wm[k] = next(s for s in self.shards if s != wm[k])
        self.rewrite_index(wrong)
        self.assert_refused("not mapped")

    def test_tensor_the_shards_lack(self):
        self.rewrite_index(lambda wm: wm.update(
            {"model.layers.9.mlp.up_proj.weight": self.shards[0]}))
        self.assert_refused("maps")

    def test_shard_with_a_tensor_castfs_does_not_map(self):
        """An int8 tensor with no llama.cpp name in a shard (and the
        index): the folder is refused, the tensor named."""
        from safetensors.torch import load_file, save_file
        shard = os.path.join(self.sharded, self.shards[0])
        t = load_file(shard)
        t["model.layers.0.mlp.up_proj.weight_scale"] = torch.ones(
            4, dtype=torch.int8)
        save_file(t, shard + ".tmp", metadata={"format": "pt"})
        os.rename(shard + ".tmp", shard)
        self.rewrite_index(lambda wm: wm.update(
            {"model.layers.0.mlp.up_proj.weight_scale": self.shards[0]}))
        self.assert_refused("weight_scale")

    def test_shard_named_by_a_path(self):
        def path(wm):
            for k in wm:
                if wm[k] == self.shards[0]:
                    wm[k] = "../one/" + self.shards[0]
        self.rewrite_index(path)
        self.assert_refused("beside it")


if __name__ == "__main__":
    tl.main()
