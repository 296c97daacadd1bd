# SPDX-License-Identifier: MIT
"""ComfyUI scaled fp8 sources (docs/FORMATS.md, "ComfyUI scaled fp8").

- The legacy form (a "scaled_fp8" marker, F8_E4M3 "M.weight" with an F32
  "M.scale_weight", an optional "M.scale_input"), the comfy_quant form
  ("M.weight_scale", "M.input_scale", a U8 "M.comfy_quant" JSON) and the
  "_quantization_metadata" header form (its layers read as ComfyUI's
  convert_old_quants and _load_quantized_module read them, re-typed
  below, the key itself gone from every view): the
  bf16/fp16/fp32/fp8 views equal, byte for byte, safetensors.torch.save()
  of what ComfyUI computes for each weight: comfy-kitchen's eager
  dequantize_per_tensor_fp8 (and comfy/ops.py's legacy scaled_fp8_ops),
  x.to(dtype) * scale.to(dtype) in torch, transcribed below; every
  companion (marker, scales, comfy_quant) is gone, every other tensor kept
  as stored. The rule differs from the fp32 product for these scales (the
  test checks it), so a view computed the DeepSeek way would fail.
- The nf4 view is bitsandbytes' quantisation of the bf16 dequantization
  (bnb_ref.py, checked against bitsandbytes in test_bnb.py).
- ComfyUI layers castfs does not dequantize (e5m2 weights, per-row scales,
  an fp8 weight without its scale; in the metadata: other formats, a layer
  without its tensors, JSON ComfyUI refuses, a legacy marker beside it)
  get no views and a reason.
- castfs info shows the layout; castfs convert writes the bf16 view.
"""
import json
import os
import shutil
import sys
import unittest
import warnings

import castfs_testlib as tl
import bnb_ref

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from safetensors.torch import load_file, save, save_file
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

F8 = torch.float8_e4m3fn
MD = {"format": "pt"}
VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32, "fp8": F8}


def comfy_quant(w):
    """ComfyUI's writer: scale = amax / 448 in fp32, per tensor."""
    s = w.float().abs().max() / 448.0
    return (w.float() / s).clamp(-448, 448).to(F8), s.reshape(())


def quant_json(full=False, fmt="float8_e4m3fn", raw=None):
    conf = {"format": fmt}
    if full:
        conf["full_precision_matrix_mult"] = True
    b = raw if raw is not None else json.dumps(conf).encode("utf-8")
    return torch.tensor(list(b), dtype=torch.uint8)


def comfy_dequant(q, s, dtype):
    """comfy-kitchen eager dequantize_per_tensor_fp8 (and the legacy
    scaled_fp8_ops): multiply in the compute dtype. The fp8 view has no
    ComfyUI compute dtype: castfs computes it in fp32 (docs/FORMATS.md)."""
    if dtype == F8:
        return (q.float() * s.float()).to(F8)
    return q.to(dtype) * s.to(dtype)


def legacy_file(g):
    t = {"scaled_fp8": torch.empty(0, dtype=F8)}
    for name, shape in (("blocks.0.attn.qkv", (48, 70)),
                        ("blocks.0.mlp.fc1", (33, 64)),
                        ("blocks.1.mlp.fc2", (64, 33))):
        q, s = comfy_quant(torch.randn(*shape, generator=g) * 0.37)
        t[name + ".weight"] = q
        t[name + ".scale_weight"] = s
        t[name + ".bias"] = torch.randn(shape[0], generator=g).bfloat16()
    t["blocks.1.mlp.fc2.scale_weight"] = \
        t["blocks.1.mlp.fc2.scale_weight"].reshape(1)
    t["blocks.0.attn.qkv.scale_input"] = torch.tensor(1.0)
    t["final.norm.weight"] = torch.randn(70, generator=g)
    return t


