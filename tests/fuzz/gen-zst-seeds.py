#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the seed corpus of fuzz_zst into tests/fuzz/fuzz_zst.in/: small
seekable-zstd files built here from the format's spec (frames by the zstd
CLI), packs written by castfs when its binary is given, and their broken
variants. Deterministic; needs the zstd CLI.

    python3 tests/fuzz/gen-zst-seeds.py [TOPDIR] [CASTFS]
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

SKIPPABLE, SEEKABLE = 0x184D2A5E, 0x8F92EAB1


def zframe(chunk):
    return subprocess.run(["zstd", "-q", "-c", "-1"], input=chunk, capture_output=True,
                          check=True).stdout


def seekable(data, frame, extra_skippable=False):
    entries, body = [], b""
    if extra_skippable:  # a skippable frame with its own (empty) entry
        sk = struct.pack("<II", 0x184D2A50, 4) + b"cast"
        entries.append(struct.pack("<II", len(sk), 0))
        body += sk
    for off in range(0, len(data), frame):
        z = zframe(data[off:off + frame])
        entries.append(struct.pack("<II", len(z), len(data[off:off + frame])))
        body += z
    table = b"".join(entries) + struct.pack("<IBI", len(entries), 0, SEEKABLE)
    return body + struct.pack("<II", SKIPPABLE, len(table)) + table


def grouped_pack(castfs, path, dtype, count, data, frame, sums=True):
    """The bytes of `castfs pack --grouped` of a one-tensor checkpoint at
    @path: @count elements of @dtype stored as @data, frames of @frame
    (without checksums unless @sums)."""
    hdr = ('{"a":{"dtype":"%s","shape":[%d],"data_offsets":[0,%d]}}'
           % (dtype, count, len(data))).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)
    subprocess.run([castfs, "pack", "--no-progress", "--grouped", "--force",
                    "--frame-size", str(frame)] + ([] if sums else ["--no-checksums"])
                   + [path], check=True)
    with open(path + ".zstg", "rb") as f:
        return f.read()


def seeds(castfs):
    rng = random.Random(14)
    data = bytes(((i // 7) ^ rng.getrandbits(2)) & 0xFF for i in range(3000))
    out = {
        "seed-one-frame": seekable(data, 4096),
        "seed-frames-512": seekable(data, 512),
        "seed-frames-100-skippable": seekable(data, 100, True),
        "seed-empty-table": seekable(b"", 512),
        "seed-plain-zstd": zframe(data),
    }
    good = out["seed-frames-512"]
    out["seed-truncated"] = good[:-5]
    lie = bytearray(good)
    struct.pack_into("<I", lie, len(good) - 9 - 6 * 8, 1 << 20)
    out["seed-lying-dsize"] = bytes(lie)
    bad = bytearray(good)
    bad[40] ^= 0xFF
    out["seed-corrupt-frame"] = bytes(bad)
    if castfs:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.safetensors")
            hdr = b'{"a":{"dtype":"BF16","shape":[700],"data_offsets":[0,1400]}}'
            hdr += b" " * (-len(hdr) % 8)
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", len(hdr)) + hdr + data[:1400])
            subprocess.run([castfs, "pack", "--no-progress", "--frame-size", "256", p],
                           check=True)
            with open(p + ".zst", "rb") as f:
                packed = f.read()
            subprocess.run([castfs, "pack", "--no-progress", "--grouped",
                            "--frame-size", "256", p], check=True)
            with open(p + ".zstg", "rb") as f:
                out["seed-castfs-grouped"] = f.read()
            # Noise bf16: each plane of a 1 KiB frame is one raw block,
            # which the reader uses where it lies (FORMATS.md, "How castfs
            # reads a grouped frame"); then a byte of one changed.
            noise = bytes(rng.getrandbits(8) for _ in range(2048))
            raw = grouped_pack(castfs, p, "BF16", 1024, noise, 1024)
            out["seed-castfs-grouped-raw"] = raw
            bad_raw = bytearray(raw)
            bad_raw[len(raw) // 2] ^= 0x10
            out["seed-castfs-grouped-raw-corrupt"] = bytes(bad_raw)
            # Weights-like bf16 (exponents 118..124, skewed): the packer
            # codes such frames tiered (FORMATS.md, "Tiered bf16 frames");
            # then a byte of the rank codes changed.
            w = bytearray()
            for _ in range(2048):
                e = 121 + min(3, max(-3, round(rng.gauss(0, 1.2))))
                v = (rng.getrandbits(1) << 15) | (e << 7) | rng.getrandbits(7)
                w += struct.pack("<H", v)
            tiered = grouped_pack(castfs, p, "BF16", 2048, bytes(w), 2048)
            out["seed-castfs-grouped-tiered"] = tiered
            # The same without checksums: a fuzzer's mutations of these
            # reach the frame parsers, which a checksum would shield.
            out["seed-castfs-grouped-tiered-nosum"] = grouped_pack(
                castfs, p, "BF16", 2048, bytes(w), 2048, sums=False)
            out["seed-castfs-grouped-raw-nosum"] = grouped_pack(
                castfs, p, "BF16", 1024, noise, 1024, sums=False)
            at = tiered.find(struct.pack("<I", 0x184D2A58))
            bad_t = bytearray(tiered)
            bad_t[at + 8 + 24 + 20] ^= 0x04
            out["seed-castfs-grouped-tiered-corrupt"] = bytes(bad_t)
            # N(0, 0.02) fp32 and fp16 weights: tiered frames of
            # transforms 6 and 7 (the fp16 one with its low-bit stream);
            # then a byte of the rank codes changed in each.
            for dt, fmt, tag in (("F32", "<f", "f32"), ("F16", "<e", "f16")):
                vals = b"".join(struct.pack(fmt, rng.gauss(0, 0.02)) for _ in range(1024))
                wide = grouped_pack(castfs, p, dt, 1024, vals, 2048)
                out["seed-castfs-grouped-tiered-" + tag] = wide
                out["seed-castfs-grouped-tiered-%s-nosum" % tag] = grouped_pack(
                    castfs, p, dt, 1024, vals, 2048, sums=False)
                at = wide.find(struct.pack("<I", 0x184D2A58))
                bad_w = bytearray(wide)
                bad_w[at + 8 + 24 + 50] ^= 0x04
                out["seed-castfs-grouped-tiered-%s-corrupt" % tag] = bytes(bad_w)
        out["seed-castfs-pack"] = packed
        sums = bytearray(packed)
        sums[-9 - 12 + 8] ^= 1  # the last frame's checksum
        out["seed-castfs-bad-checksum"] = bytes(sums)
    return out


def main():
    top = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    castfs = sys.argv[2] if len(sys.argv) > 2 else None
    d = os.path.join(top, "tests", "fuzz", "fuzz_zst.in")
    os.makedirs(d, exist_ok=True)
    for name, blob in seeds(castfs).items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
