# SPDX-License-Identifier: MIT
"""`castfs info FILE.gguf`: the header of a GGUF file written by gguf-py's
GGUFWriter (every scalar value type, arrays, a custom alignment, F32, F16
and Q8_0 tensors), compared line by line with what gguf-py's GGUFReader
reads from the same file; a truncated or corrupted file is refused with
a reason and exit status 1.
"""
import os
import subprocess
import unittest

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter, quants

import castfs_testlib as tl

VT_NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16",
            VT.UINT32: "u32", VT.INT32: "i32", VT.FLOAT32: "f32",
            VT.BOOL: "bool", VT.STRING: "string", VT.ARRAY: "array",
            VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}


def write(path):
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "a \"quoted\" string")
    w.add_uint64("t.u64", 1 << 60)
    w.add_int64("t.i64", -(1 << 60))
    w.add_float64("t.f64", 1.0 / 3)
    w.add_array("t.ints", [1, 2, 3, 4])
    w.add_array("t.strs", ["x", "yy", "zzz"])
    rng = np.random.default_rng(3)
    w.add_tensor("a.f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal(64).astype(np.float16))
    q = quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                        QT.Q8_0)
    w.add_tensor("c.q8_0", q, raw_dtype=QT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def info(path):
    return subprocess.run([tl.castfs_binary(), "info", path],
                          capture_output=True, text=True)


class GGUFInfo(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.tmp = cls._tmp.__enter__()
        cls.path = os.path.join(cls.tmp, "t.gguf")
        write(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def test_matches_gguf_py(self):
        r = info(self.path)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        g = GGUFReader(self.path)
        kvs = {}
        for ln in lines:
            if " = " in ln and ln.startswith("  "):
                head, val = ln[2:].split(" = ", 1)
                key, typ = head.rsplit(" ", 1)
                kvs[key] = (typ, val)
        fields = {k: f for k, f in g.fields.items()
                  if not k.startswith("GGUF.")}
        self.assertEqual(sorted(kvs), sorted(fields))
        for k, f in fields.items():
            typ, val = kvs[k]
            self.assertEqual(typ, VT_NAMES[f.types[0]], k)
            v = f.contents()
            if f.types[0] == VT.ARRAY:
                self.assertEqual(val, "[%s x %d]" % (VT_NAMES[f.types[1]],
                                                     len(v)), k)
            elif f.types[0] == VT.STRING:
                self.assertEqual(val, '"%s"' % v.replace('"', "\\x22"), k)
            elif f.types[0] == VT.BOOL:
                self.assertEqual(val, "true" if v else "false", k)
            elif f.types[0] == VT.FLOAT32:
                self.assertEqual(np.float32(val), np.float32(v), k)
            elif f.types[0] == VT.FLOAT64:
                self.assertEqual(float(val), float(v), k)
            else:
                self.assertEqual(int(val), int(v), k)
        data_at = int(lines[1].rsplit(" ", 1)[1])
        self.assertIn("alignment 64", lines[1])
        self.assertIn("%d bytes" % os.path.getsize(self.path), lines[1])
        rows = {}
        for ln in lines[lines.index(next(l for l in lines
                                         if l.startswith("tensors:"))) + 2:]:
            name, typ, ne, off, nbytes = ln.split()
            rows[name] = (typ, ne, int(off), int(nbytes))
        self.assertEqual(sorted(rows), sorted(t.name for t in g.tensors))
        for t in g.tensors:
            typ, ne, off, nbytes = rows[t.name]
            self.assertEqual(typ, t.tensor_type.name.lower(), t.name)
            self.assertEqual(ne, "[%s]" % ",".join(str(int(x))
                                                   for x in t.shape), t.name)
            self.assertEqual(data_at + off, t.data_offset, t.name)
            self.assertEqual(nbytes, t.n_bytes, t.name)

    def test_default_alignment(self):
        """Without general.alignment the data starts at the next multiple
        of 32 (the GGUF spec's default; gguf-py's GGUFReader), here 20
        bytes past the header: not at the next multiple of 16."""
        path = os.path.join(self.tmp, "default.gguf")
        w = GGUFWriter(path, "llama")
        w.add_string("t.pad", "x")
        w.add_tensor("a.f32", np.arange(15, dtype=np.float32).reshape(3, 5))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        g = GGUFReader(path)
        t = g.tensors[0]
        end = t.field.offset + sum(p.nbytes for p in t.field.parts)
        self.assertTrue(0 < end % 32 < 16, end)
        want = int(t.data_offset)
        del g, t
        r = info(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        head = r.stdout.splitlines()[1]
        self.assertIn("alignment 32", head)
        self.assertEqual(int(head.rsplit(" ", 1)[1]), want)

    def test_truncated_or_corrupt_is_refused(self):
        with open(self.path, "rb") as f:
            data = f.read()
        bad = os.path.join(self.tmp, "bad.gguf")
        g = GGUFReader(self.path)
        end = max(int(t.data_offset) + int(t.n_bytes) for t in g.tensors)
        del g
        for cut, why in ((end - 1, "past the end"),
                         (200, "past the end"), (3, "past the end")):
            with open(bad, "wb") as f:
                f.write(data[:cut])
            r = info(bad)
            self.assertEqual(r.returncode, 1, cut)
            self.assertIn(why, r.stderr, cut)
        # A tensor offset the file's alignment (64) does not divide, its
        # data still within the file: the GGUF spec (and llama.cpp's
        # gguf_init) refuse it.
        g = GGUFReader(self.path)
        fld = next(t for t in g.tensors if t.name == "a.f32").field
        at = fld.offset + sum(p.nbytes for p in fld.parts[:-1])
        self.assertEqual(int(fld.parts[-1][0]), 0)
        del g, fld
        with open(bad, "wb") as f:
            f.write(data[:at] + (8).to_bytes(8, "little") + data[at + 8:])
        r = info(bad)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("is not aligned", r.stderr)
        with open(bad, "wb") as f:
            f.write(b"GGUX" + data[4:])
        r = info(bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a GGUF file", r.stderr)

    def test_controls_and_bad_utf8_escaped(self):
        """Keys, string values and tensor names holding a C1 control
        (U+009B, which terminals obey as CSI), ESC or bytes that are not
        UTF-8 are printed quoted, as \\xHH (bug hunt: C1 and non-UTF-8
        bytes reached the terminal raw), and so is the file's own name (a
        bug hunt: the `file:` line printed it raw)."""
        path = os.path.join(self.tmp, "c1\u009b2J \x1b.gguf")
        w = GGUFWriter(path, "llama")
        w.add_string("k.c1\u009b2J", "v\u009b31m\x1b[0m")
        w.add_string("k.bad", "BADxUTF8")
        w.add_tensor("t\u009b2J", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "r+b") as f:
            data = f.read()
            f.seek(data.index(b"BADxUTF8") + 3)
            f.write(b"\xff")
        r = subprocess.run([tl.castfs_binary(), "info", path],
                           capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        for raw in (b"\xc2\x9b", b"\x1b", b"\xff"):
            self.assertNotIn(raw, out)
        for shown in (rb'"k.c1\xc2\x9b2J" string = "v\xc2\x9b31m\x1b[0m"',
                      rb'k.bad string = "BAD\xffUTF8"', rb'"t\xc2\x9b2J"',
                      b'file: "' + os.fsencode(self.tmp) +
                      rb'/c1\xc2\x9b2J \x1b.gguf"'):
            self.assertIn(shown, out)
        out.decode("utf-8")


class GGUFViewInfo(unittest.TestCase):
    """`castfs info X.q8_0.gguf` where only X.safetensors exists (and
    `--view q8_0.gguf X.safetensors`) computes the header of the view: the
    same listing as the file a mount serves, which gguf-py reads alike."""

    def test_view_header_as_mounted(self):
        from safetensors.torch import save_file
        from test_gguf import flux_tensors
        import torch
        with tl.tempdir() as src:
            save_file(flux_tensors(torch.bfloat16),
                      os.path.join(src, "flux.safetensors"))
            virt = info(os.path.join(src, "flux.q8_0.gguf"))
            self.assertEqual(virt.returncode, 0, virt.stderr)
            flag = subprocess.run(
                [tl.castfs_binary(), "info", "--view", "q8_0.gguf",
                 os.path.join(src, "flux.safetensors")],
                capture_output=True, text=True)
            self.assertEqual(flag.stdout, virt.stdout)
            with tl.Mount(src) as m:
                real = info(m.join("flux.q8_0.gguf"))
                g = GGUFReader(m.join("flux.q8_0.gguf"))
                ntensors = len(g.tensors)
                arch = g.fields["general.architecture"].contents()
                del g
            self.assertEqual(real.returncode, 0, real.stderr)
            self.assertEqual(virt.stdout.splitlines()[1:],
                             real.stdout.splitlines()[1:])
            self.assertIn("tensors: %d (" % ntensors, virt.stdout)
            self.assertIn('general.architecture string = "%s"' % arch,
                          virt.stdout)


class GGUFFolderInfo(unittest.TestCase):
    """`castfs info DIR.q8_0.gguf` beside a model folder DIR/ (no such
    file): the header `castfs convert DIR --view q8_0` writes, as gguf-py
    reads that file."""

    def test_folder_header_as_converted(self):
        from test_gguf_llm import make_model
        with tl.tempdir() as src:
            d = os.path.join(src, "llama")
            make_model(d, "llama")
            out = os.path.join(src, "out.gguf")
            subprocess.run([tl.castfs_binary(), "convert", d, "--view",
                            "q8_0", "-o", out, "--no-progress"], check=True)
            virt = info(d + ".q8_0.gguf")
            real = info(out)
            self.assertEqual(virt.returncode, 0, virt.stderr)
            self.assertEqual(virt.stdout.splitlines()[1:],
                             real.stdout.splitlines()[1:])
            g = GGUFReader(out)
            self.assertIn("tensors: %d (" % len(g.tensors), virt.stdout)
            self.assertIn("kvs: %d\n" % len([k for k in g.fields
                                              if not k.startswith("GGUF.")]),
                          virt.stdout)
            del g
            os.remove(os.path.join(d, "tokenizer.json"))
            r = info(d + ".q8_0.gguf")
            self.assertEqual(r.returncode, 1)
            self.assertIn("tokenizer.json", r.stderr)


if __name__ == "__main__":
    tl.main()
