# SPDX-License-Identifier: MIT
"""The K-quant GGUF files of model folders, DIR.q4_k_m.gguf,
DIR.q5_k_m.gguf and DIR.q6_k.gguf, against llama.cpp itself.

Oracles (ggml_oracle.py): llama.cpp's `llama_model_quantize` (what
llama-quantize runs) applied to castfs's DIR.bf16.gguf of a bfloat16 model
gives every tensor's type (the Q4_K_M / Q5_K_M / Q6_K mix) and bytes, and
the KVs; ggml's `quantize_row_<type>_ref` applied to the source values
(Q/K rows permuted by convert_hf_to_gguf's formula, as in
test_gguf_llm.py) gives the bytes of each block type, also for a float32
model whose rows are not whole super-blocks (llama-quantize's Q5_0 / Q5_1
/ Q8_0 fallbacks). gguf-py's GGUFReader reads every file and its
dequantizers bring each tensor back within its type's bound of the source.
llama.cpp (llama_cpp.Llama) loads DIR.q4_k_m.gguf: the token ids of the
sample texts equal the Hugging Face tokenizer's, the logits of a prompt are
within LOGIT_TOL of transformers'.

The bfloat16 Llama has 8 layers of width 256, so that use_more_bits()
picks attn_v / ffn_down layers 0, 3, 6, 7 (and not 1, 2, 4, 5) for Q6_K,
and some weight rows are made to hit the quantisers' corner cases: an
all-zero super-block, a constant one, values below GROUP_MAX_EPS, one
outlier among tiny values, ties at half steps, negative-only blocks.
"""
import copy
import os
import subprocess
import sys
import unittest

import llama_cpp
import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, quants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoConfig, AutoModelForCausalLM,
                          PreTrainedTokenizerFast)

import castfs_testlib as tl
import ggml_oracle
from test_gguf_llm import NAMES, TEXT, permute

VIEWS = ("q4_k_m", "q5_k_m", "q6_k")
SAMPLES = ["The quick brown fox", "castfs views 42!",
           "unseen words: zebra quixotic"]
# Largest |logit difference| to transformers (float32) for DIR.q4_k_m.gguf
# of the random 8-layer bfloat16 Llama (seen: about 0.2).
LOGIT_TOL = 3.0
# ... and to transformers running the file's dequantized weights (llama.cpp
# quantizes activations to 8 bits for its K-quant dot products).
DEQ_LOGIT_TOL = 0.5
# Bits of the codes of each block type: the dequantised value of an
# element is within one step, (block max - block min) / (2^bits - 1), of
# the source (half a step for an exact grid; the 6-bit sub-block scales
# and the fp16 super-block scale cost the rest), plus TINY: blocks whose
# scale underflows fp16 (or below ggml's GROUP_MAX_EPS) dequantise to 0.
BITS = {QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6, QT.Q5_0: 5, QT.Q5_1: 5,
        QT.Q8_0: 8}
# Types whose grid is symmetric about 0 (a scale, no minimum): the grid
# spans [-max|x|, max|x|].
SYMMETRIC = {QT.Q6_K, QT.Q5_0, QT.Q8_0}
TINY = 1e-6


def make_model(out, arch, hidden, layers, dtype, tied=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, tr)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                            eos_token="</s>").save_pretrained(out)
    torch.manual_seed(2)
    cfg = AutoConfig.for_model(
        arch, vocab_size=len(tok.get_vocab()), hidden_size=hidden,
        intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden // 4, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=tied,
        rms_norm_eps=1e-5, rope_theta=50000.0)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            else:
                p.uniform_(0.5, 1.5)
        corner_cases(model.model.layers[0].mlp.up_proj.weight)
    model = model.to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    return model.float().eval()


def corner_cases(w):
    """Rows of @w (at least 256 wide) that hit the quantisers' edges."""
    n = w.shape[1]
    w[0] = 0.0                                   # all zero
    w[1] = 0.25                                  # constant
    w[2] = torch.linspace(-1e-17, 1e-17, n)      # below GROUP_MAX_EPS
    w[3] = 1e-6
    w[3, 7] = 3.0                                # one outlier
    w[4] = (torch.arange(n) % 16 - 7.5) / 8      # half-step ties
    w[5] = -torch.rand(n) - 0.1                  # negative only
    w[6] = torch.arange(n, dtype=torch.float32) / n  # positive ramp


