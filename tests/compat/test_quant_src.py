# SPDX-License-Identifier: MIT
"""Quantized checkpoints as sources (docs/FORMATS.md, "Quantized sources").

- A corpus of quantized layouts castfs does not dequantize, made with the
  real libraries where they exist (bitsandbytes) and in the published
  tensor layouts otherwise: each file gets no view at all, stays readable
  as itself, and /.castfs/rejected names a tensor and the layout; plain
  neighbours (with integer position_ids and masks) keep their views.
- FP8 block-scaled files (DeepSeek-V3 / Qwen3-FP8 layout: F8_E4M3 weight +
  F32 or E8M0 weight_scale_inv per 128x128 block, partial edge blocks, a
  per-tensor scale, fused experts, DeepSeek-V4 ".scale" names): the
  bf16/fp16/fp32/fp8/fp8_e5m2 views equal, bit for bit and byte for byte,
  safetensors.torch.save() of a torch re-implementation of DeepSeek's
  weight_dequant (each element times its block's scale in fp32, then
  torch's cast; other tensors kept as stored, as fp8_cast_bf16.py does),
  and transformers' own Fp8Dequantize where it accepts the shape; the
  scales are gone. The bitsandbytes views are those of the bf16
  dequantization (bnb_ref.py; bitsandbytes loads them within the nf4
  bound). castfs info / convert show and write them.
- FP8 block model directories (a Llama whose Linear shapes are not
  multiples of 128, sharded): DIR.bf16/ loads with unmodified
  from_pretrained, no missing or unexpected keys, no quantization_config,
  every parameter bit-identical to the reference dequantization, logits
  equal; with 128-aligned shapes, equal to transformers' own CPU
  dequantization of the source.
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import bitsandbytes as bnb
        from safetensors.torch import load_file, save, save_file
        from transformers import AutoModelForCausalLM, LlamaConfig, \
            LlamaForCausalLM
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        from transformers.utils import logging as hf_logging
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

BS = 128
F8 = torch.float8_e4m3fn
CAST_VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
              "fp32": torch.float32, "fp8": F8,
              "fp8_e5m2": torch.float8_e5m2}
BNB_VIEWS = tuple(bnb_ref.VIEWS)
QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
      "weight_block_size": [128, 128]}


# ---- producing sources in the published layouts (not the oracle) ----

def quant_fp8_block(w, e8m0=False):
    """DeepSeek README_WEIGHTS: zero-pad to 128x128 blocks, one scale per
    block (amax / 448), drop the padding."""
    w = w.float()
    m, n = w.shape
    gm, gn = -(-m // BS), -(-n // BS)
    pad = torch.zeros(gm * BS, gn * BS)
    pad[:m, :n] = w
    blk = pad.view(gm, BS, gn, BS)
    s = blk.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    if e8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (blk / s[:, None, :, None]).clamp(-448, 448)
    q = q.view(gm * BS, gn * BS)[:m, :n].to(F8)
    return q, (s.to(torch.float8_e8m0fnu) if e8m0 else s)


def quant_fp8_tensor(w):
    s = w.float().abs().max() / 448.0
    return (w.float() / s).clamp(-448, 448).to(F8), s.reshape(())


# ---- the oracles ----

def deepseek_dequant(w, s):
    """DeepSeek kernel.py weight_dequant: w[i, j] * s[i // 128, j // 128]
    in fp32 (edge blocks use their block's scale)."""
    s = s.float()
    if s.numel() == 1 and s.dim() <= 1:
        return w.float() * s.reshape(())
    if s.dim() >= 2 and s.shape[-2:] == (1, 1):
        # One scale per matrix ([1, 1], [E, 1, 1]): transformers' own
        # per-tensor quantisation, whose dequantizer takes the block
        # from the grid (DeepSeek's kernel knows no such grid).
        return w.float() * s
    m, n = w.shape[-2:]
    rows = torch.arange(m) // BS
    cols = torch.arange(n) // BS
    return w.float() * s[..., rows, :][..., :, cols]


def bits(t):
    """The bytes of @t as integers (NaN-safe bit comparison)."""
    return t.contiguous().view(torch.uint8)


def dequantized_bf16(src):
    """The source as the bitsandbytes views see it: FP8 block weights
    dequantized to bf16 (the bf16 view's values), scales gone, every
    other tensor as it is."""
    deq = expected_views(src, torch.bfloat16)
    return {k: (deq[k] if src[k].dtype == F8 else t)
            for k, t in src.items() if k in deq}


def expected_views(src, dtype):
    out = {}
    for k, t in src.items():
        if k.endswith("_scale_inv") or \
                (k.endswith(".scale") and k[:-6] + ".weight" in src):
            continue
        sk = k + "_scale_inv"
        if k.endswith(".weight") and k[:-7] + ".scale" in src:
            sk = k[:-7] + ".scale"
        if sk in src:
            out[k] = deepseek_dequant(t, src[sk]).to(dtype)
        else:
            out[k] = t  # kept as stored, as DeepSeek's fp8_cast_bf16.py
    return out


# ---- the corpus of layouts castfs refuses ----

def corpus():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(16, 64, generator=g).to(torch.bfloat16)
    q4, st = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                          compress_statistics=True)
    nf4 = {"l.weight": q4}
    nf4.update({"l.weight." + k: v for k, v in st.as_dict(packed=True).items()})
    # A quant_state whose shape disagrees with the packed weight (the
    # well-formed layout is dequantized: test_bnb4_src.py).
    lie = st.as_dict(packed=False)
    lie["shape"] = (16, 66)
    del lie["absmax"], lie["quant_map"], lie["nested_absmax"], \
        lie["nested_quant_map"]
    key = [k for k in nf4 if ".quant_state." in k][0]
    from bitsandbytes.utils import pack_dict_to_tensor
    nf4[key] = pack_dict_to_tensor(lie)
    u8 = lambda *s: torch.randint(0, 255, s, dtype=torch.uint8, generator=g)
    f8 = lambda *s: torch.randn(*s, generator=g).to(F8)
    exp = "model.layers.0.mlp.experts."
    return {
        "bnb-nf4": (nf4, "bitsandbytes 4-bit"),
        # MXFP4 whose scales do not fit its blocks (the well-formed
        # layout is dequantized: test_mxfp4_src.py).
        "gptoss-mxfp4": ({exp + "gate_up_proj_blocks": u8(2, 8, 4, 16),
                          exp + "gate_up_proj_scales": u8(2, 8, 3),
                          exp + "gate_up_proj_bias": torch.zeros(2, 8)},
                         "MXFP4"),
        # A compressed-tensors FP8 scale that fits no strategy (fitting
        # ones are dequantized: test_ct_src.py).
        "ct-fp8-channel": ({"l.weight": f8(8, 32),
                            "l.weight_scale": torch.rand(7, 1).bfloat16()},
                           "compressed-tensors FP8"),
        # An NVFP4 scale grid that does not fit its packed weight
        # (fitting ones are dequantized: test_ct4_src.py).
        "ct-nvfp4": ({"l.weight_packed": u8(8, 16),
                      "l.weight_scale": f8(8, 3),
                      "l.weight_global_scale": torch.ones(1)},
                     "compressed-tensors"),
        # Asymmetric int4 whose zero points are not packed along the rows
        # (fitting ones are dequantized: test_ct_w4_src.py).
        "ct-int4": ({"l.weight_packed": torch.zeros(8, 4, dtype=torch.int32),
                     "l.weight_scale": torch.ones(8, 1).bfloat16(),
                     "l.weight_zero_point": torch.zeros(8, 1,
                                                        dtype=torch.int32),
                     "l.weight_shape": torch.tensor([8, 32])},
                    "compressed-tensors"),
        "gptq": ({"l.qweight": torch.zeros(4, 8, dtype=torch.int32),
                  "l.qzeros": torch.zeros(1, 1, dtype=torch.int32),
                  "l.scales": torch.ones(1, 8).half(),
                  "l.g_idx": torch.zeros(32, dtype=torch.int32)},
                 "GPTQ"),
        "fp8-block-64": ({"l.weight": f8(256, 256),
                          "l.weight_scale_inv": torch.ones(4, 4)},
                         "128x128 block"),
        # 16-bit float scales are read (below); a float64 one is not.
        "fp8-scale-f64": ({"l.weight": f8(256, 256),
                           "l.weight_scale_inv": torch.ones(2, 2).double()},
                          "128x128 block"),
        "fp8-orphan-scale": ({"l.weight_scale_inv": torch.ones(2, 2)},
                             "without its weight"),
        # An F8 tensor without a scale beside FP8 block weights: DeepSeek's
        # fp8_cast_bf16.py copies it as stored, a "bf16" file holding raw
        # codes (a bug hunt: served so; refused in a folder already).
        "fp8-unscaled-beside": ({"l.weight": f8(256, 256),
                                 "l.weight_scale_inv": torch.ones(2, 2),
                                 "m.weight": f8(16, 16)},
                                "without its scale"),
    }


# Folders whose config.json declares one quantized layout and whose
# tensors are another (a bug hunt: castfs went by the tensors, the loader
# goes by the config): name -> (quantization_config, tensors, reason).
def mismatched():
    g = torch.Generator().manual_seed(11)
    f8 = lambda *s: torch.randn(*s, generator=g).to(F8)
    u8 = lambda *s: torch.randint(0, 255, s, dtype=torch.uint8, generator=g)
    p = "model.layers.0.mlp.down_proj."
    ct = {p + "weight": f8(64, 64),
          p + "weight_scale": torch.rand(64, 1, generator=g).bfloat16()}
    ds = {p + "weight": f8(64, 64), p + "weight_scale_inv": torch.ones(1, 1)}
    nv = {p + "weight_packed": u8(64, 32), p + "weight_scale": f8(64, 4),
          p + "weight_global_scale": torch.tensor([3.0])}
    mx = {p + "weight_packed": u8(64, 32),
          p + "weight_scale": torch.randint(120, 130, (64, 2),
                                            dtype=torch.uint8)}

    def ctq(fmt, w):
        return {"quant_method": "compressed-tensors", "format": fmt,
                "config_groups": {"group_0": {"targets": ["Linear"],
                                              "format": fmt, "weights": w}},
                "ignore": ["lm_head"]}
    fp4 = dict(num_bits=4, type="float", symmetric=True, dynamic=False)
    ctfp8 = ctq("float-quantized", dict(num_bits=8, type="float",
                                        symmetric=True, dynamic=False,
                                        strategy="channel"))
    nvq = ctq("nvfp4-pack-quantized", dict(fp4, strategy="tensor_group",
                                           group_size=16))
    mxq = ctq("mxfp4-pack-quantized", dict(fp4, strategy="group",
                                           group_size=32))
    but = " weight, but config.json"
    return {
        "mm-fp8cfg-ct": (QC, ct, "compressed-tensors FP8 (weight_scale)" +
                         but),
        "mm-ctcfg-ds": (ctfp8, ds, "FP8 block (weight_scale_inv)" + but),
        "mm-nvcfg-mx": (nvq, mx, "compressed-tensors MXFP4" + but),
        "mm-mxcfg-nv": (mxq, nv, "compressed-tensors NVFP4" + but),
        "mm-gptoss-nv": ({"quant_method": "mxfp4"}, nv,
                         "compressed-tensors NVFP4" + but),
    }


def listing_views(names, stem):
    return sorted(n for n in names if n.startswith(stem + ".") and
                  n != stem + ".safetensors" and not n.endswith(".tensors"))


class Env:
    root = None
    mnt = None
    corpus = None
    mismatched = None
    embed = None
    fp8 = None  # the FP8 single file's tensors


def write_llama(path, hidden, inter, heads, kv, shard):
    """A random Llama saved in bf16, sharded, then quantized in the FP8
    block layout: every *proj.weight, as DeepSeek/Qwen3-FP8 publish."""
    torch.manual_seed(hidden)
    cfg = LlamaConfig(vocab_size=300, hidden_size=hidden,
                      intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(
        path, max_shard_size=shard)
    index_path = os.path.join(path, "model.safetensors.index.json")
    index = json.load(open(index_path)) if os.path.exists(index_path) else None
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        sd = load_file(os.path.join(path, name))
        out = {}
        for k, t in sd.items():
            if k.endswith("proj.weight"):
                out[k], out[k + "_scale_inv"] = quant_fp8_block(t)
                if index:
                    index["weight_map"][k + "_scale_inv"] = name
            else:
                out[k] = t
        save_file(out, os.path.join(path, name), metadata={"format": "pt"})
    if index:
        json.dump(index, open(index_path, "w"), indent=2, sort_keys=True)
    cfg_path = os.path.join(path, "config.json")
    c = json.load(open(cfg_path))
    c["quantization_config"] = QC
    json.dump(c, open(cfg_path, "w"), indent=2, sort_keys=True)


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-qsrc-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    Env.corpus = corpus()
    for name, (tensors, _) in Env.corpus.items():
        save_file(tensors, os.path.join(src, name + ".safetensors"))
    g = torch.Generator().manual_seed(3)
    plain = {"model.position_ids": torch.arange(12).reshape(1, 12),
             "model.mask": torch.tensor([True, False, True]),
             "model.norm.weight": torch.randn(40, generator=g).bfloat16(),
             "model.up.weight": torch.randn(24, 40, generator=g).bfloat16()}
    save_file(plain, os.path.join(src, "plain.safetensors"),
              metadata={"format": "pt"})
    Env.fp8 = fp8_file_tensors(g)
    save_file(Env.fp8, os.path.join(src, "fp8.safetensors"),
              metadata={"format": "pt"})
    # Model directories that must get no views: an unknown quant_method,
    # and an FP8 model whose scale sits in another shard than its weight.
    awq = os.path.join(src, "awq-model")
    os.mkdir(awq)
    save_file({"model.up.weight": torch.randn(8, 8).bfloat16()},
              os.path.join(awq, "model.safetensors"))
    json.dump({"model_type": "llama", "quantization_config":
               {"quant_method": "awq", "bits": 4}},
              open(os.path.join(awq, "config.json"), "w"))
    split = os.path.join(src, "split-fp8")
    os.mkdir(split)
    q, s = quant_fp8_block(torch.randn(130, 140))
    save_file({"model.up.weight": q}, os.path.join(split, "a.safetensors"))
    save_file({"model.up.weight_scale_inv": s},
              os.path.join(split, "b.safetensors"))
    json.dump({"model_type": "llama", "quantization_config": QC},
              open(os.path.join(split, "config.json"), "w"))
    # transformers' FineGrainedFP8 modules_to_convert: an FP8Embedding
    # with one F32 weight_scale beside FP8 block Linears, under "fp8"
    emb = os.path.join(src, "fp8-embed")
    os.mkdir(emb)
    q, s = quant_fp8_block(torch.randn(130, 140, generator=g))
    Env.embed = {"model.embed_tokens.weight":
                 torch.randn(50, 140, generator=g).to(F8),
                 "model.embed_tokens.weight_scale": torch.tensor([0.037]),
                 "model.up.weight": q, "model.up.weight_scale_inv": s}
    save_file(Env.embed, os.path.join(emb, "model.safetensors"))
    json.dump({"model_type": "llama", "quantization_config":
               dict(QC, modules_to_convert=["embed_tokens"])},
              open(os.path.join(emb, "config.json"), "w"))
    Env.mismatched = mismatched()
    for name, (qc, tensors, _) in Env.mismatched.items():
        os.mkdir(os.path.join(src, name))
        save_file(tensors, os.path.join(src, name, "model.safetensors"))
        json.dump({"model_type": "llama", "quantization_config": qc},
                  open(os.path.join(src, name, "config.json"), "w"))
    write_llama(os.path.join(src, "llama-edge"), 192, 320, 3, 1, "150KB")
    write_llama(os.path.join(src, "llama-aligned"), 256, 384, 4, 2, "10GB")
    Env.mnt = tl.Mount(src)


def tearDownModule():
    # Models loaded from the mount map its files until they are collected:
    # a busy mount cannot be unmounted.
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def fp8_file_tensors(g):
    t = {}
    # Partial edge blocks in both dimensions (576 = 4.5 x 128 rows).
    q, s = quant_fp8_block(torch.randn(576, 200, generator=g))
    t["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] = q
    t["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"] = s
    # E8M0 scales (scale_fmt "ue8m0").
    q, s = quant_fp8_block(torch.randn(320, 260, generator=g), e8m0=True)
    t["model.layers.0.mlp.up_proj.weight"] = q
    t["model.layers.0.mlp.up_proj.weight_scale_inv"] = s
    # 128-aligned: transformers' own dequantization accepts it.
    q, s = quant_fp8_block(torch.randn(256, 384, generator=g) * 3)
    t["model.layers.0.mlp.down_proj.weight"] = q
    t["model.layers.0.mlp.down_proj.weight_scale_inv"] = s
    # weight_block_size null: one per-tensor scale.
    q, s = quant_fp8_tensor(torch.randn(100, 90, generator=g))
    t["model.layers.0.self_attn.o_proj.weight"] = q
    t["model.layers.0.self_attn.o_proj.weight_scale_inv"] = s
    # transformers' per-tensor quantisation writes a [1, 1] grid: one
    # scale for a matrix larger than a block.
    q, s = quant_fp8_tensor(torch.randn(300, 260, generator=g))
    t["model.layers.0.self_attn.q_b_proj.weight"] = q
    t["model.layers.0.self_attn.q_b_proj.weight_scale_inv"] = s.reshape(1, 1)
    qs, ss = zip(*(quant_fp8_tensor(torch.randn(140, 200, generator=g))
                   for _ in range(2)))
    t["model.layers.0.mlp.experts.down_proj"] = torch.stack(qs)
    t["model.layers.0.mlp.experts.down_proj_scale_inv"] = \
        torch.stack(ss).reshape(2, 1, 1)
    # Fused experts [E, out, in] with [E, ceil(out/128), ceil(in/128)].
    qs, ss = zip(*(quant_fp8_block(torch.randn(200, 150, generator=g))
                   for _ in range(3)))
    t["model.layers.0.mlp.experts.gate_up_proj"] = torch.stack(qs)
    t["model.layers.0.mlp.experts.gate_up_proj_scale_inv"] = torch.stack(ss)
    # BF16 and F16 block scales (Qwen3-32B-FP8, Qwen3-4B-2507-FP8),
    # widened to fp32 as any scale (stop 42, a bug hunt: refused until
    # then); an edge block and subnormal fp16 scales among them.
    q, s = quant_fp8_block(torch.randn(256, 384, generator=g) * 2)
    t["model.layers.0.self_attn.k_proj.weight"] = q
    t["model.layers.0.self_attn.k_proj.weight_scale_inv"] = s.bfloat16()
    q, s = quant_fp8_block(torch.randn(256, 256, generator=g) * 1e-5)
    t["model.layers.0.self_attn.v_proj.weight"] = q
    t["model.layers.0.self_attn.v_proj.weight_scale_inv"] = s.half()
    q, s = quant_fp8_block(torch.randn(200, 130, generator=g))
    t["model.layers.0.mlp.gate_proj.weight"] = q
    t["model.layers.0.mlp.gate_proj.weight_scale_inv"] = s.half()
    # DeepSeek-V4 naming: "M.scale", here with E8M0.
    q, s = quant_fp8_block(torch.randn(130, 129, generator=g), e8m0=True)
    t["layers.1.attn.wo_a.weight"] = q
    t["layers.1.attn.wo_a.scale"] = s
    t["model.norm.weight"] = torch.randn(200, generator=g).bfloat16()
    t["model.layers.0.mlp.gate.e_score_correction_bias"] = torch.randn(8)
    t["model.position_ids"] = torch.arange(16)
    return t


class Rejected(unittest.TestCase):
    def test_corpus_has_no_views(self):
        names = os.listdir(Env.mnt.path)
        for name in Env.corpus:
            with self.subTest(name=name):
                self.assertEqual(listing_views(names, name), [])
                for v in ("bf16", "fp8", "nf4", "int8"):
                    self.assertFalse(os.path.exists(
                        Env.mnt.join("%s.%s.safetensors" % (name, v))))

    def test_corpus_shown_as_itself(self):
        for name in Env.corpus:
            with self.subTest(name=name):
                p = name + ".safetensors"
                with open(Env.mnt.join(p), "rb") as f, \
                        open(os.path.join(Env.mnt.source, p), "rb") as g:
                    self.assertEqual(f.read(), g.read())

    def test_rejected_says_why(self):
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for name, (tensors, why) in Env.corpus.items():
            with self.subTest(name=name):
                reason = rej[name + ".safetensors"]
                self.assertIn(why, reason)
                self.assertTrue(any("'%s'" % k in reason for k in tensors),
                                reason)

    def test_quantized_dirs_have_no_views(self):
        names = os.listdir(Env.mnt.path)
        for d, why in [("awq-model", "'awq'"),
                       ("split-fp8", "in this file")] + \
                [(n, m[2]) for n, m in Env.mismatched.items()]:
            with self.subTest(dir=d):
                self.assertEqual([n for n in names if n.startswith(d + ".")],
                                 [])
                self.assertFalse(os.path.exists(Env.mnt.join(d + ".bf16")))
                inside = os.listdir(Env.mnt.join(d))
                self.assertEqual([n for n in inside if n.count(".") > 1], [])
                with open(Env.mnt.join(".castfs", "rejected")) as f:
                    reasons = [r["reason"] for r in json.load(f)
                               if r["path"].startswith(d + "/")]
                self.assertTrue(reasons and all(why in r for r in reasons[:1]),
                                reasons)

    def test_fp8_embedding_of_an_fp8_model(self):
        # FP8Embedding.forward: rows.to(weight_scale.dtype) * weight_scale
        # (a bug hunt: refused as a compressed-tensors weight for a while)
        got = load_file(Env.mnt.join("fp8-embed.bf16", "model.safetensors"))
        e = Env.embed
        want = (e["model.embed_tokens.weight"].float() *
                e["model.embed_tokens.weight_scale"]).bfloat16()
        self.assertTrue(torch.equal(got["model.embed_tokens.weight"].view(
            torch.int16), want.view(torch.int16)))
        self.assertNotIn("model.embed_tokens.weight_scale", got)

    def test_plain_neighbour_keeps_views(self):
        names = os.listdir(Env.mnt.path)
        self.assertIn("plain.nf4.safetensors", names)
        src = load_file(os.path.join(Env.mnt.source, "plain.safetensors"))
        v = load_file(Env.mnt.join("plain.bf16.safetensors"))
        for k in ("model.position_ids", "model.mask"):
            self.assertTrue(torch.equal(v[k], src[k]))
            self.assertEqual(v[k].dtype, src[k].dtype)


class SingleFile(unittest.TestCase):
    def test_views_listed(self):
        names = os.listdir(Env.mnt.path)
        for v in list(CAST_VIEWS) + list(BNB_VIEWS):
            name = "fp8.%s.safetensors" % v
            self.assertTrue(os.path.exists(Env.mnt.join(name)), name)
            if not v.endswith("_nodq"):  # listed by default
                self.assertIn(name, names)

    def test_bnb_views_of_dequantized(self):
        """nf4/fp4/int8 of an FP8 source are those views of its bf16
        dequantization (bnb_ref.py, checked against bitsandbytes in
        test_bnb.py): 2-D Linear weights quantised, fused 3-D experts
        kept as bf16, scales gone."""
        src = dequantized_bf16(Env.fp8)
        quantised = {k for k, t in src.items()
                     if Env.fp8[k].dtype == F8 and t.dim() == 2}
        self.assertEqual(len(quantised), 9)
        for view, (kind, qtype, nested) in bnb_ref.VIEWS.items():
            with self.subTest(view=view):
                path = Env.mnt.join("fp8.%s.safetensors" % view)
                with open(path, "rb") as f:
                    got = f.read()
                dyn = None
                if nested:
                    dyn = load_file(path)[
                        "model.layers.0.mlp.up_proj.weight.nested_quant_map"]
                want = bnb_ref.materialise(view, src, quantised,
                                           {"format": "pt"}, dyn)
                self.assertTrue(got == want, view)
                tl.check_ranges(self, path, want, count=40)

    def test_nf4_loads_within_bound(self):
        """bitsandbytes' own dequantize_4bit of the nf4 view is within the
        nf4 bound of the dequantized weight."""
        path = Env.mnt.join("fp8.nf4_nodq.safetensors")
        sd = load_file(path)
        ref = dequantized_bf16(Env.fp8)
        k = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        qs = bnb.functional.QuantState.from_dict(
            {n[len(k) + 1:]: t for n, t in sd.items() if n.startswith(k + ".")},
            device=torch.device("cpu"))
        deq = bnb.functional.dequantize_4bit(sd[k], qs).float()
        x = ref[k].float()
        am = bnb_ref.block_absmax(x.reshape(-1), 64)
        # NF4's largest half-gap is 0.152 of the absmax (-1 .. -0.696).
        bound = bnb_ref.expand(am, 64, x.numel()).reshape(x.shape) * 0.16
        self.assertTrue(bool(((deq - x).abs() <= bound + 1e-6).all()))

    def test_dequantized_bit_exact(self):
        for v, dt in CAST_VIEWS.items():
            with self.subTest(view=v):
                exp = expected_views(Env.fp8, dt)
                want = save(exp, metadata={"format": "pt"})
                path = Env.mnt.join("fp8.%s.safetensors" % v)
                with open(path, "rb") as f:
                    got = f.read()
                got_t = load_file(path)
                self.assertEqual(sorted(got_t), sorted(exp))
                for k in exp:
                    self.assertEqual(got_t[k].dtype, exp[k].dtype, k)
                    self.assertTrue(torch.equal(bits(got_t[k]), bits(exp[k])),
                                    "%s %s" % (v, k))
                self.assertEqual(got, want)
                tl.check_ranges(self, path, want, count=60)

    def test_transformers_dequantization(self):
        """Where transformers' CPU dequantization accepts the scale grid
        (no partial blocks, or a per-tensor scale), it agrees."""
        v = load_file(Env.mnt.join("fp8.bf16.safetensors"))
        op = Fp8Dequantize(None)
        for k in ("model.layers.0.mlp.down_proj.weight",
                  "model.layers.0.self_attn.k_proj.weight",
                  "model.layers.0.self_attn.v_proj.weight",
                  "model.layers.0.self_attn.o_proj.weight",
                  "model.layers.0.self_attn.q_b_proj.weight",
                  "model.layers.0.mlp.experts.down_proj"):
            ref = op._dequantize_one(Env.fp8[k], Env.fp8[k + "_scale_inv"],
                                     output_dtype=torch.bfloat16)
            self.assertTrue(torch.equal(bits(v[k]), bits(ref)), k)

    def test_edge_blocks_refused_by_transformers(self):
        """The reason castfs follows DeepSeek's kernel for edge blocks."""
        k = "model.layers.0.mlp.up_proj.weight"
        with self.assertRaises(ValueError):
            Fp8Dequantize(None)._dequantize_one(
                Env.fp8[k], Env.fp8[k + "_scale_inv"],
                output_dtype=torch.bfloat16)


class CommandLine(unittest.TestCase):
    def run_cli(self, *args):
        return tl.subprocess.run([tl.castfs_binary()] + list(args),
                                 capture_output=True, text=True)

    def test_info_shows_layout(self):
        src = os.path.join(Env.mnt.source, "fp8.safetensors")
        r = self.run_cli("info", src)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: FP8 block, 11 weights", r.stdout)
        self.assertIn("fp8 block 128x128, F8_E8M0 scale layers.1.attn.wo_a.scale",
                      r.stdout)
        self.assertIn("fp8 per-tensor, F32 scale", r.stdout)
        self.assertIn("fp8 per-tensor, F32 scale "
                      "model.layers.0.self_attn.q_b_proj.weight_scale_inv",
                      r.stdout)
        self.assertIn("fp8 per-expert, F32 scale "
                      "model.layers.0.mlp.experts.down_proj_scale_inv",
                      r.stdout)
        r = self.run_cli("info", os.path.join(Env.mnt.source, "bnb-nf4.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: refused: tensor 'l.weight", r.stdout)
        self.assertIn("bitsandbytes 4-bit", r.stdout)

    def test_convert_writes_the_view(self):
        src = os.path.join(Env.mnt.source, "fp8.safetensors")
        out = os.path.join(Env.root, "converted.bf16.safetensors")
        r = self.run_cli("convert", src, "--view", "bf16", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        want = save(expected_views(Env.fp8, torch.bfloat16),
                    metadata={"format": "pt"})
        with open(out, "rb") as f:
            self.assertEqual(f.read(), want)
        bad = os.path.join(Env.root, "converted.nf4.safetensors")
        r = self.run_cli("convert", os.path.join(Env.mnt.source, "gptq.safetensors"),
                         "--view", "bf16", "-o", bad)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("GPTQ", r.stderr)


def load_quiet(path, **kw):
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


def reference_state(src_dir, dtype):
    sd = {}
    for name in sorted(os.listdir(src_dir)):
        if name.endswith(".safetensors"):
            sd.update(load_file(os.path.join(src_dir, name)))
    return expected_views(sd, dtype)


class ModelDir(unittest.TestCase):
    def check_dir(self, name):
        names = os.listdir(Env.mnt.path)
        for v in ("bf16", "fp16", "fp32", "fp8"):
            self.assertIn("%s.%s" % (name, v), names)
        for v in BNB_VIEWS:
            self.assertTrue(os.path.isdir(Env.mnt.join("%s.%s" % (name, v))))
        view = Env.mnt.join(name + ".bf16")
        with open(os.path.join(view, "config.json")) as f:
            cfg = json.load(f)
        self.assertNotIn("quantization_config", cfg)
        self.assertEqual(cfg["dtype"], "bfloat16")
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        ref = reference_state(os.path.join(Env.mnt.source, name),
                              torch.bfloat16)
        params = dict(model.state_dict())
        for k, t in ref.items():
            self.assertEqual(params[k].dtype, t.dtype, k)
            self.assertTrue(torch.equal(bits(params[k]), bits(t)), k)
        return model, ref

    def test_edge_model(self):
        model, ref = self.check_dir("llama-edge")
        # No variant spelling: through it a loader would read the source's
        # FP8 quantization_config next to dequantized weights.
        src_dir = Env.mnt.join("llama-edge")
        self.assertTrue(os.path.exists(os.path.join(
            src_dir, "model.safetensors.index.json")))
        self.assertEqual([n for n in os.listdir(src_dir)
                          if n.startswith("model.safetensors.index.")
                          and n != "model.safetensors.index.json"], [])
        self.assertFalse(os.path.exists(os.path.join(
            src_dir, "model.safetensors.index.bf16.json")))
        view = Env.mnt.join("llama-edge.bf16")
        idx = json.load(open(os.path.join(view, "model.safetensors.index.json")))
        self.assertEqual(sorted(idx["weight_map"]), sorted(ref))
        self.assertEqual(idx["metadata"]["total_size"],
                         sum(t.numel() * t.element_size() for t in ref.values()))
        cfg = LlamaConfig.from_pretrained(view)
        # Built in bf16 (not cast after): the rotary buffers stay fp32.
        plain = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
        plain.load_state_dict(ref)
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, plain(ids).logits))

    def test_listed_names_are_served(self):
        """Every view listed for the quantized (sharded) model is
        offered, and every DIR.<view> it lists opens and reads whole: a
        listed name never answers ENOENT or EIO."""
        with tl.Mount(Env.mnt.source,
                      options=["views=bf16:nf4:nvfp4:fp8_dynamic"]) as m:
            names = [n for n in os.listdir(m.path)
                     if n.startswith("llama-edge.")]
            self.assertEqual(sorted(names),
                             ["llama-edge.bf16", "llama-edge.fp8_dynamic",
                              "llama-edge.nf4", "llama-edge.nvfp4"])
            for n in names:
                self.assertTrue(os.path.isdir(m.join(n)), n)
            for f in os.listdir(m.join("llama-edge.nvfp4")):
                with open(m.join("llama-edge.nvfp4", f), "rb") as fh:
                    self.assertEqual(len(fh.read()),
                                     os.path.getsize(m.join(
                                         "llama-edge.nvfp4", f)), f)

    def test_edge_model_nf4(self):
        """DIR.nf4/ of an FP8 model is a bitsandbytes model of its
        dequantized weights: bnb's quantization_config, no FP8 one, every
        Linear weight within the nf4 bound of the bf16 dequantization."""
        view = Env.mnt.join("llama-edge.nf4")
        with open(os.path.join(view, "config.json")) as f:
            qc = json.load(f)["quantization_config"]
        self.assertEqual(qc["quant_method"], "bitsandbytes")
        self.assertEqual(qc["bnb_4bit_compute_dtype"], "bfloat16")
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        ref = reference_state(os.path.join(Env.mnt.source, "llama-edge"),
                              torch.bfloat16)
        n = 0
        for name, mod in model.named_modules():
            if not isinstance(mod, bnb.nn.Linear4bit):
                continue
            w = mod.weight
            deq = bnb.functional.dequantize_4bit(w.data, w.quant_state).float()
            x = ref[name + ".weight"].float()
            am = bnb_ref.block_absmax(x.reshape(-1), 64)
            # NF4's largest half-gap is 0.152 of the absmax, plus the
            # error of the 8-bit absmax of double quantisation.
            bound = bnb_ref.expand(am, 64, x.numel()).reshape(x.shape) * 0.17
            self.assertTrue(bool(((deq - x).abs() <= bound + 1e-6).all()), name)
            n += 1
        self.assertEqual(n, 14)  # 7 Linear per layer, lm_head kept

    def test_aligned_model_equals_transformers(self):
        """transformers dequantizes the source itself on a CPU machine."""
        model, _ = self.check_dir("llama-aligned")
        tf = load_quiet(os.path.join(Env.mnt.source, "llama-aligned"))
        a, b = dict(model.state_dict()), dict(tf.state_dict())
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue(torch.equal(bits(a[k]), bits(b[k])), k)
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, tf(ids).logits))


if __name__ == "__main__":
    tl.main()
