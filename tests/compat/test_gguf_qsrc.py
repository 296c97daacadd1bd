# SPDX-License-Identifier: MIT
"""GGUF files of quantized sources (docs/FORMATS.md, "GGUF of a quantized
source"): DIR.<q>.gguf of a quantized model folder is DIR.<q>.gguf of the
bf16 model its reference dequantizer gives, byte for byte.

The models are test_gguf_llm's tiny Llama and Qwen3 (a BPE tokenizer
trained by `tokenizers`, weights saved by transformers), quantized here in
the published FP8 block layout (DeepSeek-V3 / Qwen3-FP8: F8_E4M3 weight and
one weight_scale_inv per block, config.json quantization_config):
- a Qwen3 with 32x32 blocks and F32 scales: the reference bf16 model is
  transformers' own FP8 dequantization (Fp8Dequantize);
- a Llama (Q/K rows permuted) with 48x40 blocks, so that every weight has
  partial edge blocks, and E8M0 scales: transformers refuses edge blocks,
  so the reference is DeepSeek's weight_dequant (each element times its
  block's scale in fp32, then torch's bf16 cast), as test_quant_src.py;
- the same Qwen3 in two shards, every scale in the other shard than its
  weight (transformers' sharder splits a weight from its scale), against
  the reference split the same way;
- the Llama quantized to nf4 (double quantised) and the Qwen3 to LLM.int8
  by transformers + bitsandbytes on CPU: bitsandbytes' dequantize_4bit /
  int8_vectorwise_dequant;
- a Flux file in ComfyUI's scaled fp8 form: ComfyUI's bf16 rule.
Each reference is saved as a bf16 folder (the other tensors as the source
has them) next to the quantized one in the same mount; castfs's GGUF of a
bf16 folder is checked against gguf-py and llama.cpp by test_gguf*.py.
Oracles outside castfs: transformers / torch for the bf16 values,
llama.cpp (llama-cpp-python) for the q8_0 file of the Qwen3 FP8 folder,
whose logits must be within test_gguf_llamacpp's tolerance of
transformers' on the reference model, and gguf-py's GGUFReader for names.
"""
import errno
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
        import llama_cpp
        import numpy as np
        import torch
        from gguf import GGUFReader
        from safetensors.torch import load_file, save_file
        from bitsandbytes.functional import QuantState, dequantize_4bit, \
            int8_vectorwise_dequant
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, \
            PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        from test_gguf_llm import make_model
        from test_gguf_llamacpp import LOGIT_TOL
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

F8 = torch.float8_e4m3fn
VIEWS = ("f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q6_k")
TEXTS = ("config.json", "tokenizer.json", "tokenizer_config.json")
INDEX = "model.safetensors.index.json"


# ---- the sources, in the published layout (not the oracle) ----

