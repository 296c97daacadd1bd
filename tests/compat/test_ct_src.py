# SPDX-License-Identifier: MIT
"""compressed-tensors FP8 checkpoints as sources (docs/FORMATS.md,
"compressed-tensors FP8 (float-quantized)").

Producer and oracle are the real libraries, in the llm-compressor venv
(scripts/setup-llmc; ct_src_oracle.py runs there): a tiny Llama whose
Linear shapes are not multiples of 128 (edge blocks), quantized by a
data-free llm-compressor oneshot to FP8 E4M3 weights per tensor, per
channel and per 128x128 block (BF16 scales, as llm-compressor stores them
for a bf16 model), saved compressed; the expected views are every module
through compressed-tensors' own decompressor
(Float/NaiveQuantizationCompressor.decompress), which multiplies in the
scale's dtype.

- DIR.bf16/ holds exactly the decompressor's tensors, bit for bit (names,
  dtypes, shapes, bytes), no scale and no quantization_config; in DIR.fp32/
  and DIR.fp16/ the dequantized weights are torch's casts of them (other
  tensors kept as stored); from_pretrained of DIR.bf16/
  has no missing or unexpected keys and its logits equal those of the
  model built from the decompressor's state dict.
- A single file (no config.json) gets the same views; a weight_scale that
  fits no strategy gets no views and a reason; castfs info names the
  scheme.
- Sharded folders whose shards split a weight from its weight_scale
  (transformers cuts by size) get the same views (refused before stop 44).
- Each quantized folder with its config's strategy changed to each other
  one: where compressed-tensors' decompressor still reads it (one scale
  broadcasts under every strategy, one per row under "tensor"), DIR.bf16/
  holds its tensors; where it fails, the folder gets no views and a
  reason (a bug hunt: castfs dequantized by the scale's shape).
Exits 77 when FUSE, torch, transformers or the oracle venv is unavailable.
"""
import gc
import json
import os
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
        from transformers import LlamaConfig, LlamaForCausalLM
        from quant_src_common import bits, dir_tensors, end_module, \
            load_quiet, require_venv, run_oracle
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

from test_ct import tiny_llama  # noqa: E402

STRATEGIES = ("tensor", "channel", "block")
# Folders: name -> (strategy, max_shard_size). The sharded ones split
# weights from their weight_scale (transformers' sharder cuts by size; a
# bug hunt: refused until stop 44).
FOLDERS = {"ct-" + s: (s, None) for s in STRATEGIES}
FOLDERS.update({"ct-channel-sharded": ("channel", "70KB"),
                "ct-block-sharded": ("block", "70KB")})
# (the files' strategy, the config's)
MISMATCHED = [(s, t) for s in STRATEGIES for t in STRATEGIES if s != t]
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}


class Env:
    root = None
    mnt = None
    ref = {}
    tried = None  # the decompressor on MISMATCHED: tensor count or error


