# SPDX-License-Identifier: MIT
"""bitsandbytes pre-quantized 4-bit checkpoints as sources (docs/FORMATS.md,
"bitsandbytes 4-bit sources").

- A tiny Llama quantized by transformers + bitsandbytes on CPU
  (load_in_4bit, nf4, double quantisation) and written by save_pretrained
  in two shards with an index: DIR.bf16/ loads with unmodified
  from_pretrained (no missing or unexpected keys, no quantization_config),
  every weight equals bitsandbytes' dequantize_4bit of the source
  (bnb_dequantize: its pure-torch implementation, the same on every CPU;
  loaded from the source folder by transformers), logits equal;
  DIR.nf4/ is offered (its bytes: test_requant.py).
- Single files written with bnb's own QuantState.as_dict(packed=True) (what
  save_pretrained writes per weight) for nf4/fp4, with and without double
  quantisation, blocksizes 64/128/256, shapes that are not multiples of the
  block (an odd element count included) and the three quant_state dtypes:
  the bf16/fp16/fp32/fp8 views equal dequantize_4bit(...).to(dtype) bit
  for bit, companions are gone, random ranges read right.
- Lying quant_state blobs (bad JSON, a shape that disagrees with the packed
  size, an unknown quant_type, nested fields without nested tensors) get no
  views and a reason in /.castfs/rejected; castfs info shows the scheme.
"""
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import bitsandbytes as bnb
        from bitsandbytes.functional import QuantState, \
            dequantize_blockwise
        from bitsandbytes.backends.default.ops import \
            _dequantize_4bit_compute
        from bitsandbytes.backends.utils import _get_4bit_code
        from bitsandbytes.utils import pack_dict_to_tensor, \
            unpack_tensor_to_dict
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file
        from transformers import BitsAndBytesConfig, LlamaConfig, \
            LlamaForCausalLM
        from quant_src_common import bits, end_module, load_quiet
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
STATE = ".quant_state.bitsandbytes__"
# name -> (quant_type, nested, blocksize, dtype, shapes)
SINGLES = {
    "nf4-nested-64": ("nf4", True, 64, torch.bfloat16,
                      [(130, 300), (33, 45)]),
    "nf4-plain-128": ("nf4", False, 128, torch.float16, [(50, 70), (7, 3)]),
    "fp4-nested-256": ("fp4", True, 256, torch.float32,
                       [(300, 260), (9, 11)]),
    "fp4-plain-64": ("fp4", False, 64, torch.bfloat16, [(96, 200)]),
}


class Env:
    root = None
    mnt = None
    singles = {}  # name -> state dict of the source file
    own = None  # castfs's own nf4 file


def quantized(w, qtype, nested, bs, prefix):
    """Weight @w as bitsandbytes writes it: save_pretrained's per-weight
    tensors come from QuantState.as_dict(packed=True) (Params4bit)."""
    q, st = bnb.functional.quantize_4bit(w, blocksize=bs, quant_type=qtype,
                                         compress_statistics=nested)
    out = {prefix: q}
    out.update({prefix + "." + k: v
                for k, v in st.as_dict(packed=True).items()})
    return out


def make_single(path, qtype, nested, bs, dtype, shapes, seed, device="cpu"):
    """A file of 4-bit weights quantised by bitsandbytes on @device (the
    CUDA quantiser: test_gpu_bnb.py)."""
    g = torch.Generator().manual_seed(seed)
    sd = {"norm.weight": torch.randn(shapes[0][1], generator=g).to(dtype)}
    for i, shape in enumerate(shapes):
        w = (torch.randn(*shape, generator=g) * (1 + i)).to(dtype)
        w.view(-1)[5] = 0.0
        sd.update({k: v.cpu() for k, v in quantized(
            w.to(device), qtype, nested, bs, "l%d.weight" % i).items()})
    save_file(sd, path, metadata={"format": "pt"})
    return sd