def quant_fp8_block(w, bm, bn, e8m0):
    """DeepSeek README_WEIGHTS with a bm x bn block: zero-pad to whole
    blocks, one scale per block (amax / 448), drop the padding."""
    w = w.float()
    m, n = w.shape
    gm, gn = -(-m // bm), -(-n // bn)
    pad = torch.zeros(gm * bm, gn * bn)
    pad[:m, :n] = w
    blk = pad.view(gm, bm, gn, bn)
    s = blk.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    if e8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (blk / s[:, None, :, None]).clamp(-448, 448)
    q = q.view(gm * bm, gn * bn)[:m, :n].to(F8)
    return q, (s.to(torch.float8_e8m0fnu) if e8m0 else s)


# ---- the oracles ----

def transformers_dequant(q, s, block):
    return Fp8Dequantize(None)._dequantize_one(q, s,
                                               output_dtype=torch.bfloat16)


def deepseek_dequant(q, s, block):
    """DeepSeek kernel.py weight_dequant: q[i, j] * s[i // bm, j // bn]
    in fp32 (edge blocks use their block's scale), then torch's cast."""
    bm, bn = block
    m, n = q.shape
    rows = torch.arange(m) // bm
    cols = torch.arange(n) // bn
    return (q.float() * s.float()[rows, :][:, cols]).to(torch.bfloat16)


def copy_texts(frm, to, quant=None):
    os.makedirs(to)
    for f in TEXTS:
        shutil.copy(os.path.join(frm, f), to)
    with open(os.path.join(frm, "config.json")) as f:
        c = json.load(f)
    c["dtype"] = "bfloat16"
    if quant:
        c["quantization_config"] = quant
    with open(os.path.join(to, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def save(folder, sd, wmap=None):
    """@sd as model.safetensors, or as the shards @wmap names (with an
    index) when given."""
    if not wmap:
        save_file(sd, os.path.join(folder, "model.safetensors"),
                  metadata={"format": "pt"})
        return
    for fname in sorted(set(wmap.values())):
        save_file({k: sd[k] for k in sd if wmap[k] == fname},
                  os.path.join(folder, fname), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: wmap[k] for k in sd}}, f, indent=2)


def split(sd):
    """Two shards as transformers' sharder may cut them: layer 0 and the
    embedding in the first, the rest in the second, and every scale in
    the other shard than its weight."""
    first, second = "model-00001-of-00002.safetensors", \
        "model-00002-of-00002.safetensors"
    wmap = {}
    for k in sd:
        w = k[:-len("_scale_inv")] if k.endswith("_scale_inv") else k
        one = w.startswith(("model.embed_tokens.", "model.layers.0."))
        if k != w:
            one = not one
        wmap[k] = first if one else second
    return wmap


def fp8_pair(base, src, name, block, e8m0, oracle, shard=False):
    """Folder @name (FP8 block, from the fp32 model in @base) and
    @name-ref (its bf16 dequantization by @oracle) under @src."""
    sd = load_file(os.path.join(base, "model.safetensors"))
    q, ref = {}, {}
    for k, t in sorted(sd.items()):
        t = t.to(torch.bfloat16)
        if k.endswith("proj.weight"):
            q[k], q[k + "_scale_inv"] = quant_fp8_block(t, *block, e8m0)
            ref[k] = oracle(q[k], q[k + "_scale_inv"], block)
        else:
            q[k] = ref[k] = t.contiguous()
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3",
          "quant_method": "fp8", "weight_block_size": list(block)}
    wmap = split(q) if shard else None
    copy_texts(base, os.path.join(src, name), qc)
    save(os.path.join(src, name), q, wmap)
    copy_texts(base, os.path.join(src, name + "-ref"))
    save(os.path.join(src, name + "-ref"), ref, wmap)
    return wmap


def bnb4_pair(base, src, name):
    """@name: the model in @base quantized to nf4 (double quantised) and
    saved by transformers + bitsandbytes on CPU; @name-ref: bitsandbytes'
    dequantize_4bit of every 4-bit weight, other tensors as saved."""
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.bfloat16, device_map="cpu",
            quantization_config=BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16))
        m.save_pretrained(os.path.join(src, name))
        m.save_pretrained(os.path.join(src, name + "-sharded"),
                          max_shard_size="60KB")
    for f in TEXTS[1:]:
        shutil.copy(os.path.join(base, f), os.path.join(src, name))
        shutil.copy(os.path.join(base, f), os.path.join(src, name + "-sharded"))
    sd = load_file(os.path.join(src, name, "model.safetensors"))
    state = ".quant_state.bitsandbytes__nf4"
    ref = {}
    weights = [k[:k.index(state)] for k in sd if state in k]
    for w in weights:
        comp = {k[len(w) + 1:]: v for k, v in sd.items()
                if k.startswith(w + ".")}
        qs = QuantState.from_dict(comp, device="cpu")
        ref[w] = dequantize_4bit(sd[w], qs).to(torch.bfloat16)
    for k, v in sd.items():
        if k not in ref and not any(k.startswith(w + ".") for w in weights):
            ref[k] = v
    assert weights and all(v.dtype == torch.bfloat16 for v in ref.values())
    copy_texts(base, os.path.join(src, name + "-ref"))
    save(os.path.join(src, name + "-ref"), ref)
    # the sharded save's reference: the same bf16 model, each tensor in
    # the shard of the tensor it comes from (GGUF orders by shard)
    with open(os.path.join(src, name + "-sharded", INDEX)) as f:
        wmap = json.load(f)["weight_map"]
    copy_texts(base, os.path.join(src, name + "-sharded-ref"))
    save(os.path.join(src, name + "-sharded-ref"), ref,
         {k: wmap[k] for k in ref})
    return wmap, cross_shards(src, name, wmap, weights)


