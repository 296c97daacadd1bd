# SPDX-License-Identifier: MIT
"""GGUF views of diffusion checkpoints (X.<q>.gguf), read by gguf-py.

The oracle is gguf-py itself: GGUFReader must read every view (it maps the
file with np.memmap), and each tensor's bytes must equal
gguf.quants.quantize() of the source widened to float32 (Q8_0, Q4_0, F16,
BF16, F32), which gguf-py documents as the ggml reference rounding; an F32
source's quantised tensors from its F16 rounding, the file convert.py
writes for llama-quantize. Which
tensors get which type, the names, shapes and KVs are the rules of
ComfyUI-GGUF's convert.py and lcpp.patch as docs/FORMATS.md states them,
written here from that page, not from castfs. A reader that follows
ComfyUI-GGUF's loader (architecture list, orig_shape, dequantization per
use) restores every tensor within its type's bound of the source.
"""
import errno
import mmap
import os
import random
import unittest

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import quants
from safetensors.torch import save_file

import castfs_testlib as tl

VIEWS = {"f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
FILE_TYPE = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}
IMG_ARCH_LIST = {"flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos",
                 "ltxv", "hyvid", "wan", "lumina2", "qwen_image"}
# lcpp.patch llama_model_quantize_internal, "rules for image models": the
# names containing one of KEEP_FIND or equal to one of KEEP_EXACT stay
# unquantised (castfs matches prefixes: the same for these names)
UNET_FIND = ("class_embedding.", "time_embedding.", "add_embedding.",
             "time_embed.", "label_emb.", "conv_in.", "conv_out.")
KEEP_FIND = {
    "flux": ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.",
             "final_layer."),
    "sdxl": UNET_FIND,
    "sd1": UNET_FIND,
    "sd3": ("final_layer.", "time_text_embed.", "context_embedder.",
            "t_embedder.", "y_embedder.", "x_embedder."),
}
UNET_EXACT = ("input_blocks.0.0.weight", "out.2.weight")
KEEP_EXACT = {"flux": (), "sdxl": UNET_EXACT, "sd1": UNET_EXACT,
              "sd3": ("proj_out.weight", "pos_embed")}


def kept(arch, name):
    return any(k in name for k in KEEP_FIND[arch]) or \
        name in KEEP_EXACT[arch]
# Largest |error| per element, relative to the block's largest |x|: half a
# step (Q8_0: amax / 127 / 2; Q4_0: a whole step, amax / 8, where +max
# clips from code 16 to 15), plus the fp16 rounding of the scale (half an
# fp16 ulp, 2^-11 relative, times the largest code).
BOUND = {QT.Q8_0: (0.5 / 127 + 2.0 ** -11) * 1.001,
         QT.Q4_0: (1.0 / 8 + 2.0 ** -11) * 1.001,
         QT.Q4_1: (1.0 / 15 + 2.0 ** -10) * 1.001}


