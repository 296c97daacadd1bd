# SPDX-License-Identifier: MIT
"""Views that quantise again, of 4-bit quantized sources (bitsandbytes 4-bit,
compressed-tensors pack-quantized int4): each is that view of the source's
bf16 view (docs/FORMATS.md, "Views of a quantized source").

Oracles, all outside castfs:
- bnb 4-bit single files (bnb's own QuantState.as_dict(packed=True); nf4
  double-quantised, fp4 plain with an fp16 quant_state): the bf16 model is
  bitsandbytes' dequantize_4bit(...).to(bfloat16); the nf4/fp4/*_nodq/int8
  views must be byte-identical to bnb_ref.materialise() of it (the
  independent torch implementation test_bnb.py checks against bitsandbytes),
  and the codes and absmax of the *_nodq views equal bitsandbytes' own
  quantize_4bit of that bf16 weight.
- model directories (a tiny Llama quantized by transformers + bitsandbytes;
  the same quantized to W4A16 by llm-compressor): the bf16 model is bnb's
  dequantize_4bit / compressed-tensors' decompressor (ct_w4_oracle.py), and
  DIR.fp8_dynamic/, DIR.fp8_block/, DIR.w4a16/, DIR.nvfp4/ (its global
  scale over fused siblings' dequantized values) must hold exactly the
  tensors llm-compressor's data-free oneshot writes for it (ct_oracle.py),
  with a quantization_config compressed-tensors reads as the oracle's;
  DIR.nf4/ loads with from_pretrained. Exits 77 without the llm-compressor
  venv.
- fp8_scaled of the bnb single files: ComfyUI's writer rules
  (test_comfy_fp8.comfy_quantize) run on the bf16 model above.
"""
import gc
import json
import os
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import bitsandbytes as bnb
        from safetensors.torch import load_file, save_file
        import bnb_ref
        from test_bnb4_src import STATE, bits, load_quiet, make_model, \
            make_single, reference
        from test_ct import VENV_PY, run_oracle, split_groups, tensors, \
            tiny_llama
        import quant_src_common as qsc
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

SINGLES = {
    "nf4-nested-64": ("nf4", True, 64, torch.bfloat16,
                      [(130, 300), (33, 45)]),
    "fp4-plain-128": ("fp4", False, 128, torch.float16, [(50, 256)]),
}
CT_VIEWS = {"fp8_dynamic": "FP8_DYNAMIC", "fp8_block": "FP8_BLOCK",
            "w4a16": "W4A16", "nvfp4": "NVFP4A16"}


class Env:
    root = None
    mnt = None
    singles = {}
    ref = None  # the llm-compressor outputs, per source and view


def bf16_model(src, sd, out):
    """Model dir @src's config (no quantization_config) with state dict
    @sd as one bf16 file at @out: the oracle's input."""
    os.makedirs(out)
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    c.pop("quantization_config", None)
    c["dtype"] = "bfloat16"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    save_file({k: v.contiguous() for k, v in sd.items()},
              os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-requant-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    for i, (name, args) in enumerate(SINGLES.items()):
        Env.singles[name] = make_single(
            os.path.join(src, name + ".safetensors"), *args, seed=20 + i)
    make_model(os.path.join(Env.root, "plain"), os.path.join(src, "bnb"))
    deq = {}
    deq["bnb"] = reference(qsc.dir_tensors(os.path.join(src, "bnb")),
                           torch.bfloat16)
    if os.access(VENV_PY, os.X_OK):
        plain = os.path.join(Env.root, "plain-w4")
        tiny_llama(plain, torch.bfloat16, 256, 384, 64, 7)
        qsc.run_oracle("ct_w4_oracle.py", {
            "quantize": [[plain, os.path.join(src, "w4"), "group"]],
            "decompress": [[os.path.join(src, "w4"),
                            os.path.join(Env.root, "w4.ref")]]}, Env.root)
        deq["w4"] = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                     for k, v in load_file(
                         os.path.join(Env.root, "w4.ref")).items()}
        jobs = []
        for name, sd in deq.items():
            d = os.path.join(Env.root, "deq-" + name)
            bf16_model(os.path.join(src, name), sd, d)
            # No ignore beyond lm_head: nvfp4 quantises a fused group
            # that a shard boundary cuts with one global scale.
            jobs += [[d, os.path.join(Env.root, "ref", name, v), s, []]
                     for v, s in CT_VIEWS.items()]
        run_oracle({"quantize": jobs}, Env.root)
        Env.ref = os.path.join(Env.root, "ref")
    Env.mnt = tl.Mount(src)


def tearDownModule():
    qsc.end_module(Env)