def cross_shards(src, name, wmap, weights):
    """@name-xs: transformers' sharded save re-split so that every other
    4-bit weight's quant_state, absmax and nested tensors lie in the next
    shard (transformers 5 keeps a module together; an index may not)."""
    shards = sorted(set(wmap.values()))
    sd = {}
    for f in shards:
        sd.update(load_file(os.path.join(src, name + "-sharded", f)))
    xs = dict(wmap)
    for i, w in enumerate(sorted(weights)):
        for k in sd:
            if i % 2 and k.startswith(w + "."):
                xs[k] = shards[(shards.index(wmap[w]) + 1) % len(shards)]
    out = os.path.join(src, name + "-xs")
    os.makedirs(out)
    for f in ("config.json",) + TEXTS[1:]:
        shutil.copy(os.path.join(src, name + "-sharded", f), out)
    save(out, sd, xs)
    # @name-lost: the same, one quant_state gone from every shard: the
    # weight cannot be dequantized, so the folder gets no GGUF file
    lost = os.path.join(src, name + "-lost")
    os.makedirs(lost)
    for f in ("config.json",) + TEXTS[1:]:
        shutil.copy(os.path.join(out, f), lost)
    gone = sorted(weights)[1] + ".quant_state.bitsandbytes__nf4"
    save(lost, {k: v for k, v in sd.items() if k != gone},
         {k: v for k, v in xs.items() if k != gone})
    return xs


def comfy_pair(src, name):
    """@name.safetensors: a Flux-layout checkpoint in ComfyUI's legacy
    scaled fp8 form (F8_E4M3 weight, F32 per-tensor scale_weight, the
    scaled_fp8 marker; scale = amax / 448 as ComfyUI's writer), with a
    weight small enough to stay F32 in GGUF, one whose rows are not whole
    Q8_0 blocks, and kept-list layers; @name-ref.safetensors: ComfyUI's
    dequantization (comfy-kitchen's dequantize_per_tensor_fp8:
    q.to(bf16) * scale.to(bf16) in torch), other tensors as stored."""
    g = torch.Generator().manual_seed(5)
    q = {"scaled_fp8": torch.empty(0, dtype=F8)}
    ref = {}
    for k, shape in (("double_blocks.0.img_attn.proj.weight", (64, 64)),
                     ("double_blocks.0.img_mlp.0.weight", (96, 64)),
                     ("double_blocks.0.img_mlp.2.weight", (64, 40)),
                     ("double_blocks.0.txt_mod.lin.weight", (16, 32)),
                     ("img_in.weight", (64, 32))):
        w = torch.randn(*shape, generator=g) * 0.37
        s = w.abs().max() / 448.0
        q[k] = (w / s).clamp(-448, 448).to(F8)
        q[k[:-len("weight")] + "scale_weight"] = s.reshape(())
        ref[k] = q[k].to(torch.bfloat16) * s.to(torch.bfloat16)
        b = k[:-len("weight")] + "bias"
        q[b] = ref[b] = torch.randn(shape[0], generator=g).bfloat16()
    q["final_layer.linear.weight"] = ref["final_layer.linear.weight"] = \
        torch.randn(32, 64, generator=g).bfloat16()
    save_file(q, os.path.join(src, name + ".safetensors"),
              metadata={"format": "pt"})
    save_file(ref, os.path.join(src, name + "-ref.safetensors"),
              metadata={"format": "pt"})


