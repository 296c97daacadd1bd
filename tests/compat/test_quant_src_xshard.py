# SPDX-License-Identifier: MIT
"""FP8 block weights whose scale is in another shard (docs/FORMATS.md,
"Quantized sources"): a Qwen3 in the FP8 block layout, sharded by
transformers' own sharder (huggingface_hub's split_torch_state_dict_into_shards,
what save_pretrained calls) with a max_shard_size that puts weights and
their scales in different shards.

- DIR.bf16/ loads with unmodified from_pretrained and equals, parameter by
  parameter and in its logits, transformers' own CPU dequantization of the
  source, and DeepSeek's weight_dequant rule (torch) tensor by tensor.
- Each DIR.bf16/ shard holds exactly the source shard's tensors less the
  scales (the layout of the dequantized model saved with the same split).
- The requantising views' config.json names exactly the modules their
  shards keep unquantised.
- DIR.nvfp4/ (whose fused groups gate/up, q/k/v the shards cut) holds
  exactly the tensors, and a quantization_config compressed-tensors reads
  as, llm-compressor's NVFP4A16 oneshot of the DeepSeek-dequantized bf16
  model with no ignore beyond lm_head (ct_oracle.py; skipped without the
  llm-compressor venv); so does that of a model whose bf16 up_proj sits
  alone in a shard with no quantized weight (qwen3-fp8-mixed).
- A shard alone has no single-file views (its scales are elsewhere).
- A shard rewritten while a view file reading it is open fails the next
  read with an errno.
"""
import errno
import gc
import json
import os
import shutil
import sys
import time
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from huggingface_hub import split_torch_state_dict_into_shards
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM, Qwen3Config, \
            Qwen3ForCausalLM
        from transformers.utils import logging as hf_logging
        from test_ct import VENV_PY, run_oracle, split_groups, tensors
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

F8 = torch.float8_e4m3fn
BLOCK = (64, 32)


def quant_fp8_block(w, bm, bn):
    """DeepSeek README_WEIGHTS with a [bm, bn] block (shapes divide)."""
    w = w.float()
    m, n = w.shape
    blk = w.view(m // bm, bm, n // bn, bn)
    s = blk.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blk / s[:, None, :, None]).clamp(-448, 448)
    return q.view(m, n).to(F8), s


def deepseek_dequant(w, s, bm, bn, dtype=torch.bfloat16):
    """The oracle: DeepSeek kernel.py weight_dequant, w * s in fp32."""
    m, n = w.shape
    rows = torch.arange(m) // bm
    cols = torch.arange(n) // bn
    return (w.float() * s.float()[rows, :][:, cols]).to(dtype)


def bits(t):
    return t.contiguous().view(torch.uint8)


