# SPDX-License-Identifier: MIT
"""gpt-oss MXFP4 checkpoints as sources (docs/FORMATS.md, "gpt-oss MXFP4").

- A tiny GptOss model made with transformers, its experts quantized in the
  test (numpy, the OCP MXFP4 rule) to the published layout: "*_blocks" U8
  [E, R, G, 16] (low nibble first) + "*_scales" E8M0 bytes [E, R, G],
  config.json quantization_config {"quant_method": "mxfp4"}, two shards
  and an index. DIR.bf16/ loads with unmodified from_pretrained (no
  missing or unexpected keys, no quantization_config), every parameter is
  bit-identical to transformers' own CPU dequantization of the source
  (the source folder loaded with from_pretrained), logits equal.
- A single file with every code and every scale byte (0 = 2^-127 and
  0xFF included): the bf16/fp16/fp32 views equal, bit for bit,
  transformers' convert_moe_packed_tensors(dtype=...) of the source; the
  fp8 view is torch's cast of the fp32 dequantization; the scales are gone.
- DIR.nf4/ loads with from_pretrained and equals what transformers +
  bitsandbytes make of DIR.bf16/ with BitsAndBytesConfig(load_in_4bit):
  the attention projections quantised, experts and router kept bf16.
- Misshapen MXFP4 gets no views and a reason; castfs info names the layout.
"""
import gc
import json
import os
import shutil
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numpy as np
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM, GptOssConfig, \
            GptOssForCausalLM
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        from transformers.utils import logging as hf_logging
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

QC = {"modules_to_not_convert": ["model.layers.*.self_attn",
                                 "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head"],
      "quant_method": "mxfp4"}
# The OCP MXFP4 element grid (E2M1 magnitudes).
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32}


class Env:
    root = None
    mnt = None
    single = None


def bits(t):
    """The bytes of @t as integers (NaN-safe bit comparison)."""
    return t.contiguous().view(torch.uint8)


# ---- producing sources in the published layout (not the oracle) ----

def quant_mxfp4(w):
    """OCP MX rule on the last dimension of @w (fp32 [..., C]): per 32
    values a shared exponent floor(log2(amax)) - 2, each element the
    nearest E2M1 value; codes packed low nibble first. Returns (blocks
    [..., C/32, 16] uint8, scales [..., C/32] uint8)."""
    x = w.double().numpy()
    g = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(g).max(axis=-1)
    e = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-300))) - 2,
                 -127)
    e = np.clip(e, -127, 127)
    y = g / np.exp2(e)[..., None]
    mag = np.abs(y)[..., None]
    idx = np.abs(mag - E2M1).argmin(axis=-1).astype(np.uint8)
    codes = idx | np.where(y < 0, 8, 0).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return (torch.from_numpy(np.ascontiguousarray(packed)),
            torch.from_numpy((e + 127).astype(np.uint8)))


def tiny_config():
    return GptOssConfig(hidden_size=64, intermediate_size=96,
                        num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16,
                        num_local_experts=4, num_experts_per_tok=2,
                        vocab_size=128, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"],
                        max_position_embeddings=4096)


