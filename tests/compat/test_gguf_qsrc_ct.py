# SPDX-License-Identifier: MIT
"""GGUF files of compressed-tensors sources (docs/FORMATS.md, "GGUF of a
quantized source"): DIR.<q>.gguf of a folder llm-compressor quantized
(FP8 per channel, float-quantized; int4 per channel, pack-quantized,
also saved in 20 KB shards with modules split across them; NVFP4A16, nvfp4-pack-quantized)
equals, byte for byte, DIR.<q>.gguf of the bf16 model that
compressed-tensors' own decompressor gives (FloatQuantizationCompressor /
PackedQuantizationCompressor / NVFP4PackedCompressor.decompress, run in
the llm-compressor venv by ct_src_oracle.py / ct_w4_oracle.py /
ct4_src_oracle.py, then torch's bf16 cast). The model is
test_gguf_llm's tiny Qwen3 with its BPE tokenizer, saved in bfloat16.
Exits 77 without the llm-compressor venv (scripts/setup-llmc).
"""
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
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM
        from quant_src_common import INDEX, end_module, require_venv, \
            run_oracle, split_modules, weight_map
        from test_gguf_llm import make_model
        from test_gguf_qsrc import TEXTS, VIEWS, copy_texts, read, save
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

# name -> (oracle script, strategy)
SOURCES = {"qwen3-ct-fp8": ("ct_src_oracle.py", "channel"),
           "qwen3-ct-w4": ("ct_w4_oracle.py", "channel"),
           "qwen3-ct-nvfp4": ("ct4_src_oracle.py", "NVFP4A16")}
# saved by the same llm-compressor run as qwen3-ct-w4, in small shards
SHARDED, SHARD_SIZE = "qwen3-ct-w4-sharded", "20KB"


class Env:
    root = None
    mnt = None
    wmap = None  # SHARDED's weight_map


def bf16_base(root):
    """test_gguf_llm's Qwen3 saved in bfloat16, with its tokenizer."""
    fp32, out = os.path.join(root, "qwen3"), os.path.join(root, "qwen3-bf16")
    make_model(fp32, "qwen3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModelForCausalLM.from_pretrained(
            fp32, dtype=torch.bfloat16).save_pretrained(out)
    for f in TEXTS[1:]:
        shutil.copy(os.path.join(fp32, f), out)
    return out


def setUpModule():
    require_venv()
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-gguf-qsrc-ct-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    base = bf16_base(Env.root)
    for name, (script, strategy) in SOURCES.items():
        out, deq = os.path.join(src, name), os.path.join(Env.root, name)
        jobs = {"quantize": [[base, out, strategy]],
                "decompress": [[out, deq + ".ref"]]}
        if name + "-sharded" == SHARDED:
            sh = os.path.join(src, SHARDED)
            jobs["quantize"].append([base, sh, strategy, SHARD_SIZE])
            jobs["decompress"].append([sh, os.path.join(Env.root, SHARDED)
                                       + ".ref"])
        run_oracle(script, jobs, Env.root)
        if len(jobs["quantize"]) > 1:
            resplit(os.path.join(src, SHARDED))
        for job in jobs["decompress"]:
            ref_folder(base, job[0], job[1])
    Env.mnt = tl.Mount(src)


def resplit(folder):
    """Move weight_scale and weight_shape of every other int4 module to
    the next shard (transformers 5 keeps a module in one shard; an index
    need not), rewriting @folder's shards and index in place."""
    w = weight_map(folder)
    shards = sorted(set(w.values()))
    sd = {}
    for f in shards:
        sd.update(load_file(os.path.join(folder, f)))
        os.remove(os.path.join(folder, f))
    xs = dict(w)
    packed = sorted(k for k in w if k.endswith(".weight_packed"))
    for k in packed[1::2]:
        nxt = shards[(shards.index(w[k]) + 1) % len(shards)]
        for leaf in ("scale", "shape"):
            xs[k[:-len("packed")] + leaf] = nxt
    save(folder, sd, xs)


def ref_folder(base, out, deq):
    """@out-ref: the bf16 cast of decompressed @deq, sharded as @out's
    weights are (GGUF orders tensors by shard)."""
    for f in TEXTS[1:]:
        shutil.copy(os.path.join(base, f), out)
    ref = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
           for k, v in load_file(deq).items()}
    wmap = None
    if os.path.exists(os.path.join(out, INDEX)):
        w = weight_map(out)
        wmap = {k: w[k] if k in w else w[k + "_packed"] for k in ref}
        Env.wmap = w
    copy_texts(base, out + "-ref")
    save(out + "-ref", ref, wmap)


def tearDownModule():
    end_module(Env)


class CompressedTensorsGGUF(unittest.TestCase):
    def test_equal_decompressed(self):
        for name in SOURCES:
            with open(os.path.join(Env.mnt.source, name,
                                   "config.json")) as f:
                qc = json.load(f)["quantization_config"]
            self.assertEqual(qc["quant_method"], "compressed-tensors")
            sd = load_file(os.path.join(Env.mnt.source, name,
                                        "model.safetensors"))
            self.assertTrue([k for k, t in sd.items()
                             if k.endswith("weight_packed") or
                             t.dtype == torch.float8_e4m3fn], name)
            for v in VIEWS:
                with self.subTest(model=name, view=v):
                    got = read(Env.mnt.join("%s.%s.gguf" % (name, v)))
                    want = read(Env.mnt.join("%s-ref.%s.gguf" % (name, v)))
                    self.assertTrue(got == want, "%s %s" % (name, v))

    def test_sharded_int4(self):
        """The int4 model saved in 20 KB shards, re-split so that every
        other module's weight_scale and weight_shape lie in the next
        shard: each GGUF file is the one of its decompressed bf16 model
        (decompressed before the re-split), sharded as the weights are."""
        w = Env.wmap
        self.assertGreater(len(set(w.values())), 2)
        split = split_modules(w, ("scale", "shape"))
        self.assertTrue(split, "no int4 module straddles shards")
        for v in VIEWS:
            with self.subTest(view=v):
                got = read(Env.mnt.join("%s.%s.gguf" % (SHARDED, v)))
                want = read(Env.mnt.join("%s-ref.%s.gguf" % (SHARDED, v)))
                self.assertTrue(got == want, v)


if __name__ == "__main__":
    tl.main()
