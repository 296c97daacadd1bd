# SPDX-License-Identifier: MIT
"""bitsandbytes LLM.int8 sources (docs/FORMATS.md, "bitsandbytes LLM.int8").

- A file in the layout Linear8bitLt's state dict has (I8 "M.weight",
  F32 "M.SCB", transformers' U8 "M.weight_format"), quantised by
  bitsandbytes' own int8_vectorwise_quant, and a file castfs itself wrote
  (`castfs convert --view int8`): the bf16/fp16/fp32 views equal, byte for
  byte, safetensors.torch.save() of bitsandbytes' int8_vectorwise_dequant
  (CPU) of each weight cast to the view's dtype, SCB and weight_format
  gone, every other tensor kept as stored.
- The nf4 view of an int8 source is bnb_ref's nf4 of its bf16 view.
- castfs info shows the layout; castfs convert writes the bf16 view; a
  malformed SCB refuses the file.
- A model directory written by transformers' save_pretrained of a Llama
  loaded with BitsAndBytesConfig(load_in_8bit=True) on a CPU: DIR.bf16/
  has no quantization_config, loads with unmodified from_pretrained (no
  missing or unexpected keys), every parameter equals the reference model
  that from_pretrained builds from bitsandbytes' dequantization written as
  plain bf16 and the model transformers' own dequantize() makes of the
  8-bit source, and the logits are equal.
"""
import gc
import json
import os
import shutil
import sys
import unittest
import warnings

import castfs_testlib as tl
import bnb_ref

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import bitsandbytes as bnb
        from safetensors.torch import load_file, save, save_file
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, \
            LlamaConfig, LlamaForCausalLM
        from transformers.utils import logging as hf_logging
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

MD = {"format": "pt"}
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}


def bnb_file(g):
    t = {}
    for name, shape in (("model.layers.0.self_attn.q_proj", (48, 70)),
                        ("model.layers.0.mlp.up_proj", (33, 64)),
                        ("model.layers.0.mlp.down_proj", (64, 33))):
        w = torch.randn(*shape, generator=g) * 0.05
        cb, scb, _ = bnb.functional.int8_vectorwise_quant(w.half())
        t[name + ".weight"] = cb
        t[name + ".SCB"] = scb
        t[name + ".weight_format"] = torch.tensor(0, dtype=torch.uint8)
    t["model.layers.0.mlp.down_proj.bias"] = \
        torch.randn(64, generator=g).bfloat16()
    t["model.norm.weight"] = torch.randn(70, generator=g).bfloat16()
    return t


def expected(src, dtype):
    out = {}
    for k, t in src.items():
        if k.endswith(".SCB") or k.endswith(".weight_format"):
            continue
        scb = k[:-len("weight")] + "SCB"
        if k.endswith(".weight") and scb in src:
            deq = bnb.functional.int8_vectorwise_dequant(t, src[scb])
            out[k] = deq.to(dtype)
        else:
            out[k] = t
    return out


def bits(t):
    return t.contiguous().view(torch.uint8)


class Env:
    root = None
    mnt = None
    files = {}


def run_cli(*args):
    return tl.subprocess.run([tl.castfs_binary()] + list(args),
                             capture_output=True, text=True)


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-int8-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    g = torch.Generator().manual_seed(8)
    save_file(bnb_file(g), os.path.join(src, "bnb8.safetensors"),
              metadata=MD)
    # What castfs's own int8 view writes, as a source.
    plain = {"model.layers.0.mlp.gate_proj.weight":
             torch.randn(40, 72, generator=g).bfloat16(),
             "model.norm.weight": torch.randn(72, generator=g).bfloat16()}
    plain_path = os.path.join(Env.root, "plain.safetensors")
    save_file(plain, plain_path, metadata=MD)
    r = run_cli("convert", plain_path, "--view", "int8", "-o",
                os.path.join(src, "own8.safetensors"))
    assert r.returncode == 0, r.stderr
    bad = bnb_file(g)
    bad["model.layers.0.mlp.up_proj.SCB"] = torch.ones(32)
    save_file(bad, os.path.join(src, "bad-scb.safetensors"), metadata=MD)
    # Tiled layouts of older bitsandbytes (weight_format 1 col32,
    # 2 col_turing, 3 col_ampere), and a format stored as I64.
    for fmt, dt in ((1, torch.uint8), (2, torch.uint8), (3, torch.uint8),
                    (2, torch.int64), (0, torch.int64)):
        tiled = bnb_file(g)
        for k in [k for k in tiled if k.endswith(".weight_format")]:
            tiled[k] = torch.tensor(fmt, dtype=dt)
        save_file(tiled, os.path.join(src, "fmt%d-%s.safetensors" % (
            fmt, str(dt)[6:])), metadata=MD)
    for name in ("bnb8", "own8"):
        Env.files[name] = load_file(os.path.join(src, name + ".safetensors"))
    write_int8_model(os.path.join(Env.root, "bf16-model"),
                     os.path.join(src, "llama-int8"))
    Env.mnt = tl.Mount(src)


def load_quiet(path, **kw):
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


def write_int8_model(tmp, out):
    """transformers' own 8-bit checkpoint of a random Llama."""
    torch.manual_seed(12)
    cfg = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=160,
                      num_hidden_layers=2, num_attention_heads=3,
                      num_key_value_heads=1, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
    m = load_quiet(tmp, device_map="cpu",
                   quantization_config=BitsAndBytesConfig(load_in_8bit=True))
    m.save_pretrained(out)


def tearDownModule():
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


