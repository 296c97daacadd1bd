# SPDX-License-Identifier: MIT
"""Plain-cast views read by the real loaders: safetensors (torch and numpy),
torch's own .to(dtype), numpy + ml_dtypes, and the official writer's bytes.

Sources are written with safetensors itself: every bf16, f16 and fp8 bit
pattern, chosen f32/f64 values (ties, subnormals, +-0, NaN, +-Inf,
overflow), random values, integers, bools, 0-d and empty tensors, odd
shapes and metadata.
"""
import mmap
import os
import random
import struct
import unittest

import ml_dtypes
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file

import castfs_testlib as tl

# view -> (torch dtype, how overflow differs from this torch's .to()).
# torch >= 2.12 saturates e4m3fn (pytorch#178817); fp8_nan keeps the older
# NaN-on-overflow rule, fp8_e5m2_sat clamps where torch gives Inf.
VIEWS = {
    "fp32": (torch.float32, None),
    "fp16": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
    "fp8": (torch.float8_e4m3fn, None),
    "fp8_e4m3fn": (torch.float8_e4m3fn, None),
    "fp8_nan": (torch.float8_e4m3fn, "nan"),
    "fp8_e5m2": (torch.float8_e5m2, None),
    "fp8_e5m2_sat": (torch.float8_e5m2, "sat"),
}

INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
            torch.float8_e5m2: torch.uint8, torch.float64: torch.int64}


def f32_specials():
    vals = [0.0, -0.0, 1.0, -1.0, 448.0, 464.0, 465.0, 479.9, 480.0, 57344.0,
            61439.0, 61440.0, 65504.0, 65519.0, 65520.0, 3.0e38, -3.0e38,
            float("inf"), float("-inf"), 2.0 ** -6, 2.0 ** -9, 2.0 ** -10,
            1.5 * 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -14, 2.0 ** -16,
            2.0 ** -17, 2.0 ** -24, 2.0 ** -25, 2.0 ** -126, 2.0 ** -149,
            1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11,
            1.0 + 3 * 2.0 ** -11, 1.0625, 1.1875, 0.1, 1.0 / 3]
    bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in vals]
    # Every fp8/bf16/f16 rounding midpoint region: random bit patterns.
    rng = random.Random(7)
    bits += [rng.getrandbits(32) for _ in range(200000)]
    bits += [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x00000001,
             0x80000001]
    return torch.tensor(np.array(bits, dtype=np.uint32).view(np.int32)).view(
        torch.float32)


def f64_values():
    rng = random.Random(9)
    vals = [rng.uniform(-600, 600) for _ in range(20000)]
    vals += [rng.gauss(0, 1e-3) for _ in range(20000)]
    # Doubles that round differently when rounded once vs through float32.
    vals += [1.0 + 2.0 ** -8 + 2.0 ** -40, 1.0 + 2.0 ** -24 + 2.0 ** -60,
             1.0 + 2.0 ** -11 + 2.0 ** -50, 0.0, -0.0, float("inf"),
             float("nan"), 1e300, -1e-300]
    return torch.tensor(vals, dtype=torch.float64)


def all_patterns(dtype, n_bits):
    raw = np.arange(1 << n_bits, dtype=np.uint16 if n_bits == 16 else np.uint8)
    return torch.from_numpy(raw.view(np.int16 if n_bits == 16 else np.uint8)
                            .copy()).view(dtype)


def write_sources(src):
    torch.manual_seed(0)
    patterns = {
        "bf16.all": all_patterns(torch.bfloat16, 16).reshape(256, 256),
        "f16.all": all_patterns(torch.float16, 16).reshape(256, 256),
        "e4m3.all": all_patterns(torch.float8_e4m3fn, 8),
        "e5m2.all": all_patterns(torch.float8_e5m2, 8),
        "f32.special": f32_specials(),
        "f64.values": f64_values(),
    }
    save_file(patterns, os.path.join(src, "patterns.safetensors"),
              metadata={"format": "pt"})
    mixed = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(37, 65).to(torch.bfloat16),
        "model.norm.weight": torch.randn(65),
        "odd.shape": torch.randn(3, 1, 5, 7).to(torch.float16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 8, dtype=torch.bfloat16),
        "position_ids": torch.arange(77),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(11, dtype=torch.uint8),
        "i32": torch.arange(-3, 4, dtype=torch.int32),
    }
    save_file(mixed, os.path.join(src, "mixed.safetensors"),
              metadata={"format": "pt"})
    # No metadata at all: the views must add {"format": "pt"}.
    save_file({"w": torch.randn(16, 16)}, os.path.join(src, "nometa.safetensors"))
    return {"patterns": patterns, "mixed": mixed}


def expected(t, dtype, mode):
    # Tensors already in the target dtype are copied, never re-clamped.
    if not t.is_floating_point() or t.dtype == dtype:
        return t
    if mode == "sat":
        # Saturation clamps before rounding; NaN passes through clamp.
        return t.float().clamp(-57344.0, 57344.0).to(dtype)
    out = t.to(dtype)
    if mode == "nan":
        # torch < 2.12: anything above 464 (after f64 -> f32) is NaN.
        f = t.float()
        over = (f.abs() > 464.0) & ~torch.isnan(f)
        nan_bits = torch.where(torch.signbit(f), 0xFF, 0x7F).to(torch.uint8)
        u = out.view(torch.uint8).clone()
        u[over] = nan_bits[over]
        out = u.view(dtype)
    return out


def raw_sign(t):
    # From the encoding: torch's own f16 -> f32 drops the sign of NaN.
    b = bits(t)
    return (b & 0x80) != 0 if b.dtype == torch.uint8 else b < 0


def bits(t):
    return t.view(INT_VIEW[t.dtype]) if t.is_floating_point() else t


