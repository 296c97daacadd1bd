# SPDX-License-Identifier: MIT
"""The oracle side of test_ct4_src.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor + compressed-tensors.

python ct4_src_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize:   [[src_dir, out_dir, scheme(, shard)], ...]  data-free
      oneshot of the
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
      arange(20), saved to @out_file ("logits" is the logits);
  craft:      [[src_file, out_file], ...]  a single file of hand-made
      packed weights that covers the arithmetic: every E2M1 code under
      every scale byte (NVFP4: each F8_E4M3 byte, with several global
      scales; MXFP4: each exponent byte), saved to @src_file, and each
      through its compressor's decompress with the preset's scheme
      (NVFP4A16 / MXFP4A16), saved to @out_file.
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


def quantize(src, out, scheme, shard=None):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    oneshot(model=m, recipe=QuantizationModifier(
        targets="Linear", scheme=scheme, ignore=["lm_head"]))
    if shard:  # transformers' sharder splits modules across shards
        m.save_pretrained(out, save_compressed=True, max_shard_size=shard)
    else:
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


def bf16_once(x):
    """Float64 @x rounded once to bf16 (to nearest even), as float32."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(m * 256) / 256, e).float()


def hard_gscales():
    """Global scales under which a shortcut in the arithmetic changes a
    bf16 result for some E4M3 scale and code: a multiply by the reciprocal
    instead of the division, or the product rounded once to bf16 instead
    of to fp32 first (found by torch, not by castfs)."""
    torch.manual_seed(0)
    g = (torch.rand(40000, dtype=torch.float64) * 3000 + 1).float()
    s = torch.arange(1, 127, dtype=torch.uint8).view(
        torch.float8_e4m3fn).float()
    div = s[None, :] / g[:, None]
    rcp = s[None, :] * (1 / g)[:, None]
    hit = div.bfloat16().view(torch.int16) != rcp.bfloat16().view(torch.int16)
    out = g[hit.any(1)][:3].tolist()
    v = torch.tensor([1.5, 3.0, 6.0])
    ref = (div[..., None] * v).bfloat16().float()
    once = bf16_once(div.double()[..., None] * v.double())
    hit = (ref != once).flatten(1)
    return list(dict.fromkeys(out + g[hit.any(1)][:3].tolist()))


# Global scales: llm-compressor's kind (448 x 6 / amax), a few others,
# and the hard ones.
GSCALES = [29952.0, 1234.567, 3.3e-5, 7.0, 0.1]


def craft(src_file, out_file):
    from compressed_tensors.quantization import preset_name_to_scheme
    # Row r, group g: scale byte r; the 16 codes in order, twice per
    # 32-element group (low nibble = even element).
    codes = torch.arange(16, dtype=torch.uint8)
    row = (codes[0::2] | (codes[1::2] << 4)).repeat(2)  # 16 bytes, 32 elems
    packed = row.repeat(256, 1).contiguous()
    nv_scale = torch.arange(256, dtype=torch.uint8).reshape(256, 1) \
        .repeat(1, 2).view(torch.float8_e4m3fn)
    mx_scale = torch.arange(256, dtype=torch.uint8).reshape(256, 1)
    src, out = {}, {}
    nv = preset_name_to_scheme("NVFP4A16", ["Linear"])
    mx = preset_name_to_scheme("MXFP4A16", ["Linear"])
    for i, gs in enumerate(GSCALES + hard_gscales()):
        local = {"weight_packed": packed, "weight_scale": nv_scale,
                 "weight_global_scale": torch.tensor([gs],
                                                     dtype=torch.float32)}
        for k, v in local.items():
            src["nv%d.%s" % (i, k)] = v
        out["nv%d.weight" % i] = compressor("nvfp4-pack-quantized") \
            .decompress(local, nv)["weight"]
    local = {"weight_packed": packed, "weight_scale": mx_scale}
    for k, v in local.items():
        src["mx." + k] = v
    out["mx.weight"] = compressor("mxfp4-pack-quantized") \
        .decompress(local, mx)["weight"]
    save_file({k: v.clone() for k, v in src.items()}, src_file)
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
    return len(out)


def main():
    jobs = json.load(open(sys.argv[1]))
    res = {"quantize": [quantize(*j) for j in jobs.get("quantize", [])],
           "decompress": [decompress(*j) for j in jobs.get("decompress", [])],
           "load": [load(*j) for j in jobs.get("load", [])],
           "craft": [craft(*j) for j in jobs.get("craft", [])]}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
