# SPDX-License-Identifier: MIT
"""DIR.<q>.gguf of a causal-LM folder: its plan is built once per identity
of the folder's files (the JSON is not parsed again per getattr and open),
follows an edit of tokenizer.json or config.json while mounted (the
watcher), and a folder castfs cannot map is listed with its reason in
/.castfs/refused.

Oracles: gguf-py's GGUFReader for what the file holds, and the edited
JSON files themselves (json.load) for what it must hold after an edit.
"""
import errno
import json
import os
import shutil
import subprocess
import unittest

from gguf import GGUFReader

import castfs_testlib as tl
import rel_common as rc
from test_gguf_llm import make_model

SETTLE = 10.0  # seconds the watcher may take (it takes milliseconds)


class GGUFCache(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        os.mkdir(cls.src)
        cls.base = os.path.join(cls.tmp, "llama")
        make_model(cls.base, "llama")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def folder(self, name):
        d = os.path.join(self.src, name)
        shutil.copytree(self.base, d)
        return d

    def stats(self, m):
        with open(m.join(".castfs", "stats")) as f:
            return json.load(f)

    def refused(self, m):
        with open(m.join(".castfs", "refused")) as f:
            return json.load(f)

    def test_plan_built_once(self):
        self.folder("once")
        with tl.Mount(self.src) as m:
            p = m.join("once.q8_0.gguf")
            with open(p, "rb") as f:
                first = f.read()
            built = self.stats(m)["plans_built"]
            for _ in range(5):
                os.stat(p)
                with open(p, "rb") as f:
                    self.assertEqual(f.read(), first)
            self.assertEqual(self.stats(m)["plans_built"], built)
            self.assertGreater(self.stats(m)["cache_hits"]["plans"], 0)
            self.assertEqual(len(first), os.path.getsize(p))

    def test_ls_l_builds_each_view_once(self):
        """`ls -l` of the folder's parent learns each view's size from its
        plan (the listing's build, then READDIRPLUS or the lookups of its
        stats); that plan is kept, so the stats, opens and reads after it
        build nothing more: one build per view, not two (a listing's build
        kept no plan until the budget counted GGUF plans)."""
        src = os.path.join(self.tmp, "lsl")  # no other test's folders
        shutil.copytree(self.base, os.path.join(src, "listed"))
        views = ["q8_0", "q4_0"]
        opts = ["views=" + ":".join(v + ".gguf" for v in views)]
        names = ["listed.%s.gguf" % v for v in views]
        with tl.Mount(src, options=opts) as m:
            ls = subprocess.run(["ls", "-l", m.path], check=True,
                                capture_output=True, text=True).stdout
            for n in names:
                self.assertIn(n, ls)
            got = {}
            for n in names:
                os.stat(m.join(n))
                with open(m.join(n), "rb") as f:
                    got[n] = f.read()
                self.assertEqual(len(got[n]), os.path.getsize(m.join(n)))
            self.assertEqual(self.stats(m)["plans_built"], len(views))
        # The bytes the listing's plan served: what a mount that never
        # listed serves, and a GGUF file to gguf-py.
        with tl.Mount(src, options=opts) as m:
            for n in names:
                with open(m.join(n), "rb") as f:
                    self.assertEqual(f.read(), got[n], n)
                r = GGUFReader(m.join(n))
                self.assertGreater(len(r.tensors), 0, n)
                del r  # it maps the file, which would keep the mount busy

    def settles(self, m, name, check):
        def now():
            try:
                with open(m.join(name), "rb") as f:
                    data = f.read()
                return (len(data) == os.path.getsize(m.join(name))
                        and check(GGUFReader(m.join(name))))
            except (OSError, ValueError):
                return False
        rc.poll(now, SETTLE, "%s to follow the edit" % name)

    def test_follows_tokenizer_and_config_edits(self):
        d = self.folder("edit")
        name = "edit.q8_0.gguf"
        with tl.Mount(self.src) as m:
            r = GGUFReader(m.join(name))
            old_size = os.path.getsize(m.join(name))
            self.assertEqual(r.fields["llama.context_length"].contents(), 256)
            del r  # it maps the file, which would keep the mount busy
            # a vocab entry spelled longer: the tokens (and size) follow
            tj = os.path.join(d, "tokenizer.json")
            with open(tj, encoding="utf-8") as f:
                tok = json.load(f)
            vocab = tok["model"]["vocab"]
            word = max((w for w in vocab if len(w) > 2), key=vocab.get)
            vocab[word + "_renamed"] = vocab.pop(word)

            # the merges that make or use it go too, or the tokenizer is
            # one Hugging Face refuses (and castfs with it)
            def uses(m):
                a, b = m.split(" ", 1) if isinstance(m, str) else m
                return word in (a, b, a + b)
            tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                                      if not uses(m)]
            with open(tj + ".tmp", "w", encoding="utf-8") as f:
                json.dump(tok, f, ensure_ascii=False)
            os.rename(tj + ".tmp", tj)
            want = {i: w for w, i in vocab.items()}
            for a in tok["added_tokens"]:
                want[a["id"]] = a["content"]

            def tokens_follow(r):
                toks = r.fields["tokenizer.ggml.tokens"].contents()
                return all(toks[i] == w for i, w in want.items())
            self.settles(m, name, tokens_follow)
            # 8 bytes longer before the header's padding to 32 bytes
            self.assertGreaterEqual(os.path.getsize(m.join(name)), old_size)
            # a config value: the hyper-parameter KV follows
            cj = os.path.join(d, "config.json")
            with open(cj) as f:
                cfg = json.load(f)
            cfg["max_position_embeddings"] = 512
            with open(cj + ".tmp", "w") as f:
                json.dump(cfg, f)
            os.rename(cj + ".tmp", cj)
            self.settles(m, name, lambda r: r.fields[
                "llama.context_length"].contents() == 512)

    def test_refused_lists_unmapped_folders(self):
        d = self.folder("gpt2like")
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg["architectures"] = ["GPT2LMHeadModel"]
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        d = self.folder("spm")
        os.rename(os.path.join(d, "tokenizer.json"),
                  os.path.join(d, "tokenizer.model"))
        d = self.folder("notok")
        os.remove(os.path.join(d, "tokenizer.json"))
        self.folder("fine")
        with tl.Mount(self.src, options=["views=q8_0:f16"]) as m:
            got = {e["path"]: e for e in self.refused(m)}
            self.assertNotIn("fine", got)
            self.assertIn("fine.q8_0.gguf", os.listdir(m.path))
            for bad in ("gpt2like", "notok"):
                self.assertNotIn(bad + ".q8_0.gguf", os.listdir(m.path))
                # not listed, so not found: ENOENT like any absent name
                for op in (os.stat, lambda p: open(p, "rb").close()):
                    with self.assertRaises(OSError) as cm:
                        op(m.join(bad + ".q8_0.gguf"))
                    self.assertEqual(cm.exception.errno, errno.ENOENT, bad)
                # every GGUF view of the mount, with the folder's reason
                self.assertIn("q8_0.gguf", got[bad]["views"])
                self.assertIn("f16.gguf", got[bad]["views"])
            self.assertIn("architectures", got["gpt2like"]["reason"])
            self.assertIn("no tokenizer.json", got["notok"]["reason"])
            self.assertIn("SentencePiece", got["spm"]["reason"])
            # a fixed folder leaves the list
            shutil.copy(os.path.join(self.base, "tokenizer.json"),
                        os.path.join(d, "tokenizer.json"))
            self.assertNotIn("notok", {e["path"] for e in self.refused(m)})


if __name__ == "__main__":
    tl.main()