def write_gptoss(path, split=False):
    """A GptOss model with its experts in MXFP4, in two shards (@split:
    layer 0's down_proj_scales in the other shard than its blocks)."""
    torch.manual_seed(5)
    model = GptOssForCausalLM(tiny_config()).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "experts" in n and not n.endswith("_bias"):
                p.normal_(0, 0.5)  # spread the codes over the grid
    model.save_pretrained(path)
    sd = load_file(os.path.join(path, "model.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    out = {}
    for k, t in sd.items():
        if k.endswith(".experts.gate_up_proj") or \
                k.endswith(".experts.down_proj"):
            # The bf16 model's [E, in, out] is stored as [E, out, in].
            b, s = quant_mxfp4(t.float().transpose(1, 2).contiguous())
            out[k + "_blocks"] = b
            out[k + "_scales"] = s
        else:
            out[k] = t
    def first(k):
        return (".layers.0." in k) != (split and k.endswith(
            ".layers.0.mlp.experts.down_proj_scales"))
    shards = {"model-00001-of-00002.safetensors":
              {k: v for k, v in out.items() if first(k)},
              "model-00002-of-00002.safetensors":
              {k: v for k, v in out.items() if not first(k)}}
    wm = {}
    for name, part in shards.items():
        save_file(part, os.path.join(path, name), metadata={"format": "pt"})
        wm.update({k: name for k in part})
    size = sum(t.numel() * t.element_size() for t in out.values())
    json.dump({"metadata": {"total_size": size}, "weight_map": wm},
              open(os.path.join(path, "model.safetensors.index.json"), "w"),
              indent=2, sort_keys=True)
    cfg_path = os.path.join(path, "config.json")
    c = json.load(open(cfg_path))
    c["quantization_config"] = QC
    json.dump(c, open(cfg_path, "w"), indent=2, sort_keys=True)


def single_file():
    """Every code in every nibble and every scale byte, 0 and 0xFF too."""
    g = torch.Generator().manual_seed(11)
    exp = "model.layers.3.mlp.experts."
    blocks = torch.randint(0, 256, (3, 40, 3, 16), dtype=torch.uint8,
                           generator=g)
    blocks.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    scales = torch.randint(100, 150, (3, 40, 3), dtype=torch.uint8,
                           generator=g)
    scales.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    down_b = torch.randint(0, 256, (3, 96, 2, 16), dtype=torch.uint8,
                           generator=g)
    down_s = torch.randint(120, 135, (3, 96, 2), dtype=torch.uint8,
                           generator=g)
    # Rows of 1 KiB of codes, 1500 of them: a range's rows take two
    # slabs of the generator's 1 MiB code scratch.
    big = "model.layers.4.mlp.experts.down_proj_"
    big_b = torch.randint(0, 256, (1, 1500, 64, 16), dtype=torch.uint8,
                          generator=g)
    big_s = torch.randint(115, 140, (1, 1500, 64), dtype=torch.uint8,
                          generator=g)
    return {big + "blocks": big_b, big + "scales": big_s,
            exp + "gate_up_proj_blocks": blocks,
            exp + "gate_up_proj_scales": scales,
            exp + "gate_up_proj_bias": torch.randn(3, 40, generator=g),
            exp + "down_proj_blocks": down_b,
            exp + "down_proj_scales": down_s.view(torch.float8_e8m0fnu),
            exp + "down_proj_bias": torch.randn(3, 96,
                                                generator=g).bfloat16(),
            "model.norm.weight": torch.randn(96, generator=g).bfloat16()}


def reference(src, dtype):
    """What transformers makes of @src: each blocks/scales pair through
    its own convert_moe_packed_tensors, everything else as stored."""
    out = {}
    for k, t in src.items():
        if k.endswith("_scales"):
            continue
        if k.endswith("_blocks"):
            s = src[k[:-len("_blocks")] + "_scales"]
            out[k[:-len("_blocks")]] = convert_moe_packed_tensors(
                t, s.view(torch.uint8), dtype=dtype)
        else:
            out[k] = t
    return out


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-mxfp4-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    write_gptoss(os.path.join(src, "gptoss"))
    write_gptoss(os.path.join(src, "gptoss-split"), split=True)
    Env.single = single_file()
    save_file(Env.single, os.path.join(src, "experts.safetensors"),
              metadata={"format": "pt"})
    exp = "model.layers.0.mlp.experts."
    bad = {exp + "gate_up_proj_blocks": torch.zeros(2, 8, 4, 16,
                                                    dtype=torch.uint8),
           exp + "gate_up_proj_scales": torch.zeros(2, 8, 4, 2,
                                                    dtype=torch.uint8)}
    save_file(bad, os.path.join(src, "bad-mxfp4.safetensors"))
    Env.mnt = tl.Mount(src)


def tearDownModule():
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def load_quiet(path, **kw):
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


class SingleFile(unittest.TestCase):
    def test_views_bit_exact(self):
        for v, dt in VIEWS.items():
            with self.subTest(view=v):
                got = load_file(Env.mnt.join("experts.%s.safetensors" % v))
                want = reference(Env.single, dt)
                self.assertEqual(sorted(got), sorted(want))
                for k, t in want.items():
                    if k.endswith("_proj"):
                        self.assertEqual(got[k].dtype, dt, k)
                    self.assertEqual(got[k].shape, t.shape, k)
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)

    def test_fp8_view_from_dequantized(self):
        got = load_file(Env.mnt.join("experts.fp8.safetensors"))
        want = reference(Env.single, torch.float32)
        for k in ("3.mlp.experts.gate_up_proj", "3.mlp.experts.down_proj",
                  "4.mlp.experts.down_proj"):
            k = "model.layers." + k
            ref = want[k].clamp(-448, 448).to(torch.float8_e4m3fn)
            fin = want[k].isfinite()  # saturation of inf: castfs's rule
            self.assertTrue(torch.equal(bits(got[k][fin]), bits(ref[fin])), k)

    def test_ranges(self):
        """Ranges cut anywhere read the bytes of the whole file."""
        p = Env.mnt.join("experts.bf16.safetensors")
        with open(p, "rb") as f:
            whole = f.read()
        tl.check_ranges(self, p, whole)

    def test_misshapen_rejected(self):
        names = os.listdir(Env.mnt.path)
        self.assertNotIn("bad-mxfp4.bf16.safetensors", names)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        self.assertIn("MXFP4", rej["bad-mxfp4.safetensors"])

    def test_blocks_and_scales_split_refused(self):
        """A shard holding an expert's _blocks and another its _scales:
        castfs pairs them within a file, and served the two as stored
        U8 in a DIR.bf16/ whose config.json said it was dequantized
        (the loader finds no down_proj: random experts; a bug hunt,
        stop 42). Both shards are refused, and the folder gets no
        views."""
        names = os.listdir(Env.mnt.path)
        self.assertFalse([n for n in names if n.startswith("gptoss-split.")])
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for shard in ("model-00001-of-00002", "model-00002-of-00002"):
            why = rej["gptoss-split/%s.safetensors" % shard]
            self.assertIn("without their partner in this file", why)
        self.assertIn("down_proj_blocks",
                      rej["gptoss-split/model-00001-of-00002.safetensors"])
        self.assertIn("down_proj_scales",
                      rej["gptoss-split/model-00002-of-00002.safetensors"])

    def test_info_shows_layout(self):
        r = tl.subprocess.run(
            [tl.castfs_binary(), "info",
             os.path.join(Env.mnt.source, "experts.safetensors")],
            capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: MXFP4 (gpt-oss), 3 expert weights", r.stdout)
        self.assertIn("mxfp4 e2m1 blocks of 32, low nibble first, F8_E8M0 "
                      "e8m0 scale model.layers.3.mlp.experts.down_proj_scales",
                      r.stdout)

    def test_convert_writes_the_view(self):
        """castfs convert writes the bytes the mount serves (those are
        checked against transformers above)."""
        out = os.path.join(Env.root, "converted.bf16.safetensors")
        r = tl.subprocess.run(
            [tl.castfs_binary(), "convert",
             os.path.join(Env.mnt.source, "experts.safetensors"),
             "--view", "bf16", "-o", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f, \
                open(Env.mnt.join("experts.bf16.safetensors"), "rb") as g:
            self.assertEqual(f.read(), g.read())


class ModelDir(unittest.TestCase):
    def test_bf16_equals_transformers(self):
        view = Env.mnt.join("gptoss.bf16")
        with open(os.path.join(view, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f))
        idx = json.load(open(os.path.join(view,
                                          "model.safetensors.index.json")))
        self.assertFalse([k for k in idx["weight_map"]
                          if k.endswith(("_blocks", "_scales"))])
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        tf = load_quiet(os.path.join(Env.mnt.source, "gptoss"))
        a, b = dict(model.state_dict()), dict(tf.state_dict())
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertEqual(a[k].dtype, b[k].dtype, k)
            self.assertTrue(torch.equal(bits(a[k]), bits(b[k])), k)
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, tf(ids).logits))

    def test_fp32_view_loads(self):
        view = Env.mnt.join("gptoss.fp32")
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        src = {}
        d = os.path.join(Env.mnt.source, "gptoss")
        for n in os.listdir(d):
            if n.endswith(".safetensors"):
                src.update(load_file(os.path.join(d, n)))
        want = reference(src, torch.float32)
        params = dict(model.state_dict())
        for k in ("gate_up_proj", "down_proj"):
            k = "model.layers.1.mlp.experts." + k
            self.assertTrue(torch.equal(bits(params[k]), bits(want[k])), k)

    def test_nf4_is_what_transformers_quantises(self):
        """DIR.nf4/ loads with from_pretrained and is the model transformers
        + bitsandbytes make of DIR.bf16/ with BitsAndBytesConfig(
        load_in_4bit, nf4, double quant): the same Linear4bit modules (the
        attention projections: the 3-D experts are not Linear layers, and
        neither is GptOssTopKRouter), each dequantizing to the same
        weights, every other parameter and the logits equal."""
        import bitsandbytes as bnb
        from transformers import BitsAndBytesConfig
        ours, info = load_quiet(Env.mnt.join("gptoss.nf4"),
                                output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        ref = load_quiet(Env.mnt.join("gptoss.bf16"),
                         quantization_config=BitsAndBytesConfig(
                             load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16),
                         dtype=torch.bfloat16)

        def linear4(m):
            return {n: x for n, x in m.named_modules()
                    if isinstance(x, bnb.nn.Linear4bit)}
        a, b = linear4(ours), linear4(ref)
        self.assertEqual(sorted(a), sorted(b))
        self.assertTrue(a and all(".self_attn." in n for n in a), sorted(a))
        for n in a:
            wa, wb = a[n].weight, b[n].weight
            da = bnb.functional.dequantize_4bit(wa.data, wa.quant_state)
            db = bnb.functional.dequantize_4bit(wb.data, wb.quant_state)
            self.assertTrue(torch.equal(bits(da), bits(db)), n)
        pa = {k: v for k, v in ours.named_parameters()
              if k[:-len(".weight")] not in a}
        pb = {k: v for k, v in ref.named_parameters()
              if k[:-len(".weight")] not in b}
        self.assertEqual(sorted(pa), sorted(pb))
        for k in pa:
            self.assertTrue(torch.equal(bits(pa[k].data), bits(pb[k].data)),
                            k)
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(ours(ids).logits, ref(ids).logits))
        del ours, ref, a, b, pa, pb
        gc.collect()


if __name__ == "__main__":
    tl.main()
