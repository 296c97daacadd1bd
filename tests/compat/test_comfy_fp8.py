# SPDX-License-Identifier: MIT
"""The fp8_scaled view (ComfyUI scaled fp8) against ComfyUI's own rules.

ComfyUI is not on PyPI, so both sides below are written from its source
(Comfy-Org/ComfyUI 0271a46, comfy-kitchen 0935c34), each rule cited:

- the writer (what the bytes must be): comfy/quant_ops.py
  _TensorCoreFP8LayoutBase.quantize(scale="recalculate"), i.e.
  scale = f32(amax|W|) / 448 (F16 weights: 1 / clamp(1 / scale, f16 range)),
  then comfy_kitchen/backends/eager/quantization.py quantize_per_tensor_fp8:
  clamp(W * (1 / scale).to(W.dtype), -448, 448).to(float8_e4m3fn); the
  layer's state dict (comfy/ops.py _quantized_weight_state_dict):
  "P.weight" fp8, "P.weight_scale" the F32 scalar, "P.comfy_quant" the U8
  bytes of json.dumps({"format": "float8_e4m3fn"});
- the reader (what ComfyUI does with the file): comfy/utils.py
  detect_layer_quantization (any key ending ".comfy_quant" selects the
  mixed-precision ops), comfy/ops.py _load_quantized_module (the marker
  through json.loads(bytes), its format in QUANT_ALGOS, the weight cast to
  the format's storage dtype, "weight_scale" popped), and comfy-kitchen's
  dequantize_per_tensor_fp8: weight.to(bf16) * scale.to(bf16).

Checked: every 2-D Linear weight of bf16, f16 and f32 checkpoints has the
writer's codes and scale byte for byte (an all-zero weight, where the writer
makes NaN codes from 0 * inf, gets scale 1.0 and zero codes: castfs's
documented deviation); biases, norms and 4-D convolutions are copied; the
reader's dequantised weights are within the fp8 bound of the source; random
ranges equal the whole file. Exits 77 without FUSE or torch.
"""
import json
import os
import random
import sys
import unittest

import castfs_testlib as tl

try:
    import torch
    from safetensors.torch import load, save_file
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

FMT = {"format": "float8_e4m3fn"}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def checkpoint(dt, seed):
    """A Flux-like diffusion checkpoint: Linear weights of several scales
    (outliers, -0.0, a tiny one that F16's scale clamp acts on, an all-zero
    one), biases, a norm and a 4-D convolution."""
    g = torch.Generator().manual_seed(seed)
    sd = {
        "double_blocks.0.img_attn.qkv.weight": torch.randn(96, 64, generator=g) * 0.05,
        "double_blocks.0.img_attn.qkv.bias": torch.randn(96, generator=g),
        "double_blocks.0.img_mlp.0.weight": torch.randn(130, 64, generator=g) * 0.02,
        "double_blocks.0.img_attn.norm.key_norm.scale": torch.rand(16, generator=g),
        "img_in.weight": torch.randn(64, 16, generator=g),
        "final_layer.linear.weight": torch.randn(16, 64, generator=g) * 1e-4,
        "single_blocks.0.linear2.weight": torch.zeros(8, 64),
        "vae.conv_in.weight": torch.randn(8, 4, 3, 3, generator=g),
    }
    sd["img_in.weight"][0, :3] = torch.tensor([300.0, -2000.0, -0.0])
    sd["double_blocks.0.img_mlp.0.weight"][5] = 0.0
    return {k: v.to(dt) for k, v in sd.items()}


def comfy_quantize(w):
    """ComfyUI's writer (module docstring): (codes, scale)."""
    scale = torch.amax(w.abs()).to(dtype=torch.float32) / torch.finfo(torch.float8_e4m3fn).max
    if w.dtype not in [torch.float32, torch.bfloat16]:
        info = torch.finfo(w.dtype)
        scale = 1.0 / torch.clamp(1.0 / scale, min=info.min, max=info.max)
    temp = w * (1.0 / scale).to(w.dtype)
    temp = torch.clamp(temp, -448.0, 448.0)
    return temp.to(torch.float8_e4m3fn), scale.float()


def comfy_load(sd):
    """ComfyUI's reader rules (module docstring): {layer: dequantised bf16
    weight}, and the keys it consumed."""
    assert any(k.endswith(".comfy_quant") for k in sd)  # mixed ops
    out, used = {}, set()
    for k in [k for k in sd if k.endswith(".comfy_quant")]:
        p = k[:-len("comfy_quant")]
        conf = json.loads(sd[k].numpy().tobytes())
        assert conf.get("format") == "float8_e4m3fn", conf  # QUANT_ALGOS
        w = sd[p + "weight"].to(dtype=torch.float8_e4m3fn)
        s = sd[p + "weight_scale"]
        out[p + "weight"] = w.to(dtype=torch.bfloat16) * s.to(dtype=torch.bfloat16)
        used |= {k, p + "weight", p + "weight_scale"}
    return out, used


