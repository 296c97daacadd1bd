# SPDX-License-Identifier: MIT
"""The oracle side of test_ct.py, run in the llm-compressor venv
(scripts/setup-llmc): llm-compressor 0.14 + compressed-tensors 0.19.

python ct_oracle.py JOBS.json prints one JSON line of results. Jobs:
  quantize: [[src_dir, out_dir, scheme(, extra_ignore)], ...]  data-free
      oneshot of QuantizationModifier(targets="Linear", scheme=...,
      ignore=["lm_head"] + the Linear layers the scheme's group does not
      divide + extra_ignore) then save_pretrained(save_compressed=True):
      what the views must equal;
  config:   [[ours_config_json, theirs_config_json], ...]  both
      quantization_configs through compressed-tensors' QuantizationConfig;
  load:     [[src_dir, view_dir, kind], ...] (kind: channel, block, group,
      fp4)  transformers loads the view (with
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


GROUP = {"W4A16": 128, "NVFP4A16": 16}


def quantize(src, out, scheme, extra_ignore=()):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    m = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    ignore = ["lm_head"] + list(extra_ignore)
    if scheme in GROUP:  # llm-compressor refuses widths the group cuts
        ignore += sorted(n for n, x in m.named_modules()
                         if isinstance(x, torch.nn.Linear) and n != "lm_head"
                         and x.in_features % GROUP[scheme])
    oneshot(model=m, recipe=QuantizationModifier(
        targets="Linear", scheme=scheme, ignore=ignore))
    m.save_pretrained(out, save_compressed=True)
    return True


def config(ours, theirs):
    from compressed_tensors.quantization import QuantizationConfig
    q = [json.load(open(p)).get("quantization_config") for p in (ours, theirs)]
    if q[0] is None or q[1] is None:  # nothing quantised: no config
        return {"equal": q[0] is None and q[1] is None, "keys": []}
    d = [QuantizationConfig.model_validate(x).model_dump() for x in q]
    # NVFP4: castfs leaves out scale_dtype (compressed-tensors <= 0.12
    # forbids it); without it the compressor stores float8_e4m3fn anyway
    # (NVFP4PackedCompressor._compress_scale), the dtype the oracle names.
    for g0, g1 in zip(d[0]["config_groups"].values(),
                      d[1]["config_groups"].values()):
        if (d[1]["format"] == "nvfp4-pack-quantized"
                and g0["weights"]["scale_dtype"] is None
                and str(g1["weights"]["scale_dtype"]) == "torch.float8_e4m3fn"):
            g0["weights"]["scale_dtype"] = g1["weights"]["scale_dtype"]
    for x in d:  # llm-compressor reorders the ignore list it was given
        x["ignore"] = sorted(x["ignore"])
    return {"equal": d[0] == d[1], "ours": d[0], "theirs": d[1],
            "keys": sorted(q[0])}


def weight_bound(w, s):
    """|dequant - w| allowed: fp8 e4m3 rounding (half a step: 2^-4
    relative, 2^-10 of the scale below the normals) plus the bf16 roundings
    of x/scale and of the product."""
    return w.abs() * (2.0 ** -4 + 2.0 ** -7) + s * 2.0 ** -9


def scale_map(w, kind):
    """The scale each element of @w was quantised with (before rounding):
    its row's, 128x128 block's (edge blocks cut by the matrix), 128-column
    group's or 16-column group's absmax over 448 (fp8), 7.5 (int4) or 6
    (fp4)."""
    a = w.abs()
    if kind == "channel":
        return a.amax(dim=1, keepdim=True) / 448.0
    bh, g, rng = {"block": (128, 128, 448.0), "group": (1, 128, 7.5),
                  "fp4": (1, 16, 6.0)}[kind]
    r, c = a.shape
    pr, pc = -r % bh, -c % g
    p = torch.nn.functional.pad(a, (0, pc, 0, pr))
    m = p.reshape((r + pr) // bh, bh, (c + pc) // g, g).amax(dim=(1, 3))
    m = m.repeat_interleave(bh, 0).repeat_interleave(g, 1)
    return m[:r, :c] / rng


def weight_bound_w4(w, s):
    """int4: half a step (and the clamp of +7.5 to 7) plus the bf16
    roundings of x/scale and of the product."""
    return s * (0.5 + 2.0 ** -5) + w.abs() * 2.0 ** -8


def weight_bound_fp4(w, s, gabs):
    """fp4 e2m1: half a grid step (at most 1 in units of the group's
    scale, above 4), the e4m3 rounding of the group scale (2^-4 relative;
    its subnormal step 2^-9 / global scale = gabs * 2^-9 / 2688 absolute,
    times 6) and the bf16 roundings."""
    return s * (1.0 + 2.0 ** -3) + w.abs() * 2.0 ** -7 + gabs * 2.0 ** -17


def load(src, view, kind):
    ids = torch.arange(0, 96).reshape(2, 48) % 97
    ref_m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    m, info = AutoModelForCausalLM.from_pretrained(view, output_loading_info=True)
    with torch.no_grad():
        ref = ref_m(ids).logits.float()
        out = m(ids).logits.float()
    sd, sref = m.state_dict(), ref_m.state_dict()
    worst, nq = 0.0, 0
    gabs = max(v.float().abs().max().item() for k, v in sref.items()
               if k.endswith("proj.weight"))
    for name, mod in ref_m.named_modules():
        if not isinstance(mod, torch.nn.Linear) or name == "lm_head":
            continue
        w = sref[name + ".weight"].float()
        deq = sd[name + ".weight"].float()
        if deq.shape != w.shape:
            return {"error": "%s: shape %s" % (name, tuple(deq.shape))}
        s = scale_map(w, kind)
        if kind == "fp4":  # gabs: at least the fused group's absmax
            bound = weight_bound_fp4(w, s, gabs)
        elif kind == "group":
            bound = weight_bound_w4(w, s)
        else:
            bound = weight_bound(w, s)
        worst = max(worst, ((deq - w).abs() / bound).max().item())
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