class CastViews(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tl.tempdir()
        cls.src = cls.tmp.__enter__()
        cls.sources = write_sources(cls.src)
        # test_casts_isa.py sets CASTFS_ISA here to force the daemon's kernels.
        cls.mount = tl.Mount(cls.src, env=getattr(cls, "mount_env", None))

    @classmethod
    def tearDownClass(cls):
        try:
            cls.mount.close()
        finally:
            cls.tmp.__exit__(None, None, None)

    def view_path(self, name, view):
        return self.mount.join("%s.%s.safetensors" % (name, view))

    def check_tensor(self, key, got, src, dtype, mode):
        exp = expected(src, dtype, mode)
        self.assertEqual(got.dtype, exp.dtype, key)
        self.assertEqual(got.shape, exp.shape, key)
        if got.numel() == 0:
            return
        if not src.is_floating_point():
            self.assertTrue(torch.equal(got, exp), key)
            return
        nan = torch.isnan(src.float())
        gb, eb = bits(got), bits(exp)
        mismatch = (gb != eb) & ~nan
        self.assertEqual(int(mismatch.sum()), 0,
                         "%s: %d elements differ from torch .to(%s), e.g. src %s"
                         % (key, int(mismatch.sum()), dtype,
                            src[mismatch][:4].tolist()))
        # NaN policy: NaN in, NaN out, sign kept (docs/FORMATS.md).
        gn = got[nan].float()
        self.assertTrue(bool(torch.isnan(gn).all()), key + ": NaN lost")
        sign_src = raw_sign(src[nan])
        sign_got = raw_sign(got[nan])
        self.assertTrue(bool((sign_src == sign_got).all()), key + ": NaN sign")

    def test_every_view_equals_torch_to(self):
        for view, (dtype, mode) in VIEWS.items():
            for name, tensors in self.sources.items():
                with self.subTest(view=view, file=name):
                    got = load_file(self.view_path(name, view))
                    self.assertEqual(sorted(got), sorted(tensors))
                    for key, src in tensors.items():
                        self.check_tensor(key, got[key], src, dtype, mode)

    def test_bytes_equal_the_official_writer(self):
        # safetensors' own writer lays out the same tensors identically.
        for view, (dtype, mode) in VIEWS.items():
            with self.subTest(view=view):
                src = self.sources["mixed"]
                exp = {k: expected(t, dtype, mode) for k, t in src.items()}
                ref = save(exp, metadata={"format": "pt"})
                with open(self.view_path("mixed", view), "rb") as f:
                    self.assertEqual(f.read(), ref)

    def test_missing_metadata_gets_format_pt(self):
        with safe_open(self.view_path("nometa", "fp16"), framework="pt") as f:
            self.assertEqual(f.metadata(), {"format": "pt"})

    def test_safe_open_numpy_and_torch(self):
        for view in VIEWS:
            path = self.view_path("mixed", view)
            with safe_open(path, framework="pt") as ft, \
                    safe_open(path, framework="np") as fn:
                self.assertEqual(sorted(ft.keys()), sorted(fn.keys()))
                self.assertEqual(fn.metadata(), {"format": "pt"})
                for k in ft.keys():
                    t = ft.get_tensor(k)
                    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn,
                                   torch.float8_e5m2):
                        continue  # numpy has no such dtype
                    a = fn.get_tensor(k)
                    self.assertEqual(a.dtype.itemsize, t.element_size(), k)
                    self.assertEqual(a.tobytes(),
                                     t.contiguous().numpy().tobytes(), (view, k))

    def test_ml_dtypes_agrees_on_fp8_and_bf16(self):
        # A second, independent implementation of the float rules.
        src = self.sources["patterns"]["f32.special"].numpy()
        finite = np.isfinite(src)
        # ml_dtypes keeps NaN-on-overflow for e4m3fn, like fp8_nan.
        for view, mdt in (("fp8_nan", ml_dtypes.float8_e4m3fn),
                          ("fp8_e5m2", ml_dtypes.float8_e5m2),
                          ("bf16", ml_dtypes.bfloat16)):
            with safe_open(self.view_path("patterns", view), framework="pt") as f:
                got = f.get_tensor("f32.special")
            got = got.view(torch.uint8 if got.element_size() == 1 else torch.int16).numpy()
            exp = src.astype(mdt).view(got.dtype)
            # ml_dtypes' bf16 flushes f32 subnormals (Eigen); skip those.
            ok = finite & ((np.abs(src) >= np.float32(2.0 ** -126)) | (src == 0)) \
                if view == "bf16" else finite
            self.assertTrue(np.array_equal(got[ok], exp[ok]), view)

    def test_full_read_ranges_and_mmap_agree(self):
        rng = random.Random(11)
        for view in ("fp8", "bf16", "fp16", "fp32"):
            path = self.view_path("patterns", view)
            with open(path, "rb") as f:
                full = f.read()
            self.assertEqual(len(full), os.path.getsize(path))
            tl.check_ranges(self, path, full, rng, count=150)
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                for _ in range(200):
                    off = rng.randrange(len(full))
                    n = rng.randrange(1, 9000)
                    self.assertEqual(m[off:off + n], full[off:off + n])
                m.close()

    def test_views_are_read_only(self):
        path = self.view_path("mixed", "fp8")
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
            with self.assertRaises(OSError) as cm:
                os.open(path, flags)
            self.assertEqual(cm.exception.errno, 30)  # EROFS
        with self.assertRaises(OSError):
            os.unlink(path)
        with self.assertRaises(OSError):
            os.mkdir(self.mount.join("newdir"))
        self.assertEqual(sorted(os.listdir(self.src)),
                         ["mixed.safetensors", "nometa.safetensors",
                          "patterns.safetensors"])


if __name__ == "__main__":
    tl.main()