def setUpModule():
    require_venv()
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-ctsrc-")
    plain = os.path.join(Env.root, "plain")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    tiny_llama(plain, torch.bfloat16, 200, 320, 50, 4)
    jobs = {"quantize": [], "decompress": []}
    for name, (s, shard) in FOLDERS.items():
        d = os.path.join(src, name)
        jobs["quantize"].append([plain, d, s, shard])
        jobs["decompress"].append([d, os.path.join(Env.root, name + ".ref")])
    run_oracle("ct_src_oracle.py", jobs, Env.root)
    for name in FOLDERS:
        Env.ref[name] = load_file(os.path.join(Env.root, name + ".ref"))
    # The same files under a config of another strategy.
    jobs = {"try": []}
    for s, t in MISMATCHED:
        d = os.path.join(src, "cfg-%s-of-%s" % (t, s))
        shutil.copytree(os.path.join(src, "ct-" + s), d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        for g in cfg["quantization_config"]["config_groups"].values():
            g["weights"]["strategy"] = t
            g["weights"]["block_structure"] = [128, 128] if t == "block" \
                else None
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        jobs["try"].append([d, os.path.join(Env.root, "%s-of-%s.ref" % (t, s))])
    Env.tried = run_oracle("ct_src_oracle.py", jobs, Env.root)["try"]
    shutil.copy(os.path.join(src, "ct-channel", "model.safetensors"),
                os.path.join(src, "single.safetensors"))
    w = torch.randn(40, 30).to(torch.float8_e4m3fn)
    save_file({"l.weight": w, "l.weight_scale": torch.ones(3, 7).bfloat16()},
              os.path.join(src, "misfit.safetensors"))
    Env.mnt = tl.Mount(src)


def tearDownModule():
    end_module(Env)


class ModelDir(unittest.TestCase):
    def test_sharded_folders_split_weights_from_scales(self):
        for name in ("ct-channel-sharded", "ct-block-sharded"):
            with open(os.path.join(Env.mnt.source, name,
                                   "model.safetensors.index.json")) as f:
                wm = json.load(f)["weight_map"]
            self.assertTrue(any(wm[k] != wm[k[:-len("_scale")]] for k in wm
                                if k.endswith(".weight_scale")), name)

    def test_views_equal_decompressor(self):
        for name in FOLDERS:
            ref = Env.ref[name]
            src = dir_tensors(os.path.join(Env.mnt.source, name))
            deq = {k for k, t in src.items() if t.dtype == torch.float8_e4m3fn}
            for v, dt in VIEWS.items():
                with self.subTest(folder=name, view=v):
                    view = Env.mnt.join("%s.%s" % (name, v))
                    with open(os.path.join(view, "config.json")) as f:
                        self.assertNotIn("quantization_config", json.load(f))
                    got = dir_tensors(view)
                    self.assertEqual(sorted(got), sorted(ref))
                    for k, t in ref.items():
                        # Other tensors are kept as stored, as in every
                        # view of a quantized source.
                        want = t.to(dt) if k in deq else t
                        self.assertEqual(got[k].dtype, want.dtype, k)
                        self.assertTrue(torch.equal(bits(got[k]), bits(want)),
                                        k)

    def test_bf16_loads_and_logits(self):
        for name in FOLDERS:
            with self.subTest(folder=name):
                view = Env.mnt.join("%s.bf16" % name)
                model, info = load_quiet(view, output_loading_info=True)
                for k in ("missing_keys", "unexpected_keys",
                          "mismatched_keys"):
                    self.assertEqual(list(info.get(k, [])), [], k)
                cfg = LlamaConfig.from_pretrained(view)
                plain = LlamaForCausalLM._from_config(cfg,
                                                      dtype=torch.bfloat16)
                plain.load_state_dict(Env.ref[name])
                ids = torch.arange(20).reshape(1, 20)
                with torch.no_grad():
                    self.assertTrue(torch.equal(model(ids).logits,
                                                plain(ids).logits))
                del model
                gc.collect()


class ConfigStrategy(unittest.TestCase):
    def test_served_exactly_where_compressed_tensors_reads(self):
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        verdicts = set()
        for (s, t), res in zip(MISMATCHED, Env.tried):
            name = "cfg-%s-of-%s" % (t, s)
            with self.subTest(config=t, files=s, oracle=res):
                view = Env.mnt.join(name + ".bf16")
                verdicts.add(isinstance(res, int))
                if isinstance(res, str):  # the decompressor fails
                    self.assertFalse(os.path.exists(view))
                    self.assertIn("strategy does not decompress",
                                  rej.get(name + "/model.safetensors", ""))
                    continue
                ref = load_file(os.path.join(Env.root,
                                             "%s-of-%s.ref" % (t, s)))
                got = dir_tensors(view)
                self.assertEqual(sorted(got), sorted(ref))
                for k, w in ref.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(w)), k)
        self.assertEqual(verdicts, {True, False})  # both kinds met


class SingleFile(unittest.TestCase):
    def test_single_file_views(self):
        got = load_file(Env.mnt.join("single.bf16.safetensors"))
        ref = Env.ref["ct-channel"]
        self.assertEqual(sorted(got), sorted(ref))
        for k, t in ref.items():
            self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)

    def test_misfit_rejected(self):
        self.assertNotIn("misfit.bf16.safetensors", os.listdir(Env.mnt.path))
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        self.assertIn("compressed-tensors FP8", rej["misfit.safetensors"])

    def test_info_shows_scheme(self):
        r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
            Env.mnt.source, "ct-block", "model.safetensors")],
            capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("fp8 block 128x128, BF16 scale "
                      "model.layers.0.mlp.down_proj.weight_scale", r.stdout)
        r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
            Env.mnt.source, "single.safetensors")],
            capture_output=True, text=True)
        self.assertIn("fp8 per-channel, BF16 scale", r.stdout)


if __name__ == "__main__":
    tl.main()
