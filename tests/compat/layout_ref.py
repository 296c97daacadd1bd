# SPDX-License-Identifier: MIT
"""The late run of docs/FORMATS.md applied to a writer's file: tensors
whose bytes need a pass over a weight (the double-quantised absmax of
nf4/fp4, the scales of the compressed-tensors views) laid out
after all others, each run in the writer's order, unless that would leave
a tensor misaligned. Written from the documentation, not from castfs."""
import json

ELEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4,
              "BF16": 2, "F16": 2, "I16": 2, "U16": 2}


def relayout(data, late):
    """safetensors bytes `data` with the tensors named in `late` (a set,
    or a predicate on names) moved after all others."""
    is_late = late if callable(late) else late.__contains__
    n = int.from_bytes(data[:8], "little")
    head = json.loads(data[8:8 + n])  # dicts keep the file's order
    compact = json.dumps(head, separators=(",", ":"),
                         ensure_ascii=False).encode()
    assert data[8:8 + n].rstrip(b" ") == compact  # serialised as save() does
    meta = [(k, v) for k, v in head.items() if k == "__metadata__"]
    ts = [(k, v) for k, v in head.items() if k != "__metadata__"]
    ts.sort(key=lambda kv: kv[1]["data_offsets"][0])
    body = data[8 + n:]
    order = ([kv for kv in ts if not is_late(kv[0])] +
             [kv for kv in ts if is_late(kv[0])])
    out, off = [], 0
    for k, v in order:
        b, e = v["data_offsets"]
        if off % ELEM_BYTES.get(v["dtype"], 1):
            return data
        out.append(body[b:e])
        v["data_offsets"] = [off, off + e - b]
        off += e - b
    text = json.dumps(dict(meta + order), separators=(",", ":"),
                      ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(out)


def scale_is_late(name):
    """The scales of a compressed-tensors view: NVFP4's
    weight_global_scale needs its whole weight first, and every
    weight_scale (channel, block or group) is made from the weight's
    elements, which its codes' reads go over first."""
    return name.endswith((".weight_global_scale", ".weight_scale"))
