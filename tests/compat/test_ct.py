# SPDX-License-Identifier: MIT
"""compressed-tensors views (fp8_dynamic, fp8_block, w4a16, nvfp4) vs
llm-compressor.

The oracle is llm-compressor 0.14 + compressed-tensors 0.19 in their own
venv (scripts/setup-llmc; ct_oracle.py runs there): a data-free oneshot of
QuantizationModifier(targets="Linear", scheme=FP8_DYNAMIC | FP8_BLOCK |
W4A16 | NVFP4A16, ignore=["lm_head"]) saved with save_compressed=True, on
the same small
Llama models built here by transformers (dims that are not multiples of 128,
so channel scales of odd lengths and 128x128 edge blocks are both met).

- Model directory and single-file views equal the oracle's safetensors file
  byte for byte (bf16, f16 and f32 sources: the scale dtype follows the
  weight), whole and by random ranges; a sharded source gets the same
  tensors (names, dtypes, shapes, bytes) across its converted shards. For
  nvfp4 the shards cut fused groups (q/k/v, gate/up: one global scale over
  the group), which castfs quantises as llm-compressor does on the whole
  model: each shard reads its siblings' elements from the other shards.
- config.json's quantization_config, read by compressed-tensors'
  QuantizationConfig, equals the oracle's (nvfp4: but for scale_dtype,
  which castfs leaves to its float8_e4m3fn default), and carries only keys
  every compressed-tensors release accepts (no scale_dtype / zp_dtype).
- transformers (with compressed-tensors, CPU) loads each DIR.<view>/ with no
  missing or unexpected keys; its logits are within 1/8 of the largest
  source logit (fp8's relative step), and every decompressed Linear weight
  is within the fp8 bound of the source (ct_oracle.weight_bound).
- A stray consolidated.safetensors (Mistral's) beside two of the models
  changes neither: transformers does not read it, nor does the config.
Exits 77 when FUSE, torch, transformers or the oracle venv is unavailable.
"""
import json
import os
import random
import subprocess
import sys
import unittest

import castfs_testlib as tl
from layout_ref import relayout, scale_is_late

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
VENV_PY = os.path.join(os.environ.get("CASTFS_LLMC_VENV",
                                      os.path.join(ROOT, ".venv-llmc")),
                       "bin", "python")
VIEWS = {"fp8_dynamic": "FP8_DYNAMIC", "fp8_block": "FP8_BLOCK",
         "w4a16": "W4A16", "nvfp4": "NVFP4A16"}
KIND = {"fp8_dynamic": "channel", "fp8_block": "block", "w4a16": "group",
        "nvfp4": "fp4"}
# The layer groups llm-compressor gives one NVFP4 global scale
# (llmcompressor.observers.helpers.FUSED_LAYER_NAMES).
FUSED = (("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj"),
         ("q_a_proj", "kv_a_proj_with_mqa"), ("w1", "w3"))


