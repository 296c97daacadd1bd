# SPDX-License-Identifier: MIT
"""The BPE pre-tokenizers DIR.<q>.gguf names for llama.cpp: Llama-3's
("llama-bpe": its Split regex, digits in threes, ignore_merges) and
Qwen2's ("qwen2": single digits, NFC normalizer), beside gpt2's ByteLevel
(test_gguf_llm.py). Tiny models with tokenizers trained here by the
`tokenizers` library with exactly those pre-tokenizers.

Oracle: llama.cpp itself (llama-cpp-python) tokenizes sample texts from
the mounted file to the ids the Hugging Face tokenizer gives; variants
llama.cpp would tokenize differently (ignore_merges off for Llama-3's
regex, a normalizer it does not apply) get no file and a reason in
/.castfs/refused.
"""
import json
import os
import unittest

import llama_cpp
import torch
from gguf import GGUFReader
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)
from transformers import (AutoConfig, AutoModelForCausalLM,
                          PreTrainedTokenizerFast)

import castfs_testlib as tl
from test_gguf_llm import TEXT

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
         r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TRAIN = TEXT + ["I'm sure they'll say it's 2024 or 1234567 DON'T we?",
                "Tabs\tand\r\nCRLF, caf\u00e9 na\u00efve \u65e5\u672c\u8a9e"]
SAMPLES = ["The quick brown fox 1234567890", "I'm DON'T we'll they'VE",
           "  two  spaces\n\n\tand tab\r\n", "caf\u00e9 na\u00efve 42!?",
           "\u65e5\u672c\u8a9e and 12,345.678", "it's 2024... ok?!"]


def make(out, arch, regex, ignore_merges, nfc):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=420, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN * 20, tr)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                            eos_token="</s>").save_pretrained(out)
    torch.manual_seed(2)
    cfg = AutoConfig.for_model(
        arch, vocab_size=len(tok.get_vocab()), hidden_size=32,
        intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(
        out, safe_serialization=True)


class PreTokenizers(unittest.TestCase):
    GOOD = {"l3": ("llama", LLAMA3, True, False, "llama-bpe"),
            "q2": ("qwen2", QWEN2, False, True, "qwen2")}
    BAD = {"l3merges": ("llama", LLAMA3, False, False, "ignore_merges"),
           "l3nfc": ("llama", LLAMA3, True, True, "normalizer"),
           "q2merges": ("qwen2", QWEN2, True, True, "ignore_merges")}

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.src = cls._tmp.__enter__()
        for name, (arch, rx, im, nfc, _) in {**cls.GOOD, **cls.BAD}.items():
            make(os.path.join(cls.src, name), arch, rx, im, nfc)
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def test_llama_cpp_tokenizes_as_hf(self):
        for name, (arch, _, _, _, pre) in self.GOOD.items():
            with self.subTest(name=name):
                path = self.mount.join(name + ".f16.gguf")
                r = GGUFReader(path)
                self.assertEqual(r.fields["tokenizer.ggml.pre"].contents(),
                                 pre)
                del r
                hf = PreTrainedTokenizerFast.from_pretrained(
                    os.path.join(self.src, name))
                llm = llama_cpp.Llama(path, n_ctx=64, verbose=False,
                                      vocab_only=True)
                for s in SAMPLES:
                    self.assertEqual(
                        llm.tokenize(s.encode(), add_bos=False,
                                     special=False),
                        hf(s, add_special_tokens=False).input_ids, repr(s))
                llm.close()

    def test_what_llama_cpp_would_split_otherwise_is_refused(self):
        with open(self.mount.join(".castfs", "refused")) as f:
            got = {e["path"]: e["reason"] for e in json.load(f)}
        for name, (_, _, _, _, why) in self.BAD.items():
            self.assertIn(why, got.get(name, ""), name)
            with self.assertRaises(OSError):
                open(self.mount.join(name + ".q8_0.gguf"), "rb").close()
        for name in self.GOOD:
            self.assertNotIn(name, got)


if __name__ == "__main__":
    tl.main()
