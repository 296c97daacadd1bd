# SPDX-License-Identifier: MIT
"""GGUF files of compressed-tensors sources (docs/FORMATS.md, "GGUF of a
quantized source"): DIR.<q>.gguf of a folder llm-compressor quantized
(FP8 per channel, float-quantized; int4 per channel, pack-quantized;
NVFP4A16, nvfp4-pack-quantized)
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
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM
        from test_ct import VENV_PY
        from test_gguf_llm import make_model
        from test_gguf_qsrc import TEXTS, VIEWS, copy_texts, read, save
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> (oracle script, strategy)
SOURCES = {"qwen3-ct-fp8": ("ct_src_oracle.py", "channel"),
           "qwen3-ct-w4": ("ct_w4_oracle.py", "channel"),
           "qwen3-ct-nvfp4": ("ct4_src_oracle.py", "NVFP4A16")}


class Env:
    root = None
    mnt = None


def run_oracle(script, jobs):
    path = os.path.join(Env.root, script + ".json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    p = subprocess.run([VENV_PY, os.path.join(HERE, script), path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("%s failed:\n%s%s" % (script, p.stdout[-3000:],
                                                   p.stderr[-6000:]))


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
    if not os.path.exists(VENV_PY):
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)"
              % VENV_PY)
        sys.exit(tl.SKIP)
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-gguf-qsrc-ct-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    base = bf16_base(Env.root)
    for name, (script, strategy) in SOURCES.items():
        out, deq = os.path.join(src, name), os.path.join(Env.root, name)
        run_oracle(script, {"quantize": [[base, out, strategy]],
                            "decompress": [[out, deq + ".ref"]]})
        for f in TEXTS[1:]:
            shutil.copy(os.path.join(base, f), out)
        ref = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
               for k, v in load_file(deq + ".ref").items()}
        copy_texts(base, os.path.join(src, name + "-ref"))
        save(os.path.join(src, name + "-ref"), ref)
    Env.mnt = tl.Mount(src)


def tearDownModule():
    rc = Env.mnt.unmount() if Env.mnt else 0
    if Env.root:
        shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


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


if __name__ == "__main__":
    tl.main()
