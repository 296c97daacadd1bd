#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generate the bundled sample model directory that `scripts/run` mounts
when no source is given: small random-weight models with real tensor names.

  sample/flux-tiny.safetensors    Flux transformer names (original layout), bf16
  sample/llama-tiny/              a transformers LlamaForCausalLM, sharded
  sample/broken.safetensors       a truncated file, to show /.castfs/rejected
  sample/README.txt               passed through unchanged
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file


def flux_tiny(path):
    g = torch.Generator().manual_seed(1)
    h = 64

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    t = {"img_in.weight": w(h, 16), "img_in.bias": w(h),
         "txt_in.weight": w(h, 32), "txt_in.bias": w(h),
         "final_layer.linear.weight": w(16, h)}
    for i in range(2):
        p = "double_blocks.%d." % i
        for s in ("img", "txt"):
            t[p + s + "_attn.qkv.weight"] = w(3 * h, h)
            t[p + s + "_attn.qkv.bias"] = w(3 * h)
            t[p + s + "_attn.proj.weight"] = w(h, h)
            t[p + s + "_attn.norm.query_norm.scale"] = w(h // 4)
            t[p + s + "_mlp.0.weight"] = w(4 * h, h)
            t[p + s + "_mlp.2.weight"] = w(h, 4 * h)
            t[p + s + "_mod.lin.weight"] = w(6 * h, h)
    for i in range(2):
        p = "single_blocks.%d." % i
        t[p + "linear1.weight"] = w(7 * h, h)
        t[p + "linear2.weight"] = w(h, 5 * h)
        t[p + "norm.key_norm.scale"] = w(h // 4)
    save_file(t, path, metadata={"format": "pt"})


def llama_tiny(path):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return False
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, max_shard_size="100KB")
    return True


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "sample"
    os.makedirs(out, exist_ok=True)
    flux_tiny(os.path.join(out, "flux-tiny.safetensors"))
    llama_tiny(os.path.join(out, "llama-tiny"))
    with open(os.path.join(out, "broken.safetensors"), "wb") as f:
        hdr = json.dumps({"w": {"dtype": "F32", "shape": [4],
                                "data_offsets": [0, 16]}}).encode()
        f.write(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 7)
    with open(os.path.join(out, "README.txt"), "w") as f:
        f.write("A castfs sample: random weights with real tensor names.\n")
    print(out)


if __name__ == "__main__":
    main()