def current_file(g):
    t = {}
    for name, shape, full in (("layers.0.proj", (40, 96), False),
                              ("layers.1.proj", (96, 40), True)):
        q, s = comfy_quant(torch.randn(*shape, generator=g) * 2.1)
        t[name + ".weight"] = q
        t[name + ".weight_scale"] = s
        t[name + ".comfy_quant"] = quant_json(full)
    t["layers.0.proj.input_scale"] = torch.tensor(0.25)
    t["layers.1.norm.weight"] = torch.randn(96, generator=g).bfloat16()
    return t


def meta_file(g):
    """The header form: the layers named only by __metadata__'s
    _quantization_metadata, one of them with a comfy_quant tensor as well
    (the metadata's entry replaces it), one with a comfy_quant tensor
    only (ComfyUI keeps it)."""
    t, layers = {}, {}
    for name, shape, conf in (
            ("model.diffusion_model.blocks.0.attn.to_q", (64, 48),
             {"format": "float8_e4m3fn"}),
            ("model.diffusion_model.blocks.0.attn.to_k", (33, 48),
             {"format": "float8_e4m3fn",
              "full_precision_matrix_mult": True}),
            ("model.diffusion_model.blocks.1.ff.0", (96, 33),
             {"format": "float8_e4m3fn"}),
            ("model.diffusion_model.blocks.1.ff.2", (48, 96), None)):
        q, s = comfy_quant(torch.randn(*shape, generator=g) * 0.7)
        t[name + ".weight"] = q
        t[name + ".weight_scale"] = s
        t[name + ".bias"] = torch.randn(shape[0], generator=g).bfloat16()
        if conf is not None:
            layers[name] = conf
    t["model.diffusion_model.blocks.0.attn.to_q.input_scale"] = \
        torch.tensor(0.5)
    # replaced by the metadata's entry: its own format is never read
    t["model.diffusion_model.blocks.1.ff.0.comfy_quant"] = \
        quant_json(fmt="nvfp4")
    t["model.diffusion_model.blocks.1.ff.2.comfy_quant"] = quant_json()
    t["model.diffusion_model.norm_out.weight"] = \
        torch.randn(48, generator=g).bfloat16()
    md = dict(MD)
    md["_quantization_metadata"] = json.dumps({"format_version": "1.0",
                                               "layers": layers})
    return t, md


def convert_old_quants(sd, metadata):
    """comfy/utils.py convert_old_quants (ComfyUI, 2026), the metadata
    branch, re-typed: each entry of _quantization_metadata["layers"]
    becomes "<layer>.comfy_quant", the bytes of json.dumps(entry)."""
    sd = dict(sd)
    if "_quantization_metadata" in metadata:
        qm = json.loads(metadata["_quantization_metadata"])
        for k, v in qm["layers"].items():
            sd["{}.comfy_quant".format(k)] = torch.tensor(
                list(json.dumps(v).encode("utf-8")), dtype=torch.uint8)
    return sd


def comfy_load(sd, metadata, dtype):
    """What ComfyUI's model holds: convert_old_quants, then per layer
    comfy/ops.py _load_quantized_module (json.loads of its comfy_quant,
    QUANT_ALGOS["float8_e4m3fn"], weight_scale and input_scale popped)
    and comfy-kitchen's eager dequantize_per_tensor_fp8 (comfy_dequant)."""
    out = convert_old_quants(sd, metadata)
    for k in [k for k in out if k.endswith(".comfy_quant")]:
        p = k[:-len("comfy_quant")]
        conf = json.loads(out.pop(k).numpy().tobytes())
        assert conf["format"] == "float8_e4m3fn", conf
        w, s = out.pop(p + "weight"), out.pop(p + "weight_scale")
        out.pop(p + "input_scale", None)
        out[p + "weight"] = comfy_dequant(w, s.reshape(()), dtype)
    return out