def write_model(path):
    """Qwen3 in the FP8 block layout, each weight followed by its scale
    (the order of a transformers FP8 model's state dict), sharded."""
    torch.manual_seed(7)
    cfg = Qwen3Config(vocab_size=300, hidden_size=192, intermediate_size=320,
                      num_hidden_layers=2, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=64,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    sd = {}
    for k, t in model.state_dict().items():
        if k.endswith("proj.weight"):
            sd[k], sd[k + "_scale_inv"] = quant_fp8_block(t, *BLOCK)
        else:
            sd[k] = t.contiguous()
    split = split_torch_state_dict_into_shards(
        sd, filename_pattern="model{suffix}.safetensors",
        max_shard_size="60KB")
    os.makedirs(path)
    for fname, names in split.filename_to_tensors.items():
        save_file({n: sd[n] for n in names}, os.path.join(path, fname),
                  metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    json.dump({"metadata": {"total_size": total},
               "weight_map": split.tensor_to_filename},
              open(os.path.join(path, "model.safetensors.index.json"), "w"),
              indent=2, sort_keys=True)
    c = cfg.to_dict()
    c["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3",
        "quant_method": "fp8", "weight_block_size": list(BLOCK)}
    c["architectures"] = ["Qwen3ForCausalLM"]
    json.dump(c, open(os.path.join(path, "config.json"), "w"), indent=2)
    return split.tensor_to_filename


def write_mixed(path):
    """Qwen3 in the FP8 block layout whose layer-0 up_proj was left bf16
    and saved alone in the second shard (a shard with no quantized weight,
    its fused sibling gate_proj quantized in the first)."""
    torch.manual_seed(8)
    cfg = Qwen3Config(vocab_size=300, hidden_size=192, intermediate_size=320,
                      num_hidden_layers=1, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=64,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    alone = "model.layers.0.mlp.up_proj.weight"
    sd = {}
    for k, t in model.state_dict().items():
        if k == alone.replace("up_proj", "gate_proj"):
            t = t * 4  # the group's absmax: up_proj's alone would differ
        if k.endswith("proj.weight") and k != alone:
            sd[k], sd[k + "_scale_inv"] = quant_fp8_block(t, *BLOCK)
        else:
            sd[k] = t.contiguous()
    wmap = {k: "model-0000%d-of-00002.safetensors" % (2 if k == alone
                                                       else 1)
            for k in sd}
    os.makedirs(path)
    for fname in sorted(set(wmap.values())):
        save_file({k: sd[k] for k in sd if wmap[k] == fname},
                  os.path.join(path, fname), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
                  f, indent=2, sort_keys=True)
    c = cfg.to_dict()
    c["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3",
        "quant_method": "fp8", "weight_block_size": list(BLOCK),
        "modules_to_not_convert": ["model.layers.0.mlp.up_proj"]}
    c["architectures"] = ["Qwen3ForCausalLM"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


class Env:
    root = None
    mnt = None
    wmap = None


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-xshard-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    Env.wmap = write_model(os.path.join(src, "qwen3-fp8"))
    write_mixed(os.path.join(src, "qwen3-fp8-mixed"))
    Env.mnt = tl.Mount(src)


def tearDownModule():
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    shutil.rmtree(Env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def load_quiet(path, **kw):
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


def crossing():
    """The weights whose scale the sharder put in another shard."""
    return [k for k in Env.wmap if k + "_scale_inv" in Env.wmap and
            Env.wmap[k] != Env.wmap[k + "_scale_inv"]]


def source_state():
    src = os.path.join(Env.mnt.source, "qwen3-fp8")
    sd = {}
    for name in set(Env.wmap.values()):
        sd.update(load_file(os.path.join(src, name)))
    return sd


class CrossShard(unittest.TestCase):
    def test_split_crosses(self):
        """The fixture is what this test is about."""
        self.assertGreaterEqual(len(crossing()), 3, crossing())
        self.assertGreaterEqual(len(set(Env.wmap.values())), 5)

    def test_dir_equals_transformers(self):
        view = Env.mnt.join("qwen3-fp8.bf16")
        with open(os.path.join(view, "config.json")) as f:
            self.assertNotIn("quantization_config", json.load(f))
        model, info = load_quiet(view, output_loading_info=True)
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            self.assertEqual(list(info.get(k, [])), [], k)
        tf = load_quiet(os.path.join(Env.mnt.source, "qwen3-fp8"))
        sa, sb = dict(model.state_dict()), dict(tf.state_dict())
        self.assertEqual(sorted(sa), sorted(sb))
        for k in sa:
            self.assertEqual(sa[k].dtype, sb[k].dtype, k)
            self.assertTrue(torch.equal(bits(sa[k]), bits(sb[k])), k)
        ids = torch.arange(24).reshape(1, 24)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(ids).logits, tf(ids).logits))
        idx = json.load(open(os.path.join(
            view, "model.safetensors.index.json")))
        want = {k: v for k, v in Env.wmap.items()
                if not k.endswith("_scale_inv")}
        self.assertEqual(idx["weight_map"], want)

    def test_shards_tensor_by_tensor(self):
        for view, dtype in (("bf16", torch.bfloat16),
                            ("fp32", torch.float32)):
            with self.subTest(view=view):
                self.check_shards(view, dtype)

    def check_shards(self, view, dtype):
        sd = source_state()
        view = Env.mnt.join("qwen3-fp8." + view)
        for name in sorted(set(Env.wmap.values())):
            got = load_file(os.path.join(view, name))
            want = sorted(k for k, v in Env.wmap.items()
                          if v == name and not k.endswith("_scale_inv"))
            self.assertEqual(sorted(got), want, name)
            for k in want:
                if k + "_scale_inv" in sd:
                    ref = deepseek_dequant(sd[k], sd[k + "_scale_inv"],
                                           *BLOCK, dtype)
                elif dtype == torch.bfloat16:
                    ref = sd[k]
                else:
                    continue  # plain tensors: see test_dir_equals_*
                self.assertTrue(torch.equal(bits(got[k]), bits(ref)), k)

    def test_index_read_once(self):
        """The folder's index is read and parsed once per identity, not at
        every listing and open of a view's shard (/.castfs/stats)."""
        def texts_read():
            with open(Env.mnt.join(".castfs", "stats")) as f:
                return json.load(f)["texts_read"]
        view = Env.mnt.join("qwen3-fp8.bf16")
        name = Env.wmap[crossing()[0]]
        with open(os.path.join(view, name), "rb") as f:
            head = f.read(64)
        os.listdir(view)  # the first may plan every shard once
        before = texts_read()
        for _ in range(5):
            self.assertIn(name, os.listdir(view))
            with open(os.path.join(view, name), "rb") as f:
                self.assertEqual(f.read(64), head)
        self.assertEqual(texts_read(), before)

    def test_nvfp4_preplan_once(self):
        """Every shard's DIR.nvfp4/ file finds its fused siblings in the
        bf16 view of the whole model: that pre-plan is built once per
        identity of the shards and shared, not once per shard
        (shard_fuse_built in /.castfs/stats), and a second mount serves the
        same bytes."""
        src = Env.mnt.source
        shards = sorted(set(Env.wmap.values()))
        self.assertGreaterEqual(len(shards), 3)
        with tl.Mount(src) as m:
            view = m.join("qwen3-fp8.nvfp4")
            for shard in shards:
                with open(os.path.join(view, shard), "rb") as f:
                    got = f.read()
                with open(os.path.join(Env.mnt.join("qwen3-fp8.nvfp4"),
                                       shard), "rb") as f:
                    self.assertEqual(got, f.read(), shard)
            os.listdir(view)
            with open(os.path.join(view, "config.json"), "rb") as f:
                f.read()
            with open(m.join(".castfs", "stats")) as f:
                st = json.load(f)
            self.assertEqual(st["shard_fuse_built"], 1, st)
            self.assertGreaterEqual(st["plans_built"], len(shards))

    def test_config_names_what_shards_hold(self):
        """A requantising DIR.<view>/'s quantization_config agrees with its
        shards: a module whose weight the view quantises (its scale in
        another source shard included) is never in compressed-tensors'
        ignore list or bitsandbytes' skipped modules, and every projection
        the view keeps unquantised is (a loader reads the config to know
        which modules hold quantized tensors)."""
        # (w4a16 quantises no weight of this model: no width is a
        # multiple of its group of 128)
        for view, mark in (("fp8_dynamic", ".weight_scale"),
                           ("nvfp4", ".weight_scale"),
                           ("nf4", ".weight.absmax")):
            with self.subTest(view=view):
                d = Env.mnt.join("qwen3-fp8." + view)
                with open(os.path.join(d, "config.json")) as f:
                    qc = json.load(f)["quantization_config"]
                skip = set(qc.get("ignore") or
                           qc.get("llm_int8_skip_modules") or [])
                names = set()
                for shard in sorted(set(Env.wmap.values())):
                    names |= set(load_file(os.path.join(d, shard)))
                quant = {k[:-len(mark)] for k in names if k.endswith(mark)}
                plain = {k[:-len(".weight")] for k in names
                         if k.endswith("proj.weight")} - quant
                self.assertTrue(quant, view)
                for m in sorted(k[:-len(".weight")] for k in crossing()):
                    self.assertIn(m, quant, (view, "crossing", m))
                # nvfp4 quantises a fused group that a shard cuts
                for m in split_groups(os.path.join(Env.mnt.source,
                                                   "qwen3-fp8")):
                    self.assertIn(m, quant, (view, "cut group", m))
                self.assertEqual(sorted(quant & skip), [], view)
                self.assertEqual(sorted(plain - skip), [], view)

    def test_nvfp4_equals_llm_compressor(self):
        """Fused groups cut by a shard take one global scale over the
        group's dequantized values, as llm-compressor gives on the
        dequantized model; so does a group whose member in a shard with
        no quantized weight is bf16 (qwen3-fp8-mixed)."""
        if not os.access(VENV_PY, os.X_OK):
            self.skipTest("no llm-compressor venv")
        for name in ("qwen3-fp8", "qwen3-fp8-mixed"):
            with self.subTest(model=name):
                self.check_nvfp4(name)

    def check_nvfp4(self, name):
        src = os.path.join(Env.mnt.source, name)
        self.assertTrue(split_groups(src))
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            shards = set(json.load(f)["weight_map"].values())
        sd = {}
        for shard in shards:
            sd.update(load_file(os.path.join(src, shard)))
        deq = {k: deepseek_dequant(v, sd[k + "_scale_inv"], *BLOCK)
               if k + "_scale_inv" in sd else v
               for k, v in sd.items() if not k.endswith("_scale_inv")}
        bf16 = os.path.join(Env.root, "deq-" + name)
        os.makedirs(bf16)
        with open(os.path.join(src, "config.json")) as f:
            c = json.load(f)
        c.pop("quantization_config")
        c["dtype"] = "bfloat16"
        with open(os.path.join(bf16, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
        save_file(deq, os.path.join(bf16, "model.safetensors"),
                  metadata={"format": "pt"})
        ref = os.path.join(Env.root, "ref-nvfp4-" + name)
        run_oracle({"quantize": [[bf16, ref, "NVFP4A16", []]]}, Env.root)
        view = Env.mnt.join(name + ".nvfp4")
        got, want = tensors(view), tensors(ref)
        self.assertEqual(sorted(got), sorted(want))
        self.assertEqual([k for k in want if got[k] != want[k]], [])
        job = [os.path.join(view, "config.json"),
               os.path.join(ref, "config.json")]
        r = run_oracle({"config": [job]}, Env.root)["config"][0]
        self.assertTrue(r["equal"], json.dumps(r, indent=1))

    def test_no_single_file_views(self):
        name = Env.wmap[crossing()[0]]
        stem = name[:-len(".safetensors")]
        src = Env.mnt.join("qwen3-fp8")
        self.assertIn(name, os.listdir(src))
        self.assertFalse(os.path.exists(
            os.path.join(src, stem + ".bf16.safetensors")))

    def test_rewritten_shard_fails_reads(self):
        k = crossing()[0]
        mine, other = Env.wmap[k], Env.wmap[k + "_scale_inv"]
        p = os.path.join(Env.mnt.join("qwen3-fp8.bf16"), mine)
        size = os.path.getsize(p)
        with open(p, "rb") as f:
            before = f.read()
        fd = os.open(p, os.O_RDONLY)
        try:
            self.assertEqual(len(os.pread(fd, 64, 0)), 64)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            # the scales' shard rewritten in place: same bytes, new mtime
            path = os.path.join(Env.mnt.source, "qwen3-fp8", other)
            with open(path, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(data)
            os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
            with self.assertRaises(OSError) as cm:
                os.pread(fd, size, 0)
            self.assertIn(cm.exception.errno, (errno.EIO, errno.ESTALE))
        finally:
            os.close(fd)
        # a new open reads the shards as they are now (the same bytes)
        deadline = time.time() + 20
        while True:
            try:
                with open(p, "rb") as f:
                    self.assertEqual(f.read(), before)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)


if __name__ == "__main__":
    unittest.main()
