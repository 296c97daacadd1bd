# SPDX-License-Identifier: MIT
"""A source with a large __metadata__ (40 MB of text, within the 100 MB
header limit): every view writes it, and the views' plans hold it once.

Before stop 42 each view's plan kept two copies of it (the pairs and the
header text): `ls -l` of one such file took the daemon past 600 MB (a bug
hunt of stop 41). Now the views of a source share one copy of the
metadata object's text (docs/ARCHITECTURE.md, "Plans").

- The cast views equal safetensors' own writer (`safetensors.torch.save`
  of the cast tensors with the same metadata) byte for byte: whole, by
  random ranges and by ranges across the header's pieces.
- Every view's header carries the metadata (json) and loads.
- The daemon's memory after `ls -l` and a header read of every view grows
  by less than four times the metadata (one copy per view costs over
  twice per view; eight views here). Skipped under a sanitizer, whose
  allocator keeps freed memory.
"""
import errno
import json
import os
import shutil
import struct
import unittest

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save, save_file

import castfs_testlib as tl

META_MB = 40


def big_text():
    """About META_MB MB of text that JSON must escape in places."""
    unit = 'pt "quoted" \\back\\ slash/ é ✓ \x01 tab\t line\n'
    return unit * (META_MB * 1000 * 1000 // len(unit.encode()))


class BigMetadata(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = tl.tempdir()
        cls.src = cls.ctx.__enter__()
        g = torch.Generator().manual_seed(7)
        cls.tensors = {
            "model.layers.0.mlp.up_proj.weight":
                torch.randn(128, 256, generator=g).bfloat16(),
            "model.norm.weight": torch.randn(256, generator=g).bfloat16()}
        # One key: safetensors' writer orders several keys by a hash.
        cls.meta = {"format": big_text()}
        save_file(cls.tensors, os.path.join(cls.src, "m.safetensors"),
                  metadata=cls.meta)
        cls.mnt = tl.Mount(cls.src, options=["cache_mb=16"])

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.ctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def views(self):
        names = sorted(n for n in os.listdir(self.mnt.path)
                       if n.startswith("m.") and n.endswith(".safetensors")
                       and n != "m.safetensors")
        self.assertGreaterEqual(len(names), 6, names)
        return names

    def test_cast_views_equal_the_writer(self):
        for view, dt in (("fp16", torch.float16), ("fp32", torch.float32),
                         ("fp8", torch.float8_e4m3fn)):
            with self.subTest(view=view):
                want = save({k: v.to(dt) for k, v in self.tensors.items()},
                            metadata=self.meta)
                path = self.mnt.join("m.%s.safetensors" % view)
                with open(path, "rb") as f:
                    got = f.read()
                self.assertEqual(len(got), len(want))
                self.assertTrue(got == want, view)
                # Across the header's pieces: the prefix, the shared
                # metadata object, the tensors' entries.
                meta_at = len(b'{"__metadata__":') + 8
                meta_end = want.rindex(b'"}', 0, 8 + struct.unpack(
                    "<Q", want[:8])[0]) + 2
                for off, n in ((0, 4096), (meta_at - 3, 10),
                               (meta_end - 5, 64), (meta_at, meta_end),
                               (meta_end - 1, 4096)):
                    with open(path, "rb") as f:
                        f.seek(off)
                        self.assertEqual(f.read(n), want[off:off + n],
                                         (view, off, n))
                tl.check_ranges(self, path, want, count=50)

    def test_every_view_has_it(self):
        for name in self.views():
            with self.subTest(view=name):
                with open(self.mnt.join(name), "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    head = json.loads(f.read(n))
                self.assertEqual(head["__metadata__"], self.meta)
        with open(self.mnt.join("m.nf4.safetensors"), "rb") as f:
            self.assertIn("model.layers.0.mlp.up_proj.weight",
                          st_load(f.read()))

    def test_memory_holds_one_copy(self):
        m = tl.Mount(self.src, options=["cache_mb=16"])
        try:
            pid = m.daemon()
            if tl.sanitizer(pid):
                self.skipTest("RSS not checked under %s" % tl.sanitizer(pid))
            os.listdir(m.path)
            base = tl.rss_mb(pid)
            names = self.views()
            for name in names:
                os.stat(m.join(name))
                with open(m.join(name), "rb") as f:
                    f.read(1 << 20)
            grown = tl.rss_mb(pid) - base
            print("daemon grew %.0f MB for %d views of a %d MB __metadata__"
                  % (grown, len(names), META_MB))
            self.assertLess(grown, 4 * META_MB, names)
        finally:
            self.assertEqual(m.unmount(), 0)


class ManyDims(unittest.TestCase):
    """One shape of 2,000,000 dimensions (a 4 MB header; torch reads it).
    Parsed by cJSON, every number cost a node of ~80 bytes and each
    view's header an snprintf() per number: `ls -l` took the daemon to
    210 MB and 2 s (a 20 M-dimension header: 1.7 GB, 43 s; a bug hunt).
    Now 16 bytes a value: the peak stays under 120 MB, and the view
    still equals torch's cast."""

    DIMS = 2000000

    def test_parse_is_lean(self):
        with tl.tempdir() as src:
            shape = [1] * self.DIMS
            shape[0] = 4
            w = torch.arange(4, dtype=torch.bfloat16).reshape(shape)
            save_file({"w": w}, os.path.join(src, "m.safetensors"))
            with tl.Mount(src) as m:
                pid = m.daemon()
                base = tl.rss_mb(pid)
                os.listdir(m.path)
                for n in os.listdir(m.path):
                    os.stat(m.join(n))
                peak = tl.rss_mb(pid, "VmHWM") - base
                with open(m.join("m.fp16.safetensors"), "rb") as f:
                    got = st_load(f.read())["w"]
                self.assertEqual(got.dim(), self.DIMS)
                self.assertTrue(torch.equal(got, w.half()))
                print("peak %.0f MB over the idle daemon" % peak)
                if not tl.sanitizer(pid):
                    self.assertLess(peak, 120)


class ManyJsonValues(unittest.TestCase):
    """JSON texts of many tiny values: a model folder's config.json,
    tokenizer.json and chat_template.json (read up to 64 MiB) and a ComfyUI
    "_quantization_metadata" (up to the 100 MB header limit). cJSON spends
    ~80 bytes a value, so a 62 MB config.json of "0," took the daemon to
    2.5 GB and 11.6 s for a listing of its parent, a tokenizer.json so to
    2.4 GB for a `stat` of a GGUF view, a metadata string to 4.9 GB (a bug
    hunt). Now each text is counted before it is parsed: over its cap
    (1,048,576 values; 4,194,304 for the tokenizer's) the GGUF views are
    refused and the checkpoint rejected with the reason (`E2BIG`), the
    raw files read as they are, and the daemon's peak stays near the
    texts' own size. The text files of one GGUF build (each up to 256 MiB,
    64 additional chat templates too) are read up to 64 MiB in all: a
    folder of 300 MB of templates kept 300 MB per GGUF view built."""

    @staticmethod
    def zeros(n):
        return "[" + "0," * (n - 1) + "0]"

    @classmethod
    def setUpClass(cls):
        import test_gguf_llm
        cls.ctx = tl.tempdir()
        cls.src = cls.ctx.__enter__()
        test_gguf_llm.make_model(os.path.join(cls.src, "ok"), "llama")
        for name, f, n in (("cfg", "config.json", 8 << 20),
                           ("tok", "tokenizer.json", 5 << 20)):
            d = os.path.join(cls.src, name)
            shutil.copytree(os.path.join(cls.src, "ok"), d)
            with open(os.path.join(d, f)) as fh:
                text = fh.read().rstrip()
            with open(os.path.join(d, f), "w") as fh:
                fh.write(text[:-1] + ', "x": ' + cls.zeros(n) + "}")
        # an index of 1.1 million names: over the cap, the folder is
        # refused (no DIR.<view>/ whose index would then fail E2BIG)
        d = os.path.join(cls.src, "idx")
        shutil.copytree(os.path.join(cls.src, "ok"), d)
        shard = "model-00001-of-00001.safetensors"
        os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, shard))
        wm = {"t.%d" % i: shard for i in range(1100000)}
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
        # 70 MB of chat templates: each GGUF view's header held them all
        d = os.path.join(cls.src, "tmpl")
        shutil.copytree(os.path.join(cls.src, "ok"), d)
        os.mkdir(os.path.join(d, "additional_chat_templates"))
        for f, mb in (("chat_template.jinja", 30),
                      ("additional_chat_templates/rag.jinja", 20),
                      ("additional_chat_templates/tool.jinja", 20)):
            with open(os.path.join(d, f), "w") as fh:
                fh.write("{{ messages }}" + "a" * (mb << 20))
        # a chat_template.json over the cap (read without a .jinja and
        # without tokenizer_config.json's key): parsed uncapped while
        # the tokenizer's trees were held
        d = os.path.join(cls.src, "ctj")
        shutil.copytree(os.path.join(cls.src, "ok"), d)
        with open(os.path.join(d, "chat_template.json"), "w") as fh:
            fh.write('{"chat_template": "{{ messages }}", "x": ' +
                     cls.zeros(1100000) + "}")
        meta = '{"layers": {}, "x": ' + cls.zeros(1100000) + "}"
        save_file({"w": torch.ones(4, 4, dtype=torch.bfloat16)},
                  os.path.join(cls.src, "comfy.safetensors"),
                  metadata={"_quantization_metadata": meta})

    @classmethod
    def tearDownClass(cls):
        cls.ctx.__exit__(None, None, None)

    def test_refused_within_bounds(self):
        with tl.Mount(self.src) as m:
            pid = m.daemon()
            base = tl.rss_mb(pid)
            names = os.listdir(m.path)
            for n in names:
                os.stat(m.join(n))
            for n in ("cfg", "tok", "tmpl", "ctj"):
                with self.assertRaises(FileNotFoundError):
                    os.stat(m.join(n + ".q8_0.gguf"))
            self.assertGreater(os.stat(m.join("ok.q8_0.gguf")).st_size, 0)
            self.assertIn("ok.bf16", names)
            self.assertIn("tok.bf16", names)
            self.assertNotIn("idx.bf16", names)
            self.assertNotIn("model.safetensors.index.bf16.json",
                             os.listdir(m.join("idx")))
            peak = tl.rss_mb(pid, "VmHWM") - base
            with open(m.join(".castfs/refused")) as f:
                why = {(e["path"], e["views"][0], e["reason"])
                       for e in json.load(f)}
            self.assertIn(("cfg", "f16.gguf", "GGUF: config.json: more "
                           "than 1048576 JSON values"), why)
            self.assertIn(("tok", "f16.gguf", "GGUF: tokenizer.json: more "
                           "than 4194304 JSON values"), why)
            self.assertIn(("idx", "fp32", "model.safetensors.index.json: "
                           "index: more than 1048576 JSON values"), why)
            self.assertIn(("tmpl", "f16.gguf", "GGUF: the text files hold "
                           "more than the 64 MiB castfs reads"), why)
            self.assertIn(("ctj", "f16.gguf", "GGUF: chat_template.json: "
                           "more than 1048576 JSON values"), why)
            with open(m.join(".castfs/rejected")) as f:
                bad = {e["path"]: e for e in json.load(f)}
            self.assertEqual(bad["comfy.safetensors"]["error"],
                             os.strerror(errno.E2BIG))
            self.assertIn("more than 1048576 JSON values",
                          bad["comfy.safetensors"]["reason"])
            for f in ("comfy.safetensors", "cfg/config.json",
                      "tok/tokenizer.json"):
                with open(m.join(f), "rb") as a, \
                        open(os.path.join(self.src, f), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f)
            print("peak %.0f MB over the idle daemon" % peak)
            if not tl.sanitizer(pid):
                self.assertLess(peak, 120)


if __name__ == "__main__":
    tl.main()
