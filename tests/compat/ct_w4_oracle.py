# SPDX-License-Identifier: MIT
"""The oracle side of test_ct_w4_src.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor + compressed-tensors.

python ct_w4_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize:   [[src_dir, out_dir, strategy(, shard)], ...]  data-free
      oneshot of
      symmetric int4 weights ("group": groups of 128, W4A16's; "channel"),
      or asymmetric ones ("asym-group": llm-compressor's W4A16_ASYM
      preset; "asym-channel": the same per channel), lm_head ignored,
      save_pretrained(save_compressed=True): the pack-quantized source
      castfs reads;
  decompress: [[ct_dir, out_file], ...]  every module of @ct_dir through
      compressed-tensors' own PackedQuantizationCompressor.decompress, the
      other tensors as stored, saved to @out_file: what DIR.<view>/ of the
      source must hold.
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
    asym = strategy.startswith("asym-")
    strategy = strategy[len("asym-"):] if asym else strategy
    w = {"num_bits": 4, "type": "int", "symmetric": not asym,
         "dynamic": False, "strategy": strategy}
    if strategy == "group":
        w["group_size"] = 128
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    if asym and strategy == "group":
        mod = QuantizationModifier(targets="Linear", scheme="W4A16_ASYM",
                                   ignore=["lm_head"])
    else:
        mod = QuantizationModifier(
            config_groups={"group_0": {"targets": ["Linear"], "weights": w}},
            ignore=["lm_head"])
    oneshot(model=m, recipe=mod)
    if shard:  # transformers' sharder splits modules across shards
        m.save_pretrained(out, save_compressed=True, max_shard_size=shard)
    else:
        m.save_pretrained(out, save_compressed=True)
    return True


def decompress(ct_dir, out_file):
    from compressed_tensors.compressors.pack_quantized.base import \
        PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    qc = json.load(open(os.path.join(ct_dir, "config.json")))
    qc = QuantizationConfig.model_validate(qc["quantization_config"])
    (scheme,) = qc.config_groups.values()
    sd = {}
    for n in sorted(os.listdir(ct_dir)):
        if n.endswith(".safetensors"):
            sd.update(load_file(os.path.join(ct_dir, n)))
    out = {}
    for k, t in sd.items():
        if k.endswith(".weight_packed"):
            mod = k[:-len(".weight_packed")]
            local = {n[len(mod) + 1:]: v for n, v in sd.items()
                     if n.startswith(mod + ".weight_")}
            out[mod + ".weight"] = PackedQuantizationCompressor.decompress(
                local, scheme)["weight"]
        elif ".weight_" not in k:
            out[k] = t
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
    return len(out)


def main():
    jobs = json.load(open(sys.argv[1]))
    res = {"quantize": [quantize(*j) for j in jobs.get("quantize", [])],
           "decompress": [decompress(*j) for j in jobs.get("decompress", [])]}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