def source_tensors(model, rot):
    """llama.cpp name -> float32 values as castfs reads them."""
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
        if rot and k.endswith(("q_proj.weight", "q_proj.bias")):
            v = permute(v, cfg.num_attention_heads, cfg.num_attention_heads)
        if rot and k.endswith(("k_proj.weight", "k_proj.bias")):
            v = permute(v, cfg.num_attention_heads, cfg.num_key_value_heads)
        out[name] = v.numpy()
    return out


def unpermute(w, n_head):
    """The inverse of convert_hf_to_gguf.py LlamaModel.permute."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def dequantized_model(model, path):
    """@model with the weights of GGUF file @path, dequantized by
    gguf-py (Q/K rows of the Llama put back in Hugging Face's order)."""
    cfg = model.config
    back = {v: k for k, v in NAMES.items()}
    r = GGUFReader(path)
    sd = {}
    for t in r.tensors:
        x = quants.dequantize(np.asarray(t.data), t.tensor_type)
        x = torch.from_numpy(np.array(x, dtype=np.float32)).reshape(
            list(reversed(t.shape.tolist())))
        if t.name.endswith("attn_q.weight"):
            x = unpermute(x, cfg.num_attention_heads)
        if t.name.endswith("attn_k.weight"):
            x = unpermute(x, cfg.num_key_value_heads)
        if t.name == "token_embd.weight":
            k = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            k = "model.norm.weight"
        elif t.name == "output.weight":
            k = "lm_head.weight"
        else:
            _, n, rest = t.name.split(".", 2)
            k = "model.layers.%s.%s" % (n, back[rest])
        sd[k] = x
    m = copy.deepcopy(model)
    m.load_state_dict(sd)
    return m.eval()


def kvs(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = (f.types, f.contents())
    return out


class KQuant(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        cls.out = os.path.join(cls.tmp, "out")
        os.mkdir(cls.src)
        os.mkdir(cls.out)
        cls.models = {
            # name: (folder, model, rows permuted, source dtype)
            "llama": (os.path.join(cls.src, "llama"), None, True),
            "qwen2": (os.path.join(cls.src, "qwen2"), None, False),
            "tied": (os.path.join(cls.src, "tied"), None, False),
        }
        big = make_model(cls.models["llama"][0], "llama", 256, 8,
                         torch.bfloat16)
        small = make_model(cls.models["qwen2"][0], "qwen2", 64, 2,
                           torch.float32)
        cls.models["llama"] = (cls.models["llama"][0], big, True)
        cls.models["qwen2"] = (cls.models["qwen2"][0], small, False)
        # tied embeddings: token_embd is the output matrix (Q6_K)
        tied = make_model(cls.models["tied"][0], "qwen3", 256, 2,
                          torch.bfloat16, tied=True)
        cls.models["tied"] = (cls.models["tied"][0], tied, False)
        # 80 layers, 2 KV heads for 4 (test_70b_rule only)
        make_model(os.path.join(cls.src, "deep"), "llama", 256, 80,
                   torch.bfloat16)
        cls.mount = tl.Mount(cls.src)
        cls.oracle = {}

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def view(self, arch, view):
        p = self.mount.join("%s.%s.gguf" % (arch, view))
        if not os.path.exists(p):  # say why, from the daemon's log
            self.fail("%s: no such file; castfs said:\n%s" % (
                p, self.mount.output()[-4000:]))
        return p

    def llama_quantized(self, arch, view):
        """llama_model_quantize of castfs's DIR.bf16.gguf (exact for a
        bfloat16 source: bf16 -> f32 loses nothing)."""
        key = (arch, view)
        if key not in self.oracle:
            dst = os.path.join(self.out, "oracle.%s.%s.gguf" % key)
            ggml_oracle.llama_quantize(self.view(arch, "bf16"), dst, view)
            self.oracle[key] = dst
        return self.oracle[key]

    def test_tensors_equal_ggml_reference(self):
        """Every tensor's type is llama-quantize's; its bytes are ggml's
        quantize_row_*_ref of the source values."""
        for arch, (_, model, rot) in self.models.items():
            src = source_tensors(model, rot)
            for view in VIEWS:
                with self.subTest(arch=arch, view=view):
                    r = GGUFReader(self.view(arch, view))
                    o = GGUFReader(self.llama_quantized(arch, view))
                    want_types = {t.name: t.tensor_type for t in o.tensors}
                    self.assertEqual(sorted(t.name for t in r.tensors),
                                     sorted(want_types))
                    for t in r.tensors:
                        qt = t.tensor_type
                        self.assertEqual(qt, want_types[t.name], t.name)
                        x = src[t.name]
                        self.assertEqual(list(reversed(t.shape.tolist())),
                                         list(x.shape), t.name)
                        got = np.asarray(t.data).tobytes()
                        if qt in ggml_oracle.BLOCK:
                            want = ggml_oracle.quantize_ref(qt, x).tobytes()
                        else:
                            want = quants.quantize(x, qt).tobytes()
                        self.assertEqual(got, want, t.name)

    def test_file_equals_llama_quantize(self):
        """For the bfloat16 models, castfs's file has llama-quantize's
        tensors (types, shapes, bytes) and KVs."""
        for arch in ("llama", "tied"):
            # q8_0 and q4_0 too: their output matrix follows the same rule
            for view in VIEWS + ("q8_0", "q4_0"):
                with self.subTest(arch=arch, view=view):
                    self.check_file(arch, view)

    def check_file(self, arch, view):
        """castfs's DIR.<view>.gguf of @arch against llama_model_quantize."""
        r = GGUFReader(self.view(arch, view))
        o = GGUFReader(self.llama_quantized(arch, view))
        want = {t.name: t for t in o.tensors}
        types = {}
        for t in r.tensors:
            w = want[t.name]
            types.setdefault(t.tensor_type.name, []).append(t.name)
            self.assertEqual(t.tensor_type, w.tensor_type, t.name)
            self.assertEqual(t.shape.tolist(), w.shape.tolist())
            self.assertEqual(np.asarray(t.data).tobytes(),
                             np.asarray(w.data).tobytes(), t.name)
        self.assertEqual(kvs(r), kvs(o))
        print("%s: %s" % (view, {k: len(v) for k, v in
                                 types.items()}), file=sys.stderr)
        out = "token_embd.weight" if arch == "tied" else "output.weight"
        self.assertEqual(want[out].tensor_type,
                         QT.Q8_0 if view == "q8_0" else QT.Q6_K)
        if arch == "tied":
            self.assertNotIn("output.weight", want)
        elif view in ("q4_k_m", "q5_k_m"):
            # the mix really mixes: Q6_K attn_v in layers 0 3 6 7
            self.assertEqual(
                sorted(n for n in types["Q6_K"]
                       if "attn_v" in n),
                ["blk.%d.attn_v.weight" % i for i in (0, 3, 6, 7)])

    def test_70b_rule(self):
        """An 80-layer Llama with grouped KV heads is llama.cpp's
        LLM_TYPE_70B: its attn_v tensors outside use_more_bits() are Q5_K
        in Q4_K_M. Types only (header), against llama_model_quantize."""
        r = GGUFReader(self.view("deep", "q4_k_m"))
        o = GGUFReader(self.llama_quantized("deep", "q4_k_m"))
        want = {t.name: t.tensor_type for t in o.tensors}
        got = {t.name: t.tensor_type for t in r.tensors}
        self.assertEqual(got, want)
        # layers 0-9 and 70-79 use more bits; of 10-69 every third from 12
        self.assertEqual(got["blk.10.attn_v.weight"], QT.Q5_K)
        self.assertEqual(got["blk.12.attn_v.weight"], QT.Q6_K)
        self.assertEqual(got["blk.10.ffn_down.weight"], QT.Q4_K)

    def test_dequantizes_within_bound(self):
        for arch, (_, model, rot) in self.models.items():
            src = source_tensors(model, rot)
            for view in VIEWS:
                r = GGUFReader(self.view(arch, view))
                for t in r.tensors:
                    if t.tensor_type not in BITS:
                        continue
                    with self.subTest(arch=arch, view=view, t=t.name):
                        x = src[t.name]
                        per = ggml_oracle.BLOCK[t.tensor_type][0]
                        got = quants.dequantize(np.asarray(t.data),
                                                t.tensor_type)
                        xb = x.reshape(-1, per)
                        err = np.abs(got.reshape(-1, per) - xb).max(1)
                        lo = np.minimum(xb.min(1), 0)
                        hi = np.maximum(xb.max(1), 0)
                        if t.tensor_type in SYMMETRIC:
                            hi = np.abs(xb).max(1)
                            lo = -hi
                        step = (hi - lo) / (2 ** BITS[t.tensor_type] - 1)
                        bad = err > step + TINY
                        self.assertFalse(
                            bad.any(), "%s: block %s err %g step %g" % (
                                t.name, np.argmax(bad),
                                err[np.argmax(bad)], step[np.argmax(bad)]))

    def test_convert_writes_the_oracle_bytes(self):
        """`castfs convert --view q4_k_m` writes llama-quantize's tensors;
        random ranges of the mounted file equal the converted file."""
        out = os.path.join(self.out, "llama.q4_k_m.gguf")
        subprocess.run([tl.castfs_binary(), "convert",
                        self.models["llama"][0], "--view", "q4_k_m", "-o",
                        out, "--no-progress"], check=True)
        r = GGUFReader(out)
        o = {t.name: t for t in
             GGUFReader(self.llama_quantized("llama", "q4_k_m")).tensors}
        for t in r.tensors:
            self.assertEqual(t.tensor_type, o[t.name].tensor_type, t.name)
            self.assertEqual(np.asarray(t.data).tobytes(),
                             np.asarray(o[t.name].data).tobytes(), t.name)
        with open(out, "rb") as f:
            data = f.read()
        tl.check_ranges(self, self.view("llama", "q4_k_m"), data, count=60)

    def test_llama_cpp_loads_q4_k_m(self):
        d, model, _ = self.models["llama"]
        hf = PreTrainedTokenizerFast.from_pretrained(d)
        llm = llama_cpp.Llama(self.view("llama", "q4_k_m"), n_ctx=256,
                              logits_all=True, verbose=False, seed=0,
                              n_threads=2)
        for s in SAMPLES:
            self.assertEqual(
                llm.tokenize(s.encode(), add_bos=False, special=False),
                hf(s, add_special_tokens=False).input_ids, repr(s))
        prompt = hf(SAMPLES[0], add_special_tokens=False).input_ids
        llm.reset()
        llm.eval(prompt)
        got = np.array(llm.scores[:len(prompt)])
        with torch.no_grad():
            want = model(torch.tensor([prompt])).logits[0].numpy()
        err = np.abs(got - want).max()
        print("llama q4_k_m: max |logit difference| %.4f (logits up to "
              "%.2f)" % (err, np.abs(want).max()), file=sys.stderr)
        self.assertLess(err, LOGIT_TOL)
        # transformers running the weights of the file (gguf-py's
        # dequantizers): llama.cpp reads what castfs wrote
        with torch.no_grad():
            deq = dequantized_model(model, self.view("llama", "q4_k_m"))
            want = deq(torch.tensor([prompt])).logits[0].numpy()
        err = np.abs(got - want).max()
        print("llama q4_k_m: max |logit difference| %.4f to the "
              "dequantized weights" % err, file=sys.stderr)
        self.assertLess(err, DEQ_LOGIT_TOL)
        llm.close()
        # the file llama-quantize makes gives the very same logits
        ref = llama_cpp.Llama(self.llama_quantized("llama", "q4_k_m"),
                              n_ctx=256, logits_all=True, verbose=False,
                              seed=0, n_threads=2)
        ref.eval(prompt)
        self.assertEqual(np.array(ref.scores[:len(prompt)]).tobytes(),
                         got.tobytes())
        ref.close()


if __name__ == "__main__":
    tl.main()
