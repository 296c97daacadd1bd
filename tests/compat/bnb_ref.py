# SPDX-License-Identifier: MIT
"""Reference materialisation of castfs' bitsandbytes views, written with torch.

This is a second implementation of the rules in docs/FORMATS.md
("bitsandbytes views"), independent of castfs' C code: test_bnb.py compares
the bytes of every mounted view with the file built here. The values
themselves are checked against the real bitsandbytes in test_bnb.py.
"""
import json

import numpy as np
import torch
from safetensors.torch import save

from layout_ref import relayout

NESTED = 256
OFFSET_WIDTH = 24  # CASTFS_Q4_OFFSET_WIDTH


def code_table(qtype):
    """bitsandbytes' 4-bit code table, on the CPU."""
    from bitsandbytes.functional import get_4bit_type
    return get_4bit_type(qtype, device="cpu").float()


def bounds(table):
    """(float32 midpoints of the sorted values, sorted position -> code)."""
    order = torch.argsort(table, stable=True)
    srt = table[order]
    return (srt[:-1] + srt[1:]) / 2, order


def finite_abs(x):
    a = x.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a))


def block_absmax(x, bs):
    """Largest finite |x| of each block of bs elements (last block short)."""
    n = x.numel()
    nb = (n + bs - 1) // bs
    a = torch.zeros(nb * bs, dtype=torch.float32)
    a[:n] = finite_abs(x)
    return a.view(nb, bs).amax(dim=1)


def expand(per_block, bs, n):
    return per_block.repeat_interleave(bs)[:n]


def q_codes(x, scale, mids):
    """Positions among the sorted values: midpoints strictly exceeded."""
    s = x * scale
    s = torch.where(torch.isnan(x), torch.zeros_like(s), s)
    return torch.bucketize(s, mids)


def quantize_4bit(w, bs, qtype):
    """(packed U8 [(n+1)//2, 1], float32 absmax) of weight w."""
    x = w.reshape(-1).float()
    n = x.numel()
    am = block_absmax(x, bs)
    scale = 1.0 / am.clamp(min=1e-38)
    mids, order = bounds(code_table(qtype))
    pos = q_codes(x, expand(scale, bs, n), mids)
    if n % 2:
        pad = q_codes(torch.zeros(1), scale[-1:], mids)
        pos = torch.cat([pos, pad])
    codes = order[pos].to(torch.uint8)
    packed = (codes[0::2] << 4) | codes[1::2]
    return packed.unsqueeze(1), am


def double_quant(am, dynmap):
    """(offset, U8 codes, nested absmax) of the float32 block absmax."""
    nb = am.numel()
    # Each nested block's sum in block order, those sums in block order.
    a64 = am.numpy().astype(np.float64)
    sums = [np.cumsum(a64[i:i + NESTED])[-1] for i in range(0, nb, NESTED)]
    total = np.cumsum(np.array(sums))[-1]
    offset = torch.tensor(np.float32(total / nb))
    v = am - offset
    ng = (nb + NESTED - 1) // NESTED
    pad = torch.zeros(ng * NESTED, dtype=torch.float32)
    pad[:nb] = v.abs()
    nested = pad.view(ng, NESTED).amax(dim=1)
    scale = 1.0 / nested.clamp(min=1e-38)
    mids = (dynmap[:-1] + dynmap[1:]) / 2
    q = q_codes(v, expand(scale, NESTED, nb), mids).to(torch.uint8)
    return offset, q, nested


def state_dtype(dtype):
    if dtype == torch.float64:
        return "float32"
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return "bfloat16"
    return str(dtype).replace("torch.", "")


def state_json(qtype, bs, w, offset=None):
    """quant_state bytes: json.dumps of bnb's dict, offset padded."""
    d = {"quant_type": qtype, "blocksize": bs, "dtype": state_dtype(w.dtype),
         "shape": list(w.shape)}
    if offset is None:
        return json.dumps(d).encode()
    d.update({"nested_blocksize": NESTED, "nested_dtype": "float32",
              "nested_offset": float(offset)})
    text = json.dumps(d)
    num = repr(float(offset))
    assert text.endswith(num + "}") and len(num) <= OFFSET_WIDTH
    return (text[:-1] + " " * (OFFSET_WIDTH - len(num)) + "}").encode()


def u8(b):
    return torch.tensor(list(b), dtype=torch.uint8)


def bnb4_tensors(name, w, qtype, nested, bs, dynmap):
    """The tensors castfs writes for 4-bit weight `name`."""
    packed, am = quantize_4bit(w, bs, qtype)
    out = {name: packed, name + ".quant_map": code_table(qtype)}
    if nested:
        offset, q, na = double_quant(am, dynmap)
        out[name + ".absmax"] = q
        out[name + ".nested_absmax"] = na
        out[name + ".nested_quant_map"] = dynmap.clone()
        state = state_json(qtype, bs, w, offset)
    else:
        out[name + ".absmax"] = am
        state = state_json(qtype, bs, w)
    out[name + ".quant_state.bitsandbytes__" + qtype] = u8(state)
    return out


def int8_rows(w):
    """(I8 codes, float32 SCB) of a 2-D weight, through float16."""
    x = w.to(torch.float16).float()
    am = finite_abs(x).amax(dim=1)
    # bnb's 127.0 / row_stats: torch computes reciprocal(row_stats) * 127.
    scale = torch.where(am > 0, am.reciprocal() * 127.0, torch.zeros_like(am))
    q = torch.round(x * scale[:, None]).clamp(-127, 127)
    q = torch.where(torch.isnan(x), torch.zeros_like(q), q)
    q = torch.where(torch.isinf(x), torch.sign(x) * 127, q)
    return q.to(torch.int8), am


def int8_tensors(name, w):
    codes, scb = int8_rows(w)
    mod = name[:-len("weight")] if name.endswith(".weight") else name + "."
    return {name: codes, mod + "SCB": scb,
            mod + "weight_format": torch.tensor(0, dtype=torch.uint8)}


VIEWS = {
    # view name: (kind, quant type, double quantisation)
    "nf4": ("bnb4", "nf4", True),
    "fp4": ("bnb4", "fp4", True),
    "nf4_nodq": ("bnb4", "nf4", False),
    "fp4_nodq": ("bnb4", "fp4", False),
    "int8": ("int8", None, False),
}


def late_names(name, qtype):
    """The tensors of a double-quantised weight whose bytes need the
    whole weight's statistics: laid out last (docs/FORMATS.md)."""
    return {name + ".absmax", name + ".nested_absmax",
            name + ".quant_state.bitsandbytes__" + qtype}


def materialise(view, src, quantised, metadata, dynmap, bs=64):
    """The bytes of `view` of checkpoint `src` (a dict of tensors) in
    which exactly the names in `quantised` are converted."""
    kind, qtype, nested = VIEWS[view]
    out, late = {}, set()
    for name, w in src.items():
        if name not in quantised:
            out[name] = w
        elif kind == "int8":
            out.update(int8_tensors(name, w))
        else:
            out.update(bnb4_tensors(name, w, qtype, nested, bs, dynmap))
            if nested:
                late |= late_names(name, qtype)
    return relayout(save(out, metadata=metadata), late)