def expected(src, dtype):
    out = {}
    for k, t in src.items():
        mod = k.rsplit(".", 1)[0] + "." if "." in k else ""
        leaf = k.rsplit(".", 1)[-1]
        if leaf in ("scaled_fp8", "scale_weight", "scale_input",
                    "weight_scale", "input_scale", "comfy_quant"):
            continue
        scale = src.get(mod + "scale_weight", src.get(mod + "weight_scale"))
        if leaf == "weight" and t.dtype == F8:
            out[k] = comfy_dequant(t, scale.reshape(()), dtype)
        else:
            out[k] = t
    return out


def bits(t):
    return t.contiguous().view(torch.uint8)


def qmeta(layers):
    md = dict(MD)
    md["_quantization_metadata"] = layers if isinstance(layers, str) else \
        json.dumps({"layers": layers})
    return md


# The metadata of the refused files that have one.
REFUSED_META = {
    "comfy-meta-nvfp4": qmeta({"l": {"format": "nvfp4"}}),
    "comfy-meta-e5m2": qmeta({"l": {"format": "float8_e5m2"}}),
    "comfy-meta-string": qmeta({"l": "float8_e4m3fn"}),
    "comfy-meta-ghost": qmeta({"l": {"format": "float8_e4m3fn"},
                               "ghost": {"format": "float8_e4m3fn"}}),
    "comfy-meta-json": qmeta('{"layers": {"l": {"format": '
                             '"float8_e4m3fn"}}} x'),
    "comfy-meta-marker": qmeta({"l": {"format": "float8_e4m3fn"}}),
}


def refused():
    g = torch.Generator().manual_seed(9)
    q, s = comfy_quant(torch.randn(16, 32, generator=g))
    pair = {"l.weight": q, "l.weight_scale": s}
    return {
        "comfy-meta-nvfp4": {
            "l.weight": torch.randint(0, 255, (16, 16), dtype=torch.uint8),
            "l.weight_scale": torch.ones(16, 2).to(F8),
            "l.weight_scale_2": torch.tensor(1.0)},
        "comfy-meta-e5m2": dict(pair),
        "comfy-meta-string": dict(pair),
        "comfy-meta-ghost": dict(pair),
        "comfy-meta-json": dict(pair),
        "comfy-meta-marker": {"scaled_fp8": torch.empty(0, dtype=F8),
                              "l.weight": q, "l.scale_weight": s,
                              "l.weight_scale": s.clone()},
        "comfy-e5m2": {"scaled_fp8": torch.empty(0, dtype=torch.float8_e5m2),
                       "l.weight": torch.randn(16, 32).to(torch.float8_e5m2),
                       "l.scale_weight": s},
        # ComfyUI reads the layer by its comfy_quant JSON's "format" (a
        # bug hunt: castfs went by the dtypes, as e4m3fn)
        "comfy-quant-nvfp4": dict(pair, **{"l.comfy_quant":
                                           quant_json(fmt="nvfp4")}),
        "comfy-quant-e5m2": dict(pair, **{"l.comfy_quant":
                                          quant_json(fmt="float8_e5m2")}),
        "comfy-quant-nojson": dict(pair, **{"l.comfy_quant":
                                            quant_json(raw=b"e4m3fn")}),
        "comfy-quant-trailing": dict(pair, **{"l.comfy_quant": quant_json(
            raw=b'{"format": "float8_e4m3fn"} x')}),
        "comfy-row-scale": {"l.weight": q,
                            "l.weight_scale": torch.rand(16, 1),
                            "l.comfy_quant": quant_json()},
        "comfy-lone-fp8": {"scaled_fp8": torch.empty(0, dtype=F8),
                           "l.weight": q, "l.scale_weight": s,
                           "m.weight": q.clone()},
    }


class Env:
    root = None
    mnt = None
    files = {}
    meta = None


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-comfy-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    g = torch.Generator().manual_seed(4)
    Env.files = {"legacy": legacy_file(g), "current": current_file(g)}
    Env.files["meta"], Env.meta = meta_file(g)
    Env.files.update(refused())
    for name, t in Env.files.items():
        md = Env.meta if name == "meta" else REFUSED_META.get(name, MD)
        save_file(t, os.path.join(src, name + ".safetensors"), metadata=md)
    Env.mnt = tl.Mount(src)


