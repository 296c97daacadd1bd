#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Regenerate tests/data/malformed/: small safetensors files, each named for
its one defect, and EXPECTED (<file> <errno-name> <key phrase>), which
tests/unit/test_st_header.c replays. Plain Python, no third-party modules.

    python3 scripts/gen-malformed.py [OUTDIR]
"""
import json
import os
import struct
import sys

CASES = []


def case(name, data, err, phrase):
    assert " " not in name and name.endswith(".safetensors"), name
    assert all(n != name for n, *_ in CASES), name
    CASES.append((name, bytes(data), err, phrase))


def tj(name, dtype, shape, offs):
    """One tensor entry as the writer spells it (name already JSON text)."""
    return '%s:{"dtype":"%s","shape":[%s],"data_offsets":[%s]}' % (
        name if name.startswith('"') else json.dumps(name), dtype, shape, offs)


def obj(*entries, meta='{"format":"pt"}'):
    parts = ([f'"__metadata__":{meta}'] if meta is not None else []) + list(entries)
    return "{" + ",".join(parts) + "}"


def st(header, data=b"", claim=None, pad=True):
    """8-byte LE length, header (str or bytes) padded with spaces to 8, data."""
    h = header.encode() if isinstance(header, str) else header
    if pad:
        h += b" " * (-len(h) % 8)
    n = len(h) if claim is None else claim
    return struct.pack("<Q", n) + h + data


W4 = tj("w", "F32", "2,2", "0,16")  # a valid 16-byte tensor
D16 = bytes(range(16))

# --- the 8-byte length and the file size ---------------------------------
case("empty-file.safetensors", b"", "EINVAL", "file of 0 bytes is shorter than the 8-byte header length")
case("short-length-prefix.safetensors", b"\x10\0\0\0\0", "EINVAL", "file of 5 bytes is shorter")
full = st(obj(W4), D16)
case("truncated-header.safetensors", full[:40], "EINVAL", "past end of file (size 40)")
hl = st(obj(W4))
case("header-len-past-end.safetensors", st(obj(W4), claim=len(hl) - 8 + 1), "EINVAL",
     "header length %d past end of file (size %d)" % (len(hl) - 7, len(hl)))
case("header-over-100mb.safetensors", st(b"{}", claim=100_000_001, pad=False), "E2BIG",
     "header length 100000001 exceeds the 100000000-byte limit")
case("header-len-u64-max.safetensors", st(b"{}", claim=2**64 - 1, pad=False), "E2BIG",
     "exceeds the 100000000-byte limit")
case("empty-header.safetensors", st(b"", b"", pad=False), "EINVAL", "must begin with '{' (found nothing")

# --- bytes of the header text -------------------------------------------
case("non-utf8.safetensors", st(obj(tj('"w\xff"', "F32", "2,2", "0,16")).encode("latin-1"), D16),
     "EINVAL", "not valid UTF-8 at header byte 34")
case("utf8-overlong.safetensors", st(b'{"w\xc0\xaf":{}}'), "EINVAL", "not valid UTF-8 at header byte 3")
case("utf8-surrogate.safetensors", st(b'{"w\xed\xa0\x80":{}}'), "EINVAL", "not valid UTF-8 at header byte 3")
case("utf8-above-max.safetensors", st(b'{"w\xf4\x90\x80\x80":{}}'), "EINVAL", "not valid UTF-8")
case("utf8-bom.safetensors", st(b"\xef\xbb\xbf" + obj(W4).encode(), D16), "EINVAL", "must begin with '{'")
case("leading-space.safetensors", st(" " + obj(W4), D16), "EINVAL", "must begin with '{'")
case("not-an-object.safetensors", st("[" + obj(W4) + "]", D16), "EINVAL", "must begin with '{'")
case("trailing-garbage.safetensors", st(obj(W4) + "x", D16), "EINVAL", "after the JSON object")
case("two-objects.safetensors", st(obj(W4) + "{}", D16), "EINVAL", "byte 0x7b after the JSON object")
case("nul-padding.safetensors", st(obj(W4).encode() + b"\0" * 3, D16, pad=False), "EINVAL",
     "control byte 0x00 outside a string")
case("raw-control-char.safetensors", st(obj(tj('"w\tx"', "F32", "2,2", "0,16")), D16), "EINVAL",
     "raw control byte 0x09 in a string at header byte 34")
case("control-outside-string.safetensors", st(obj(W4).replace(",", ",\x0b", 1), D16), "EINVAL",
     "control byte 0x0b outside a string")
case("invalid-escape.safetensors", st(obj(tj('"w\\q"', "F32", "2,2", "0,16")), D16), "EINVAL",
     "invalid escape in a string at header byte 34")
case("lone-surrogate-escape.safetensors", st(obj(tj('"w\\ud83d"', "F32", "2,2", "0,16")), D16),
     "EINVAL", "invalid escape")
case("unterminated-string.safetensors", st('{"__metadata__":{"format":"pt'), "EINVAL",
     "unterminated string starting at header byte 26")
case("invalid-json.safetensors", st('{"w" {"dtype":"F32","shape":[],"data_offsets":[0,4]}}', b"\0" * 4),
     "EINVAL", "invalid JSON near header byte")
case("unclosed-object.safetensors", st(obj(W4)[:-1], D16), "EINVAL", "invalid JSON near header byte")

deep = '{"w":{"dtype":"U8","shape":[],"data_offsets":[0,1],"x":' + "[" * 5000 + "]" * 5000 + "}}"
case("deep-nesting.safetensors", st(deep, b"\0"), "EINVAL", "JSON nested deeper than 127 levels at header byte 180")

# --- numbers --------------------------------------------------------------
case("negative-shape.safetensors", st(obj(tj("w", "F32", "-2,2", "0,16")), D16), "EINVAL", "negative number -2")
case("float-offset.safetensors", st(obj(tj("w", "F32", "2,2", "0,16.0")), D16), "EINVAL",
     "number 16.0 at header byte 83 is not an integer")
case("exponent-shape.safetensors", st(obj(tj("w", "U8", "1e1", "0,10")), b"\0" * 10), "EINVAL",
     "number 1e1 at header byte 59 is not an integer")
case("leading-zero.safetensors", st(obj(tj("w", "F32", "02,2", "0,16")), D16), "EINVAL", "has a leading zero")
case("huge-number.safetensors", st(obj(tj("w", "U8", "9007199254740993", "0,9007199254740993"))), "EINVAL",
     "number 9007199254740993 at header byte 59 exceeds 2^53")

# --- __metadata__ ---------------------------------------------------------
case("metadata-non-string.safetensors", st(obj(W4, meta='{"format":"pt","epoch":3}'), D16), "EINVAL",
     "__metadata__ 'epoch': value must be a string, got a number")
case("metadata-array.safetensors", st(obj(W4, meta='["pt"]'), D16), "EINVAL",
     "__metadata__ must be an object or null, got an array")
case("duplicate-metadata-key.safetensors", st(obj(W4, meta='{"format":"pt","format":"tf"}'), D16), "EINVAL",
     "duplicate __metadata__ key 'format'")
case("duplicate-metadata.safetensors", st(obj(W4, '"__metadata__":null'), D16), "EINVAL",
     "duplicate key '__metadata__'")

# --- tensor objects -------------------------------------------------------
case("tensor-not-object.safetensors", st(obj('"w":"F32"')), "EINVAL", "tensor 'w': expected an object, got a string")
case("missing-dtype.safetensors", st(obj('"w":{"shape":[2,2],"data_offsets":[0,16]}'), D16), "EINVAL",
     "tensor 'w': missing field 'dtype'")
case("missing-shape.safetensors", st(obj('"w":{"dtype":"F32","data_offsets":[0,16]}'), D16), "EINVAL",
     "tensor 'w': missing field 'shape'")
case("missing-offsets.safetensors", st(obj('"w":{"dtype":"F32","shape":[2,2]}'), D16), "EINVAL",
     "tensor 'w': missing field 'data_offsets'")
case("duplicate-field.safetensors",
     st(obj('"w":{"dtype":"F32","shape":[2,2],"shape":[4],"data_offsets":[0,16]}'), D16),
     "EINVAL", "tensor 'w': duplicate field 'shape'")
case("dtype-not-string.safetensors", st(obj('"w":{"dtype":32,"shape":[2,2],"data_offsets":[0,16]}'), D16),
     "EINVAL", "tensor 'w': field 'dtype' must be a string, got a number")
case("unknown-dtype.safetensors", st(obj(tj("w", "F9", "2,2", "0,16")), D16), "EINVAL",
     "tensor 'w': unknown dtype 'F9'")
case("dtype-lowercase.safetensors", st(obj(tj("w", "f32", "2,2", "0,16")), D16), "EINVAL",
     "unknown dtype 'f32'")
case("shape-not-array.safetensors", st(obj('"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}'), D16),
     "EINVAL", "tensor 'w': field 'shape' must be an array, got a number")
case("shape-string-entry.safetensors", st(obj(tj("w", "F32", '2,"2"', "0,16")), D16), "EINVAL",
     "tensor 'w': shape[1] must be an integer, got a string")
case("offsets-not-array.safetensors", st(obj('"w":{"dtype":"F32","shape":[2,2],"data_offsets":"0-16"}'), D16),
     "EINVAL", "field 'data_offsets' must be an array, got a string")
case("three-offsets.safetensors", st(obj(tj("w", "F32", "2,2", "0,8,16")), D16), "EINVAL",
     "tensor 'w': data_offsets must have 2 entries, got 3")
case("one-offset.safetensors", st(obj(tj("w", "F32", "2,2", "16")), D16), "EINVAL",
     "data_offsets must have 2 entries, got 1")
case("duplicate-names.safetensors", st(obj(tj("w", "F32", "2,2", "0,16"), tj("w", "F32", "2,2", "16,32")),
                                       D16 + D16), "EINVAL", "duplicate tensor name 'w'")
case("duplicate-names-escaped.safetensors", st(obj(tj("w", "F32", "2,2", "0,16"), tj('"\\u0077"', "F32", "2,2",
                                                                                    "16,32")), D16 + D16),
     "EINVAL", "duplicate tensor name 'w'")

# --- offsets and sizes (the reference validate()) -------------------------
case("offsets-not-from-zero.safetensors", st(obj(tj("w", "F32", "2,2", "4,20")), D16 + b"\0" * 4), "EINVAL",
     "tensor 'w': data_offsets begin at 4, but the first tensor must begin at 0")
case("hole-in-offsets.safetensors", st(obj(tj("a", "F32", "2", "0,8"), tj("b", "F32", "2", "12,20")),
                                       D16 + b"\0" * 4),
     "EINVAL", "tensor 'b': data_offsets [12,20) leave a hole after 'a', which ends at 8")
case("overlapping-offsets.safetensors", st(obj(tj("a", "F32", "2", "0,8"), tj("b", "F32", "2", "4,12")),
                                           b"\0" * 12),
     "EINVAL", "tensor 'b': data_offsets [4,12) overlap 'a', which ends at 8")
case("end-before-begin.safetensors", st(obj(tj("a", "F32", "2", "0,8"), tj("b", "F32", "0", "8,4")), b"\0" * 8),
     "EINVAL", "tensor 'b': data_offsets end 4 is before begin 8")
case("size-mismatch.safetensors", st(obj(tj("w", "F16", "4", "0,10")), b"\0" * 10), "EINVAL",
     "tensor 'w': data_offsets [0,10) hold 10 bytes, but 4 elements of F16 need 8")
case("shape-overflow.safetensors", st(obj(tj("w", "U8", "4294967296,4294967296", "0,0"))), "EOVERFLOW",
     "tensor 'w': shape product overflows 64 bits")
case("bits-overflow.safetensors", st(obj(tj("w", "F64", "9007199254740992,256", "0,0"))), "EOVERFLOW",
     "tensor 'w': 2305843009213693952 elements of F64: bit count overflows 64 bits")
case("sub-byte-misaligned.safetensors", st(obj(tj("w", "F4", "3", "0,2")), b"\0\0"), "EINVAL",
     "tensor 'w': 3 elements of 4-bit F4 do not fill whole bytes")
case("f6-misaligned.safetensors", st(obj(tj("w", "F6_E2M3", "6", "0,5")), b"\0" * 5), "EINVAL",
     "6 elements of 6-bit F6_E2M3 do not fill whole bytes")
case("trailing-bytes.safetensors", st(obj(W4), D16 + b"\0"), "EINVAL", "(trailing bytes)")
case("truncated-data.safetensors", st(obj(W4), D16[:15]), "EINVAL", "(truncated)")
case("empty-tensor-with-bytes.safetensors", st(obj(tj("e", "F32", "0", "0,4"))), "EINVAL",
     "tensor 'e': data_offsets [0,4) hold 4 bytes, but 0 elements of F32 need 0")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "malformed")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(out, f))
    lines = ["# <file> <errno-name> <key phrase of the diagnostic>",
             "# generated by scripts/gen-malformed.py; do not edit"]
    for name, data, err, phrase in CASES:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        lines.append(f"{name} {err} {phrase}")
    with open(os.path.join(out, "EXPECTED"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(CASES)} files in {out}")


if __name__ == "__main__":
    main()
