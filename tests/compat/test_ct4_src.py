# SPDX-License-Identifier: MIT
"""compressed-tensors NVFP4 and MXFP4 checkpoints as sources
(docs/FORMATS.md, "compressed-tensors NVFP4 / MXFP4 (packed FP4)").

Producer and oracle are the real libraries, in the llm-compressor venv
(scripts/setup-llmc; ct4_src_oracle.py runs there): a tiny Llama (Linear
rows that are not multiples of 16 or 32; compressed-tensors itself needs
the columns to be) quantized by llm-compressor's data-free oneshot with
the NVFP4A16 and MXFP4A16 presets and saved compressed
(nvfp4-pack-quantized, mxfp4-pack-quantized). The expected views are
every module through compressed-tensors' own compressor
(NVFP4PackedCompressor / MXFP4PackedCompressor.decompress), and
transformers' own CPU dequantization of the source
(CompressedTensorsConfig(dequantize=True)).

- DIR.bf16/ holds exactly the decompressor's tensors, bit for bit (names,
  dtypes, shapes, bytes), no packed weight, scale or global scale, and no
  quantization_config; in DIR.fp32/ and DIR.fp16/ the dequantized weights
  are torch's casts of them (other tensors kept as stored).
- from_pretrained of DIR.bf16/ has no missing or unexpected keys, every
  parameter equals transformers' dequantized load of the source, and so do
  the logits.
- fp8_dynamic, fp8_block and w4a16 of the NVFP4 directory equal
  llm-compressor run on the decompressor's bf16 model (ct_oracle.py).
- A hand-made file of every code under every scale byte, through the
  same decompressors, is matched bit for bit (NaN and Inf included).
- A single file (no config.json) gets the same views; its nf4/fp4/int8
  views are those of the dequantized weights (bnb_ref.py); random ranges
  read the same bytes.
- A sharded save whose modules straddle shards (a 100 KB shard size:
  transformers' sharder puts a packed weight and its scales in different
  shards): DIR.bf16/fp16/fp32/ equal the decompressor's output of the
  whole folder, each output shard holding its source shard's tensors less
  the companions, and DIR.bf16/ loads with from_pretrained.
- Layouts castfs does not follow (asymmetric, g_idx, a missing or 0-d
  global scale, an E8M0-typed scale, a scale grid that does not fit,
  columns that are not whole groups, a config.json with another group
  size or activation order) get no views and a reason in
  /.castfs/rejected; castfs info and the tensor tree's .info name the
  scheme; castfs convert writes the mounted bytes.
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
        import bnb_ref
        from quant_src_common import bits, dir_tensors, end_module, \
            load_quiet, require_venv, run_oracle, shard_names, \
            split_modules, weight_map
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

from test_ct import tensors, tiny_llama  # noqa: E402
from test_ct import run_oracle as run_ct_oracle  # noqa: E402

SCHEMES = {"nvfp4": "NVFP4A16", "mxfp4": "MXFP4A16"}
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}
Q = "model.layers.0.self_attn.q_proj."


class Env:
    root = None
    mnt = None
    ref = {}
    tf = {}


def corpus(src):
    """Single files whose FP4 layout castfs does not follow, each with the
    words its reason must hold; built from one module of the NVFP4
    source."""
    nv = load_file(os.path.join(src, "ct-nvfp4", "model.safetensors"))
    mx = load_file(os.path.join(src, "ct-mxfp4", "model.safetensors"))
    base = {k[len(Q):]: v for k, v in nv.items() if k.startswith(Q)}
    mxb = {k[len(Q):]: v for k, v in mx.items() if k.startswith(Q)}
    rows, cols = base["weight_packed"].shape[0], base["weight_packed"].shape[1] * 2
    cases = {
        "asym": (dict(base, weight_zero_point=torch.zeros(
            rows, cols // 16, dtype=torch.float8_e4m3fn)), "zero point"),
        "gidx": (dict(base, weight_g_idx=torch.zeros(cols, dtype=torch.int32)),
                 "g_idx"),
        "noglobal": ({k: v for k, v in base.items()
                      if k != "weight_global_scale"}, "weight_global_scale"),
        "global0d": (dict(base, weight_global_scale=base[
            "weight_global_scale"].reshape(())), "weight_global_scale"),
        "e8m0": (dict(mxb, weight_scale=mxb["weight_scale"].view(
            torch.float8_e8m0fnu)), "neither F8_E4M3"),
        "misfit": (dict(base, weight_scale=base["weight_scale"][:, :cols // 32]
                        .contiguous()), "cols / 16"),
        # 216 columns, 13 whole groups of 16 and half of one, under a
        # scale of 216 // 16 = 13 columns: the last 8 elements have no
        # scale (compressed-tensors would write ceil(216 / 16) = 14, with
        # its "requires strict division" warning; castfs follows whole
        # groups only).
        "partial": (dict(base, weight_packed=base["weight_packed"][
            :, :108].contiguous(), weight_scale=base["weight_scale"][
                :, :13].contiguous()), "cols / 16"),
        "noscale": ({"weight_packed": base["weight_packed"]},
                    "without its weight_scale"),
    }
    for name, (sd, _) in cases.items():
        save_file({"l." + k: v.contiguous() for k, v in sd.items()},
                  os.path.join(src, "bad-%s.safetensors" % name))
    return {"bad-%s.safetensors" % n: why for n, (_, why) in cases.items()}


def bad_config(src, name, edit):
    """A copy of the NVFP4 model directory whose quantization_config is
    changed by @edit(weights)."""
    d = os.path.join(src, name)
    shutil.copytree(os.path.join(src, "ct-nvfp4"), d)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    edit(cfg["quantization_config"]["config_groups"]["group_0"]["weights"])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def setUpModule():
    require_venv()
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-ct4src-")
    plain = os.path.join(Env.root, "plain")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    # q/o: 224 x 224, k/v: 112 x 224, gate/up: 352 x 224, down: 224 x 352
    tiny_llama(plain, torch.bfloat16, 224, 352, 56, 4)
    jobs = {"quantize": [], "decompress": [], "load": [],
            "craft": [[os.path.join(src, "crafted.safetensors"),
                       os.path.join(Env.root, "crafted.ref")]]}
    for s, scheme in SCHEMES.items():
        d = os.path.join(src, "ct-" + s)
        jobs["quantize"].append([plain, d, scheme])
        jobs["decompress"].append([d, os.path.join(Env.root, s + ".ref")])
        jobs["load"].append([d, os.path.join(Env.root, s + ".tf")])
    jobs["quantize"].append([plain, os.path.join(src, "ct-sharded"),
                             "NVFP4A16", "100KB"])
    jobs["decompress"].append([os.path.join(src, "ct-sharded"),
                               os.path.join(Env.root, "sharded.ref")])
    run_oracle("ct4_src_oracle.py", jobs, Env.root)
    Env.ref["sharded"] = load_file(os.path.join(Env.root, "sharded.ref"))
    Env.ref["crafted"] = load_file(os.path.join(Env.root, "crafted.ref"))
    for s in SCHEMES:
        Env.ref[s] = load_file(os.path.join(Env.root, s + ".ref"))
        Env.tf[s] = load_file(os.path.join(Env.root, s + ".tf"))
    shutil.copy(os.path.join(src, "ct-nvfp4", "model.safetensors"),
                os.path.join(src, "single.safetensors"))
    Env.bad = corpus(src)
    bad_config(src, "cfg-group32", lambda w: w.update(group_size=32))
    bad_config(src, "cfg-actorder", lambda w: w.update(actorder="group"))
    Env.mnt = tl.Mount(src)


def tearDownModule():
    end_module(Env)


def rejected():
    with open(Env.mnt.join(".castfs", "rejected")) as f:
        return {r["path"]: r["reason"] for r in json.load(f)}


class ModelDir(unittest.TestCase):
    def test_views_equal_decompressor(self):
        for s in SCHEMES:
            ref = Env.ref[s]
            src = dir_tensors(os.path.join(Env.mnt.source, "ct-" + s))
            deq = {k[:-len("_packed")] for k in src
                   if k.endswith(".weight_packed")}
            self.assertEqual(len(deq), 14)
            for v, dt in VIEWS.items():
                with self.subTest(scheme=s, view=v):
                    view = Env.mnt.join("ct-%s.%s" % (s, v))
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

    def test_bf16_equals_transformers_dequantization(self):
        for s in SCHEMES:
            with self.subTest(scheme=s):
                view = Env.mnt.join("ct-%s.bf16" % s)
                model, info = load_quiet(view, output_loading_info=True)
                for k in ("missing_keys", "unexpected_keys",
                          "mismatched_keys"):
                    self.assertEqual(list(info.get(k, [])), [], k)
                tf = dict(Env.tf[s])
                want_logits = tf.pop("logits")
                got = dict(model.state_dict())
                self.assertEqual(sorted(got), sorted(tf))
                for k, t in tf.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
                ids = torch.arange(20).reshape(1, 20)
                with torch.no_grad():
                    self.assertTrue(torch.equal(model(ids).logits,
                                                want_logits))
                del model
                gc.collect()

    def test_split_module_served(self):
        """A sharded save whose modules straddle shards (transformers'
        sharder splits them): each DIR.<view>/ shard dequantizes its
        weights with their companions from whichever shard holds them."""
        wm = weight_map(os.path.join(Env.mnt.source, "ct-sharded"))
        split = split_modules(wm, ("scale", "global_scale"))
        self.assertTrue(split)  # the case is real
        self.assertNotIn("ct-sharded", rejected())
        ref = Env.ref["sharded"]
        deq = {k[:-len("_packed")] for k in wm if k.endswith("_packed")}
        for v, dt in VIEWS.items():
            with self.subTest(view=v):
                view = Env.mnt.join("ct-sharded." + v)
                with open(os.path.join(view,
                                       "model.safetensors.index.json")) as f:
                    vm = json.load(f)["weight_map"]
                self.assertEqual(sorted(vm), sorted(ref))
                for n in sorted(set(vm.values())):
                    got = load_file(os.path.join(view, n))
                    # the source shard's tensors less the companions
                    self.assertEqual(sorted(got), shard_names(
                        wm, n, ("weight_scale", "weight_global_scale",
                                "input_global_scale")), n)
                    for k, t in got.items():
                        want = ref[k].to(dt) if k in deq else ref[k]
                        self.assertEqual(t.dtype, want.dtype, k)
                        self.assertTrue(torch.equal(bits(t), bits(want)),
                                        k)
        model, info = load_quiet(Env.mnt.join("ct-sharded.bf16"),
                                 output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        del model
        gc.collect()

    def test_bad_configs_rejected(self):
        rej = rejected()
        names = os.listdir(Env.mnt.path)
        for d in ("cfg-group32", "cfg-actorder"):
            with self.subTest(dir=d):
                self.assertNotIn(d + ".bf16", names)
                self.assertIn("quant_method 'compressed-tensors'",
                              rej[d + "/model.safetensors"])


class CtViews(unittest.TestCase):
    """fp8_dynamic, fp8_block, w4a16 and nvfp4 of the NVFP4 source equal
    llm-compressor run on the bf16 model the decompressor gives
    (ct_oracle.py), as for FP8 sources (test_ct_qsrc.py); nvfp4's
    config.json too."""
    VIEWS = {"fp8_dynamic": "FP8_DYNAMIC", "fp8_block": "FP8_BLOCK",
             "w4a16": "W4A16", "nvfp4": "NVFP4A16"}

    def test_ct_views_equal_llm_compressor_on_the_bf16_model(self):
        deq = os.path.join(Env.root, "nvfp4.deq")
        os.mkdir(deq)
        with open(os.path.join(Env.mnt.source, "ct-nvfp4",
                               "config.json")) as f:
            cfg = json.load(f)
        del cfg["quantization_config"]
        with open(os.path.join(deq, "config.json"), "w") as f:
            json.dump(cfg, f)
        save_file(Env.ref["nvfp4"], os.path.join(deq, "model.safetensors"),
                  metadata={"format": "pt"})
        ref = os.path.join(Env.root, "ctref")
        run_ct_oracle({"quantize": [[deq, os.path.join(ref, v), sch, []]
                                    for v, sch in self.VIEWS.items()]},
                      Env.root)
        for v in self.VIEWS:
            with self.subTest(view=v):
                got = tensors(Env.mnt.join("ct-nvfp4." + v))
                want = tensors(os.path.join(ref, v))
                self.assertEqual(sorted(got), sorted(want))
                self.assertEqual([k for k in want if got[k] != want[k]], [])
        jobs = [[Env.mnt.join("ct-nvfp4.nvfp4", "config.json"),
                 os.path.join(ref, "nvfp4", "config.json")]]
        for r in run_ct_oracle({"config": jobs}, Env.root)["config"]:
            self.assertTrue(r["equal"], json.dumps(r, indent=1))


class SingleFile(unittest.TestCase):
    def test_single_file_views(self):
        ref = Env.ref["nvfp4"]
        for v, dt in VIEWS.items():
            with self.subTest(view=v):
                path = Env.mnt.join("single.%s.safetensors" % v)
                got = load_file(path)
                self.assertEqual(sorted(got), sorted(ref))
                want = {k: (t.to(dt) if k.endswith("proj.weight") and
                            k != "lm_head.weight" else t)
                        for k, t in ref.items()}
                for k, t in want.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
                with open(path, "rb") as f:
                    data = f.read()
                tl.check_ranges(self, path, data, count=40)

    def test_every_code_and_scale(self):
        """Every E2M1 code under every scale byte (NaN, Inf, subnormal
        E4M3 and E8M0 0 and 0xFF included) and global scales chosen so
        that a reciprocal multiply or a missing fp32 rounding would show:
        bit for bit the decompressor's, NaN payloads included."""
        ref = Env.ref["crafted"]
        self.assertGreaterEqual(len(ref), 8)
        for v, dt in VIEWS.items():
            with self.subTest(view=v):
                got = load_file(Env.mnt.join("crafted.%s.safetensors" % v))
                self.assertEqual(sorted(got), sorted(ref))
                for k, t in ref.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(t.to(dt))),
                                    k)

    def test_bnb_views_of_dequantized(self):
        """nf4/fp4/int8 of an FP4 source are those views of the
        decompressor's bf16 weights (bnb_ref.py, checked against
        bitsandbytes in test_bnb.py)."""
        src = Env.ref["nvfp4"]
        quantised = {k for k in src if k.endswith("proj.weight")}
        self.assertEqual(len(quantised), 14)
        for view, (_, _, nested) in bnb_ref.VIEWS.items():
            with self.subTest(view=view):
                path = Env.mnt.join("single.%s.safetensors" % view)
                with open(path, "rb") as f:
                    got = f.read()
                dyn = None
                if nested:
                    dyn = load_file(path)[
                        "model.layers.0.mlp.up_proj.weight.nested_quant_map"]
                want = bnb_ref.materialise(view, src, quantised,
                                           {"format": "pt"}, dyn)
                self.assertTrue(got == want, view)
                tl.check_ranges(self, path, want, count=20)

    def test_corpus_rejected(self):
        rej = rejected()
        names = os.listdir(Env.mnt.path)
        for path, why in Env.bad.items():
            with self.subTest(file=path):
                stem = path[:-len(".safetensors")]
                self.assertIn(path, names)  # shown as itself
                self.assertNotIn(stem + ".bf16.safetensors", names)
                self.assertFalse(os.path.exists(
                    Env.mnt.join(stem + ".bf16.safetensors")))
                self.assertIn("compressed-tensors FP4", rej[path])
                self.assertIn(why, rej[path])

    def test_info_shows_scheme(self):
        for s, words in (("nvfp4", "nvfp4 e2m1 groups of 16, low nibble "
                          "first, F8_E4M3 scale / global scale " + Q +
                          "weight_scale"),
                         ("mxfp4", "mxfp4 e2m1 groups of 32, low nibble "
                          "first, U8 e8m0 scale " + Q + "weight_scale")):
            r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
                Env.mnt.source, "ct-" + s, "model.safetensors")],
                capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("quantized: compressed-tensors NVFP4/MXFP4, 14 "
                          "packed weights", r.stdout)
            self.assertIn(words, r.stdout)
        info = Env.mnt.join("single.bf16.safetensors.tensors", "model",
                            "layers", "0", "self_attn", "q_proj",
                            "weight.info")
        with open(info) as f:
            text = f.read()
        self.assertIn("conversion: dequantize packed FP4 x group scale -> "
                      "BF16", text)
        self.assertIn('source: "' + Q + 'weight_packed"', text)

    def test_convert_writes_the_view(self):
        out = os.path.join(Env.root, "converted.bf16.safetensors")
        r = subprocess.run([tl.castfs_binary(), "convert", os.path.join(
            Env.mnt.source, "single.safetensors"), "--view", "bf16", "-o",
            out, "--no-progress"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f1, \
                open(Env.mnt.join("single.bf16.safetensors"), "rb") as f2:
            self.assertEqual(f1.read(), f2.read())


if __name__ == "__main__":
    tl.main()