class BnbViewsOfBnb4(unittest.TestCase):
    def test_views_equal_bnb_ref_of_bf16(self):
        for name, sd in Env.singles.items():
            src = reference(sd, torch.bfloat16)
            quantised = {k[:k.index(STATE)] for k in sd if STATE in k}
            for view, (kind, qtype, nested) in bnb_ref.VIEWS.items():
                with self.subTest(file=name, view=view):
                    path = Env.mnt.join("%s.%s.safetensors" % (name, view))
                    with open(path, "rb") as f:
                        got = f.read()
                    dyn = None
                    if nested:
                        dyn = load_file(path)["l0.weight.nested_quant_map"]
                    want = bnb_ref.materialise(view, src, quantised,
                                               {"format": "pt"}, dyn)
                    self.assertTrue(got == want, view)
                    tl.check_ranges(self, path, want, count=30)

    def test_nodq_equals_bitsandbytes(self):
        for name, sd in Env.singles.items():
            src = reference(sd, torch.bfloat16)
            for qtype in ("nf4", "fp4"):
                with self.subTest(file=name, view=qtype):
                    got = load_file(Env.mnt.join(
                        "%s.%s_nodq.safetensors" % (name, qtype)))
                    for k in src:
                        if k + STATE + qtype not in got:
                            continue
                        q, st = bnb.functional.quantize_4bit(
                            src[k], blocksize=64, quant_type=qtype,
                            compress_statistics=False)
                        self.assertTrue(torch.equal(got[k], q), k)
                        self.assertTrue(torch.equal(
                            bits(got[k + ".absmax"]), bits(st.absmax)), k)


class ComfyOfBnb4(unittest.TestCase):
    def test_fp8_scaled_is_comfyuis_writer_on_bf16(self):
        """fp8_scaled of a bnb 4-bit file: ComfyUI's writer
        (test_comfy_fp8.comfy_quantize) run on dequantize_4bit's bf16."""
        from test_comfy_fp8 import comfy_quantize
        for name, sd in Env.singles.items():
            src = reference(sd, torch.bfloat16)
            path = Env.mnt.join("%s.fp8_scaled.safetensors" % name)
            got = load_file(path)
            for k, w in src.items():
                with self.subTest(file=name, tensor=k):
                    if k + STATE not in "".join(sd):
                        self.assertTrue(torch.equal(bits(got[k]), bits(w)))
                        continue
                    codes, scale = comfy_quantize(w)
                    self.assertTrue(torch.equal(got[k].view(torch.uint8),
                                                codes.view(torch.uint8)), k)
                    self.assertTrue(torch.equal(
                        bits(got[k[:-len("weight")] +
                                 "weight_scale"].reshape(1)),
                        bits(scale.reshape(1))), k)
            with open(path, "rb") as f:
                tl.check_ranges(self, path, f.read(), count=20)


class ModelDirs(unittest.TestCase):
    def test_listed(self):
        names = os.listdir(Env.mnt.path)
        for v in ("bnb.nf4", "bnb.int8", "nf4-nested-64.nf4.safetensors",
                  "fp4-plain-128.int8.safetensors"):
            self.assertIn(v, names)
        # the compressed-tensors views resolve (not listed by default)
        for v in ("bnb.fp8_dynamic", "bnb.w4a16",
                  "nf4-nested-64.fp8_block.safetensors"):
            self.assertTrue(os.path.exists(Env.mnt.join(v)), v)

    def test_nf4_dir_loads(self):
        view = Env.mnt.join("bnb.nf4")
        with open(os.path.join(view, "config.json")) as f:
            self.assertEqual(json.load(f)["quantization_config"]
                             ["bnb_4bit_quant_type"], "nf4")
        model, info = load_quiet(view, output_loading_info=True,
                                 device_map="cpu")
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        with torch.no_grad():
            out = model(torch.arange(10).reshape(1, 10)).logits
        self.assertTrue(bool(torch.isfinite(out.float()).all()))
        del model
        gc.collect()

    def test_ct_views_equal_llm_compressor(self):
        if Env.ref is None:
            self.skipTest("no llm-compressor venv")
        # The bnb model's shards cut fused groups: nvfp4 quantises them
        # with one global scale, as the oracle does with no ignore.
        self.assertTrue(split_groups(os.path.join(Env.mnt.source, "bnb")))
        for name in ("bnb", "w4"):
            for view in CT_VIEWS:
                with self.subTest(source=name, view=view):
                    got = tensors(Env.mnt.join("%s.%s" % (name, view)))
                    want = tensors(os.path.join(Env.ref, name, view))
                    self.assertEqual(sorted(got), sorted(want))
                    bad = [k for k in want if got[k] != want[k]]
                    self.assertEqual(bad, [])

    def test_ct_config_is_the_oracles(self):
        if Env.ref is None:
            self.skipTest("no llm-compressor venv")
        jobs = [[Env.mnt.join("%s.%s" % (n, v), "config.json"),
                 os.path.join(Env.ref, n, v, "config.json")]
                for n in ("bnb", "w4") for v in CT_VIEWS]
        for j, r in zip(jobs, run_oracle({"config": jobs},
                                         Env.root)["config"]):
            with self.subTest(config=j[0]):
                self.assertTrue(r["equal"], json.dumps(r, indent=1))


if __name__ == "__main__":
    tl.main()