def split_groups(src):
    """The modules of fused groups that a sharded @src spreads over more
    than one file (castfs's nvfp4 reads their siblings across shards)."""
    idx = os.path.join(src, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return []
    with open(idx) as f:
        wm = json.load(f)["weight_map"]
    out = []
    for k in wm:
        if not k.endswith(".weight") or k.count(".") < 2:
            continue
        parent, mod = k.rsplit(".", 2)[0], k.rsplit(".", 2)[1]
        for g in FUSED:
            names = ["%s.%s.weight" % (parent, n) for n in g]
            if (mod == g[0] and all(n in wm for n in names) and
                    len({wm[n] for n in names}) > 1):
                out += ["%s.%s" % (parent, n) for n in g]
    return sorted(out)


def tiny_llama(path, dtype, hidden, inter, head_dim, seed, shard=None):
    """A random Llama saved by transformers (names and layout as real)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=head_dim,
                      max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).to(dtype)
    with torch.no_grad():  # some rows of zeros: the eps scale
        m.model.layers[0].mlp.up_proj.weight[3].zero_()
        m.model.layers[1].self_attn.q_proj.weight[:, 5] *= 40.0  # outliers
        # -0.0: alone, and a whole group of 16 (a zero scale)
        m.model.layers[0].mlp.down_proj.weight[1, 3] = -0.0
        m.model.layers[0].mlp.down_proj.weight[2, 16:32] = -0.0
    if shard:
        m.save_pretrained(path, max_shard_size=shard)
    else:
        m.save_pretrained(path)


# name -> (dtype, hidden, intermediate, head_dim, shard): "odd*" have dims
# that are not multiples of 128 (edge blocks); "load" has the input dims
# compressed-tensors' per-group-128 activations need, with 64-row k/v
# weights (edge block rows), and is sharded.
MODELS = {
    "odd_bf16": (torch.bfloat16, 200, 320, 50, None),
    "odd_f16": (torch.float16, 200, 320, 50, None),
    "odd_f32": (torch.float32, 200, 320, 50, None),
    "load": (torch.bfloat16, 256, 384, 32, "300KB"),
    "w4mix": (torch.bfloat16, 256, 320, 32, None),
}
# Models with a stray consolidated.safetensors beside them.
STRAY = ("load", "w4mix")


# Largest |logits - source logits| allowed, relative to the largest source
# logit: fp8's relative step (1/8); int4 with 15 levels per group and fp4
# with 15 per 16 elements, 1/3.
LOGIT_TOL = {"channel": 1 / 8, "block": 1 / 8, "group": 1 / 3, "fp4": 1 / 3}


def KIND_OF(view_dir):
    return KIND[view_dir.rsplit(".", 1)[1]]


def run_oracle(jobs, tmp):
    path = os.path.join(tmp, "jobs.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    p = subprocess.run([VENV_PY, os.path.join(HERE, "ct_oracle.py"), path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("ct_oracle failed:\n" + p.stdout[-3000:] +
                             p.stderr[-6000:])
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def tensors(d):
    """{name: (dtype, shape, bytes)} over every safetensors file of @d but
    the stray consolidated.safetensors."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors") or f == "consolidated.safetensors":
            continue
        with safe_open(os.path.join(d, f), "pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                out[k] = (str(t.dtype), tuple(t.shape),
                          t.contiguous().view(torch.uint8).numpy().tobytes())
    return out