class ComfyFp8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp_cm = tl.tempdir()
        cls.tmp = cls.tmp_cm.__enter__()
        cls.src = {}
        for i, dt in enumerate(DTYPES):
            name = "flux_%s.safetensors" % str(dt)[6:]
            cls.src[name] = checkpoint(dt, 40 + i)
            save_file(cls.src[name], os.path.join(cls.tmp, name))
        g = torch.Generator().manual_seed(9)
        r = lambda *s: torch.randn(*s, generator=g).bfloat16()  # noqa: E731
        cls.full = {  # an SD checkpoint: UNet, text encoder, VAE
            "model.diffusion_model.input_blocks.1.1.proj_in.weight": r(32, 16),
            "model.diffusion_model.out.2.weight": r(4, 8, 3, 3),
            "cond_stage_model.transformer.text_model.encoder.layers.0."
            "self_attn.q_proj.weight": r(16, 16),
            "first_stage_model.decoder.mid.attn_1.q.weight": r(8, 8),
        }
        cls.lora = {  # kohya and PEFT spellings
            "lora_unet_input_blocks_1_1_proj_in.lora_down.weight": r(4, 16),
            "lora_unet_input_blocks_1_1_proj_in.lora_up.weight": r(32, 4),
            "transformer.blocks.0.attn.to_q.lora_A.weight": r(4, 16),
        }
        save_file(cls.full, os.path.join(cls.tmp, "sd_full.safetensors"))
        save_file(cls.lora, os.path.join(cls.tmp, "lora.safetensors"))
        cls.mnt = tl.Mount(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.tmp_cm.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def view(self, name):
        path = self.mnt.join(name.replace(".safetensors", ".fp8_scaled.safetensors"))
        with open(path, "rb") as f:
            return path, f.read()

    def test_comfy__bytes_are_comfyuis_writer(self):
        for name, src in self.src.items():
            _, data = self.view(name)
            sd = load(data)
            for k, w in src.items():
                with self.subTest(file=name, tensor=k):
                    if w.ndim != 2 or not k.endswith(".weight"):
                        self.assertEqual(sd[k].dtype, w.dtype)
                        self.assertTrue(torch.equal(sd[k], w))
                        continue
                    p = k[:-len("weight")]
                    self.assertEqual(sd[k].dtype, torch.float8_e4m3fn)
                    self.assertEqual(sd[p + "weight_scale"].dtype, torch.float32)
                    self.assertEqual(tuple(sd[p + "weight_scale"].shape), ())
                    self.assertEqual(sd[p + "comfy_quant"].dtype, torch.uint8)
                    self.assertEqual(sd[p + "comfy_quant"].numpy().tobytes(),
                                     json.dumps(FMT).encode("utf-8"))
                    codes, scale = comfy_quantize(w)
                    if not w.abs().amax() and w.dtype != torch.float16:
                        # the writer's 0 * inf: NaN codes (F16's clamp
                        # keeps its scale finite: exact there)
                        self.assertTrue(codes.float().isnan().all())
                        codes = torch.zeros_like(codes)
                        scale = torch.tensor(1.0)
                    self.assertTrue(torch.equal(sd[k].view(torch.uint8),
                                                codes.view(torch.uint8)))
                    self.assertEqual(sd[p + "weight_scale"].item(), scale.item())
            self.assertEqual(len(sd), len(src) + 2 * 5)  # 5 Linear weights

    def test_comfy__only_what_comfyui_reads_so(self):
        """In a full checkpoint ComfyUI builds only the diffusion model
        with its mixed-precision ops (the text encoder and VAE are built
        from their own parts, without them), and a LoRA's matrices are
        added as they are: those stay as stored (a bug hunt: quantised,
        their codes would be read as values)."""
        sd = load(self.view("sd_full.safetensors")[1])
        p = "model.diffusion_model.input_blocks.1.1.proj_in."
        self.assertEqual(sd[p + "weight"].dtype, torch.float8_e4m3fn)
        self.assertIn(p + "comfy_quant", sd)
        for k, w in self.full.items():
            if not k.startswith(p):
                self.assertTrue(torch.equal(sd[k], w), k)
        self.assertEqual(len(sd), len(self.full) + 2)
        sd = load(self.view("lora.safetensors")[1])
        self.assertEqual(sorted(sd), sorted(self.lora))
        for k, w in self.lora.items():
            self.assertTrue(torch.equal(sd[k], w), k)

    def test_comfy__reader_dequantises_within_fp8_bound(self):
        for name, src in self.src.items():
            _, data = self.view(name)
            sd = load(data)
            deq, used = comfy_load(sd)
            self.assertEqual(sorted(deq), sorted(k for k, w in src.items()
                                                 if w.ndim == 2 and k.endswith(".weight")))
            self.assertEqual(set(sd) - used, {k for k in src if k not in deq})
            for k, d in deq.items():
                with self.subTest(file=name, tensor=k):
                    w = src[k].float()
                    s = sd[k[:-len("weight")] + "weight_scale"].item()
                    # e4m3: half a step (2^-4 relative; 2^-10 of the scale
                    # below the normals), plus the roundings of x / scale in
                    # the weight's dtype, of the scale and of the product in
                    # bf16 (2^-9 each).
                    bound = w.abs() * (2.0 ** -4 + 3 * 2.0 ** -8) + s * 2.0 ** -9
                    self.assertTrue(bool(((d.float() - w).abs() <= bound).all()),
                                    ((d.float() - w).abs() - bound).max().item())

    def test_comfy__ranges_equal_the_whole_file(self):
        rng = random.Random(7)
        for name in self.src:
            path, data = self.view(name)
            self.assertEqual(os.stat(path).st_size, len(data))
            tl.check_ranges(self, path, data, rng, count=80)


if __name__ == "__main__":
    tl.main()
