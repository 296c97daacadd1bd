# SPDX-License-Identifier: MIT
"""A transformers causal-LM folder DIR/ as one llama.cpp GGUF file: the
mounted DIR.<q>.gguf, and `castfs convert DIR --view q8_0` (the same
bytes), checked by gguf-py.

The models are built here: a byte-level BPE tokenizer trained by the
`tokenizers` library and a tiny Llama (Q/K rows permuted) and Qwen3 (q/k
norms) saved by transformers. Oracles: gguf-py's GGUFReader and
gguf.quants.quantize of the source (permuted with convert_hf_to_gguf's
formula, written here) for every tensor, and the KVs from config.json.
llama.cpp itself loads the same files in test_gguf_llamacpp.py.
"""
import json
import os
import shutil
import subprocess
import unittest

import llama_cpp
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import quants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoConfig, AutoModelForCausalLM,
                          PreTrainedTokenizerFast)

import castfs_testlib as tl

VIEWS = {"f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
TEXT = ["The quick brown fox jumps over the lazy dog. " * 3,
        "castfs shows converted views of model checkpoints, per read range.",
        "Numbers 12345 and 67890, punctuation!? (yes) -- and newlines\n\nhere.",
        "llama.cpp reads GGUF files; ComfyUI-GGUF loads diffusion models."]

NAMES = {"input_layernorm.weight": "attn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight",
         "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias",
         "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias",
         "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight",
         "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}


# transformers model_type -> llama.cpp general.architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2",
             "qwen3": "qwen3"}


def make_model(out, arch, head_dim=16):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, tr)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                            eos_token="</s>").save_pretrained(out)
    torch.manual_seed(1)
    cfg = AutoConfig.for_model(
        arch, vocab_size=len(tok.get_vocab()), hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=50000.0)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
            else:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    return model.eval()


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def expected_tensors(model, arch, view):
    cfg = model.config
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().float()
        if k == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif k == "model.norm.weight":
            name = "output_norm.weight"
        elif k == "lm_head.weight":
            name = "output.weight"
        else:
            _, _, n, rest = k.split(".", 3)
            name = "blk.%s.%s" % (n, NAMES[rest])
        rot = GGUF_ARCH[arch] == "llama"
        if rot and k.endswith(("q_proj.weight", "q_proj.bias")):
            v = permute(v, cfg.num_attention_heads, cfg.num_attention_heads)
        if rot and k.endswith(("k_proj.weight", "k_proj.bias")):
            v = permute(v, cfg.num_attention_heads, cfg.num_key_value_heads)
        qt = VIEWS[view] if v.dim() == 2 else QT.F32
        if view == "q4_0" and name == "output.weight":
            qt = QT.Q8_0  # rows of 64: not whole Q6_K blocks (llama-quantize)
        out[name] = (qt, v.numpy())
    return out


