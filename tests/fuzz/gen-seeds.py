#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the seed corpora of the fuzz targets into tests/fuzz/<target>.in/.
Plain Python, deterministic. The campaigns' minimised corpora are added to
the same directories (docs/FUZZING.md); this script only writes seed-*.

    python3 tests/fuzz/gen-seeds.py [TOPDIR]
"""
import json
import os
import random
import shutil
import struct
import sys

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
        "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64}
ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2",
         "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
         "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]


def nbytes(dtype, shape):
    n = 1
    for s in shape:
        n *= s
    return n * BITS[dtype] // 8


def safetensors(tensors, meta=None, rng=None):
    """tensors: [(name, dtype, shape, bytes or None)], laid out as the
    official writer does (dtype descending, then name)."""
    rng = rng or random.Random(0)
    items = sorted(tensors, key=lambda t: (-ORDER.index(t[1]), t[0]))
    hdr, data, off = {}, b"", 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dtype, shape, raw in items:
        n = nbytes(dtype, shape)
        raw = raw if raw is not None else bytes(rng.getrandbits(8)
                                                for _ in range(n))
        assert len(raw) == n
        hdr[name] = {"dtype": dtype, "shape": shape,
                     "data_offsets": [off, off + n]}
        data += raw
        off += n
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data


def f32_specials():
    vals = [0.0, -0.0, 1.0, -1.0, 448.0, 464.0, 480.0, 57344.0, 65504.0,
            65520.0, 3.0e38, float("inf"), float("-inf"), float("nan"),
            2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -14, 2.0 ** -24,
            2.0 ** -126, 2.0 ** -149, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
            0.1, 1.0 / 3]
    return b"".join(struct.pack("<f", v) for v in vals) + \
        struct.pack("<4I", 0x7FC00001, 0xFFC00000, 0x00000001, 0x807FFFFF)


def checkpoints():
    rng = random.Random(7)
    sp = f32_specials()
    yield "tiny", safetensors([("w", "F32", [2], None)], rng=rng)
    yield "linear", safetensors([
        ("l.weight", "F32", [8, 16], None), ("l.bias", "F32", [8], None),
        ("e.weight", "BF16", [4, 8], None), ("n", "F16", [3], None),
        ("s", "F32", [], None), ("empty", "F32", [0, 4], None),
        ("ids", "I64", [2], None), ("mask", "BOOL", [3], None)],
        meta={"format": "pt"}, rng=rng)
    yield "specials", safetensors([
        ("f32", "F32", [len(sp) // 4], sp),
        ("f16", "F16", [64], None), ("bf16", "BF16", [64], None),
        ("f64", "F64", [9], None), ("e4m3", "F8_E4M3", [64], None),
        ("e5m2", "F8_E5M2", [64], None)], rng=rng)
    yield "exotic", safetensors([
        ("f4", "F4", [4], None), ("e8", "F8_E8M0", [2], None),
        ("c", "C64", [1], None), ("u\u00e9\u4e2d", "U8", [3], None),
        ("esc\"\\/\n", "I8", [1], None)], meta={"k": "v", "": ""}, rng=rng)
    yield "fp8-matrix", safetensors([
        ("m.weight", "F8_E4M3", [16, 64], None),
        ("m.bias", "F16", [16], None)], rng=rng)


def header_seeds(top):
    for name, data in checkpoints():
        yield name, data
    mal = os.path.join(top, "tests", "data", "malformed")
    for f in sorted(os.listdir(mal)):
        if f.endswith(".safetensors"):
            with open(os.path.join(mal, f), "rb") as fh:
                yield "malformed-" + f[:-12], fh.read()
    js = b'{"__metadata__":null,"a":{"dtype":"U8","shape":[1],' \
         b'"data_offsets":[0,1],"extra":[1,{"x":"y"}]}}'
    yield "meta-null-extra", struct.pack("<Q", len(js)) + js + b"\x01"


def recipe_seeds():
    yield "empty", b"{}"
    yield "views", json.dumps({"views": {
        "half": {"kind": "cast", "dtype": "F16", "listed": True,
                 "summary": "half"},
        "e4": {"base": "fp8", "saturate": False, "rules": [
            {"match": "*.bias", "convert": False},
            {"min_rank": 2, "max_rank": 2, "dtypes": ["F32", "BF16"],
             "convert": True}]},
        "q": {"kind": "bnb4", "quant_type": "fp4", "blocksize": 128,
              "double_quant": False},
        "i8": {"kind": "int8", "listed": False},
        "fp16": {"base": "bf16", "dtype": "F16"}}}).encode()
    yield "bad-name", b'{"views":{"Bad.Name":{"kind":"cast","dtype":"F16"}}}'
    yield "bad-blocksize", b'{"views":{"q":{"kind":"bnb4","blocksize":100}}}'
    yield "unknown-key", b'{"views":{},"x":1}'
    yield "select", b"fp16,bf16:nf4"


def plan_seeds():
    # [view][flags][nranges][ranges...] + file; views by built-in index.
    rng = random.Random(11)
    files = [d for _, d in checkpoints()]
    for vi in range(13):
        f = files[vi % len(files)]
        nr = 4
        ranges = b"".join(struct.pack("<II", rng.randrange(len(f) * 2),
                                      rng.randrange(1, len(f) * 2))
                          for _ in range(nr))
        yield "view%02d" % vi, bytes([vi, 0, nr]) + ranges + f
    # Every built-in view (25; the target takes the index modulo their
    # count) on weights wide enough for its blocks: GGUF K-quants take
    # rows of 256, compressed-tensors groups of 128 columns.
    wide = safetensors([
        ("blk.0.attn_q.weight", "BF16", [4, 256], None),
        ("blk.0.ffn_up.weight", "F16", [2, 512], None),
        ("blk.0.ffn_down.weight", "F32", [3, 256], None),
        ("blk.0.attn_norm.weight", "F32", [256], None)],
        rng=random.Random(12))
    for vi in range(25):
        nr = 4
        ranges = b"".join(struct.pack("<II", rng.randrange(len(wide) * 2),
                                      rng.randrange(1, len(wide) * 2))
                          for _ in range(nr))
        yield "view%02d-wide" % vi, bytes([vi, 0, nr]) + ranges + wide


def convert_seeds():
    rng = random.Random(5)
    sp = f32_specials()
    for fi in range(7):
        for ti in range(7):
            payload = sp if fi == 1 else bytes(rng.getrandbits(8)
                                               for _ in range(200))
            yield "p%d%d" % (fi, ti), bytes([fi, ti, (fi * 7 + ti) & 0x7f]) \
                + payload


def gguf_quant_seeds():
    """[mode] + elements for every quantiser, source type and offset:
    random weights, ties (d = 1), zeros, NaN / Inf, subnormals; 9 blocks
    (one group of 8 and a tail) or 17."""
    rng = random.Random(16)

    def f32_block(kind):
        x = [rng.uniform(-1, 1) * 2.0 ** rng.randrange(-30, 30)
             for _ in range(32)]
        if kind == 1:
            x = [k + 0.5 for k in range(-16, 16)]
            x[5] = 127.0
        elif kind == 2:
            x = [0.0] * 32
        elif kind == 3:
            x[rng.randrange(32)] = float("nan")
        elif kind == 4:
            x[rng.randrange(32)] = float("inf")
        elif kind == 5:
            x = [rng.uniform(-1, 1) * 2.0 ** -140 for _ in range(32)]
        return b"".join(struct.pack("<f", v) for v in x)

    for mode in range(8):
        for nb in (9, 17):
            kinds = [rng.randrange(6) if nb == 17 else 0
                     for _ in range(nb)]
            data = b"".join(f32_block(k) for k in kinds)
            src = (mode >> 1) & 3
            if src in (1, 2):  # 16-bit: the top half (bf16) or a half
                vals = struct.unpack("<%df" % (nb * 32), data)
                if src == 1:
                    data = b"".join(struct.pack("<I", struct.unpack(
                        "<I", struct.pack("<f", v))[0])[2:] for v in vals)
                else:
                    data = b"".join(struct.pack("<e", max(-65504.0, min(
                        65504.0, v)) if v == v else v) for v in vals)
            m = mode | ((mode * 3) & 7) << 3 | (mode & 3) << 6
            yield "q%d_%d" % (mode, nb), bytes([m]) + data


def write(top, target, seeds):
    d = os.path.join(top, "tests", "fuzz", target + ".in")
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.unlink(os.path.join(d, f))
    for name, data in seeds:
        with open(os.path.join(d, "seed-" + name), "wb") as fh:
            fh.write(data)


def main():
    top = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    write(top, "fuzz_st_header", header_seeds(top))
    write(top, "fuzz_recipe", recipe_seeds())
    write(top, "fuzz_plan_read", plan_seeds())
    write(top, "fuzz_convert", convert_seeds())
    write(top, "fuzz_gguf_quant", gguf_quant_seeds())


if __name__ == "__main__":
    main()
