# SPDX-License-Identifier: MIT
"""compressed-tensors pack-quantized int4 checkpoints as sources
(docs/FORMATS.md, "compressed-tensors pack-quantized int4").

- Tiny Llamas made with transformers, quantized by llm-compressor (its
  venv, ct_w4_oracle.py) to symmetric int4 in groups of 128 (W4A16) and
  per channel (rows of 200 and 330 columns: code rows padded to whole
  I32 words), and asymmetric (llm-compressor's W4A16_ASYM preset, and the
  same per channel: 100- and 330-row weights, so the zero points, packed
  along the rows, pad their last word) and saved compressed: every
  DIR.bf16/fp16/fp32 weight equals
  compressed-tensors' own PackedQuantizationCompressor.decompress of the
  source, cast by torch; DIR.bf16/ loads with unmodified from_pretrained
  (no missing or unexpected keys, no quantization_config), logits equal
  to the model built from the decompressor's weights; DIR.nf4/ is
  offered (its bytes: test_requant.py).
- The asymmetric model saved in 100 KB shards (weight_packed, scale,
  weight_shape and zero point of a module in different shards): every
  DIR.bf16/fp16/fp32/ weight equals the decompressor's output of the whole
  folder, DIR.bf16/ loads with from_pretrained.
- A single file (symmetric and asymmetric): its bf16 view equal to the
  decompressor's, random ranges; the asymmetric file's nf4_nodq view is
  bitsandbytes' quantize_4bit of the decompressor's bf16 weights.
- Zero points of the wrong shape, g_idx, a weight_shape that disagrees
  with the packed codes and a missing weight_shape: no views and a
  reason; so, in a directory, for a weight without the zero point its
  config.json's symmetric: false requires, and for a zero point where it
  says symmetric. castfs info shows the scheme.
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
        from transformers import LlamaConfig, LlamaForCausalLM
        from quant_src_common import bits, dir_tensors, end_module, \
            load_quiet, require_venv, run_oracle, shard_names, \
            split_modules, weight_map
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

from test_ct import tiny_llama  # noqa: E402

# strategy -> (hidden, intermediate, head_dim) of its model
STRATEGIES = {"group": (256, 384, 64), "channel": (200, 330, 50),
              "asym-group": (256, 384, 64), "asym-channel": (200, 330, 50)}
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}


class Env:
    root = None
    mnt = None
    ref = {}


def lies(src, single):
    """Files whose int4 layout castfs must refuse, from @single's."""
    mod = "model.layers.0.self_attn.q_proj."
    sd = load_file(single)
    packed = sd[mod + "weight_packed"]
    out = {}
    zp = dict(sd)
    zp[mod + "weight_zero_point"] = torch.zeros(  # not packed by rows
        packed.shape[0], 1, dtype=torch.int32)
    out["zero-point"] = (zp, "weight_zero_point that is not I32")
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


