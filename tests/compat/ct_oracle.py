# SPDX-License-Identifier: MIT
"""The oracle side of test_ct.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor 0.14 + compressed-tensors 0.19.

python ct_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize: [[src_dir, out_dir, scheme], ...]  data-free oneshot of
      QuantizationModifier(targets="Linear", scheme=..., ignore=["lm_head"])
      then save_pretrained(save_compressed=True): what the views must equal;
  config:   [[ours_config_json, theirs_config_json], ...]  both
      quantization_configs through compressed-tensors' QuantizationConfig;
  load:     [[src_dir, view_dir, block], ...] (block 0: channel scales)  transformers loads the view (with
      compressed-tensors decompressing it on CPU): loading info, logits
      against the source's, and each dequantised weight against its source.
"""
import json
import logging
import sys
import warnings

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def quantize(src, out, scheme):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    oneshot(model=m, recipe=QuantizationModifier(
        targets="Linear", scheme=scheme, ignore=["lm_head"]))
    m.save_pretrained(out, save_compressed=True)
    return True


def config(ours, theirs):
    from compressed_tensors.quantization import QuantizationConfig
    q = [json.load(open(p))["quantization_config"] for p in (ours, theirs)]
    d = [QuantizationConfig.model_validate(x).model_dump() for x in q]
    return {"equal": d[0] == d[1], "ours": d[0], "theirs": d[1],
            "keys": sorted(q[0])}


def weight_bound(w, s):
    """|dequant - w| allowed: fp8 e4m3 rounding (half a step: 2^-4
    relative, 2^-10 of the scale below the normals) plus the bf16 roundings
    of x/scale and of the product."""
    return w.abs() * (2.0 ** -4 + 2.0 ** -7) + s * 2.0 ** -9


def scale_map(w, block):
    """The absmax/448 each element of @w was scaled by: its row's, or its
    128x128 block's (edge blocks cut by the matrix)."""
    a = w.abs()
    if not block:
        return a.amax(dim=1, keepdim=True) / 448.0
    r, c = a.shape
    pr, pc = -r % block, -c % block
    p = torch.nn.functional.pad(a, (0, pc, 0, pr))
    m = p.reshape((r + pr) // block, block, (c + pc) // block, block).amax(dim=(1, 3))
    m = m.repeat_interleave(block, 0).repeat_interleave(block, 1)
    return m[:r, :c] / 448.0


def load(src, view, block):
    ids = torch.arange(0, 96).reshape(2, 48) % 97
    ref_m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    m, info = AutoModelForCausalLM.from_pretrained(view, output_loading_info=True)
    with torch.no_grad():
        ref = ref_m(ids).logits.float()
        out = m(ids).logits.float()
    sd, sref = m.state_dict(), ref_m.state_dict()
    worst, nq = 0.0, 0
    for name, mod in ref_m.named_modules():
        if not isinstance(mod, torch.nn.Linear) or name == "lm_head":
            continue
        w = sref[name + ".weight"].float()
        deq = sd[name + ".weight"].float()
        if deq.shape != w.shape:
            return {"error": "%s: shape %s" % (name, tuple(deq.shape))}
        s = scale_map(w, block)
        worst = max(worst, ((deq - w).abs() / weight_bound(w, s)).max().item())
        nq += 1
    return {"info": {k: [str(x) for x in v] for k, v in info.items()},
            "max_dlogits": (out - ref).abs().max().item(),
            "max_ref": ref.abs().max().item(),
            "weight_err_over_bound": worst, "linear_checked": nq,
            "dtype": str(sd["model.layers.0.mlp.up_proj.weight"].dtype)}


def main():
    jobs = json.load(open(sys.argv[1]))
    res = {"quantize": [quantize(*j) for j in jobs.get("quantize", [])],
           "config": [config(*j) for j in jobs.get("config", [])],
           "load": [load(*j) for j in jobs.get("load", [])]}
    print("\nRESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
