# SPDX-License-Identifier: MIT
"""Tensor trees (docs/TENSOR_TREE.md) checked against NumPy and the header.

Fixtures carry real names of real architectures (Llama, Flux, SD UNet) and
hostile ones. Every tensor file of the source's tree and of each view's
tree is compared with NumPy's own reading of the bytes (ml_dtypes for the
types NumPy lacks), with the header parsed here in Python, and through
extended attributes. Paths are decoded with an implementation independent
of castfs's C one.
"""
import errno
import json
import os
import re
import struct
import unittest

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import load_file, save_file

import castfs_testlib as tl

# safetensors dtype -> (numpy dtype of the stored bytes, widened to float32)
NP_TYPES = {
    "BOOL": (np.bool_, False), "U8": (np.uint8, False), "I8": (np.int8, False),
    "U16": (np.uint16, False), "I16": (np.int16, False),
    "U32": (np.uint32, False), "I32": (np.int32, False),
    "U64": (np.uint64, False), "I64": (np.int64, False),
    "F16": (np.float16, False), "F32": (np.float32, False),
    "F64": (np.float64, False), "C64": (np.complex64, False),
    "BF16": (ml_dtypes.bfloat16, True),
    "F8_E4M3": (ml_dtypes.float8_e4m3fn, True),
    "F8_E5M2": (ml_dtypes.float8_e5m2, True),
    "F8_E8M0": (np.uint8, False),  # bit patterns
    "F4": (np.uint8, False),  # bit patterns (expected_array)
}

CAST_VIEWS = ["fp32", "fp16", "bf16", "fp8", "fp8_e5m2"]
TORCH_DTYPE = {"F32": torch.float32, "F16": torch.float16,
               "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
               "F8_E5M2": torch.float8_e5m2}
# Source dtypes a cast view converts (docs/FORMATS.md "Plain casts").
CASTABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16,
            torch.float8_e4m3fn, torch.float8_e5m2)
VIEW_DTYPE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16", "fp8": "F8_E4M3",
              "fp8_e5m2": "F8_E5M2"}


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", None)
    return hdr, meta, 8 + n


def decode_path(rel):
    """Tree path (without suffix) -> tensor name, per docs/TENSOR_TREE.md."""
    out, cont = b"", False
    comps = rel.split("/")
    for i, c in enumerate(comps):
        c = os.fsencode(c)
        more = c.endswith(b"%+")
        if more:
            c = c[:-2]
        if c == b"%" and not cont and not more:
            part = b""
        else:
            part = re.sub(rb"%([0-9A-F]{2})",
                          lambda m: bytes([int(m.group(1), 16)]), c)
        out += part
        if not more and i < len(comps) - 1:
            out += b"."
        cont = more
    return out.decode("utf-8")