def dir_lies(src):
    """Directories whose shard disagrees with config.json's symmetric."""
    out = {}
    for name, base, why in (
            ("lie-asym-nozp", "w4-asym-channel", "requires"),
            ("lie-sym-zp", "w4-channel", "declares symmetric")):
        d = os.path.join(src, name)
        shutil.copytree(os.path.join(src, base), d)
        f = os.path.join(d, "model.safetensors")
        sd = load_file(f)
        mod = "model.layers.1.mlp.up_proj."
        if name == "lie-asym-nozp":
            del sd[mod + "weight_zero_point"]
        else:
            rows = sd[mod + "weight_packed"].shape[0]
            sd[mod + "weight_zero_point"] = torch.full(
                ((rows + 7) // 8, 1), 0x88888888 - (1 << 32),
                dtype=torch.int32)  # every zero point 0: still refused
        save_file(sd, f, metadata={"format": "pt"})
        out[name] = why
    return out


def config_refusals(src):
    """Directories whose config.json is a compressed-tensors layout castfs
    does not dequantize, each with what the refusal must name."""
    out = {}
    for name, why in (("cfg-kv-cache", "kv_cache_scheme set"),
                      ("cfg-mixed", "format 'mixed-precision'"),
                      ("cfg-dynamic", "config_groups scheme")):
        d = os.path.join(src, name)
        shutil.copytree(os.path.join(src, "w4-channel"), d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        qc = cfg["quantization_config"]
        if name == "cfg-kv-cache":
            qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float",
                                     "strategy": "tensor",
                                     "dynamic": False, "symmetric": True}
        elif name == "cfg-mixed":
            qc["format"] = "mixed-precision"
        else:
            for g in qc["config_groups"].values():
                g["weights"]["dynamic"] = True
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        out[name] = why
    return out


def setUpModule():
    require_venv()
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
    # asymmetric groups saved in 100 KB shards: modules straddle shards
    jobs["quantize"].append([os.path.join(Env.root, "plain-asym-group"),
                             os.path.join(src, "w4-sharded"), "asym-group",
                             "100KB"])
    jobs["decompress"].append([os.path.join(src, "w4-sharded"),
                               os.path.join(Env.root, "sharded.ref")])
    run_oracle("ct_w4_oracle.py", jobs, Env.root)
    for s in list(STRATEGIES) + ["sharded"]:
        Env.ref[s] = load_file(os.path.join(Env.root, s + ".ref"))
    single = os.path.join(src, "single.safetensors")
    shutil.copy(os.path.join(src, "w4-channel", "model.safetensors"), single)
    shutil.copy(os.path.join(src, "w4-asym-channel", "model.safetensors"),
                os.path.join(src, "single-asym.safetensors"))
    Env.lies = lies(src, single)
    Env.dir_lies = dir_lies(src)
    Env.cfg = config_refusals(src)
    Env.mnt = tl.Mount(src)


def tearDownModule():
    end_module(Env)


class ModelDir(unittest.TestCase):
    def test_views_equal_decompressor(self):
        for s in STRATEGIES:
            ref = Env.ref[s]
            src = dir_tensors(os.path.join(Env.mnt.source, "w4-" + s))
            deq = {k[:-len("_packed")] for k in src
                   if k.endswith(".weight_packed")}
            self.assertEqual(len(deq), 14)
            zps = [t for k, t in src.items()
                   if k.endswith(".weight_zero_point")]
            self.assertEqual(len(zps), 14 if s.startswith("asym") else 0)
            if zps:  # the zero points matter: not all stored as 8 (0)
                nib = torch.cat([(z.view(-1, 1) >> torch.arange(0, 32, 4))
                                 & 15 for z in zps])
                self.assertGreater(int((nib != 8).sum()), nib.numel() // 4)
                with open(os.path.join(Env.mnt.source, "w4-" + s,
                                       "config.json")) as f:
                    qc = json.load(f)["quantization_config"]
                for g in qc["config_groups"].values():
                    self.assertIs(g["weights"]["symmetric"], False)
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

    def test_split_modules_served(self):
        """A 100 KB-shard save (modules straddle shards: weight_packed,
        weight_scale, weight_shape and weight_zero_point in different
        files): each DIR.<view>/ shard holds its source shard's weights
        dequantized with their companions from wherever they are, equal
        to the decompressor's output of the whole folder."""
        wm = weight_map(os.path.join(Env.mnt.source, "w4-sharded"))
        comp = ("weight_scale", "weight_shape", "weight_zero_point")
        split = split_modules(wm, ("scale", "shape", "zero_point"))
        self.assertTrue(split)  # the case is real
        ref = Env.ref["sharded"]
        deq = {k[:-len("_packed")] for k in wm if k.endswith("_packed")}
        for v, dt in VIEWS.items():
            with self.subTest(view=v):
                view = Env.mnt.join("w4-sharded." + v)
                with open(os.path.join(view,
                                       "model.safetensors.index.json")) as f:
                    vm = json.load(f)["weight_map"]
                self.assertEqual(sorted(vm), sorted(ref))
                for n in sorted(set(vm.values())):
                    got = load_file(os.path.join(view, n))
                    self.assertEqual(sorted(got), shard_names(wm, n, comp),
                                     n)
                    for k, t in got.items():
                        if k not in deq:
                            # a shard without int4 weights is cast like
                            # any checkpoint (documented): kept as stored
                            # or torch's cast of it
                            self.assertIn(t.dtype, (ref[k].dtype, dt), k)
                            self.assertTrue(torch.equal(
                                bits(t), bits(ref[k].to(t.dtype))), k)
                            continue
                        want = ref[k].to(dt)
                        self.assertEqual(t.dtype, want.dtype, k)
                        self.assertTrue(torch.equal(bits(t), bits(want)),
                                        k)
        model, info = load_quiet(Env.mnt.join("w4-sharded.bf16"),
                                 output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
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
        for name, s in (("single", "channel"),
                        ("single-asym", "asym-channel")):
            with self.subTest(file=name):
                path = Env.mnt.join(name + ".bf16.safetensors")
                got = load_file(path)
                ref = Env.ref[s]
                self.assertEqual(sorted(got), sorted(ref))
                for k, t in ref.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
                with open(path, "rb") as f:
                    whole = f.read()
                tl.check_ranges(self, path, whole, random.Random(3),
                                count=100)

    def test_nf4_of_asymmetric(self):
        """nf4_nodq of the asymmetric file: bitsandbytes' own
        quantize_4bit of the decompressor's bf16 weight, every tensor it
        leaves as the bf16 view has it."""
        import bitsandbytes as bnb
        got = load_file(Env.mnt.join("single-asym.nf4_nodq.safetensors"))
        ref = Env.ref["asym-channel"]
        state = ".quant_state.bitsandbytes__nf4"
        n = 0
        for k, t in ref.items():
            with self.subTest(tensor=k):
                if k + state not in got:
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
                    continue
                q, st = bnb.functional.quantize_4bit(
                    t, blocksize=64, quant_type="nf4",
                    compress_statistics=False)
                self.assertTrue(torch.equal(got[k], q), k)
                self.assertTrue(torch.equal(bits(got[k + ".absmax"]),
                                            bits(st.absmax)), k)
                n += 1
        self.assertEqual(n, 14)

    def test_dir_lies_rejected(self):
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for name, why in Env.dir_lies.items():
            with self.subTest(lie=name):
                self.assertNotIn(name + ".bf16", names)
                reason = rej[name + "/model.safetensors"]
                self.assertIn("up_proj", reason)
                self.assertIn(why, reason)

    def test_config_refusal_names_the_key(self):
        """A compressed-tensors config castfs does not read is refused
        with what rules it out, not only its quant_method."""
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for name, why in Env.cfg.items():
            with self.subTest(config=name):
                self.assertNotIn(name + ".bf16", names)
                reason = rej[name + "/model.safetensors"]
                self.assertIn("quant_method 'compressed-tensors'", reason)
                self.assertIn(why, reason)

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
        r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
            Env.mnt.source, "w4-asym-group", "model.safetensors")],
            capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("int4 asymmetric (zero points), groups of 128, BF16 "
                      "scale model.layers.0.mlp.down_proj.weight_scale",
                      r.stdout)


if __name__ == "__main__":
    tl.main()
