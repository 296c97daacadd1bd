# SPDX-License-Identifier: MIT
"""compressed-tensors pack-quantized int4 checkpoints as sources
(docs/FORMATS.md, "compressed-tensors pack-quantized int4").

- Tiny Llamas made with transformers, quantized by llm-compressor (its
  venv, ct_w4_oracle.py) to symmetric int4 in groups of 128 (W4A16) and
  per channel (rows of 200 and 330 columns: code rows padded to whole
  I32 words) and saved compressed: every DIR.bf16/fp16/fp32 weight equals
  compressed-tensors' own PackedQuantizationCompressor.decompress of the
  source, cast by torch; DIR.bf16/ loads with unmodified from_pretrained
  (no missing or unexpected keys, no quantization_config), logits equal
  to the model built from the decompressor's weights; DIR.nf4/ is
  offered (its bytes: test_requant.py).
- A single file: its bf16 view equal to the decompressor's, random ranges.
- Zero points, g_idx, a weight_shape that disagrees with the packed codes
  and a missing weight_shape: no views and a reason; castfs info shows
  the scheme.
"""
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM, LlamaConfig, \
            LlamaForCausalLM
        from transformers.utils import logging as hf_logging
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

from test_ct import VENV_PY, tiny_llama  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# strategy -> (hidden, intermediate, head_dim) of its model
STRATEGIES = {"group": (256, 384, 64), "channel": (200, 330, 50)}
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}


class Env:
    root = None
    mnt = None
    ref = {}


def bits(t):
    return t.contiguous().view(torch.uint8)


def run_oracle(jobs):
    path = os.path.join(Env.root, "jobs.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    p = subprocess.run([VENV_PY, os.path.join(HERE, "ct_w4_oracle.py"), path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("ct_w4_oracle failed:\n" + p.stdout[-3000:] +
                             p.stderr[-6000:])
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def dir_tensors(d):
    out = {}
    for n in sorted(os.listdir(d)):
        if n.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, n)))
    return out


def lies(src, single):
    """Files whose int4 layout castfs must refuse, from @single's."""
    mod = "model.layers.0.self_attn.q_proj."
    sd = load_file(single)
    packed = sd[mod + "weight_packed"]
    out = {}
    zp = dict(sd)
    zp[mod + "weight_zero_point"] = torch.zeros(
        (packed.shape[0] + 7) // 8, 1, dtype=torch.int32)
    out["zero-point"] = (zp, "zero points")
    gi = dict(sd)
    gi[mod + "weight_g_idx"] = torch.zeros(200, dtype=torch.int32)
    out["g-idx"] = (gi, "g_idx")
    shp = dict(sd)
    shp[mod + "weight_shape"] = torch.tensor([packed.shape[0], 240])
    out["shape"] = (shp, "weight_shape")
    nos = dict(sd)
    del nos[mod + "weight_shape"]
    out["no-shape"] = (nos, "weight_shape")
    for name, (t, _) in out.items():
        save_file(t, os.path.join(src, "lie-%s.safetensors" % name))
    return {k: why for k, (_, why) in out.items()}


def setUpModule():
    if not os.path.exists(VENV_PY):
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)"
              % VENV_PY)
        sys.exit(tl.SKIP)
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-ctw4src-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    jobs = {"quantize": [], "decompress": []}
    for i, (s, (hid, inter, hd)) in enumerate(STRATEGIES.items()):
        plain = os.path.join(Env.root, "plain-" + s)
        tiny_llama(plain, torch.bfloat16, hid, inter, hd, 4 + i)
        d = os.path.join(src, "w4-" + s)
        jobs["quantize"].append([plain, d, s])
        jobs["decompress"].append([d, os.path.join(Env.root, s + ".ref")])
    run_oracle(jobs)
    for s in STRATEGIES:
        Env.ref[s] = load_file(os.path.join(Env.root, s + ".ref"))
    single = os.path.join(src, "single.safetensors")
    shutil.copy(os.path.join(src, "w4-channel", "model.safetensors"), single)
    Env.lies = lies(src, single)
    Env.mnt = tl.Mount(src)


def tearDownModule():
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    if Env.root:
        shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def load_quiet(path, **kw):
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


class ModelDir(unittest.TestCase):
    def test_views_equal_decompressor(self):
        for s in STRATEGIES:
            ref = Env.ref[s]
            src = dir_tensors(os.path.join(Env.mnt.source, "w4-" + s))
            deq = {k[:-len("_packed")] for k in src
                   if k.endswith(".weight_packed")}
            self.assertEqual(len(deq), 14)
            for v, dt in VIEWS.items():
                with self.subTest(strategy=s, view=v):
                    view = Env.mnt.join("w4-%s.%s" % (s, v))
                    with open(os.path.join(view, "config.json")) as f:
                        self.assertNotIn("quantization_config", json.load(f))
                    got = dir_tensors(view)
                    self.assertEqual(sorted(got), sorted(ref))
                    for k, t in ref.items():
                        want = t.to(dt) if k in deq else t
                        self.assertEqual(got[k].dtype, want.dtype, k)
                        self.assertEqual(got[k].shape, want.shape, k)
                        self.assertTrue(torch.equal(bits(got[k]), bits(want)),
                                        k)

    def test_bf16_loads_and_logits(self):
        for s in STRATEGIES:
            with self.subTest(strategy=s):
                view = Env.mnt.join("w4-%s.bf16" % s)
                model, info = load_quiet(view, output_loading_info=True)
                for k in ("missing_keys", "unexpected_keys",
                          "mismatched_keys"):
                    self.assertEqual(list(info.get(k, [])), [], k)
                cfg = LlamaConfig.from_pretrained(view)
                plain = LlamaForCausalLM._from_config(cfg,
                                                      dtype=torch.bfloat16)
                plain.load_state_dict(Env.ref[s])
                ids = torch.arange(20).reshape(1, 20)
                with torch.no_grad():
                    self.assertTrue(torch.equal(model(ids).logits,
                                                plain(ids).logits))
                del model
                gc.collect()

    def test_quantising_views_offered(self):
        """Views that quantise again are offered (their bytes:
        test_requant.py)."""
        names = os.listdir(Env.mnt.path)
        self.assertIn("w4-group.bf16", names)
        self.assertIn("w4-group.nf4", names)
        self.assertTrue(os.path.exists(
            Env.mnt.join("single.nf4.safetensors")))


class SingleFile(unittest.TestCase):
    def test_single_file_view_and_ranges(self):
        path = Env.mnt.join("single.bf16.safetensors")
        got = load_file(path)
        ref = Env.ref["channel"]
        self.assertEqual(sorted(got), sorted(ref))
        for k, t in ref.items():
            self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
        with open(path, "rb") as f:
            whole = f.read()
        tl.check_ranges(self, path, whole, random.Random(3), count=100)

    def test_lies_rejected(self):
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for name, why in Env.lies.items():
            with self.subTest(lie=name):
                base = "lie-" + name
                self.assertNotIn(base + ".bf16.safetensors", names)
                self.assertIn("compressed-tensors", rej[base + ".safetensors"])
                self.assertIn(why, rej[base + ".safetensors"])

    def test_info_shows_scheme(self):
        r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
            Env.mnt.source, "w4-group", "model.safetensors")],
            capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: compressed-tensors pack-quantized int4, "
                      "14 weights", r.stdout)
        self.assertIn("int4 symmetric, groups of 128, BF16 scale "
                      "model.layers.0.mlp.down_proj.weight_scale", r.stdout)


if __name__ == "__main__":
    tl.main()