class CtViews(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp_cm = tl.tempdir()
        cls.tmp = cls.tmp_cm.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        cls.ref = os.path.join(cls.tmp, "ref")
        os.makedirs(cls.src)
        jobs = []
        for i, (name, (dt, h, it, hd, shard)) in enumerate(MODELS.items()):
            tiny_llama(os.path.join(cls.src, name), dt, h, it, hd, 100 + i,
                       shard)
            for view, scheme in VIEWS.items():
                src = os.path.join(cls.src, name)
                jobs.append([src, os.path.join(cls.ref, name + "." + view),
                             scheme, []])
        run_oracle({"quantize": jobs}, cls.tmp)
        # Mistral's consolidated.safetensors beside the model: transformers
        # never reads it, so its widths (no multiple of 128) must not reach
        # the quantization_config's ignore list.
        for name in STRAY:
            save_file({"layers.0.attention.wq.weight":
                       torch.randn(200, 200, dtype=torch.bfloat16),
                       "output.weight": torch.randn(20, 200)},
                      os.path.join(cls.src, name, "consolidated.safetensors"))
        cls.mnt = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.tmp_cm.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def ref_file(self, model, view):
        """llm-compressor's file, with its scales laid out last
        (docs/FORMATS.md, "the late run")."""
        with open(os.path.join(self.ref, model + "." + view,
                               "model.safetensors"), "rb") as f:
            return relayout(f.read(), scale_is_late)

    def test_ct__single_files_equal_llm_compressor(self):
        rng = random.Random(13)
        for model in ("odd_bf16", "odd_f16", "odd_f32", "w4mix"):
            for view in VIEWS:
                with self.subTest(model=model, view=view):
                    want = self.ref_file(model, view)
                    for path in (self.mnt.join(model + "." + view,
                                               "model.safetensors"),
                                 self.mnt.join(model, "model." + view +
                                               ".safetensors")):
                        with open(path, "rb") as f:
                            got = f.read()
                        if got != want:
                            self.fail_tensors(path, model, view)
                        self.assertEqual(os.stat(path).st_size, len(want))
                        tl.check_ranges(self, path, want, rng, count=60)

    def fail_tensors(self, path, model, view):
        a = tensors(os.path.dirname(path)) if path.endswith(
            "/model.safetensors") else None
        b = tensors(os.path.join(self.ref, model + "." + view))
        bad = [k for k in b if a is None or a.get(k) != b[k]]
        self.fail("%s differs from llm-compressor; tensors: %s" %
                  (path, bad[:8]))

    def test_ct__sharded_directory_has_llm_compressors_tensors(self):
        # The shards cut fused groups: nvfp4 reads across shards.
        self.assertTrue(split_groups(os.path.join(self.src, "load")))
        for view in VIEWS:
            with self.subTest(view=view):
                got = tensors(self.mnt.join("load." + view))
                want = tensors(os.path.join(self.ref, "load." + view))
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    self.assertEqual(got[k], want[k], k)
                with open(self.mnt.join("load." + view,
                                        "model.safetensors.index.json")) as f:
                    wm = json.load(f)["weight_map"]
                self.assertEqual(sorted(wm), sorted(want))

    def test_ct__config_is_what_compressed_tensors_reads(self):
        jobs = [[self.mnt.join(m + "." + v, "config.json"),
                 os.path.join(self.ref, m + "." + v, "config.json")]
                for m in ("odd_bf16", "load", "w4mix") for v in VIEWS]
        for j, r in zip(jobs, run_oracle({"config": jobs}, self.tmp)["config"]):
            with self.subTest(config=j[0]):
                self.assertTrue(r["equal"], json.dumps(r, indent=1))
            with open(j[0]) as f:
                q = json.load(f).get("quantization_config")
            if j[0].endswith("odd_bf16.w4a16/config.json"):
                self.assertIsNone(q)  # no width is a multiple of 128
                continue
            for g in q["config_groups"].values():
                for args in (g["weights"], g["input_activations"] or {}):
                    self.assertFalse({"scale_dtype", "zp_dtype"} & set(args))
            self.assertNotIn("version", q)

    def test_ct__transformers_loads_the_views(self):
        jobs = [[os.path.join(self.src, m), self.mnt.join(m + "." + v),
                 KIND[v]] for m in ("load", "w4mix") for v in VIEWS
                if m == "load" or v in ("w4a16", "nvfp4")]
        for j, r in zip(jobs, run_oracle({"load": jobs}, self.tmp)["load"]):
            with self.subTest(view=j[1]):
                print("%s: max|dlogits| %.4f of %.3f, weight error/bound %.3f"
                      % (os.path.basename(j[1]), r["max_dlogits"],
                         r["max_ref"], r["weight_err_over_bound"]))
                self.assertNotIn("error", r)
                for k in ("missing_keys", "unexpected_keys",
                          "mismatched_keys", "error_msgs"):
                    self.assertEqual(r["info"].get(k, []), [], k)
                self.assertEqual(r["linear_checked"], 14)
                self.assertLessEqual(r["weight_err_over_bound"], 1.0)
                self.assertLessEqual(r["max_dlogits"],
                                     r["max_ref"] * LOGIT_TOL[KIND_OF(j[1])])


if __name__ == "__main__":
    if not os.access(VENV_PY, os.X_OK):
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)" % VENV_PY)
        sys.exit(tl.SKIP)
    tl.main()
