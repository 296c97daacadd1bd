# SPDX-License-Identifier: MIT
"""The oracle side of test_ct4_src.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor + compressed-tensors.

python ct4_src_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize:   [[src_dir, out_dir, scheme], ...]  data-free oneshot of the
      preset @scheme ("NVFP4A16" or "MXFP4A16"; lm_head ignored) to every
      Linear, save_pretrained(save_compressed=True): the
      nvfp4-pack-quantized / mxfp4-pack-quantized source castfs reads;
  decompress: [[ct_dir, out_file], ...]  every module of @ct_dir through
      compressed-tensors' own compressor (NVFP4PackedCompressor /
      MXFP4PackedCompressor .decompress), the other tensors as stored,
      saved to @out_file: what DIR.<view>/ of the source must hold;
  load:       [[ct_dir, out_file], ...]  transformers' from_pretrained of
      @ct_dir in bf16 with CompressedTensorsConfig(dequantize=True) (its
      CPU dequantization): its state dict and the logits of
      arange(20), saved to @out_file ("logits" is the logits).
"""
import json
import logging
import os
import sys
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402,F401
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

# The tensors of a module that its compressor folds into its weight.
COMPANIONS = ("weight_scale", "weight_global_scale", "input_global_scale")


def quantize(src, out, scheme):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    oneshot(model=m, recipe=QuantizationModifier(
        targets="Linear", scheme=scheme, ignore=["lm_head"]))
    m.save_pretrained(out, save_compressed=True)
    return True


def compressor(fmt):
    from compressed_tensors.compressors.mxfp4.base import \
        MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.base import \
        NVFP4PackedCompressor
    return {"nvfp4-pack-quantized": NVFP4PackedCompressor,
            "mxfp4-pack-quantized": MXFP4PackedCompressor}[fmt]


def decompress(ct_dir, out_file):
    from compressed_tensors.quantization import QuantizationConfig
    qc = json.load(open(os.path.join(ct_dir, "config.json")))
    comp = compressor(qc["quantization_config"]["format"])
    qc = QuantizationConfig.model_validate(qc["quantization_config"])
    (scheme,) = qc.config_groups.values()
    sd = {}
    for n in sorted(os.listdir(ct_dir)):
        if n.endswith(".safetensors"):
            sd.update(load_file(os.path.join(ct_dir, n)))
    out = {}
    for k, t in sd.items():
        mod, leaf = k.rsplit(".", 1)
        if leaf == "weight_packed":
            local = {c: sd[mod + "." + c] for c in COMPANIONS
                     if mod + "." + c in sd}
            local["weight_packed"] = t
            out[mod + ".weight"] = comp.decompress(local, scheme)["weight"]
        elif leaf not in COMPANIONS or mod + ".weight_packed" not in sd:
            out[k] = t
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
    return len(out)


def load(ct_dir, out_file):
    from transformers.utils.quantization_config import \
        CompressedTensorsConfig
    m = AutoModelForCausalLM.from_pretrained(
        ct_dir, dtype=torch.bfloat16,
        quantization_config=CompressedTensorsConfig(dequantize=True))
    with torch.no_grad():
        logits = m(torch.arange(20).reshape(1, 20)).logits
    out = {k: v.contiguous() for k, v in m.state_dict().items()}
    out["logits"] = logits.contiguous()
    save_file(out, out_file)
    return len(out)


def main():
    jobs = json.load(open(sys.argv[1]))
    res = {"quantize": [quantize(*j) for j in jobs.get("quantize", [])],
           "decompress": [decompress(*j) for j in jobs.get("decompress", [])],
           "load": [load(*j) for j in jobs.get("load", [])]}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