def int8_pair(base, src, name):
    """@name: the model in @base loaded with load_in_8bit and saved by
    transformers + bitsandbytes on CPU (I8 weight, SCB, weight_format);
    @name-ref: bitsandbytes' int8_vectorwise_dequant of every weight in
    bf16, other tensors as saved."""
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.bfloat16, device_map="cpu",
            quantization_config=BitsAndBytesConfig(load_in_8bit=True))
        m.save_pretrained(os.path.join(src, name))
    for f in TEXTS[1:]:
        shutil.copy(os.path.join(base, f), os.path.join(src, name))
    sd = load_file(os.path.join(src, name, "model.safetensors"))
    ref = {}
    for k, t in sd.items():
        if k.endswith((".SCB", ".weight_format")):
            continue
        scb = k[:-len("weight")] + "SCB"
        ref[k] = int8_vectorwise_dequant(t, sd[scb]).to(torch.bfloat16) \
            if scb in sd else t
    assert any(k.endswith(".SCB") for k in sd)
    copy_texts(base, os.path.join(src, name + "-ref"))
    save(os.path.join(src, name + "-ref"), ref)


def gptoss_file(path):
    """gpt-oss MXFP4 experts in the published layout (test_mxfp4_src):
    "*_blocks" U8 [E, R, G, 16] + "*_scales" E8M0 bytes [E, R, G]."""
    g = torch.Generator().manual_seed(3)
    exp = "model.layers.0.mlp.experts."
    save_file({exp + "gate_up_proj_blocks": torch.randint(
                   0, 256, (2, 40, 2, 16), dtype=torch.uint8, generator=g),
               exp + "gate_up_proj_scales": torch.randint(
                   120, 130, (2, 40, 2), dtype=torch.uint8, generator=g),
               "model.norm.weight": torch.randn(64, generator=g).bfloat16()},
              path, metadata={"format": "pt"})


class Env:
    root = None
    mnt = None
    qwen3 = None  # the fp32 base folder
    wmap = None
    bnb4_wmap = None  # llama-nf4-sharded's weight_map
    bnb4_xs = None  # llama-nf4-xs's


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-gguf-qsrc-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    Env.qwen3 = os.path.join(Env.root, "qwen3")
    llama = os.path.join(Env.root, "llama")
    make_model(Env.qwen3, "qwen3")
    make_model(llama, "llama")
    fp8_pair(Env.qwen3, src, "qwen3-fp8", (32, 32), False,
             transformers_dequant)
    fp8_pair(llama, src, "llama-fp8-edge", (48, 40), True, deepseek_dequant)
    Env.wmap = fp8_pair(Env.qwen3, src, "qwen3-fp8-sharded", (32, 32),
                        False, transformers_dequant, shard=True)
    Env.bnb4_wmap, Env.bnb4_xs = bnb4_pair(llama, src, "llama-nf4")
    int8_pair(Env.qwen3, src, "qwen3-int8")
    comfy_pair(src, "flux-scaled")
    gptoss_file(os.path.join(src, "gptoss.safetensors"))
    Env.mnt = tl.Mount(src, options=[
        "views=" + ":".join(v + ".gguf" for v in VIEWS)])