class Int8(unittest.TestCase):
    def test_own_file_is_int8(self):
        src = Env.files["own8"]
        self.assertEqual(src["model.layers.0.mlp.gate_proj.weight"].dtype,
                         torch.int8)
        self.assertIn("model.layers.0.mlp.gate_proj.SCB", src)

    def test_views_bit_exact(self):
        for name in ("bnb8", "own8"):
            for v, dt in VIEWS.items():
                with self.subTest(file=name, view=v):
                    exp = expected(Env.files[name], dt)
                    path = Env.mnt.join("%s.%s.safetensors" % (name, v))
                    got_t = load_file(path)
                    self.assertEqual(sorted(got_t), sorted(exp))
                    for k in exp:
                        self.assertEqual(got_t[k].dtype, exp[k].dtype, k)
                        self.assertTrue(torch.equal(bits(got_t[k]),
                                                    bits(exp[k])), k)
                    want = save(exp, metadata=MD)
                    with open(path, "rb") as f:
                        self.assertEqual(f.read(), want)
                    tl.check_ranges(self, path, want, count=30)

    def test_nf4_of_dequantized(self):
        src = Env.files["bnb8"]
        deq = expected(src, torch.bfloat16)
        quantised = {k for k, t in src.items() if t.dtype == torch.int8}
        path = Env.mnt.join("bnb8.nf4_nodq.safetensors")
        with open(path, "rb") as f:
            got = f.read()
        self.assertTrue(got == bnb_ref.materialise("nf4_nodq", deq,
                                                   quantised, MD, None))

    def test_bad_scb_refused(self):
        names = os.listdir(Env.mnt.path)
        self.assertEqual([n for n in names if n.startswith("bad-scb.")],
                         ["bad-scb.safetensors"])
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        self.assertIn("LLM.int8", rej["bad-scb.safetensors"])
        self.assertIn("'model.layers.0.mlp.up_proj.SCB'",
                      rej["bad-scb.safetensors"])


    def test_tiled_weight_format_refused(self):
        """bitsandbytes reads only weight_format 0 (row-major); the tiled
        layouts' bytes are other weights read as rows (castfs served them
        until stop 42, found by a bug hunt). Which it accepts is asked of
        bitsandbytes itself (maybe_rearrange_weight)."""
        import bitsandbytes.nn.modules as bm
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for fmt, dt in ((1, "uint8"), (2, "uint8"), (3, "uint8"),
                        (2, "int64"), (0, "int64")):
            name = "fmt%d-%s" % (fmt, dt)
            sd = {"m.weight": torch.zeros(2, 2, dtype=torch.int8),
                  "m.weight_format": torch.tensor(fmt)}
            try:
                bm.maybe_rearrange_weight(sd, "m.", None, True, [], [], [])
                bnb_reads = True
            except ValueError:
                bnb_reads = False
            with self.subTest(file=name):
                self.assertEqual(name + ".bf16.safetensors" in names,
                                 bnb_reads)
                if not bnb_reads:
                    self.assertIn("weight_format %d (not 0" % fmt,
                                  rej[name + ".safetensors"])


class ModelDir(unittest.TestCase):
    def test_int8_model_bf16(self):
        src = os.path.join(Env.mnt.source, "llama-int8")
        with open(os.path.join(src, "config.json")) as f:
            self.assertTrue(json.load(f)["quantization_config"]["load_in_8bit"])
        sd = {}
        for n in os.listdir(src):
            if n.endswith(".safetensors"):
                sd.update(load_file(os.path.join(src, n)))
        self.assertTrue(any(t.dtype == torch.int8 for t in sd.values()))
        view = Env.mnt.join("llama-int8.bf16")
        with open(os.path.join(view, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f))
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        ref = expected(sd, torch.bfloat16)
        ref_dir = os.path.join(Env.root, "int8-ref")
        os.mkdir(ref_dir)
        save_file(ref, os.path.join(ref_dir, "model.safetensors"), metadata=MD)
        cfg = json.load(open(os.path.join(src, "config.json")))
        del cfg["quantization_config"]
        json.dump(cfg, open(os.path.join(ref_dir, "config.json"), "w"))
        plain = load_quiet(ref_dir)
        a, b = dict(model.state_dict()), dict(plain.state_dict())
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertEqual(a[k].dtype, b[k].dtype, k)
            self.assertTrue(torch.equal(bits(a[k]), bits(b[k])), k)
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, plain(ids).logits))
        # transformers' own dequantization of its 8-bit model agrees.
        tf = load_quiet(src, device_map="cpu")
        tf.dequantize()
        c = dict(tf.state_dict())
        self.assertEqual(sorted(a), sorted(c))
        for k in a:
            self.assertTrue(torch.equal(bits(a[k]), bits(c[k])), k)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, tf(ids).logits))
        del model, plain, tf


class CommandLine(unittest.TestCase):
    def test_info(self):
        r = run_cli("info", os.path.join(Env.mnt.source, "bnb8.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: bitsandbytes LLM.int8, 3 weights", r.stdout)
        self.assertIn("LLM.int8, F32 row scale "
                      "model.layers.0.mlp.up_proj.SCB", r.stdout)

    def test_convert_bf16(self):
        out = os.path.join(Env.root, "bnb8.bf16.safetensors")
        r = run_cli("convert", os.path.join(Env.mnt.source,
                                            "bnb8.safetensors"),
                    "--view", "bf16", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), save(expected(Env.files["bnb8"],
                                                     torch.bfloat16),
                                            metadata=MD))


if __name__ == "__main__":
    tl.main()
