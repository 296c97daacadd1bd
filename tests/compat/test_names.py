# SPDX-License-Identifier: MIT
"""Hostile file names under a real mount: what castfs writes about them
(/.castfs/rejected, /.castfs/config, its log) is valid UTF-8 that a strict
decoder accepts, holds no control byte, and gives the raw bytes back by
the documented rule (docs/FORMATS.md: each \\xHH is the byte HH). The
oracle is Python's strict UTF-8 codec and json module."""
import json
import os
import re
import subprocess
import time
import unittest

import castfs_testlib as tl

# A newline that would forge a log line, an escape sequence for the
# terminal, a byte that is not UTF-8, a C1 control, a backslash.
HOSTILE = [
    b"bad\nforged: rejected: nothing.safetensors",
    b"\x1b[31mred\x1b[0m.safetensors",
    b"latin1-caf\xe9.safetensors",
    b"csi\xc2\x9bname.safetensors",
    b"back\\slash\xff.safetensors",
]


def unescape(s):
    """The documented way back from an escaped name to its bytes."""
    out, raw = bytearray(), s.encode("utf-8")
    i = 0
    while i < len(raw):
        if raw[i:i + 2] == b"\\x":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def strict_json(data):
    text = data.decode("utf-8", errors="strict")
    for ch in text:
        assert ord(ch) >= 0x20 or ch in "\n\t", repr(ch)
    return json.loads(text)


class TestNames(unittest.TestCase):
    def test_rejected_config_and_log_are_clean_and_reversible(self):
        with tl.tempdir() as src:
            srcb = os.fsencode(src)
            for name in HOSTILE:
                with open(os.path.join(srcb, name), "wb") as f:
                    f.write(b"not a checkpoint")
            with tl.Mount(src) as m:
                os.listdir(m.path)  # every header read once
                with open(m.join(".castfs", "rejected"), "rb") as f:
                    rejected = strict_json(f.read())
                got = sorted(unescape(r["path"]) for r in rejected)
                self.assertEqual(got, sorted(HOSTILE))
                with open(m.join(".castfs", "config"), "rb") as f:
                    config = strict_json(f.read())
                self.assertEqual(unescape(config["source"]), srcb)
                time.sleep(0.2)
                log = m.output().encode("utf-8", errors="surrogateescape")
            log.decode("utf-8", errors="strict")
            self.assertNotRegex(log, re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]"))
            self.assertNotIn(b"\xc2\x9b", log)
            lines = [l for l in log.split(b"\n") if b"rejected" in l]
            self.assertEqual(len(lines), len(HOSTILE), lines)
            for name in HOSTILE:
                self.assertEqual(sum(1 for l in lines
                                     if name in unescape(l.decode())), 1,
                                 name)

    def test_reasons_quote_names_escaped_once(self):
        """A reason quotes a tensor name as the parser escaped it, so
        /.castfs/rejected and the log show it as `castfs info` does, not
        escaped a second time (a bug hunt: 'a\\x5cx5cb\\x5cx1bc' for
        'a\\x5cb\\x1bc'); what a reason quotes raw (a quant_method from
        config.json) is still escaped, once."""
        tensor = {"a\\b\x1bc": {"dtype": "F32", "shape": [4],
                                "data_offsets": [0, 10]}}
        method = "x\x1b[31m\u009b\\y"
        with tl.tempdir() as src:
            h = json.dumps(tensor).encode()
            h += b" " * (-len(h) % 8)
            bad = os.path.join(src, "bad.safetensors")
            with open(bad, "wb") as f:
                f.write(len(h).to_bytes(8, "little") + h + bytes(10))
            os.mkdir(os.path.join(src, "q"))
            h = json.dumps({"w": {"dtype": "F32", "shape": [1],
                                  "data_offsets": [0, 4]}}).encode()
            h += b" " * (-len(h) % 8)
            with open(os.path.join(src, "q", "model.safetensors"), "wb") as f:
                f.write(len(h).to_bytes(8, "little") + h + bytes(4))
            with open(os.path.join(src, "q", "config.json"), "w") as f:
                json.dump({"architectures": ["LlamaForCausalLM"],
                           "quantization_config": {"quant_method": method}},
                          f)
            info = subprocess.run([tl.castfs_binary(), "info", bad],
                                  capture_output=True, text=True)
            shown = info.stderr.strip().split(bad + ": ", 1)[1]
            self.assertIn("'a\\x5cb\\x1bc'", shown)
            with tl.Mount(src) as m:
                os.listdir(m.path)
                os.listdir(m.join("q"))
                with open(m.join(".castfs", "rejected"), "rb") as f:
                    rejected = {r["path"]: r["reason"]
                                for r in strict_json(f.read())}
                time.sleep(0.2)
                log = m.output()
            self.assertEqual(rejected["bad.safetensors"], shown)
            self.assertIn("bad.safetensors: rejected: " + shown + "\n", log)
            quant = rejected["q/model.safetensors"]
            self.assertIn("'x\\x1b[31m\\xc2\\x9b\\y'", quant)
            self.assertIn("q/model.safetensors: rejected: " + quant + "\n",
                          log)