def reference(sd, dtype):
    """bitsandbytes' dequantize_4bit of every 4-bit weight (bnb_dequantize),
    then .to(dtype); other tensors as stored."""
    out = {}
    weights = [k[:k.index(STATE)] for k in sd if STATE in k]
    for w in weights:
        comp = {k[len(w) + 1:]: v for k, v in sd.items()
                if k.startswith(w + ".")}
        qs = QuantState.from_dict(comp, device="cpu")
        out[w] = bnb_dequantize(sd[w], qs).to(dtype)
    for k, v in sd.items():
        if k not in out and not any(k.startswith(w + ".") for w in weights):
            out[k] = v
    return out


LIES = ("bad-json", "shape", "quant-type", "nested", "trailing", "bad-utf8")


def lying(path, how):
    """A nf4 file whose quant_state lies in way @how."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 64, generator=g).bfloat16()
    q, st = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                         compress_statistics=False)
    sd = {"l.weight": q}
    sd.update({"l.weight." + k: v for k, v in st.as_dict(packed=True).items()})
    key = "l.weight" + STATE + "nf4"
    d = json.loads(bytes(sd[key].tolist()).decode())
    if how == "bad-json":
        sd[key] = torch.tensor(list(b'{"quant_type": "nf4", '),
                               dtype=torch.uint8)
    elif how == "shape":
        d["shape"] = [16, 66]
        sd[key] = pack_dict_to_tensor(d)
    elif how == "quant-type":
        sd["l.weight" + STATE + "int3"] = sd.pop(key)
    elif how == "nested":
        d.update({"nested_blocksize": 256, "nested_dtype": "float32",
                  "nested_offset": 0.5})
        sd[key] = pack_dict_to_tensor(d)
    elif how in ("trailing", "bad-utf8"):
        # A whole, valid object, then a NUL; or a key whose value is not
        # UTF-8: bitsandbytes' decode() / json.loads() raise on both.
        raw = json.dumps(d).encode()
        raw = raw + b"\0" if how == "trailing" else \
            raw[:-1] + b', "x": "\xff"}'
        sd[key] = torch.tensor(list(raw), dtype=torch.uint8)
    save_file(sd, path)


def bnb_dequantize(A, qs):
    """bitsandbytes' dequantize_4bit, the same on every CPU: its pure-torch
    implementation (the fallback its CPU backend takes for odd last
    dimensions), absmax as dequantize_4bit makes it, and FP4 code 8 as its
    C++ kernel decodes it (-0.0; docs/FORMATS.md, "Value") where that kernel
    would run. The C++ kernel itself is not the oracle: on AVX-512 CPUs it
    misreads weights whose last dimension is a multiple of 32 but not of
    the blocksize (FORMATS.md, "Loader caveat"; [96, 96] for one), and its
    results differ between machines."""
    absmax = qs.absmax
    if qs.nested:
        absmax = dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    a = A.view(torch.uint8).reshape(-1)
    out = _dequantize_4bit_compute(
        a, absmax.float(), _get_4bit_code(qs.quant_type, A.device),
        qs.blocksize, qs.shape, qs.dtype)
    if qs.quant_type == "fp4" and qs.shape[-1] % 2 == 0:
        n = out.numel()
        codes = torch.stack([a >> 4, a & 15], 1).reshape(-1)[:n]
        flat = out.reshape(-1).clone()
        flat[codes == 8] = -0.0
        out = flat.reshape(out.shape)
    return out


def make_model(plain, dst):
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(plain)
    m = load_quiet(plain, quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16), device_map="cpu")
    m.save_pretrained(dst, max_shard_size="60KB")


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-bnb4src-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    make_model(os.path.join(Env.root, "plain"), os.path.join(src, "llama-nf4"))
    for i, (name, args) in enumerate(SINGLES.items()):
        Env.singles[name] = make_single(
            os.path.join(src, name + ".safetensors"), *args, seed=i)
    for how in LIES:
        lying(os.path.join(src, "lie-%s.safetensors" % how), how)
    # A seekable-zstd pack of one (its quant_state in a frame of its own
    # or cut by frames: read through the pack's reader).
    os.mkdir(os.path.join(src, "packed"))
    packed = os.path.join(src, "packed", "p.safetensors")
    shutil.copy(os.path.join(src, "nf4-nested-64.safetensors"), packed)
    run_cli("pack", "--frame-size", "4K", packed)
    os.unlink(packed)
    # castfs's own nf4 view, written by castfs convert, as a source.
    g = torch.Generator().manual_seed(9)
    plain = os.path.join(Env.root, "plain.safetensors")
    save_file({"a.weight": torch.randn(70, 130, generator=g).bfloat16(),
               "a.bias": torch.randn(70, generator=g).bfloat16()}, plain)
    run_cli("convert", plain, "--view", "nf4", "-o",
            os.path.join(src, "own.safetensors"))
    Env.own = load_file(os.path.join(src, "own.safetensors"))
    bf16_storage(os.path.join(src, "bf16-storage"))
    Env.mnt = tl.Mount(src)


def bf16_storage(d):
    """A sharded 4-bit folder saved with bnb_4bit_quant_storage bfloat16:
    the codes packed into a BF16 [n, 1] weight in one shard, its
    quant_state in the other."""
    os.mkdir(d)
    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 128, generator=g).bfloat16()
    q, st = bnb.functional.quantize_4bit(
        w, blocksize=64, quant_type="nf4", quant_storage=torch.bfloat16,
        compress_statistics=False)
    comp = {"m.weight." + k: v for k, v in st.as_dict(packed=True).items()}
    s1, s2 = "model-00001-of-00002.safetensors", \
        "model-00002-of-00002.safetensors"
    save_file({"m.weight": q, "n.weight": torch.ones(8).bfloat16()},
              os.path.join(d, s1), metadata={"format": "pt"})
    save_file(comp, os.path.join(d, s2), metadata={"format": "pt"})
    wm = {"m.weight": s1, "n.weight": s1}
    wm.update({k: s2 for k in comp})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256,
                      num_hidden_layers=1, num_attention_heads=4,
                      vocab_size=97).to_dict()
    cfg["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4",
        bnb_4bit_quant_storage=torch.bfloat16).to_dict()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def run_cli(*args):
    r = subprocess.run([tl.castfs_binary()] + list(args),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("castfs %s: %s" % (args[0], r.stderr))


def tearDownModule():
    end_module(Env)


class SingleFile(unittest.TestCase):
    def test_views_equal_dequantize_4bit(self):
        for name, sd in Env.singles.items():
            for v, dt in VIEWS.items():
                with self.subTest(file=name, view=v):
                    got = load_file(Env.mnt.join("%s.%s.safetensors" %
                                                 (name, v)))
                    want = reference(sd, dt)
                    self.assertEqual(sorted(got), sorted(want))
                    for k, t in want.items():
                        self.assertEqual(got[k].dtype, t.dtype, k)
                        self.assertEqual(got[k].shape, t.shape, k)
                        self.assertTrue(torch.equal(bits(got[k]), bits(t)),
                                        k)

    def test_ranges(self):
        name = "fp4-nested-256"
        path = Env.mnt.join(name + ".bf16.safetensors")
        with open(path, "rb") as f:
            whole = f.read()
        got = load_file(path)
        want = reference(Env.singles[name], torch.bfloat16)
        for k, t in want.items():
            self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)
        tl.check_ranges(self, path, whole, random.Random(5), count=100)

    def test_packed_and_castfs_written_sources(self):
        for path, sd in ((Env.mnt.join("packed", "p.bf16.safetensors"),
                          Env.singles["nf4-nested-64"]),
                         (Env.mnt.join("own.fp32.safetensors"), Env.own)):
            with self.subTest(path=path):
                got = load_file(path)
                want = reference(sd, got["a.weight" if "own" in path
                                         else "l0.weight"].dtype)
                self.assertEqual(sorted(got), sorted(want))
                for k, t in want.items():
                    self.assertTrue(torch.equal(bits(got[k]), bits(t)), k)

    def test_lies_rejected(self):
        names = os.listdir(Env.mnt.path)
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        why = {"bad-json": "not a JSON object",
               "shape": "packed size",
               "quant-type": "unknown quant_type",
               "nested": "absmax does not fit",
               "trailing": "not a JSON object",
               "bad-utf8": "not a JSON object"}
        self.assertEqual(set(why), set(LIES))
        for how in ("trailing", "bad-utf8"):
            # The oracle: bitsandbytes refuses these blobs itself.
            with safe_open(os.path.join(Env.mnt.source, "lie-%s.safetensors"
                                        % how), "pt") as f:
                blob = f.get_tensor("l.weight" + STATE + "nf4")
            with self.subTest(oracle=how), self.assertRaises(ValueError):
                unpack_tensor_to_dict(blob)
        for how, text in why.items():
            with self.subTest(lie=how):
                base = "lie-%s" % how
                self.assertNotIn(base + ".bf16.safetensors", names)
                self.assertIn("bitsandbytes 4-bit", rej[base + ".safetensors"])
                self.assertIn(text, rej[base + ".safetensors"])

    def test_info_shows_scheme(self):
        r = subprocess.run([tl.castfs_binary(), "info", os.path.join(
            Env.mnt.source, "nf4-nested-64.safetensors")],
            capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("quantized: bitsandbytes 4-bit, 2 weights", r.stdout)
        self.assertIn("bnb nf4 blocks of 64, double-quantised absmax, true "
                      "shape [130, 300] BF16", r.stdout)

    def test_convert_writes_the_view(self):
        out = os.path.join(Env.root, "conv.fp16.safetensors")
        r = subprocess.run([tl.castfs_binary(), "convert", os.path.join(
            Env.mnt.source, "nf4-plain-128.safetensors"), "--view", "fp16",
            "-o", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f, \
                open(Env.mnt.join("nf4-plain-128.fp16.safetensors"),
                     "rb") as g:
            self.assertEqual(f.read(), g.read())


class Storage(unittest.TestCase):
    def test_non_byte_storage_refused(self):
        """bnb_4bit_quant_storage bfloat16 packs the codes into BF16
        elements: split from its quant_state by a shard, such a weight
        passed for a plain bf16 one and its codes were served cast (a
        bug hunt, stop 42). castfs reads byte storage only: the folder
        is refused by its config, every shard with the reason."""
        names = os.listdir(Env.mnt.path)
        self.assertFalse([n for n in names if n.startswith("bf16-storage.")])
        # the shards themselves, and none of their views
        shards = [n for n in os.listdir(Env.mnt.join("bf16-storage"))
                  if n.startswith("model-")]
        self.assertEqual(sorted(shards), ["model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"])
        with open(Env.mnt.join(".castfs", "rejected")) as f:
            rej = {r["path"]: r["reason"] for r in json.load(f)}
        for s in shards:
            self.assertIn("bnb_4bit_quant_storage 'bfloat16'",
                          rej["bf16-storage/" + s])


class ModelDir(unittest.TestCase):
    def test_bf16_loads_equal_bnb(self):
        view = Env.mnt.join("llama-nf4.bf16")
        with open(os.path.join(view, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f))
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        src = load_quiet(os.path.join(Env.mnt.source, "llama-nf4"),
                         device_map="cpu")
        ref = {}
        for name, mod in src.named_modules():
            if isinstance(mod, bnb.nn.Linear4bit):
                ref[name + ".weight"] = bnb_dequantize(
                    mod.weight.data, mod.weight.quant_state)
        self.assertEqual(len(ref), 14)
        got = dict(model.named_parameters())
        for k, t in ref.items():
            self.assertEqual(got[k].dtype, torch.bfloat16, k)
            self.assertTrue(torch.equal(bits(got[k].data), bits(t)), k)
        plain = LlamaForCausalLM._from_config(
            LlamaConfig.from_pretrained(view), dtype=torch.bfloat16)
        sd = dict(src.state_dict())
        sd.update(ref)
        plain.load_state_dict({k: v for k, v in sd.items()
                               if k in plain.state_dict()})
        ids = torch.arange(20).reshape(1, 20)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, plain(ids).logits))
        del model, src
        gc.collect()

    def test_quantising_views_offered(self):
        """Views that quantise again are offered (their bytes:
        test_requant.py)."""
        names = os.listdir(Env.mnt.path)
        self.assertIn("llama-nf4.bf16", names)
        self.assertIn("llama-nf4.nf4", names)
        self.assertTrue(os.path.exists(
            Env.mnt.join("nf4-plain-128.nf4.safetensors")))


if __name__ == "__main__":
    tl.main()