class LLMGGUF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.models = {}
        cls.src = os.path.join(cls.tmp, "src")
        cls.out = os.path.join(cls.tmp, "out")
        os.mkdir(cls.src)
        os.mkdir(cls.out)
        for arch in GGUF_ARCH:
            d = os.path.join(cls.src, arch)
            cls.models[arch] = (d, make_model(d, arch))
        # not a model castfs maps: no GGUF file
        d = os.path.join(cls.src, "gpt2")
        os.mkdir(d)
        for f in ("config.json", "tokenizer.json", "model.safetensors"):
            with open(os.path.join(cls.models["llama"][0], f), "rb") as a:
                data = a.read()
            if f == "config.json":
                data = data.replace(b"LlamaForCausalLM", b"GPT2LMHeadModel")
            with open(os.path.join(d, f), "wb") as b:
                b.write(data)
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def convert(self, arch, view):
        """The mounted DIR.<view>.gguf (the file llama.cpp maps)."""
        return self.mount.join("%s.%s.gguf" % (arch, view))

    def test_convert_writes_the_mounted_bytes(self):
        for arch in self.models:
            for view in ("f16", "q4_0"):
                out = os.path.join(self.out, "%s.%s.gguf" % (arch, view))
                subprocess.run([tl.castfs_binary(), "convert",
                                self.models[arch][0], "--view", view, "-o",
                                out, "--no-progress"], check=True)
                with open(out, "rb") as a, open(self.convert(arch, view),
                                                "rb") as b:
                    self.assertEqual(a.read(), b.read(), (arch, view))

    def test_listed_when_chosen(self):
        self.assertNotIn("llama.q8_0.gguf", os.listdir(self.mount.path))
        with tl.Mount(self.src, options=["views=q8_0:f16"]) as m:
            names = os.listdir(m.path)
            for arch in self.models:
                self.assertIn(arch + ".q8_0.gguf", names)
                self.assertIn(arch + ".f16.gguf", names)
                self.assertGreater(os.path.getsize(m.join(arch + ".q8_0.gguf")),
                                   0)
            self.assertNotIn("gpt2.q8_0.gguf", names)
            self.assertNotIn("llama.q4_0.gguf", names)

    def test_unmapped_folder_has_no_gguf(self):
        self.assertTrue(os.path.isdir(self.mount.join("gpt2")))
        with self.assertRaises(OSError):
            open(self.mount.join("gpt2.q8_0.gguf"), "rb").close()
        self.assertFalse(os.path.exists(self.mount.join("llama.q8_0")))
        self.assertFalse(os.path.exists(self.mount.join("nothere.q8_0.gguf")))

    def test_gguf_py_reads_every_tensor(self):
        for arch in self.models:
            model = self.models[arch][1]
            for view in VIEWS:
                with self.subTest(arch=arch, view=view):
                    r = GGUFReader(self.convert(arch, view))
                    f = lambda k: r.fields[k].contents()
                    cfg = model.config
                    ga = GGUF_ARCH[arch]
                    self.assertEqual(f("general.architecture"), ga)
                    self.assertEqual(f(ga + ".block_count"),
                                     cfg.num_hidden_layers)
                    self.assertEqual(f(ga + ".attention.head_count"),
                                     cfg.num_attention_heads)
                    self.assertEqual(f(ga + ".attention.head_count_kv"),
                                     cfg.num_key_value_heads)
                    self.assertEqual(f(ga + ".embedding_length"),
                                     cfg.hidden_size)
                    self.assertEqual(f(ga + ".feed_forward_length"),
                                     cfg.intermediate_size)
                    self.assertEqual(f(ga + ".context_length"),
                                     cfg.max_position_embeddings)
                    self.assertAlmostEqual(
                        f(ga + ".attention.layer_norm_rms_epsilon"),
                        cfg.rms_norm_eps, delta=1e-12)
                    self.assertEqual(f(ga + ".rope.freq_base"),
                                     cfg.rope_parameters["rope_theta"])
                    self.assertEqual(f("general.file_type"),
                                     {"f16": 1, "bf16": 32, "q8_0": 7,
                                      "q4_0": 2}[view])
                    self.assertEqual(f("tokenizer.ggml.model"), "gpt2")
                    self.assertEqual(f("tokenizer.ggml.pre"), "gpt-2")
                    exp = expected_tensors(model, arch, view)
                    self.assertEqual(sorted(t.name for t in r.tensors),
                                     sorted(exp))
                    for t in r.tensors:
                        qt, data = exp[t.name]
                        self.assertEqual(t.tensor_type, qt, t.name)
                        self.assertEqual(list(reversed(t.shape.tolist())),
                                         list(data.shape), t.name)
                        want = quants.quantize(data, qt)
                        self.assertEqual(np.asarray(t.data).tobytes(),
                                         want.tobytes(), t.name)

    def test_head_dim_of_a_config_without_one(self):
        # convert_hf_to_gguf.py reads AutoConfig's to_dict(), whose class
        # fills in head_dim: hidden / heads for Llama, 128 for Qwen3. castfs
        # wrote no key_length then, and llama.cpp took a Qwen3's heads for
        # 64 / 4 = 16 and failed to load it (a bug hunt).
        with tl.tempdir() as src:
            for arch, hd in (("llama", 16), ("qwen3", 128), ("qwen2", 16)):
                d = os.path.join(src, arch)
                make_model(d, arch, head_dim=hd)
                edit_json(os.path.join(d, "config.json"),
                          lambda c: c.pop("head_dim", None))
            with tl.Mount(src) as m:
                for arch in ("llama", "qwen3", "qwen2"):
                    with self.subTest(arch=arch):
                        d = os.path.join(src, arch)
                        want = AutoConfig.from_pretrained(d).to_dict().get(
                            "head_dim")
                        path = m.join(arch + ".f16.gguf")
                        r = GGUFReader(path)
                        key = GGUF_ARCH[arch] + ".attention.key_length"
                        got = r.fields[key].contents() \
                            if key in r.fields else None
                        del r
                        self.assertEqual(got, want)
                        llm = llama_cpp.Llama(path, n_ctx=64, verbose=False)
                        llm.close()

    def test_defaults_of_a_config_without_them(self):
        # A config.json without rms_norm_eps or rope_theta (hand-written,
        # or saved by an older transformers): convert_hf_to_gguf.py writes
        # the values of AutoConfig's to_dict(), the config class's
        # defaults; castfs must write the same (nothing checked them).
        with tl.tempdir() as src:
            for arch in GGUF_ARCH:
                d = os.path.join(src, arch)
                shutil.copytree(self.models[arch][0], d)

                def drop(c):
                    c.pop("rms_norm_eps", None)
                    c.pop("rope_theta", None)
                    c.pop("rope_parameters", None)
                    c.pop("rope_scaling", None)
                edit_json(os.path.join(d, "config.json"), drop)
            with tl.Mount(src) as m:
                for arch in GGUF_ARCH:
                    with self.subTest(arch=arch):
                        cfg = AutoConfig.from_pretrained(
                            os.path.join(src, arch)).to_dict()
                        ga = GGUF_ARCH[arch]
                        r = GGUFReader(m.join(arch + ".f16.gguf"))
                        f = lambda k: r.fields[k].contents()
                        self.assertEqual(
                            f(ga + ".attention.layer_norm_rms_epsilon"),
                            np.float32(cfg["rms_norm_eps"]))
                        self.assertEqual(
                            f(ga + ".rope.freq_base"),
                            np.float32(cfg["rope_parameters"]["rope_theta"]))
                        del r

    def test_tokenizer_vocab(self):
        d, _ = self.models["llama"]
        hf = PreTrainedTokenizerFast.from_pretrained(d)
        r = GGUFReader(self.convert("llama", "f16"))
        toks = r.fields["tokenizer.ggml.tokens"].contents()
        vocab = hf.get_vocab()
        self.assertEqual(len(toks), len(vocab))
        for s, i in vocab.items():
            self.assertEqual(toks[i], s)
        self.assertEqual(r.fields["tokenizer.ggml.bos_token_id"].contents(),
                         hf.bos_token_id)
        self.assertEqual(r.fields["tokenizer.ggml.eos_token_id"].contents(),
                         hf.eos_token_id)