def expected_array(dtype, shape, raw):
    if dtype == "F4":  # bit patterns: pairs a byte, else one flat row
        a = np.frombuffer(raw, dtype=np.uint8)
        if shape and shape[-1] % 2 == 0:
            return a.reshape(shape[:-1] + [shape[-1] // 2])
        return a
    np_type, widen = NP_TYPES[dtype]
    a = np.frombuffer(raw, dtype=np_type).reshape(shape)
    return a.astype(np.float32) if widen else a


def same_bits(a, b):
    """Equal dtypes, shapes and values, -0.0 apart from 0.0; any NaN
    equals any NaN (castfs widens NaN payloads as torch does, ml_dtypes
    gives the canonical NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind not in "fc":
        return a.tobytes() == b.tobytes()
    if a.dtype.kind == "f" and not np.array_equal(np.signbit(a), np.signbit(b)):
        return False
    return np.array_equal(a, b, equal_nan=True)


def llama(d):
    g = torch.Generator().manual_seed(1)
    t = {"model.embed_tokens.weight": torch.randn(32, 16, generator=g),
         "model.norm.weight": torch.randn(16, generator=g),
         "lm_head.weight": torch.randn(32, 16, generator=g)}
    for i in range(2):
        p = "model.layers.%d." % i
        for m in ("q", "k", "v", "o"):
            t[p + "self_attn.%s_proj.weight" % m] = torch.randn(16, 16, generator=g)
        for m, s in (("gate", (24, 16)), ("up", (24, 16)), ("down", (16, 24))):
            t[p + "mlp.%s_proj.weight" % m] = torch.randn(*s, generator=g)
        t[p + "input_layernorm.weight"] = torch.randn(16, generator=g)
        t[p + "post_attention_layernorm.weight"] = torch.randn(16, generator=g)
    t = {k: v.to(torch.bfloat16) for k, v in t.items()}
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.rand(8)
    save_file(t, os.path.join(d, "llama.safetensors"), metadata={"format": "pt"})


def flux(d):
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {"double_blocks.0.img_attn.qkv.weight": r(48, 16).to(torch.bfloat16),
         "double_blocks.0.img_attn.qkv.bias": r(48).to(torch.bfloat16),
         "double_blocks.0.img_attn.norm.query_norm.scale": r(8).to(torch.bfloat16),
         "double_blocks.0.img_mod.lin.weight": r(96, 16).to(torch.float8_e4m3fn),
         "double_blocks.0.txt_mlp.0.weight": (r(64, 16) * 1e4).to(torch.float8_e5m2),
         "single_blocks.3.linear1.weight": r(80, 16).to(torch.float16),
         "single_blocks.3.linear1.bias": r(80).to(torch.float16),
         "single_blocks.3.modulation.lin.weight": r(48, 16),
         "img_in.weight": r(16, 64).to(torch.float64),
         "time_in.in_layer.weight": r(16, 256).to(torch.bfloat16),
         "guidance_in.out_layer.bias": r(16).to(torch.bfloat16)}
    # Hostile values: NaN, Inf, subnormals, out of fp8 range.
    t["final_layer.linear.weight"] = torch.tensor(
        [[float("nan"), float("inf"), -float("inf"), 1e-40, 6e4, -1e5, 0.0, -0.0]],
        dtype=torch.float32)
    save_file(t, os.path.join(d, "flux.safetensors"),
              metadata={"format": "pt", "modelspec.title": "flux \"dev\"\n"})


def sdunet(d):
    g = torch.Generator().manual_seed(3)
    p = "model.diffusion_model."
    t = {p + "input_blocks.1.0.in_layers.2.weight": torch.randn(8, 4, 3, 3, generator=g),
         p + "input_blocks.1.0.in_layers.2.bias": torch.randn(8, generator=g),
         p + "input_blocks.1.0.in_layers.0.weight": torch.randn(4, generator=g),
         p + "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight":
             torch.randn(8, 8, generator=g),
         p + "out.2.weight": torch.randn(4, 8, 3, 3, generator=g),
         p + "time_embed.0.weight": torch.randn(16, 8, generator=g),
         "first_stage_model.decoder.conv_in.weight": torch.randn(8, 4, 3, 3, generator=g),
         "cond_stage_model.transformer.text_model.embeddings.position_ids":
             torch.arange(77, dtype=torch.int64).reshape(1, 77)}
    t = {k: (v.half() if v.is_floating_point() else v) for k, v in t.items()}
    save_file(t, os.path.join(d, "sd-unet.safetensors"))


HOSTILE = ["a//b", "a..b", "..", ".", "", "x/y", "x%2Fy", "p" * 300 + ".w",
           "\u00e9" * 200 + ".w", "a.b", "a.b.c", "a.", ".a", "100%.w",
           "ctrl\x01name", "q%+", "sp ace.#hash", "weight.info", "weight.npy.x"]


def hostile(d):
    t = {n: torch.full((i % 3 + 1,), float(i)) for i, n in enumerate(HOSTILE)}
    save_file(t, os.path.join(d, "hostile.safetensors"), metadata={"format": "pt"})


def dtypes(d):
    t = {"bool": torch.tensor([True, False, True]),
         "u8": torch.arange(5, dtype=torch.uint8),
         "i8": torch.arange(-3, 3, dtype=torch.int8),
         "i16": torch.arange(-3, 3, dtype=torch.int16),
         "u16": torch.arange(6, dtype=torch.int32).to(torch.uint16),
         "i32": torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3),
         "u32": torch.arange(6, dtype=torch.int64).to(torch.uint32),
         "i64": torch.arange(-3, 3, dtype=torch.int64),
         "u64": torch.arange(6, dtype=torch.int64).to(torch.uint64),
         "f64": torch.randn(2, 2, dtype=torch.float64),
         "c64": torch.randn(3, dtype=torch.complex64),
         "e8m0": torch.tensor([1.0, 2.0, 0.25, 1024.0]).to(torch.float8_e8m0fnu),
         "scalar": torch.tensor(3.5, dtype=torch.bfloat16),
         "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
         "big_rank": torch.zeros(1, 1, 1, 1, 1, 1, 1, 2)}
    save_file(t, os.path.join(d, "dtypes.safetensors"))


def fp4(d):
    """F4 (E2M1) bit patterns, written by hand (torch's float4_e2m1fn_x2
    holds only even rows): a last dimension of 4 (two bytes a row) and
    of 3 (a row ends inside a byte: one flat array of the 3 bytes)."""
    g = torch.Generator().manual_seed(4)
    parts = [("f4_even", "F4", [2, 4], bytes([0x21, 0x43, 0x65, 0x87])),
             ("f4_odd", "F4", [2, 3], bytes([0xa9, 0xcb, 0xed])),
             ("w", "BF16", [4, 4],
              torch.randn(4, 4, generator=g).bfloat16().view(
                  torch.uint8).numpy().tobytes())]
    hdr, data = {}, b""
    for name, dt, shape, raw in parts:
        hdr[name] = {"dtype": dt, "shape": shape,
                     "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "fp4.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


FIXTURES = [llama, flux, sdunet, hostile, dtypes, fp4]


class TensorTrees(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src_ctx = tl.tempdir()
        cls.src = cls.src_ctx.__enter__()
        for make in FIXTURES:
            make(cls.src)
        cls.mnt = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.src_ctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def files(self):
        return sorted(f for f in os.listdir(self.src) if f.endswith(".safetensors"))

    def views_of(self, base):
        """The cast views, plus every other listed view; a listed view that
        cannot be stat()ed is a failure, not a view to leave out."""
        stem = base[:-len(".safetensors")]
        out = []
        for v in sorted(os.listdir(self.mnt.path)):
            m = re.fullmatch(re.escape(stem) + r"\.([a-z0-9_]+)\.safetensors", v)
            if not m:
                continue
            try:
                os.stat(self.mnt.join(v))
            except OSError as e:
                self.fail("listed view %s cannot be stat()ed: %s" % (v, e))
            out.append(m.group(1))
        for v in CAST_VIEWS:
            self.assertIn(v, out)
        return out

    def walk(self, tree):
        """{tensor name: path of its stem} of a mounted tree."""
        found = {}
        for root, dirs, files in os.walk(tree):
            for name in dirs + files:
                self.assertLessEqual(len(os.fsencode(name)), 255)
                self.assertNotIn(name, ("", ".", ".."))
            for f in files:
                if f.endswith(".info"):
                    rel = os.path.relpath(os.path.join(root, f[:-5]), tree)
                    found[decode_path(rel)] = os.path.join(root, f[:-5])
        return found

    def check_tensor(self, stem, name, info, data_start, raw_file, view):
        begin, end = info["data_offsets"]
        with open(raw_file, "rb") as f:
            f.seek(data_start + begin)
            raw = f.read(end - begin)
        with open(stem + ".raw", "rb") as f:
            self.assertEqual(f.read(), raw, name)
        self.assertEqual(os.stat(stem + ".raw").st_size, end - begin)
        exp = expected_array(info["dtype"], info["shape"], raw)
        got = np.load(stem + ".npy")
        self.assertTrue(same_bits(got, exp), "%s: %r != %r" % (name, got, exp))
        if exp.size:
            mm = np.load(stem + ".npy", mmap_mode="r")
            self.assertTrue(same_bits(np.asarray(mm), exp), name)
        with open(stem + ".npy", "rb") as f:
            data = f.read()
        self.assertEqual(len(data), os.stat(stem + ".npy").st_size)
        self.check_info(stem, name, info, data_start, view)
        self.check_xattrs(stem, name, info, view)

    def check_info(self, stem, name, info, data_start, view):
        with open(stem + ".info", "rb") as f:
            text = f.read()
        self.assertEqual(len(text), os.stat(stem + ".info").st_size)
        lines = dict(l.split(": ", 1) for l in text.decode().splitlines())
        self.assertEqual(json.loads(lines["name"]), name)
        self.assertEqual(lines["dtype"], info["dtype"])
        self.assertEqual(json.loads(lines["shape"]), info["shape"])
        self.assertEqual(int(lines["elements"]), int(np.prod(info["shape"], dtype=np.int64)))
        b, e = info["data_offsets"]
        self.assertEqual(int(lines["bytes"]), e - b)
        self.assertEqual(json.loads(lines["data_offsets"]), [b, e])
        self.assertEqual(json.loads(lines["file_offsets"]), [data_start + b, data_start + e])
        widened = NP_TYPES[info["dtype"]][1]
        self.assertEqual("widened to float32" in lines["npy"], widened, lines["npy"])
        if view:
            self.assertEqual(json.loads(lines["view"]), view)
            self.assertIn("conversion", lines)
        else:
            self.assertNotIn("view", lines)

    def check_xattrs(self, stem, name, info, view):
        for suffix in (".info", ".npy", ".raw"):
            p = stem + suffix
            self.assertEqual(os.getxattr(p, "user.castfs.dtype").decode(), info["dtype"])
            self.assertEqual(json.loads(os.getxattr(p, "user.castfs.shape")), info["shape"])
            self.assertEqual(os.getxattr(p, "user.castfs.name").decode(), name)
            names = os.listxattr(p)
            self.assertIn("user.castfs.dtype", names)
            self.assertEqual("user.castfs.view" in names, bool(view))
            for n in names:  # what is listed can be got (cp --preserve=xattr)
                os.getxattr(p, n)
            with self.assertRaises(OSError) as cm:
                os.getxattr(p, "user.castfs.nope")
            self.assertEqual(cm.exception.errno, errno.ENODATA)

    def check_tree(self, tree, file_path, view):
        hdr, meta, data_start = read_header(file_path)
        found = self.walk(tree)
        self.assertEqual(sorted(found), sorted(hdr), tree)
        for name, stem in found.items():
            self.check_tensor(stem, name, hdr[name], data_start, file_path, view)
        with open(os.path.join(tree, "__metadata__.json")) as f:
            self.assertEqual(json.load(f), meta or {})
        return hdr

    def test_source_trees(self):
        for f in self.files():
            with self.subTest(file=f):
                self.check_tree(self.mnt.join(f + ".tensors"),
                                os.path.join(self.src, f), None)

    def test_view_trees(self):
        for f in self.files():
            stem = f[:-len(".safetensors")]
            src_hdr, _, _ = read_header(os.path.join(self.src, f))
            for v in self.views_of(f):
                with self.subTest(file=f, view=v):
                    vf = self.mnt.join("%s.%s.safetensors" % (stem, v))
                    hdr = self.check_tree(vf + ".tensors", vf, v)
                    if v in VIEW_DTYPE:
                        self.check_cast_origin(vf + ".tensors", src_hdr, hdr, v)
                    # safetensors' torch loader refuses an F4 row that
                    # ends inside a byte: fp4's cast views are checked by
                    # check_tree and check_cast_origin only.
                    if v in VIEW_DTYPE and f != "fp4.safetensors":
                        self.check_cast_values(vf + ".tensors",
                                               os.path.join(self.src, f), v)

    def check_cast_values(self, tree, src_path, view):
        """Each tensor file of a cast view's tree holds torch's .to() of
        the source tensor (read by safetensors, cast by torch): the oracle
        is outside castfs, where check_tree compared with castfs's own
        view file. Non-float tensors and other float formats are copied."""
        src = load_file(src_path)
        dt = TORCH_DTYPE[VIEW_DTYPE[view]]
        found = self.walk(tree)
        self.assertEqual(sorted(found), sorted(src), tree)
        for name, t in src.items():
            want = t.to(dt) if t.dtype in CASTABLE else t
            with open(found[name] + ".raw", "rb") as f:
                got = f.read()
            wb = want.reshape(-1).view(torch.uint8).numpy().tobytes() \
                if want.numel() else b""
            if got == wb:
                continue
            # NaN encodings are castfs' choice (docs/FORMATS.md): only the
            # positions and signs must agree there.
            g = torch.frombuffer(bytearray(got), dtype=want.dtype) \
                .reshape(want.shape)
            nan = torch.isnan(want.float())
            self.assertTrue(bool(nan.any()), "%s: %s differs from torch" %
                            (tree, name))
            self.assertTrue(torch.equal(torch.isnan(g.float()), nan), name)
            self.assertTrue(torch.equal(
                g[~nan].reshape(-1).view(torch.uint8),
                want[~nan].reshape(-1).view(torch.uint8)), name)

    def check_cast_origin(self, tree, src_hdr, hdr, view):
        for name, info in hdr.items():
            stem = os.path.join(tree, *self.stem_of(tree, name))
            with open(stem + ".info") as f:
                lines = dict(l.split(": ", 1) for l in f.read().splitlines())
            src = src_hdr[name]
            src_name, end = json.JSONDecoder().raw_decode(lines["source"])
            self.assertEqual(src_name, name)
            self.assertTrue(lines["source"][end:].startswith(" in "), lines["source"])
            conv = os.getxattr(stem + ".raw", "user.castfs.conversion").decode()
            self.assertEqual(lines["conversion"], conv)
            if src["dtype"] == info["dtype"]:
                self.assertEqual(conv, "copy", name)
            else:
                self.assertEqual(info["dtype"], VIEW_DTYPE[view])
                self.assertTrue(conv.startswith("cast %s -> %s" % (src["dtype"], info["dtype"])),
                                conv)
            self.assertEqual(os.getxattr(stem + ".npy", "user.castfs.source_tensor").decode(),
                             name)

    def stem_of(self, tree, name):
        found = self.walk(tree)
        return [os.path.relpath(found[name], tree)]

    def test_escaped_names(self):
        tree = self.mnt.join("hostile.safetensors.tensors")
        for rel in ["x%2Fy", "x%252Fy", "a%2F%2Fb", "a/%/b", "%/%/%", "%/%", "%", "a/%", "%/a",
                    "100%25/w", "ctrl%01name", "q%25+", "sp ace/#hash", "a/b", "a/b/c",
                    "weight/info", "weight/npy/x"]:
            self.assertTrue(os.path.exists(os.path.join(tree, rel + ".raw")), rel)
        self.assertTrue(os.path.isdir(os.path.join(tree, "a", "b")))
        long_dir = os.path.join(tree, "p" * 248 + "%+")
        self.assertTrue(os.path.isdir(long_dir))
        self.assertTrue(os.path.exists(os.path.join(long_dir, "p" * 52, "w.npy")))
        for name in HOSTILE:
            self.assertIn(name, self.walk(tree))
        # Every component stays within NAME_MAX with its suffix, and cuts
        # of a UTF-8 name fall between characters.
        for root, dirs, files in os.walk(tree):
            for n in dirs + files:
                self.assertLessEqual(len(os.fsencode(n)), 255)
                os.fsencode(n).decode("utf-8")

    def test_missing_names(self):
        tree = self.mnt.join("llama.safetensors.tensors")
        for rel in ["model/norm/weight", "model/norm/weight.bin", "model/norm.info",
                    "model/nope", "model/norm/weight.info/x", "model/norm/%77eight.info",
                    "model.norm.weight.info", "nope.safetensors.tensors"]:
            with self.assertRaises(OSError, msg=rel) as cm:
                os.stat(os.path.join(tree, rel))
            self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ENOTDIR), rel)
        with self.assertRaises(OSError):
            os.stat(self.mnt.join("nope.safetensors.tensors"))
        with self.assertRaises(OSError):
            os.stat(self.mnt.join("llama.nope.safetensors.tensors"))

    def test_listing(self):
        root = os.listdir(self.mnt.path)
        ino = {e.name: e.inode() for e in os.scandir(self.mnt.path)}
        for f in self.files():
            self.assertIn(f + ".tensors", root)
            self.assertEqual(ino[f + ".tensors"], os.stat(self.mnt.join(f + ".tensors")).st_ino)
            self.assertNotIn(f[:-12] + ".fp8.safetensors.tensors", root)
        tree = self.mnt.join("llama.safetensors.tensors")
        self.assertEqual(sorted(os.listdir(tree)),
                         ["__metadata__.json", "lm_head", "model"])
        self.assertEqual(sorted(os.listdir(os.path.join(tree, "model", "norm"))),
                         ["weight.info", "weight.npy", "weight.raw"])
        # A directory and a tensor of the same name side by side.
        self.assertEqual(sorted(os.listdir(self.mnt.join("hostile.safetensors.tensors", "a"))),
                         ["%", "%.info", "%.npy", "%.raw", "b", "b.info", "b.npy", "b.raw"])

    def test_inode_numbers_stable(self):
        tree = self.mnt.join("flux.safetensors.tensors", "double_blocks", "0", "img_attn")
        for d in (tree, os.path.join(tree, "qkv"), self.mnt.join("flux.safetensors.tensors")):
            with os.scandir(d) as it:
                for e in it:
                    self.assertEqual(e.inode(), os.stat(e.path, follow_symlinks=False).st_ino,
                                     e.path)

    def test_read_only(self):
        p = self.mnt.join("llama.safetensors.tensors", "model", "norm", "weight.npy")
        for flags in (os.O_WRONLY, os.O_RDWR):
            with self.assertRaises(OSError) as cm:
                os.open(p, flags)
            self.assertEqual(cm.exception.errno, errno.EROFS)

    def test_random_ranges(self):
        """Ranges that cut elements of a widened .npy of a view."""
        p = self.mnt.join("flux.fp8.safetensors.tensors", "time_in", "in_layer", "weight.npy")
        with open(p, "rb") as f:
            whole = f.read()
        tl.check_ranges(self, p, whole, count=100)

    def test_npy_dtypes(self):
        tree = self.mnt.join("dtypes.safetensors.tensors")
        e8m0 = np.load(os.path.join(tree, "e8m0.npy"))
        self.assertEqual(e8m0.dtype, np.uint8)
        self.assertEqual(e8m0.view(ml_dtypes.float8_e8m0fnu).astype(np.float32).tolist(),
                         [1.0, 2.0, 0.25, 1024.0])
        with open(os.path.join(tree, "e8m0.info")) as f:
            self.assertIn("bit patterns", f.read())
        self.assertEqual(np.load(os.path.join(tree, "scalar.npy")).shape, ())
        self.assertEqual(float(np.load(os.path.join(tree, "scalar.npy"))), 3.5)
        self.assertEqual(np.load(os.path.join(tree, "empty.npy")).shape, (0, 4))
        self.assertEqual(np.load(os.path.join(tree, "c64.npy")).dtype, np.complex64)

    def test_generated_tensors_list_no_source_tensor(self):
        """A tensor a view generates (nf4's quant_map, ...) has no source
        tensor: listxattr must not name user.castfs.source_tensor, whose
        getxattr is ENODATA (bug hunt: it was listed, and cp
        --preserve=xattr failed on it)."""
        tree = self.mnt.join("llama.nf4.safetensors.tensors")
        generated = 0
        for name, stem in self.walk(tree).items():
            for suffix in (".info", ".npy", ".raw"):
                p = stem + suffix
                names = os.listxattr(p)
                for n in names:
                    os.getxattr(p, n)
                conv = os.getxattr(p, "user.castfs.conversion").decode()
                if conv != "generated":
                    self.assertIn("user.castfs.source_tensor", names, name)
                    continue
                generated += 1
                self.assertNotIn("user.castfs.source_tensor", names, name)
                with self.assertRaises(OSError) as cm:
                    os.getxattr(p, "user.castfs.source_tensor")
                self.assertEqual(cm.exception.errno, errno.ENODATA)
        self.assertGreater(generated, 0)

    def test_empty_tensor_conversion_named_as_the_others(self):
        """An empty tensor has no extent of its own to say how the view
        casts it: its conversion reads as a non-empty one's of the same
        dtypes, saturation included (bug hunt: it lacked "(saturating)")."""
        tree = self.mnt.join("dtypes.fp8.safetensors.tensors")
        conv = {n: os.getxattr(os.path.join(tree, n + ".raw"),
                               "user.castfs.conversion").decode()
                for n in ("empty", "scalar")}
        self.assertEqual(conv["scalar"], "cast BF16 -> F8_E4M3 (saturating)")
        self.assertEqual(conv["empty"], conv["scalar"])


class DeepNames(unittest.TestCase):
    """A name of 20,000 dotted parts (a 40 KB header): each tree node kept
    its whole path, so walking the tree cost O(N^2): 546 MB and seconds
    (a bug hunt). Nodes deeper than PATH_MAX are not listed and their
    lookup is ENAMETOOLONG; the daemon stays small."""

    PARTS = 20000

    def test_walk_is_bounded(self):
        with tl.tempdir() as src:
            name = "a." * self.PARTS + "w"
            h = json.dumps({name: {"dtype": "F32", "shape": [4],
                                   "data_offsets": [0, 16]}}).encode()
            h += b" " * (-len(h) % 8)
            with open(os.path.join(src, "m.safetensors"), "wb") as f:
                f.write(struct.pack("<Q", len(h)) + h + b"\0" * 16)
            with tl.Mount(src) as m:
                pid = m.daemon()
                base = tl.rss_mb(pid)
                fd = os.open(m.join("m.safetensors.tensors"), os.O_RDONLY)
                depth, sub = 0, ""
                try:
                    while True:  # down by dir fds: no path is too long
                        names = os.listdir(fd)
                        if names != ["a"] and depth:
                            break
                        nfd = os.open("a", os.O_RDONLY, dir_fd=fd)
                        os.close(fd)
                        fd, depth = nfd, depth + 1
                        sub = sub + "/a" if sub else "a"
                    self.assertEqual(names, [])
                    with self.assertRaises(OSError) as cm:
                        os.stat("a", dir_fd=fd)
                    self.assertEqual(cm.exception.errno, errno.ENAMETOOLONG)
                finally:
                    os.close(fd)
                # the deepest listed directory, and no deeper
                self.assertLessEqual(len(sub), 4095)
                self.assertGreater(len(sub) + 2, 4095)
                grown = tl.rss_mb(pid) - base
                print("walked %d levels; the daemon grew %.0f MB"
                      % (depth, grown))
                if not tl.sanitizer(pid):
                    self.assertLess(grown, 64)


if __name__ == "__main__":
    tl.main()
