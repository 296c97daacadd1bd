# SPDX-License-Identifier: MIT
"""FP8 block sources of any weight_block_size (docs/FORMATS.md, "Quantized
sources"): the block size comes from config.json's quantization_config.

- A Qwen3 (Qwen3Config) quantized in [64, 32] blocks whose shapes divide:
  DIR.bf16/ loads with unmodified from_pretrained and equals, parameter by
  parameter and in its logits, transformers' own CPU dequantization of the
  source.
- A Qwen3-MoE (Qwen3MoeConfig, per-expert weights as save_pretrained
  writes them) quantized in [32, 64] blocks with partial edge blocks in
  both dimensions, sharded: DIR.bf16/ equals the reference model that
  from_pretrained builds from DeepSeek's weight_dequant rule (each element
  times its own block's scale in fp32, then RNE to bf16) written as plain
  bf16 safetensors; logits equal. transformers refuses those shapes.
- A directory whose scales do not fit its declared block size gets no
  views and a reason naming the block size.
- castfs info and castfs convert of one shard read the block size from the
  config.json beside it.
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
        import torch
        from safetensors.torch import load_file, save, save_file
        from transformers import AutoModelForCausalLM, Qwen3Config, \
            Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        from transformers.utils import logging as hf_logging
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

F8 = torch.float8_e4m3fn


def qc(block):
    return {"activation_scheme": "dynamic", "fmt": "e4m3",
            "quant_method": "fp8", "weight_block_size": list(block)}


# ---- producing sources in the published layout (not the oracle) ----

def quant_fp8_block(w, bm, bn):
    """DeepSeek README_WEIGHTS with a [bm, bn] block: zero-pad to whole
    blocks, one scale per block (amax / 448), drop the padding."""
    w = w.float()
    m, n = w.shape
    gm, gn = -(-m // bm), -(-n // bn)
    pad = torch.zeros(gm * bm, gn * bn)
    pad[:m, :n] = w
    blk = pad.view(gm, bm, gn, bn)
    s = blk.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blk / s[:, None, :, None]).clamp(-448, 448)
    return q.view(gm * bm, gn * bn)[:m, :n].to(F8), s


# ---- the oracle ----

def deepseek_dequant(w, s, bm, bn):
    """DeepSeek kernel.py weight_dequant with block [bm, bn]:
    w[i, j] * s[i // bm, j // bn] in fp32."""
    m, n = w.shape
    rows = torch.arange(m) // bm
    cols = torch.arange(n) // bn
    return w.float() * s.float()[rows, :][:, cols]


def bits(t):
    return t.contiguous().view(torch.uint8)


def reference_state(src_dir, block, dtype=torch.bfloat16):
    sd = {}
    for name in sorted(os.listdir(src_dir)):
        if name.endswith(".safetensors"):
            sd.update(load_file(os.path.join(src_dir, name)))
    out = {}
    for k, t in sd.items():
        if k.endswith("_scale_inv"):
            continue
        if k + "_scale_inv" in sd:
            out[k] = deepseek_dequant(t, sd[k + "_scale_inv"],
                                      *block).to(dtype)
        else:
            out[k] = t
    return out


def quantize_dir(path, block):
    """Every *proj.weight of the saved model in the FP8 block layout, the
    index and config.json updated as DeepSeek / Qwen3-FP8 publish them."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    index = json.load(open(index_path)) if os.path.exists(index_path) else None
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        out = {}
        for k, t in load_file(os.path.join(path, name)).items():
            if k.endswith("proj.weight"):
                out[k], out[k + "_scale_inv"] = quant_fp8_block(t, *block)
                if index:
                    index["weight_map"][k + "_scale_inv"] = name
            else:
                out[k] = t
        save_file(out, os.path.join(path, name), metadata={"format": "pt"})
    if index:
        json.dump(index, open(index_path, "w"), indent=2, sort_keys=True)
    cfg_path = os.path.join(path, "config.json")
    c = json.load(open(cfg_path))
    c["quantization_config"] = qc(block)
    json.dump(c, open(cfg_path, "w"), indent=2, sort_keys=True)


def write_qwen3(path):
    torch.manual_seed(5)
    cfg = Qwen3Config(vocab_size=300, hidden_size=192, intermediate_size=320,
                      num_hidden_layers=2, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=64,
                      tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    quantize_dir(path, QWEN3_BLOCK)


def write_moe(path):
    torch.manual_seed(6)
    cfg = Qwen3MoeConfig(vocab_size=300, hidden_size=96,
                         intermediate_size=200, moe_intermediate_size=80,
                         num_hidden_layers=2, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=40, num_experts=4,
                         num_experts_per_tok=2, decoder_sparse_step=1,
                         mlp_only_layers=[], tie_word_embeddings=False)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(
        path, max_shard_size="200KB")
    quantize_dir(path, MOE_BLOCK)


QWEN3_BLOCK = (64, 32)
MOE_BLOCK = (32, 64)


class Env:
    root = None
    mnt = None


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-qblock-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    write_qwen3(os.path.join(src, "qwen3-fp8"))
    write_moe(os.path.join(src, "moe-fp8"))
    # Scales in 128x128 blocks under a config that declares 64x64.
    bad = os.path.join(src, "wrong-block")
    os.mkdir(bad)
    q, s = quant_fp8_block(torch.randn(200, 200), 128, 128)
    save_file({"model.up_proj.weight": q, "model.up_proj.weight_scale_inv": s},
              os.path.join(bad, "model.safetensors"))
    json.dump({"model_type": "llama", "quantization_config": qc((64, 64))},
              open(os.path.join(bad, "config.json"), "w"))
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


def check_loads(test, view):
    with open(os.path.join(view, "config.json")) as f:
        cfg = json.load(f)
    test.assertNotIn("quantization_config", cfg)
    model, info = load_quiet(view, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        test.assertEqual(list(info.get(k, [])), [], k)
    return model


def check_same(test, a, b):
    sa, sb = dict(a.state_dict()), dict(b.state_dict())
    test.assertEqual(sorted(sa), sorted(sb))
    for k in sa:
        test.assertEqual(sa[k].dtype, sb[k].dtype, k)
        test.assertTrue(torch.equal(bits(sa[k]), bits(sb[k])), k)
    ids = torch.arange(24).reshape(1, 24)
    with torch.no_grad():
        test.assertTrue(torch.equal(a(ids).logits, b(ids).logits))


class BlockSize(unittest.TestCase):
    def test_qwen3_equals_transformers(self):
        """transformers dequantizes the [64, 32] source itself on CPU."""
        model = check_loads(self, Env.mnt.join("qwen3-fp8.bf16"))
        tf = load_quiet(os.path.join(Env.mnt.source, "qwen3-fp8"))
        check_same(self, model, tf)
        # The oracle of the edge-block test agrees where both apply.
        ref = reference_state(os.path.join(Env.mnt.source, "qwen3-fp8"),
                              QWEN3_BLOCK)
        sd = dict(model.state_dict())
        k = "model.layers.1.mlp.down_proj.weight"
        self.assertTrue(torch.equal(bits(sd[k]), bits(ref[k])))

    def test_moe_edge_blocks(self):
        """[32, 64] blocks with partial edges: DeepSeek's rule."""
        src = os.path.join(Env.mnt.source, "moe-fp8")
        self.assertTrue(os.path.exists(
            os.path.join(src, "model.safetensors.index.json")))
        model = check_loads(self, Env.mnt.join("moe-fp8.bf16"))
        ref = reference_state(src, MOE_BLOCK)
        ref_dir = os.path.join(Env.root, "moe-ref")
        os.mkdir(ref_dir)
        save_file(ref, os.path.join(ref_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        cfg = json.load(open(os.path.join(src, "config.json")))
        del cfg["quantization_config"]
        json.dump(cfg, open(os.path.join(ref_dir, "config.json"), "w"))
        check_same(self, model, load_quiet(ref_dir))
        idx = json.load(open(Env.mnt.join(
            "moe-fp8.bf16", "model.safetensors.index.json")))
        self.assertEqual(sorted(idx["weight_map"]), sorted(ref))

    def test_moe_edge_refused_by_transformers(self):
        """Why castfs follows DeepSeek's kernel for these shapes."""
        src = os.path.join(Env.mnt.source, "moe-fp8")
        sd = {}
        for n in os.listdir(src):
            if n.endswith(".safetensors"):
                sd.update(load_file(os.path.join(src, n)))
        k = "model.layers.0.mlp.experts.0.gate_proj.weight"  # [80, 96]
        with self.assertRaises(ValueError):
            Fp8Dequantize(None)._dequantize_one(
                sd[k], sd[k + "_scale_inv"], output_dtype=torch.bfloat16)

    def test_single_file_views(self):
        """A shard's own fp32 view, tensor by tensor, and its byte ranges."""
        src = os.path.join(Env.mnt.source, "qwen3-fp8", "model.safetensors")
        sd = load_file(src)
        exp = {}
        for k, t in sd.items():
            if k.endswith("_scale_inv"):
                continue
            exp[k] = t
            if k + "_scale_inv" in sd:
                exp[k] = deepseek_dequant(t, sd[k + "_scale_inv"],
                                          *QWEN3_BLOCK)
        want = save(exp, metadata={"format": "pt"})
        path = Env.mnt.join("qwen3-fp8", "model.fp32.safetensors")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), want)
        tl.check_ranges(self, path, want, count=40)

    def test_wrong_block_refused(self):
        names = os.listdir(Env.mnt.path)
        self.assertEqual([n for n in names if n.startswith("wrong-block.")],
                         [])
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            reasons = [r["reason"] for r in json.load(f)
                       if r["path"].startswith("wrong-block/")]
        self.assertTrue(reasons, reasons)
        self.assertIn("64x64 block", reasons[0])
        self.assertIn("'model.up_proj.weight_scale_inv'", reasons[0])


class CommandLine(unittest.TestCase):
    def run_cli(self, *args):
        return tl.subprocess.run([tl.castfs_binary()] + list(args),
                                 capture_output=True, text=True)

    def shard(self):
        src = os.path.join(Env.mnt.source, "moe-fp8")
        idx = json.load(open(os.path.join(
            src, "model.safetensors.index.json")))
        return os.path.join(src, idx["weight_map"][
            "model.layers.0.mlp.experts.0.gate_proj.weight"])

    def test_info_shows_block(self):
        r = self.run_cli("info", self.shard())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("fp8 block 32x64, F32 scale "
                      "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
                      r.stdout)

    def test_convert_bf16(self):
        shard = self.shard()
        out = os.path.join(Env.root, "shard.bf16.safetensors")
        r = self.run_cli("convert", shard, "--view", "bf16", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        sd = load_file(shard)
        exp = {k: (deepseek_dequant(t, sd[k + "_scale_inv"], *MOE_BLOCK)
                   .to(torch.bfloat16) if k + "_scale_inv" in sd else t)
               for k, t in sd.items() if not k.endswith("_scale_inv")}
        with open(out, "rb") as f:
            self.assertEqual(f.read(), save(exp, metadata={"format": "pt"}))


if __name__ == "__main__":
    tl.main()