def edit_json(path, change):
    with open(path) as f:
        d = json.load(f)
    change(d)
    with open(path, "w") as f:
        json.dump(d, f, indent=2)


class Refused(unittest.TestCase):
    """Folders whose config or tokenizer means something a castfs GGUF
    would drop (stop 43, a bug hunt: llama.cpp's logits off by as much as
    the logits themselves, 0.66-3.9, for the config ones; every sample
    text tokenized otherwise for the tokenizer ones) get no GGUF and a
    reason; transformers is the oracle that each config setting changes
    the model."""

    def rope(kind, **kw):
        return lambda c: c["rope_parameters"].update(rope_type=kind, **kw)

    def model(key, value):
        return lambda c: c["model"].__setitem__(key, value)

    def dup_id(t):
        v = t["model"]["vocab"]
        a, b = sorted(v, key=v.get)[300:302]
        v[b] = v[a]

    def merge_oov(t):
        m = t["model"]["merges"]
        pair = ["zq\u00e9", "xq"]  # in no vocabulary
        m.append(" ".join(pair) if isinstance(m[0], str) else pair)

    CONFIG = {
        "rope-linear": (rope("linear", factor=2.0), "rope_parameters"),
        "rope-llama3": (rope("llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0,
                             original_max_position_embeddings=16),
                        "rope_parameters"),
        "rope-yarn": (rope("yarn", factor=4.0,
                           original_max_position_embeddings=16),
                      "rope_parameters"),
        "gelu": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
        "layer-types": (lambda c: c.update(
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=4), "layer_types"),
        "theta-text": (lambda c: c["rope_parameters"].update(
            rope_theta="1e6"), "rope_theta is not a number"),
    }
    TOKENIZER = {
        "suffix": (model("end_of_word_suffix", "</w>"), "end_of_word_suffix"),
        "prefix": (model("continuing_subword_prefix", "##"),
                   "continuing_subword_prefix"),
        "dropout": (model("dropout", 0.5), "dropout"),
        "dup-id": (dup_id, "twice"),
        "merge-oov": (merge_oov, "outside the vocabulary"),
    }

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        os.mkdir(cls.src)
        cls.base = os.path.join(cls.src, "base")
        cls.models = {"base": make_model(cls.base, "llama")}
        # Sliding windows of the architectures that have them (Llama's
        # modules ignore layer_types): qwen2's own switch, which then
        # names its sliding layers, and qwen3's layer_types.
        for name, arch in (("qwen2-sliding", "qwen2"), ("qwen3", "qwen3")):
            cls.models[name] = make_model(os.path.join(cls.src, name), arch)
        edit_json(os.path.join(cls.src, "qwen2-sliding", "config.json"),
                  lambda c: c.update(use_sliding_window=True,
                                     sliding_window=4, max_window_layers=1,
                                     layer_types=None))
        for name, (change, _) in list(cls.CONFIG.items()) + \
                list(cls.TOKENIZER.items()):
            d = os.path.join(cls.src, name)
            shutil.copytree(cls.base if name != "layer-types" else
                            os.path.join(cls.src, "qwen3"), d)
            f = "config.json" if name in cls.CONFIG else "tokenizer.json"
            edit_json(os.path.join(d, f), change)
        cls.mount = tl.Mount(cls.src)

    tearDownClass = LLMGGUF.__dict__["tearDownClass"]  # the same mount

    def test_refused_with_reason(self):
        with open(self.mount.join(".castfs", "refused")) as f:
            got = {e["path"]: e["reason"] for e in json.load(f)}
        whys = {n: w for n, (_, w) in
                list(self.CONFIG.items()) + list(self.TOKENIZER.items())}
        whys["qwen2-sliding"] = "use_sliding_window"
        for name, why in whys.items():
            with self.subTest(folder=name):
                self.assertIn(why, got.get(name, ""))
                with self.assertRaises(OSError):
                    open(self.mount.join(name + ".f16.gguf"), "rb").close()
        self.assertNotIn("base", got)
        self.assertGreater(os.path.getsize(self.mount.join("base.f16.gguf")),
                           0)

    def test_merge_outside_the_vocabulary_is_refused_by_hf(self):
        from tokenizers import Tokenizer
        with self.assertRaises(Exception) as cm:
            Tokenizer.from_file(os.path.join(self.src, "merge-oov",
                                             "tokenizer.json"))
        self.assertIn("out of vocabulary", str(cm.exception))
        Tokenizer.from_file(os.path.join(self.base, "tokenizer.json"))

    def test_each_config_setting_changes_the_model(self):
        ids = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 12, 3, 60, 8, 11]])
        # Not run: a rope_theta in text, and sliding layer_types without
        # use_sliding_window (transformers refuses to run either).
        for name in ["qwen2-sliding"] + [n for n in self.CONFIG if n not in
                                         ("theta-text", "layer-types")]:
            with self.subTest(folder=name), torch.no_grad():
                orig = self.models.get(name, self.models["base"])
                m = AutoModelForCausalLM.from_pretrained(
                    os.path.join(self.src, name), torch_dtype=torch.float32)
                diff = (m(ids, use_cache=False).logits -
                        orig(ids, use_cache=False).logits).abs().max().item()
                self.assertGreater(diff, 1e-3)

if __name__ == "__main__":
    tl.main()