class LongNames(unittest.TestCase):
    """Source names up to NAME_MAX (255 bytes): every name a listing shows
    is looked up, and the views whose names fit are listed and read
    torch's cast. A view name of 252 bytes or more answered ENAMETOOLONG
    to its lookup although listed: the lookup asks for a pack
    "X.fp8.safetensors.zst" first, a name past NAME_MAX (a bug hunt)."""

    def test_every_listed_name_looks_up(self):
        import torch
        from safetensors.torch import load, save_file
        w = torch.arange(16, dtype=torch.bfloat16).reshape(4, 4)
        with tl.tempdir() as src:
            for total in range(240, 256):
                stem = "a" * (total - len(".safetensors"))
                save_file({"w": w}, os.path.join(src, stem + ".safetensors"))
            with tl.Mount(src) as m:
                names = os.listdir(m.path)
                bad = {}
                for n in names:
                    try:
                        os.stat(m.join(n))
                    except OSError as e:
                        bad[len(n)] = e.strerror
                self.assertEqual(bad, {})
                views = [n for n in names if n.endswith(".fp16.safetensors")]
                # stems of 228 to 238 bytes: 255 - len(".fp16.safetensors")
                self.assertEqual(sorted(len(n) for n in views),
                                 list(range(245, 256)))
                for n in views:
                    with open(m.join(n), "rb") as f:
                        got = load(f.read())["w"]
                    self.assertTrue(torch.equal(got, w.half()), n)

    def test_index_spellings_name_shards_that_exist(self):
        """An index's variant spelling (model.safetensors.index.fp8.json)
        names each shard's view (X.fp8.safetensors): listed only where
        every such name fits NAME_MAX. With 250-byte shard names,
        index.fp8_e5m2.json was listed and named views of 259 bytes."""
        import torch
        from safetensors.torch import save_file
        with tl.tempdir() as src:
            d = os.path.join(src, "lm")
            os.mkdir(d)
            wm = {}
            for i in range(2):
                shard = str(i) + "s" * 237 + ".safetensors"  # 250 bytes
                save_file({"l%d.weight" % i: torch.ones(8, 8).bfloat16()},
                          os.path.join(d, shard), metadata={"format": "pt"})
                wm["l%d.weight" % i] = shard
            with open(os.path.join(d, "model.safetensors.index.json"),
                      "w") as f:
                json.dump({"metadata": {"total_size": 256},
                           "weight_map": wm}, f)
            with tl.Mount(src) as m:
                names = os.listdir(m.join("lm"))
                spellings = [n for n in names
                             if n.startswith("model.safetensors.index.")]
                self.assertIn("model.safetensors.index.fp8.json", spellings)
                self.assertNotIn("model.safetensors.index.fp8_e5m2.json",
                                 spellings)
                with self.assertRaises(FileNotFoundError):
                    os.stat(m.join("lm/model.safetensors.index."
                                   "fp8_e5m2.json"))
                for n in spellings:
                    with open(m.join("lm", n)) as f:
                        shards = set(json.load(f)["weight_map"].values())
                    for shard in shards:
                        self.assertIn(shard, names, n)
                        os.stat(m.join("lm", shard))


if __name__ == "__main__":
    tl.main()