def tearDownModule():
    rc = Env.mnt.unmount() if Env.mnt else 0
    shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


class Comfy(unittest.TestCase):
    def test_rule_is_not_the_fp32_product(self):
        """The compute-dtype rule matters for these scales: a view that
        multiplied in fp32 then rounded would not equal the oracle."""
        differ = 0
        for name in ("legacy", "current"):
            src = Env.files[name]
            for k, t in src.items():
                if t.dtype == F8 and k.endswith(".weight"):
                    e = expected(src, torch.bfloat16)[k]
                    mod = k[:-len("weight")]
                    s = src.get(mod + "scale_weight",
                                src.get(mod + "weight_scale")).reshape(())
                    f32 = (t.float() * s).to(torch.bfloat16)
                    differ += int((bits(e) != bits(f32)).any())
        self.assertGreater(differ, 0)

    def test_views_bit_exact(self):
        for name in ("legacy", "current", "meta"):
            for v, dt in VIEWS.items():
                with self.subTest(file=name, view=v):
                    if name == "meta":
                        exp = comfy_load(Env.files[name], Env.meta, dt)
                    else:
                        exp = expected(Env.files[name], dt)
                    want = save(exp, metadata=MD)
                    path = Env.mnt.join("%s.%s.safetensors" % (name, v))
                    got_t = load_file(path)
                    self.assertEqual(sorted(got_t), sorted(exp))
                    for k in exp:
                        self.assertEqual(got_t[k].dtype, exp[k].dtype, k)
                        self.assertTrue(torch.equal(bits(got_t[k]),
                                                    bits(exp[k])), k)
                    with open(path, "rb") as f:
                        self.assertEqual(f.read(), want)
                    tl.check_ranges(self, path, want, count=30)

    def test_nf4_of_dequantized(self):
        src = expected(Env.files["legacy"], torch.bfloat16)
        quantised = {k for k, t in Env.files["legacy"].items()
                     if t.dtype == F8 and k.endswith(".weight")}
        path = Env.mnt.join("legacy.nf4_nodq.safetensors")
        with open(path, "rb") as f:
            got = f.read()
        self.assertTrue(got == bnb_ref.materialise("nf4_nodq", src,
                                                   quantised, MD, None))

    def test_refused(self):
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for name in refused():
            with self.subTest(name=name):
                self.assertEqual([n for n in names
                                  if n.startswith(name + ".")
                                  and n != name + ".safetensors"], [])
                self.assertIn("ComfyUI", rej[name + ".safetensors"])
                if name.startswith("comfy-quant-"):  # its loader refuses
                    with self.assertRaises((AssertionError, ValueError)):
                        comfy_load(Env.files[name], MD, torch.bfloat16)


class CommandLine(unittest.TestCase):
    def run_cli(self, *args):
        return tl.subprocess.run([tl.castfs_binary()] + list(args),
                                 capture_output=True, text=True)

    def test_info(self):
        r = self.run_cli("info", os.path.join(Env.mnt.source,
                                              "current.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: ComfyUI scaled fp8, 2 weights", r.stdout)
        self.assertIn("comfy scaled fp8, F32 scale layers.0.proj.weight_scale",
                      r.stdout)

    def test_info_metadata_form(self):
        r = self.run_cli("info", os.path.join(Env.mnt.source,
                                              "meta.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: ComfyUI scaled fp8, 4 weights", r.stdout)

    def test_convert_bf16(self):
        out = os.path.join(Env.root, "legacy.bf16.safetensors")
        r = self.run_cli("convert", os.path.join(Env.mnt.source,
                                                 "legacy.safetensors"),
                         "--view", "bf16", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(),
                             save(expected(Env.files["legacy"],
                                           torch.bfloat16), metadata=MD))


if __name__ == "__main__":
    tl.main()
