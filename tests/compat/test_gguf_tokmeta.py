# SPDX-License-Identifier: MIT
"""The tokenizer metadata of DIR.<q>.gguf beyond the vocabulary: token
types, special token ids, add_bos/add_eos/add_sep and the chat template.

One tiny Llama folder (BPE tokenizer trained here, 8 ids past the
vocabulary) and variants of its tokenizer.json, tokenizer_config.json,
config.json and chat template files, each the layout of some published
model family: Qwen2's null bos_token, a TemplateProcessing post-processor
adding <s>, a chat template in tokenizer_config.json, in
chat_template.jinja (with named ones in additional_chat_templates/) or as
a list of named templates, added tokens that are not special but look
so; folders whose template files convert_hf_to_gguf.py cannot read are
refused with a reason.

Oracles, computed here from the folder: gguf-py's SpecialVocab written by
a GGUFWriter (every tokenizer.* KV it adds, in its order, with its types);
convert_hf_to_gguf.py's get_vocab_base (transcribed below, run on
transformers' AutoTokenizer) for the token strings and types; and
llama.cpp (llama-cpp-python) loading the mounted file: it adds BOS as the
Hugging Face tokenizer does and sees the chat template.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import gguf
import llama_cpp
import torch
from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer,
                          PreTrainedTokenizerFast)

import castfs_testlib as tl
from test_gguf_llm import TEXT

EXTRA = 8  # ids past the tokenizer's: get_vocab_base's [PAD<i>]
TPL = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
NOT_META = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.model",
            "tokenizer.ggml.pre")


def make_base(out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, tr)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                            eos_token="</s>").save_pretrained(out)
    torch.manual_seed(3)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=len(tok.get_vocab()) + EXTRA, hidden_size=32,
        intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(
        out, safe_serialization=True)


def edit(d, name, f):
    p = os.path.join(d, name)
    with open(p, encoding="utf-8") as fp:
        j = json.load(fp)
    f(j)
    with open(p, "w", encoding="utf-8") as fp:
        json.dump(j, fp, indent=1, ensure_ascii=False)


def added(content, special, normalized):
    def f(j):
        j["added_tokens"].append({
            "id": len(j["model"]["vocab"]) + len(j["added_tokens"]) - 2,
            "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special})
    return f


def template(single, pair):
    def ent(x):
        return ({"Sequence": {"id": x, "type_id": 0}} if x in "AB" else
                {"SpecialToken": {"id": x, "type_id": 0}})

    def f(j):
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [ent(x) for x in single],
            "pair": [ent(x) for x in pair],
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]}
                               for t, i in (("<s>", 0), ("</s>", 1))}}
    return f


def pop(*keys):
    return lambda j: [j.pop(k, None) for k in keys]


def put(**kv):
    return lambda j: j.update(kv)


TC, TJ, CFG = "tokenizer_config.json", "tokenizer.json", "config.json"
XT = "additional_chat_templates/"
# name: ([(file, edit)], {extra file: text})
VARIANTS = {
    "types": ([(TJ, added("<|fim_prefix|>", False, False)),
               (TJ, added("\u0120hello", False, False)),
               (TJ, added("\u00fcn\u00efcode", False, False)),
               (TJ, added("a\u2581b", False, True)),
               # does_token_look_special's other shapes: CONTROL too
               (TJ, added("<unused7>", False, False)),
               (TJ, added("<pad>", False, True)),
               (TJ, added("<\uff5cend\u2581of\u2581text\uff5c>", False,
                          False))], {}),
    "chat_tc": ([(TC, put(chat_template=TPL))], {}),
    # Python's text mode reads "\r\n" and a lone "\r" as "\n"
    "chat_jinja": ([], {"chat_template.jinja":
                        TPL.replace("%}<", "%}\r\n<").replace("}}{", "}}\r{")}),
    "chat_both": ([(TC, put(chat_template="tc wins"))],
                  {"chat_template.jinja": TPL, XT + "rag.jinja": "rag"}),
    "chat_null": ([(TC, put(chat_template=None))],
                  {"chat_template.jinja": TPL}),
    # transformers >= 4.56 saves named templates as files (gguf-py reads
    # them beside chat_template.jinja only)
    "chat_files": ([], {"chat_template.jinja": TPL,
                        XT + "tool-use.jinja": "tools\r\n{{ x }}",
                        XT + "rag.jinja": "rag",
                        XT + ".jinja": "dot",
                        XT + "notes.txt": "not a template"}),
    "chat_files_default": ([], {"chat_template.jinja": TPL,
                                XT + "default.jinja": "other default",
                                XT + "z.jinja": "z"}),
    # GGUFWriter.add_string writes no empty string (the name is listed)
    "chat_files_empty": ([], {"chat_template.jinja": TPL,
                              XT + "e.jinja": "", XT + "r.jinja": "r"}),
    "chat_jinja_empty": ([], {"chat_template.jinja": ""}),
    # a file name that is not UTF-8: one "_" per byte, as Python's
    # surrogateescape reads it
    "chat_files_bytes": ([], {"chat_template.jinja": TPL,
                              (XT + "a\x80b.jinja").encode("latin-1"): "ab",
                              (XT + "\xe2\x82x.jinja").encode("latin-1"):
                              "x"}),
    "chat_files_nojinja": ([], {"chat_template.json": json.dumps(
        {"chat_template": TPL}), XT + "rag.jinja": "rag"}),
    "chat_json": ([], {"chat_template.json": json.dumps(
        {"chat_template": TPL + "json"})}),
    "chat_list": ([(TC, put(chat_template=[
        {"name": "default", "template": TPL},
        {"name": "tool-use", "template": "tools"},
        {"name": "rag", "template": "rag"},
        {"name": "", "template": "skipped"}]))], {}),
    "ids_cfg": ([(TC, pop("bos_token", "eos_token")),
                 (CFG, put(pad_token_id=1))], {}),
    "ids_qwen": ([(TC, put(bos_token=None, eos_token="</s>",
                           pad_token="</s>")),
                  (CFG, put(bos_token_id=1, eos_token_id=[1, 0]))], {}),
    "add_bos": ([(TJ, template("<s> A".split(), "<s> A <s> B".split()))],
                {}),
    "add_bos_tc": ([(TJ, template("<s> A".split(), "<s> A <s> B".split())),
                    (TC, put(add_bos_token=False, add_eos_token=True))], {}),
    "add_eot": ([(TJ, template("<s> A </s>".split(),
                               "<s> A </s> </s> B </s>".split())),
                 (TC, put(eos_token="<s>"))], {}),
    "add_sep_notc": ([(TJ, template("A".split(), "A </s> B".split()))],
                     {"chat_template.jinja": TPL}),
}
NO_TC = {"add_sep_notc"}
# Folders convert_hf_to_gguf.py stops on (SpecialVocab cannot read a
# template) or whose GGUF depends on the directory's order (two files of
# one name: the one globbed last wins), each with castfs's reason.
REFUSED = {
    "chat_files_dir": ({"chat_template.jinja": TPL, XT + "a.jinja": "a",
                        XT + "sub.jinja/x": "a folder"},
                       "additional_chat_templates/sub.jinja is not a "
                       "readable file"),
    "chat_files_clash": ({"chat_template.jinja": TPL,
                          XT + "tool-use.jinja": "1",
                          XT + "tool_use.jinja": "2"}, "both named"),
    "chat_files_latin1": ({"chat_template.jinja": TPL,
                           XT + "l.jinja": b"caf\xe9"}, "not UTF-8"),
    # gguf-py reads through a link to a folder; castfs follows none
    "chat_files_link": ({"chat_template.jinja": TPL,
                         "tpl/q.jinja": "q"}, "symbolic link"),
}


def ref_special(d):
    """The tokenizer.* KVs gguf-py's SpecialVocab adds (convert_hf_to_gguf
    _set_vocab_gpt2: load_merges, no n_vocab), as a GGUFWriter holds them."""
    w = gguf.GGUFWriter(path=None, arch="llama")
    gguf.SpecialVocab(d, load_merges=True).add_to_gguf(w, quiet=True)
    return {k: (v.value, v.type) for k, v in w.kv_data[0].items()
            if k.startswith("tokenizer.") and k not in NOT_META}


def does_token_look_special(t):
    # convert_hf_to_gguf.py TextModel.does_token_look_special
    seems = t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
    seems = seems or (t.startswith("<|") and t.endswith("|>"))
    seems = seems or (t.startswith("<\uff5c") and t.endswith("\uff5c>"))
    return seems or (t.startswith("<unused") and t.endswith(">"))


def get_vocab_base(d, vocab_size):
    # convert_hf_to_gguf.py TextModel.get_vocab_base, without the pre name
    tokenizer = AutoTokenizer.from_pretrained(d)
    reverse_vocab = {i: t for t, i in tokenizer.vocab.items()}
    added_vocab = tokenizer.get_added_vocab()
    dec = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse_vocab:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse_vocab[i]
        if token in added_vocab:
            if not dec[i].normalized:
                token = tokenizer.decode(
                    tokenizer.encode(token, add_special_tokens=False))
            if dec[i].special or does_token_look_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def kv_order(m):
    """The keys of @m in order, the named templates' sorted in place."""
    named = iter(sorted(k for k in m
                        if k.startswith("tokenizer.chat_template.")))
    return [next(named) if k.startswith("tokenizer.chat_template.") else k
            for k in m]