def tearDownModule():
    rc = Env.mnt.unmount() if Env.mnt else 0
    if Env.root:
        shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Fp8BlockGGUF(unittest.TestCase):
    def check_equal(self, name, views=VIEWS, ref=None):
        for v in views:
            with self.subTest(model=name, view=v):
                got = Env.mnt.join("%s.%s.gguf" % (name, v))
                want = Env.mnt.join("%s.%s.gguf" % (ref or name + "-ref", v))
                size = os.stat(got).st_size
                data = read(got)
                self.assertEqual(len(data), size)
                self.assertTrue(data == read(want), "%s %s" % (name, v))

    def test_f32_scales_equal_transformers_dequant(self):
        self.check_equal("qwen3-fp8")

    def test_edge_blocks_e8m0_permuted(self):
        self.check_equal("llama-fp8-edge")

    def test_sharded_scales_elsewhere(self):
        crossing = [k for k in Env.wmap if k + "_scale_inv" in Env.wmap and
                    Env.wmap[k] != Env.wmap[k + "_scale_inv"]]
        self.assertTrue(crossing, "the split puts no scale elsewhere")
        self.check_equal("qwen3-fp8-sharded")

    def test_bnb4(self):
        self.check_equal("llama-nf4")

    def test_bnb4_sharded(self):
        """The nf4 model saved by save_pretrained in 60 KB shards, and
        re-split with the quant_state, absmax and nested tensors of every
        other weight in another shard than the weight: each GGUF file is
        the one of the bf16 reference sharded as the weights are."""
        self.assertGreater(len(set(Env.bnb4_wmap.values())), 2)
        self.check_equal("llama-nf4-sharded")
        w = Env.bnb4_xs
        state = ".quant_state.bitsandbytes__nf4"
        crossing = [k for k in w if state in k and
                    w[k] != w[k[:k.index(state)]]]
        self.assertTrue(crossing, "no quant_state away from its weight")
        self.check_equal("llama-nf4-xs", ref="llama-nf4-sharded-ref")

    def test_bnb4_sharded_lost_state_refused(self):
        """A sharded nf4 folder with a quant_state in no shard gets no
        GGUF file and says why in /.castfs/refused."""
        name = "llama-nf4-lost.q8_0.gguf"
        with self.assertRaises(OSError):
            os.stat(Env.mnt.join(name))
        self.assertNotIn(name, os.listdir(Env.mnt.path))
        with open(Env.mnt.join(".castfs", "refused")) as f:
            why = [r["reason"] for r in json.load(f)
                   if r["path"] == "llama-nf4-lost"]
        self.assertTrue(why and "bitsandbytes 4-bit" in why[0], why)
        # nor is its packed weight served as stored in DIR.bf16/
        state = ".quant_state.bitsandbytes__nf4"
        w = sorted(k[:k.index(state)] for k in Env.bnb4_xs if state in k)[1]
        with self.assertRaises(OSError) as e:
            read(Env.mnt.join("llama-nf4-lost.bf16", Env.bnb4_xs[w]))
        self.assertEqual(e.exception.errno, errno.EOPNOTSUPP)

    def test_bnb4_sharded_bf16_dir(self):
        """DIR.bf16/ of the re-split folder (each shard read through its
        composite header) holds bitsandbytes' dequantization, bit for
        bit, and no quant_state, absmax or nested tensor."""
        ref = {}
        d = Env.mnt.join("llama-nf4-sharded-ref")
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                ref.update(load_file(os.path.join(d, f)))
        got = {}
        d = Env.mnt.join("llama-nf4-xs.bf16")
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                got.update(load_file(os.path.join(d, f)))
        self.assertEqual(sorted(got), sorted(ref))
        for k in ref:
            self.assertTrue(torch.equal(got[k].view(torch.uint8),
                                        ref[k].view(torch.uint8)), k)

    def test_llm_int8(self):
        self.check_equal("qwen3-int8")

    def test_comfy_scaled_fp8_diffusion(self):
        """X.<q>.gguf of a ComfyUI scaled fp8 Flux file: the same file of
        ComfyUI's bf16 dequantization."""
        for v in ("f16", "bf16", "q8_0", "q4_0"):
            with self.subTest(view=v):
                got = read(Env.mnt.join("flux-scaled.%s.gguf" % v))
                want = read(Env.mnt.join("flux-scaled-ref.%s.gguf" % v))
                self.assertTrue(got == want, v)
        r = GGUFReader(Env.mnt.join("flux-scaled.q8_0.gguf"))
        types = {t.name: t.tensor_type.name for t in r.tensors}
        self.assertEqual(types["double_blocks.0.img_attn.proj.weight"],
                         "Q8_0")
        self.assertEqual(types["double_blocks.0.txt_mod.lin.weight"], "F32")
        self.assertEqual(types["double_blocks.0.img_mlp.2.weight"], "BF16")
        self.assertFalse([n for n in types if "scale" in n])

    def test_not_offered(self):
        """gpt-oss MXFP4 experts (no llama.cpp mapping) get no GGUF file,
        and say why (castfs convert for a single file, whose reason the
        daemon only logs)."""
        name = "gptoss.q8_0.gguf"
        with self.assertRaises(OSError):
            os.stat(Env.mnt.join(name))
        self.assertNotIn(name, os.listdir(Env.mnt.path))
        r = subprocess.run([tl.castfs_binary(), "convert",
                            os.path.join(Env.mnt.source, "gptoss.safetensors"),
                            "--view", "q8_0", "-o",
                            os.path.join(Env.root, "gptoss.gguf")],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("gpt-oss MXFP4 experts have no llama.cpp mapping",
                      r.stderr)

    def test_listed(self):
        """Chosen with -o views=, the GGUF files of quantized sources are
        listed like those of their references."""
        names = set(os.listdir(Env.mnt.path))
        for stem in ("qwen3-fp8", "llama-fp8-edge", "qwen3-fp8-sharded",
                     "llama-nf4", "qwen3-int8", "flux-scaled"):
            for v in ("f16", "q8_0"):
                self.assertIn("%s.%s.gguf" % (stem, v), names)
                self.assertIn("%s-ref.%s.gguf" % (stem, v), names)

    def test_names_are_the_bf16_models(self):
        r = GGUFReader(Env.mnt.join("qwen3-fp8.q8_0.gguf"))
        names = [t.name for t in r.tensors]
        self.assertFalse([n for n in names if "scale" in n])
        ref = GGUFReader(Env.mnt.join("qwen3-fp8-ref.q8_0.gguf"))
        self.assertEqual(names, [t.name for t in ref.tensors])
        self.assertEqual(r.fields["general.architecture"].contents(),
                         "qwen3")

    def test_convert_writes_the_file(self):
        """castfs convert DIR --view q8_0 writes the mounted file, for the
        one-file and the sharded FP8 folder (the block size from their
        config.json)."""
        for name in ("qwen3-fp8", "qwen3-fp8-sharded"):
            out = os.path.join(Env.root, name + ".q8_0.gguf")
            r = subprocess.run([tl.castfs_binary(), "convert",
                                os.path.join(Env.mnt.source, name),
                                "--view", "q8_0", "-o", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(read(out) == read(Env.mnt.join(
                name + "-ref.q8_0.gguf")), name)

    def test_ranges(self):
        path = Env.mnt.join("llama-fp8-edge.q4_k_m.gguf")
        tl.check_ranges(self, path,
                        read(Env.mnt.join("llama-fp8-edge-ref.q4_k_m.gguf")),
                        count=100)

    def test_llama_cpp_logits(self):
        """llama.cpp runs the FP8 folder's q8_0 file; its logits are those
        of transformers on the dequantized (reference) model."""
        ref = os.path.join(Env.mnt.source, "qwen3-fp8-ref")
        hf = PreTrainedTokenizerFast.from_pretrained(ref)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(
                ref, dtype=torch.float32).eval()
        llm = llama_cpp.Llama(Env.mnt.join("qwen3-fp8.q8_0.gguf"),
                              n_ctx=256, logits_all=True, verbose=False,
                              seed=0, n_threads=2)
        prompt = hf("The quick brown fox jumps over the lazy dog.",
                    add_special_tokens=False).input_ids
        llm.eval(prompt)
        got = np.array(llm.scores[:len(prompt)])
        with torch.no_grad():
            want = model(torch.tensor([prompt])).logits[0].numpy()
        llm.close()
        err = np.abs(got - want).max()
        print("qwen3 fp8 q8_0: max |logit difference| %.4f" % err,
              file=sys.stderr)
        self.assertLess(err, LOGIT_TOL["q8_0"])


if __name__ == "__main__":
    tl.main()