def rand(shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def flux_tensors(dtype):
    g = torch.Generator().manual_seed(3)
    t = {
        "double_blocks.0.img_attn.proj.weight": rand((64, 64), g),
        "double_blocks.0.img_attn.proj.bias": rand((64,), g),
        "double_blocks.0.img_mlp.0.weight": rand((96, 64), g, 0.02),
        "double_blocks.0.img_attn.norm.key_norm.scale": rand((16,), g),
        "img_in.weight": rand((64, 32), g),
        "final_layer.linear.weight": rand((32, 64), g),
        "single_blocks.0.small.weight": rand((8, 16), g),
        "single_blocks.0.odd.weight": rand((40, 48), g),
        "single_blocks.0.conv.weight": rand((8, 8, 4, 4), g),
    }
    # Blocks that test the rounding rules: zeros, ties, one huge value,
    # a negative maximum (Q4_0 scales by the signed max).
    w = torch.zeros(32, 64)
    w[1] = torch.arange(64) * 0.5 - 16
    w[2, :32] = torch.linspace(-127, 127, 32)
    w[3, 5] = -1000.0
    w[4] = (torch.arange(64) % 17) * 0.125 - 1.0
    w[5:] = rand((27, 64), g, 3.0)
    t["double_blocks.0.txt_mod.lin.weight"] = w
    out = {"model.diffusion_model." + k: v.to(dtype) for k, v in t.items()}
    if dtype == torch.float64:
        # Doubles a hair past the midpoint of two halves: float32 rounds
        # them onto the midpoint, so torch's cast (through float32) and
        # numpy's (once) part ways on every one.
        h = (torch.randn(32, 64, generator=g) * 4).half().numpy()
        up = np.nextafter(h, np.float16(np.inf))
        mid = (h.astype(np.float64) + up.astype(np.float64)) / 2
        out["model.diffusion_model.double_blocks.0.ties.weight"] = \
            torch.from_numpy(mid + np.abs(mid) * 2.0 ** -40)
    out["first_stage_model.decoder.conv.weight"] = rand((64, 64), g).to(dtype)
    return out


def ff_down(g):
    """Q4_1's rounding cases: a zero block, a constant one (d = 0), codes
    at .5 ties, a huge outlier, an fp16-overflowing range."""
    w = rand((64, 128), g)
    w[0] = 0
    w[1] = 3.0
    w[2] = torch.arange(128) % 32 * 0.25 - 2.0
    w[3, 7] = -1000.0
    w[4, :32] = torch.linspace(-60000, 60000, 32)
    return w


def sdxl_tensors():
    g = torch.Generator().manual_seed(5)
    t = {
        "input_blocks.3.0.op.weight": rand((32, 32, 3, 3), g),
        "input_blocks.6.0.op.weight": rand((32, 32, 3, 3), g),
        "output_blocks.2.2.conv.weight": rand((32, 32, 3, 3), g),
        "output_blocks.5.2.conv.weight": rand((32, 32, 1, 1), g),
        "input_blocks.0.0.weight": rand((32, 4, 3, 3), g),
        "label_emb.0.0.weight": rand((64, 96), g),
        "input_blocks.1.1.proj_in.weight": rand((64, 64), g),
        "input_blocks.1.1.norm.weight": rand((64,), g),
        # lcpp.patch's feed-forward output: Q4_1 in a Q4_0 file (a bug
        # hunt: castfs wrote Q4_0); its input stays Q4_0
        "input_blocks.1.1.transformer_blocks.0.ff.net.2.weight":
            ff_down(g),
        "input_blocks.1.1.transformer_blocks.0.ff.net.0.proj.weight":
            rand((128, 64), g),
    }
    return {k: v.to(torch.float16) for k, v in t.items()}


def sd1_tensors():
    """convert.py's SD 1.x detection keys (and not SDXL's), the keep-list's
    2-D time_embed and convolutions, a 3x3 convolution reshaped."""
    g = torch.Generator().manual_seed(6)
    t = {k: rand((32, 32, 3, 3), g) for k in (
        "input_blocks.3.0.op.weight", "input_blocks.6.0.op.weight",
        "input_blocks.9.0.op.weight", "output_blocks.2.1.conv.weight",
        "output_blocks.5.2.conv.weight", "output_blocks.8.2.conv.weight")}
    t.update({
        "input_blocks.0.0.weight": rand((32, 4, 3, 3), g),
        "out.2.weight": rand((4, 32, 3, 3), g),
        "time_embed.0.weight": rand((64, 32), g),
        "time_embed.2.weight": rand((64, 64), g),
        "input_blocks.1.1.proj_in.weight": rand((64, 64), g),
        "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight":
            rand((64, 64), g),
        "input_blocks.1.1.transformer_blocks.0.ff.net.2.weight":
            ff_down(g),
    })
    return {k: v.to(torch.float16) for k, v in t.items()}


def sd3_tensors():
    """convert.py's SD3 detection key, every entry of its keep-list."""
    g = torch.Generator().manual_seed(7)
    t = {
        "joint_blocks.0.x_block.attn.qkv.weight": rand((96, 64), g),
        "joint_blocks.0.context_block.mlp.fc2.weight": rand((64, 128), g),
        "joint_blocks.0.x_block.adaLN_modulation.1.weight":
            rand((128, 64), g),
        "context_embedder.weight": rand((64, 96), g),
        "x_embedder.proj.weight": rand((64, 16, 2, 2), g),
        "x_embedder.mlp.weight": rand((64, 64), g),
        "t_embedder.mlp.0.weight": rand((64, 64), g),
        "y_embedder.mlp.0.weight": rand((64, 96), g),
        "final_layer.linear.weight": rand((64, 64), g),
        "final_layer.adaLN_modulation.1.weight": rand((128, 64), g),
        "time_text_embed.text_embedder.linear_1.weight": rand((64, 64), g),
        "proj_out.weight": rand((64, 64), g),
        "pos_embed": rand((1, 32, 64), g),
    }
    return {"model.diffusion_model." + k: v.to(torch.bfloat16)
            for k, v in t.items()}


# lcpp.patch img_tensor_get_type, "Rules for ffn" (substrings of the name)
FFN_DOWN = ("ffn_down", ".ffn.2.weight", ".ff.net.2.weight",
            ".mlp.layer2.weight", ".adaln_modulation_mlp.2.weight",
            ".feed_forward.w2.weight")


def expected_type(arch, view, name, src_dtype, shape):
    """ComfyUI-GGUF's choice (docs/FORMATS.md "GGUF views")."""
    n = int(np.prod(shape)) if shape else 1
    if len(shape) <= 1 or n <= 1024:
        if src_dtype in (torch.float32, torch.bfloat16):
            return QT.F32
        return QT.F16
    want = VIEWS[view]
    if want in (QT.F16, QT.BF16):
        return want
    base = QT.BF16 if src_dtype == torch.bfloat16 else QT.F16
    if len(shape) != 2 or shape[-1] % 32 or kept(arch, name):
        return base
    if want == QT.Q4_0 and (any(p in name for p in FFN_DOWN) or (
            "experts." in name and ".w2.weight" in name)):
        return QT.Q4_1
    return want


def gguf_shape(arch, shape):
    """convert.py's sd1/sdxl reshape; None when the shape is kept."""
    n = int(np.prod(shape))
    if arch in ("sd1", "sdxl") and len(shape) > 1 and n >= 512 \
            and n % 256 == 0 and shape[-1] % 256:
        return [n // 256, 256]
    return None


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


class GGUFViews(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._src = tl.tempdir()
        cls.src = cls._src.__enter__()
        cls.sources = {
            "flux_bf16": ("flux", flux_tensors(torch.bfloat16)),
            "flux_f32": ("flux", flux_tensors(torch.float32)),
            # convert.py casts F64 with numpy: one rounding to F16
            "flux_f64": ("flux", flux_tensors(torch.float64)),
            "sdxl": ("sdxl", sdxl_tensors()),
            "sd1": ("sd1", sd1_tensors()),
            "sd3": ("sd3", sd3_tensors()),
        }
        for name, (_, t) in cls.sources.items():
            save_file(t, os.path.join(cls.src, name + ".safetensors"))
        g = torch.Generator().manual_seed(9)
        save_file({"encoder.layer.0.weight": rand((64, 64), g)},
                  os.path.join(cls.src, "unknown.safetensors"))
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._src.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def path(self, src, view):
        return self.mount.join("%s.%s.gguf" % (src, view))

    def expected(self, src, view):
        """name -> (type, gguf shape or None, torch shape, float32 data)."""
        arch, tensors = self.sources[src]
        out = {}
        for k, v in tensors.items():
            if not k.startswith("model.diffusion_model.") and \
                    src.startswith("flux"):
                continue  # convert.py strip_prefix drops the rest
            name = k[len("model.diffusion_model."):] \
                if k.startswith("model.diffusion_model.") else k
            shape = list(v.shape)
            fixed = gguf_shape(arch, shape)
            qt = expected_type(arch, view, name, v.dtype, fixed or shape)
            data = v.numpy() if v.dtype == torch.float64 else \
                v.float().numpy()
            if qt in (QT.Q8_0, QT.Q4_0, QT.Q4_1) and \
                    v.dtype in (torch.float32, torch.float64):
                # convert.py writes an F32 or F64 tensor as F16 (numpy's
                # cast: F64 rounded once), which llama-quantize then
                # quantises (bug hunts: castfs quantised the F32 values)
                data = data.astype(np.float16).astype(np.float32)
            out[name] = (qt, fixed, shape, data)
        return out

    def check_view(self, src, view):
        arch = self.sources[src][0]
        path = self.path(src, view)
        reader = GGUFReader(path)  # np.memmap of the mounted file
        self.assertEqual(field(reader, "general.architecture"), arch)
        self.assertEqual(field(reader, "general.quantization_version"), 2)
        self.assertEqual(field(reader, "general.file_type"), FILE_TYPE[view])
        exp = self.expected(src, view)
        names = [t.name for t in reader.tensors]
        self.assertEqual(names, sorted(exp))
        for t in reader.tensors:
            qt, fixed, shape, data = exp[t.name]
            self.assertEqual(t.tensor_type, qt, t.name)
            self.assertEqual(list(reversed(t.shape.tolist())), fixed or shape,
                             t.name)
            key = "comfy.gguf.orig_shape." + t.name
            if fixed:
                self.assertEqual(field(reader, key), shape)
            else:
                self.assertNotIn(key, reader.fields)
            src_data = data.reshape(fixed) if fixed else data
            want = quants.quantize(src_data, qt)
            got = np.asarray(t.data)
            self.assertEqual(got.tobytes(), want.tobytes(),
                             "%s %s %s" % (src, view, t.name))
        # gguf.cpp: offsets sequential, each tensor padded to 32.
        off = 0
        for t in sorted(reader.tensors, key=lambda t: t.data_offset):
            self.assertEqual(t.data_offset - reader.data_offset, off)
            off += (t.n_bytes + 31) // 32 * 32
        self.assertEqual(reader.data_offset % 32, 0)
        self.assertEqual(os.path.getsize(path), reader.data_offset + off)
        return reader

    def test_every_view(self):
        for src in self.sources:
            for view in VIEWS:
                with self.subTest(src=src, view=view):
                    self.check_view(src, view)

    def test_comfyui_loader_rules(self):
        """ComfyUI-GGUF loader.py: architecture check, orig_shape restore,
        dequantization per use; within the type's bound of the source."""
        for src in ("flux_bf16", "sdxl"):
            exp = self.expected(src, "q8_0")
            reader = GGUFReader(self.path(src, "q8_0"))
            arch = field(reader, "general.architecture")
            self.assertIn(arch, IMG_ARCH_LIST)
            seen = set()
            for t in reader.tensors:
                key = "comfy.gguf.orig_shape." + t.name
                shape = field(reader, key) if key in reader.fields else \
                    list(reversed(t.shape.tolist()))
                deq = quants.dequantize(np.asarray(t.data), t.tensor_type)
                deq = np.asarray(deq, dtype=np.float32).reshape(shape)
                qt, _, tshape, data = exp[t.name]
                self.assertEqual(list(shape), tshape)
                if qt in BOUND:
                    blocks = data.reshape(-1, 32)
                    scale = np.abs(blocks).max(axis=1, keepdims=True)
                    err = np.abs(deq.reshape(-1, 32) - blocks)
                    self.assertTrue(np.all(err <= scale * BOUND[qt] + 1e-6),
                                    t.name)
                    seen.add(qt)
                elif qt == QT.F16:
                    self.assertTrue(np.array_equal(
                        deq, data.astype(np.float16).astype(np.float32)),
                        t.name)
                else:
                    self.assertTrue(np.array_equal(deq, data), t.name)
            self.assertIn(QT.Q8_0, seen)

    def test_q4_1_for_feed_forward_outputs(self):
        import ggml_oracle  # llama-cpp-python's libggml-base
        reader = GGUFReader(self.path("sdxl", "q4_0"))
        types = {t.name: t.tensor_type for t in reader.tensors}
        ff = "input_blocks.1.1.transformer_blocks.0.ff.net."
        self.assertEqual(types[ff + "2.weight"], QT.Q4_1)
        self.assertEqual(types[ff + "0.proj.weight"], QT.Q4_0)
        # ggml's own quantize_row_q4_1_ref, beside gguf-py's (every view)
        t = next(t for t in reader.tensors if t.name == ff + "2.weight")
        x = self.sources["sdxl"][1][ff + "2.weight"].float().numpy()
        self.assertEqual(np.asarray(t.data).tobytes(),
                         ggml_oracle.quantize_ref(QT.Q4_1, x).tobytes())

    def test_q4_0_quantized(self):
        reader = GGUFReader(self.path("flux_f32", "q4_0"))
        types = {t.name: t.tensor_type for t in reader.tensors}
        self.assertEqual(types["double_blocks.0.txt_mod.lin.weight"], QT.Q4_0)
        self.assertEqual(types["img_in.weight"], QT.F16)  # keep-list
        self.assertEqual(types["single_blocks.0.odd.weight"], QT.F16)

    def test_ranges_and_mmap(self):
        path = self.path("flux_bf16", "q8_0")
        with open(path, "rb") as f:
            full = f.read()
        self.assertEqual(len(full), os.path.getsize(path))
        rng = random.Random(11)
        tl.check_ranges(self, path, full, rng, count=100)
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            for _ in range(100):
                off = rng.randrange(len(full))
                n = rng.randrange(1, 5000)
                self.assertEqual(m[off:off + n], full[off:off + n])
            m.close()

    def test_listed_when_chosen(self):
        self.assertNotIn("flux_bf16.q8_0.gguf", os.listdir(self.mount.path))
        with tl.Mount(self.src, options=["views=q8_0:fp8"]) as m:
            names = os.listdir(m.path)
            for src in self.sources:
                self.assertIn(src + ".q8_0.gguf", names)
            self.assertIn("unknown.fp8.safetensors", names)
            self.assertNotIn("unknown.q8_0.gguf", names)
            self.assertNotIn("flux_bf16.q4_0.gguf", names)

    def assert_no_such_file(self, path):
        """A GGUF name castfs refuses is not listed, so its lookup answers
        ENOENT like any other name not there (the reason is in the log)."""
        for op in (os.stat, lambda p: open(p, "rb").close()):
            with self.assertRaises(OSError) as cm:
                op(path)
            self.assertEqual(cm.exception.errno, errno.ENOENT, path)

    def test_unknown_architecture_has_no_view(self):
        self.assert_no_such_file(self.path("unknown", "q8_0"))
        self.assertFalse(os.path.exists(self.mount.join(
            "flux_bf16.q8_0.safetensors")))
        self.assertFalse(os.path.exists(self.mount.join("flux_bf16.q8_0")))

    def test_no_k_quant_mix_for_diffusion(self):
        """llama-quantize's K-quant mixes are made for model folders only
        (docs/FORMATS.md): a lookup fails rather than guess the image-model
        mix of ComfyUI-GGUF's patched llama-quantize."""
        for view in ("q4_k_m", "q5_k_m", "q6_k"):
            self.assert_no_such_file(self.path("flux_bf16", view))
        self.assertIn("K-quant mixes are built for model folders only",
                      self.mount.output())


if __name__ == "__main__":
    tl.main()
