# SPDX-License-Identifier: MIT
"""The oracle side of test_ct_src.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor + compressed-tensors.

python ct_src_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize:   [[src_dir, out_dir, strategy(, max_shard_size)], ...]
      data-free oneshot of
      FP8 E4M3 weights with that strategy ("tensor", "channel", "block"
      128x128; lm_head ignored), save_pretrained(save_compressed=True):
      the compressed-tensors source castfs reads;
  decompress: [[ct_dir, out_file], ...]  every module of @ct_dir through
      compressed-tensors' own FloatQuantizationCompressor.decompress, the
      other tensors as stored, saved to @out_file: what DIR.<view>/ of the
      source must hold;
  try:        [[ct_dir, out_file], ...]  the same, but a decompressor that
      fails gives its error (a string) instead of stopping: whether
      compressed-tensors reads the folder at all.
"""
import json
import logging
import os
import sys
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def quantize(src, out, strategy, shard=None):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    w = {"num_bits": 8, "type": "float", "symmetric": True,
         "dynamic": False, "strategy": strategy}
    if strategy == "block":
        w["block_structure"] = [128, 128]
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    oneshot(model=m, recipe=QuantizationModifier(
        config_groups={"group_0": {"targets": ["Linear"], "weights": w}},
        ignore=["lm_head"]))
    if shard:
        m.save_pretrained(out, save_compressed=True, max_shard_size=shard)
    else:
        m.save_pretrained(out, save_compressed=True)
    return True


def decompress(ct_dir, out_file):
    from compressed_tensors.compressors.naive_quantized.base import \
        FloatQuantizationCompressor, NaiveQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    qc = json.load(open(os.path.join(ct_dir, "config.json")))
    comp = {"float-quantized": FloatQuantizationCompressor,
            "naive-quantized": NaiveQuantizationCompressor}[
                qc["quantization_config"]["format"]]
    qc = QuantizationConfig.model_validate(qc["quantization_config"])
    (scheme,) = qc.config_groups.values()
    sd = {}
    for n in sorted(os.listdir(ct_dir)):
        if n.endswith(".safetensors"):
            sd.update(load_file(os.path.join(ct_dir, n)))
    out = {}
    for k, t in sd.items():
        mod = k.rsplit(".", 1)[0]
        if mod + ".weight_scale" in sd:
            if k.endswith(".weight"):
                local = {"weight": t, "weight_scale": sd[mod + ".weight_scale"]}
                out[k] = comp.decompress(
                    local, scheme)["weight"]
            continue  # scales: folded into their weight
        out[k] = t
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
    return len(out)


def try_decompress(ct_dir, out_file):
    try:
        return decompress(ct_dir, out_file)
    except Exception as e:  # the verdict itself
        return "%s: %s" % (type(e).__name__, e)


def main():
    jobs = json.load(open(sys.argv[1]))
    res = {"quantize": [quantize(*j) for j in jobs.get("quantize", [])],
           "decompress": [decompress(*j) for j in jobs.get("decompress", [])],
           "try": [try_decompress(*j) for j in jobs.get("try", [])]}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
