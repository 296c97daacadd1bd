# SPDX-License-Identifier: MIT
"""bitsandbytes model-folder views (DIR.nf4/, DIR.int8/) of models whose
last module is not lm_head, and of GPT-2-style Conv1D models, load and run
as transformers' own quantisation of the source does (stop 40, found by a
bug hunt):

- LlamaForSequenceClassification (`score`) and CLIPTextModelWithProjection
  (`text_projection`, SDXL's text_encoder_2): castfs quantises the head,
  and wrote `llm_int8_skip_modules: null`, whose default keeps the last
  module: int8 loaded it as a plain Linear holding the codes, nf4 failed
  with MISMATCH. The oracle: the source quantised in memory by
  transformers + bitsandbytes with the head quantised too (a skip list of
  lm_head only).
- GPT2LMHeadModel: Conv1D weights are stored [in, out]; transformers
  quantises their transpose, castfs quantised the rows as stored (the
  forward failed). castfs now keeps them as they are; the oracle: the
  source quantised in memory with the Conv1D modules skipped.

Each: the load reports no key trouble, every module is of the oracle's
class, and the logits equal the oracle's exactly (the same codes).
"""
import gc
import os
import unittest

import torch
import transformers as T

import castfs_testlib as tl
from test_modeldir import load_quietly

VIEWS = {"nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                     bnb_4bit_use_double_quant=True),
         "int8": dict(load_in_8bit=True)}


def models():
    """name -> (class, model, dtype, skip list of the oracle)."""
    torch.manual_seed(5)
    cls = T.LlamaForSequenceClassification(T.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        num_labels=32, pad_token_id=0))  # bnb's CPU nf4 wants N % 32 == 0
    te2 = T.CLIPTextModelWithProjection(T.CLIPTextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, vocab_size=100, projection_dim=64,
        max_position_embeddings=16))
    gpt2 = T.GPT2LMHeadModel(T.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=32))
    return {"cls": (T.LlamaForSequenceClassification, cls, torch.bfloat16,
                    ["lm_head"]),
            "te2": (T.CLIPTextModelWithProjection, te2, torch.float32,
                    ["lm_head"]),
            "gpt2": (T.GPT2LMHeadModel, gpt2, torch.float32,
                     ["lm_head", "c_attn", "c_proj", "c_fc"])}


class Heads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.src = cls._tmp.__enter__()
        cls.models = models()
        for name, (_, m, dt, _) in cls.models.items():
            m.to(dt).save_pretrained(os.path.join(cls.src, name))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def check(self, m, name, view):
        klass, _, dt, skip = self.models[name]
        got = load_quietly(self, klass, m.join(name + "." + view),
                           device_map="cpu")
        kw = dict(VIEWS[view])
        if view == "nf4":
            kw["bnb_4bit_compute_dtype"] = dt
        ref = klass.from_pretrained(
            os.path.join(self.src, name), device_map="cpu", dtype=dt,
            quantization_config=T.BitsAndBytesConfig(
                llm_int8_skip_modules=skip, **kw))
        kinds = {n: type(mod).__name__ for n, mod in ref.named_modules()}
        self.assertEqual({n: type(mod).__name__
                          for n, mod in got.named_modules()}, kinds)
        # the control: the head is quantised (and GPT-2's Conv1D kept)
        quant = "Linear4bit" if view == "nf4" else "Linear8bitLt"
        head = {"cls": "score", "te2": "text_projection",
                "gpt2": "transformer.h.0.mlp.c_fc"}[name]
        self.assertEqual(kinds[head], "Conv1D" if name == "gpt2" else quant)
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        with torch.no_grad():
            want = ref(input_ids=ids)[0]
            have = got(input_ids=ids)[0]
        self.assertTrue(torch.equal(have, want), (name, view))

    def test_heads_and_conv1d(self):
        with tl.Mount(self.src) as m:
            for name in self.models:
                for view in VIEWS:
                    with self.subTest(model=name, view=view):
                        self.check(m, name, view)
                    # Loaded models map the mounted files (and hold
                    # cycles): let them go, or the unmount finds the
                    # mount busy and the daemon is killed.
                    gc.collect()


if __name__ == "__main__":
    tl.main()