def got_meta(r):
    out = {}
    for f in r.fields.values():
        if f.name.startswith("tokenizer.") and f.name not in NOT_META:
            out[f.name] = (f.contents(), f.types[0])
    return out


class TokenizerMeta(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.src = cls._tmp.__enter__()
        base = os.path.join(tempfile.mkdtemp(prefix="castfs-tokmeta-"), "b")
        make_base(base)
        all_ = list(VARIANTS.items()) + [(n, ([], f)) for n, (f, _) in
                                         REFUSED.items()]
        for name, (edits, files) in all_:
            d = os.path.join(cls.src, name)
            shutil.copytree(base, d)
            for fn, f in edits:
                edit(d, fn, f)
            for fn, text in files.items():
                p = os.path.join(os.fsencode(d), os.fsencode(fn))
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as fp:
                    fp.write(text if isinstance(text, bytes) else
                             text.encode())
            if name == "chat_files_link":
                os.symlink("tpl", os.path.join(d, XT.rstrip("/")))
            if name in NO_TC:
                os.remove(os.path.join(d, TC))
        shutil.rmtree(os.path.dirname(base))
        cls.mount = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mount.unmount()
        cls._tmp.__exit__(None, None, None)
        if rc != 0:
            raise AssertionError("castfs exited with %d" % rc)

    def reader(self, name, view="f16"):
        return GGUFReader(self.mount.join("%s.%s.gguf" % (name, view)))

    def test_special_vocab_kvs(self):
        for name in VARIANTS:
            with self.subTest(name=name):
                d = os.path.join(self.src, name)
                ref = ref_special(d)
                r = self.reader(name)
                got = got_meta(r)
                # gguf-py lists the template names in a set's order, and
                # the files' in directory order (castfs: sorted by name)
                for m in (ref, got):
                    if "tokenizer.chat_templates" in m:
                        v, t = m["tokenizer.chat_templates"]
                        m["tokenizer.chat_templates"] = (sorted(v), t)
                self.assertEqual(got, ref)
                self.assertEqual(kv_order(got), kv_order(ref))
                del r

    def test_chat_templates_present(self):
        # the oracle itself must have something to compare
        want = {"chat_tc": TPL,
                "chat_jinja": TPL.replace("%}<", "%}\n<").replace("}}{",
                                                                   "}}\n{"),
                "chat_both": "tc wins", "chat_json": TPL + "json",
                "chat_list": TPL}
        for name, tpl in want.items():
            with self.subTest(name=name):
                self.assertEqual(ref_special(os.path.join(
                    self.src, name))["tokenizer.chat_template"][0], tpl)
                llm = llama_cpp.Llama(self.mount.join(name + ".q8_0.gguf"),
                                      vocab_only=True, verbose=False)
                self.assertEqual(llm.metadata["tokenizer.chat_template"],
                                 tpl)
                llm.close()
        got = got_meta(self.reader("chat_list"))
        self.assertEqual(got["tokenizer.chat_template.tool_use"][0], "tools")
        ref = ref_special(os.path.join(self.src, "chat_files"))
        self.assertEqual(ref["tokenizer.chat_template.tool_use"][0],
                         "tools\n{{ x }}")
        self.assertEqual(ref["tokenizer.chat_template._jinja"][0], "dot")
        self.assertEqual(ref["tokenizer.chat_template"][0], TPL)
        llm = llama_cpp.Llama(self.mount.join("chat_files.q8_0.gguf"),
                              vocab_only=True, verbose=False)
        for k in ("tokenizer.chat_template.tool_use",
                  "tokenizer.chat_template.rag", "tokenizer.chat_template"):
            self.assertEqual(llm.metadata[k], ref[k][0], k)
        llm.close()
        self.assertEqual(ref_special(os.path.join(
            self.src, "chat_files_default"))["tokenizer.chat_template"][0],
            "other default")
        for name in ("chat_both", "chat_files_nojinja"):
            self.assertNotIn("tokenizer.chat_templates",
                             got_meta(self.reader(name)))
        self.assertNotIn("tokenizer.chat_template",
                         got_meta(self.reader("chat_null")))

    def test_unreadable_templates_refused(self):
        with open(self.mount.join(".castfs", "refused")) as f:
            got = {e["path"]: e["reason"] for e in json.load(f)}
        for name, (_, why) in REFUSED.items():
            with self.subTest(name=name):
                d = os.path.join(self.src, name)
                if name == "chat_files_clash":  # one of the two
                    self.assertIn(ref_special(d)[
                        "tokenizer.chat_template.tool_use"][0], ("1", "2"))
                elif name == "chat_files_link":  # read through the link
                    self.assertEqual(ref_special(d)[
                        "tokenizer.chat_template.q"][0], "q")
                else:  # the oracle stops
                    with self.assertRaises(Exception):
                        ref_special(d)
                self.assertIn(why, got.get(name, ""))
                self.assertFalse(os.path.exists(
                    self.mount.join(name + ".f16.gguf")))
        self.assertNotIn("chat_files", got)

    def test_unopenable_templates_folder_refused(self):
        # A folder castfs may not open (its daemon without
        # CAP_DAC_OVERRIDE): a reason, not a GGUF that vanishes without
        # one; the folder beside it keeps its GGUF.
        if subprocess.run(["setpriv", "--bounding-set=-dac_override",
                           "true"], capture_output=True).returncode:
            raise unittest.SkipTest("setpriv cannot drop CAP_DAC_OVERRIDE")
        with tl.tempdir() as src:
            os.chmod(src, 0o755)
            for name in ("chat_files", "chat_tc"):
                shutil.copytree(os.path.join(self.src, name),
                                os.path.join(src, name))
            xt = os.path.join(src, "chat_files", XT)
            os.chmod(xt, 0)
            caps = "-dac_override,-dac_read_search"
            try:
                with tl.Mount(src, prefix=["setpriv", "--inh-caps=" + caps,
                                           "--bounding-set=" + caps]) as m:
                    self.assertTrue(os.path.exists(
                        m.join("chat_tc.f16.gguf")))
                    self.assertFalse(os.path.exists(
                        m.join("chat_files.f16.gguf")))
                    with open(m.join(".castfs", "refused")) as f:
                        got = {e["path"]: e["reason"] for e in json.load(f)}
                    self.assertIn("additional_chat_templates/ cannot be "
                                  "read: Permission denied",
                                  got.get("chat_files", ""), got)
            finally:
                os.chmod(xt, 0o755)

    def test_token_types(self):
        for name in ("types", "chat_tc"):
            with self.subTest(name=name):
                d = os.path.join(self.src, name)
                with open(os.path.join(d, CFG)) as fp:
                    n = json.load(fp)["vocab_size"]
                tokens, types = get_vocab_base(d, n)
                r = self.reader(name)
                self.assertEqual(
                    list(r.fields["tokenizer.ggml.tokens"].contents()),
                    tokens)
                self.assertEqual(
                    list(r.fields["tokenizer.ggml.token_type"].contents()),
                    [int(t) for t in types])
                del r
        self.assertIn(gguf.TokenType.UNUSED, types)

    def test_llama_cpp_special_tokens(self):
        # not add_bos_tc: there gguf-py (and castfs) take
        # tokenizer_config.json's add_bos_token, transformers the template
        for name in ("add_bos", "ids_cfg", "ids_qwen", "types"):
            with self.subTest(name=name):
                d = os.path.join(self.src, name)
                hf = AutoTokenizer.from_pretrained(d)
                with open(os.path.join(d, CFG)) as fp:
                    cfg = json.load(fp)
                llm = llama_cpp.Llama(self.mount.join(name + ".f16.gguf"),
                                      vocab_only=True, verbose=False)
                text = "The quick brown fox"
                self.assertEqual(llm.tokenize(text.encode(), add_bos=True),
                                 hf(text).input_ids)
                if name.startswith("ids"):
                    self.assertEqual(llm.token_bos(), cfg["bos_token_id"])
                llm.close()


if __name__ == "__main__":
    tl.main()
