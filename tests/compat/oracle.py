# SPDX-License-Identifier: MIT
"""Files castfs must produce, built without castfs, and their comparison.

oracle_bytes(path, view) is the view of a safetensors file as torch (or
ml_dtypes) casts it, written by safetensors' own writer, or as bnb_ref.py
(a torch re-implementation of docs/FORMATS.md) lays out the bitsandbytes
views, with the set of quantised tensors written from FORMATS.md's rule and
bnb_check's dynamic map: nothing in it is read from castfs.
"""
import json

import ml_dtypes
import torch
from safetensors import safe_open
from safetensors.torch import load, load_file, save

import bnb_check
import bnb_ref

# Source dtypes a cast view converts (docs/FORMATS.md "Plain casts").
CASTABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16,
            torch.float8_e4m3fn, torch.float8_e5m2)


# Module names quantised views keep (docs/FORMATS.md "Which tensors are
# quantised"), written out here from the documentation.
KEPT_MODULES = {
    "embed_tokens", "embeddings", "word_embeddings", "position_embeddings",
    "token_type_embeddings", "wte", "wpe", "shared", "embed_positions",
    "relative_attention_bias", "position_embedding", "token_embedding",
    "embed_in", "embed_out", "embedding", "lm_head", "tok_embeddings"}


def header_of(data):
    """(parsed header, offset of the data section) of safetensors bytes."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), 8 + n


def bnb_quantised(src):
    return {k for k, t in src.items()
            if t.dim() == 2 and t.numel() and t.dtype in CASTABLE
            and k.endswith(".weight")
            and k[:-len(".weight")].rsplit(".", 1)[-1] not in KEPT_MODULES}


def _ml_e4m3(t):
    """float8_e4m3fn with NaN on overflow (ml_dtypes), via float32."""
    a = t.float().numpy().astype(ml_dtypes.float8_e4m3fn)
    return torch.from_numpy(a.view("uint8")).view(torch.float8_e4m3fn)


def _sat_e5m2(t):
    return t.float().clamp(-57344.0, 57344.0).to(torch.float8_e5m2)


# view -> how torch (or ml_dtypes) casts a float tensor for it
CASTS = {"fp32": lambda t: t.to(torch.float32),
         "fp16": lambda t: t.to(torch.float16),
         "bf16": lambda t: t.to(torch.bfloat16),
         "fp8": lambda t: t.to(torch.float8_e4m3fn),
         "fp8_e4m3fn": lambda t: t.to(torch.float8_e4m3fn),
         "fp8_nan": _ml_e4m3,
         "fp8_e5m2": lambda t: t.to(torch.float8_e5m2),
         "fp8_e5m2_sat": _sat_e5m2}


def oracle_bytes(path, view):
    """The file a view of @path must be, built without castfs: torch (or
    ml_dtypes) casts written by safetensors' own writer, or bnb_ref's
    torch materialisation of the bitsandbytes layout."""
    src = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {"format": "pt"}
    if view in bnb_ref.VIEWS:
        return bnb_ref.materialise(view, src, bnb_quantised(src), meta,
                                   bnb_check.dynamic_map())
    cast = CASTS[view]
    out = {}
    for k, t in src.items():
        dt = cast(torch.zeros(1)).dtype
        out[k] = cast(t) if t.dtype in CASTABLE and t.dtype != dt else t
    return save(out, metadata=meta)


def assert_same_file(test, got, want, what):
    """@got is the file @want (both safetensors bytes): the same header
    entries and metadata (the order of two or more metadata keys is
    castfs' choice), and the same data bytes, but for NaN encodings
    (castfs' documented choice; torch even drops the sign of a NaN it
    casts to bf16, so only positions are compared here: test_casts
    checks NaN signs against the source)."""
    hg, og = header_of(got)
    hw, ow = header_of(want)
    test.assertEqual(hg, hw, what)
    if got[og:] == want[ow:]:
        return
    tg, tw = load(got), load(want)
    for k, w in tw.items():
        g = tg[k]
        if not w.is_floating_point():
            test.assertTrue(torch.equal(g, w), "%s: %s" % (what, k))
            continue
        nan = torch.isnan(w.float())
        test.assertTrue(torch.equal(torch.isnan(g.float()), nan),
                        "%s: %s NaN positions" % (what, k))
        gb = g.reshape(-1).view(torch.uint8).view(-1, g.element_size())
        wb = w.reshape(-1).view(torch.uint8).view(-1, w.element_size())
        keep = ~nan.reshape(-1)
        test.assertTrue(torch.equal(gb[keep], wb[keep]),
                        "%s: %s differs from the oracle" % (what, k))
