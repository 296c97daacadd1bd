# SPDX-License-Identifier: MIT
"""Packed sources under a real mount: X.safetensors.zst (written by
`castfs pack`, and by an independent writer) is shown as X.safetensors, and
every view, the tensor tree and the original bytes equal those of the same
checkpoint left uncompressed (full reads, random ranges, mmap). The values
are checked with the real loaders against torch: safetensors reads the
packed original and its casts, torch .to() is the oracle. Hostile packs are
rejected with a reason or fail only the bad range with EIO.
"""
import errno
import gc
import json
import mmap
import os
import random
import shutil
import struct
import subprocess
import time
import unittest

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import castfs_testlib as tl
from test_pack import independent_pack, seek_table


def castfs(*args):
    return subprocess.run([tl.castfs_binary()] + list(args), capture_output=True, text=True)


def model():
    torch.manual_seed(3)
    return {
        "model.layers.0.self_attn.q_proj.weight": (torch.randn(256, 512) * 0.02).bfloat16(),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(512, 256) * 0.02).to(torch.float16),
        "model.layers.1.mlp.down_proj.weight": torch.randn(256, 512) * 0.02,
        "model.embed_tokens.weight": (torch.randn(100, 256)).bfloat16(),
        "model.norm.weight": torch.ones(256),
        "model.empty": torch.zeros(0, 3),
        "model.ids": torch.arange(17, dtype=torch.int64),
    }


def read(path):
    with open(path, "rb") as f:
        return f.read()


def packed_llama(src, seed, *pack_flags):
    """A tiny sharded bf16 Llama saved by transformers as @src/plain and
    packed in place of each shard as @src/packed (`castfs pack DIR/`)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    plain = os.path.join(src, "plain")
    model.save_pretrained(plain, max_shard_size="200KB")
    shutil.copytree(plain, os.path.join(src, "packed"))
    r = castfs("pack", "--no-progress", "--remove", *pack_flags, "--frame-size", "32K",
               os.path.join(src, "packed") + "/")
    assert r.returncode == 0, r.stderr
    return plain


class PackedMount(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = tl.tempdir()
        cls.src = cls.ctx.__enter__()
        cls.wctx = tl.tempdir()
        cls.work = cls.wctx.__enter__()
        cls.tensors = model()
        s = cls.src
        save_file(cls.tensors, os.path.join(s, "u.safetensors"), metadata={"format": "pt"})
        for name in ("p", "corrupt", "both", "lying", "g"):
            shutil.copy(os.path.join(s, "u.safetensors"), os.path.join(s, name + ".safetensors"))
        for name in ("p", "corrupt", "lying"):
            r = castfs("pack", "--no-progress", "--remove", "--frame-size", "64K",
                       os.path.join(s, name + ".safetensors"))
            assert r.returncode == 0, r.stderr
        r = castfs("pack", "--no-progress", "--remove", "--grouped", "--frame-size", "64K",
                   os.path.join(s, "g.safetensors"))
        assert r.returncode == 0, r.stderr
        shutil.copy(os.path.join(s, "g.safetensors.zstg"),
                    os.path.join(s, "misnamed.safetensors.zst"))
        shutil.copy(os.path.join(s, "u.safetensors"), os.path.join(s, "i.safetensors"))
        independent_pack(os.path.join(s, "i.safetensors"), os.path.join(s, "i.safetensors.zst"))
        os.remove(os.path.join(s, "i.safetensors"))
        shutil.copy(os.path.join(s, "p.safetensors.zst"), os.path.join(s, "both.safetensors.zst"))
        # A pack whose decoded size disagrees with its header: 16 bytes more.
        with open(os.path.join(s, "u.safetensors"), "rb") as f, \
                open(os.path.join(cls.work, "long.safetensors"), "wb") as g:
            g.write(f.read() + bytes(16))
        independent_pack(os.path.join(cls.work, "long.safetensors"),
                         os.path.join(s, "sizelie.safetensors.zst"))
        with open(os.path.join(s, "plainzst.safetensors.zst"), "wb") as f:
            f.write(subprocess.run(["zstd", "-q", "-c", os.path.join(s, "u.safetensors")],
                                   capture_output=True, check=True).stdout)
        cls.corrupt_range = cls.damage(os.path.join(s, "corrupt.safetensors.zst"),
                                       os.path.join(s, "lying.safetensors.zst"))
        cls.shift(os.path.join(s, "p.safetensors.zst"),
                  os.path.join(s, "shifted.safetensors.zst"))
        # Float frames are tier-coded (FORMATS.md); random int16 ones stay
        # zstd frames whose planes are raw blocks, read where they lie.
        graw = dict(cls.tensors, **{"model.codes": torch.randint(
            -32768, 32767, (256, 512), dtype=torch.int16)})
        save_file(graw, os.path.join(s, "graw.safetensors"), metadata={"format": "pt"})
        cls.graw_orig = read(os.path.join(s, "graw.safetensors"))
        r = castfs("pack", "--no-progress", "--remove", "--grouped", "--frame-size", "64K",
                   os.path.join(s, "graw.safetensors"))
        assert r.returncode == 0, r.stderr
        cls.remark(os.path.join(s, "graw.safetensors.zstg"),
                   os.path.join(s, "gmark.safetensors.zstg"))
        cls.graw_range = cls.damage_raw_plane(os.path.join(s, "graw.safetensors.zstg"))
        cls.before = {f: read(os.path.join(s, f)) for f in os.listdir(s)}
        cls.mnt = tl.Mount(s)
        with open(cls.mnt.join(".castfs", "config")) as f:
            cls.views = [v["name"] for v in json.load(f)["views"] if v.get("listed", True)]

    @staticmethod
    def damage(corrupt, lying):
        """Flip a byte of the last data frame of @corrupt (its decoded range
        is returned), and make @lying's first table entry lie."""
        frames, _ = seek_table(corrupt)
        data = bytearray(read(corrupt))
        coff = sum(c for c, _, _ in frames[:-2])
        doff = sum(d for _, d, _ in frames[:-2])
        data[coff + frames[-2][0] // 2] ^= 0xFF
        with open(corrupt, "wb") as f:
            f.write(data)
        data = bytearray(read(lying))
        first = len(data) - 9 - len(frames) * 12
        struct.pack_into("<I", data, first, frames[0][0] + 8)
        with open(lying, "wb") as f:
            f.write(data)
        return doff, doff + frames[-2][1]

    @staticmethod
    def shift(path, out):
        """@path with a seek table whose decoded sizes lie and still add
        up: frame 1 says 8 bytes more, the last frame 8 less. Every frame
        between them decodes to its own size with its own good checksum,
        8 bytes late by the table (stop 40, found by a bug hunt: the
        mount served them shifted, without an error)."""
        frames, _ = seek_table(path)
        assert len(frames) > 4
        data = bytearray(read(path))
        first = len(data) - 9 - len(frames) * 12
        for k, delta in ((1, 8), (len(frames) - 1, -8)):
            struct.pack_into("<I", data, first + 12 * k + 4,
                             frames[k][1] + delta)
        with open(out, "wb") as f:
            f.write(data)

    @staticmethod
    def remark(path, out):
        """@path with one transform byte of its grouping marker changed to
        another that fits the frame (2-byte planes <-> bf16 exponent +
        planes, 4-byte <-> fp32): every frame's own checksum still holds,
        and the frame un-groups wrong unless the marker is checked (stop
        40, found by a bug hunt: silently wrong bytes, unpack exit 0)."""
        data = bytearray(read(path))
        at = data.rindex(b"CASTFSG1") + 8
        swap = {1: 2, 2: 1, 3: 4, 4: 3}
        i = next(i for i in range(at, len(data)) if data[i] in swap)
        data[i] = swap[data[i]]
        with open(out, "wb") as f:
            f.write(data)

    @staticmethod
    def damage_raw_plane(path):
        """Flip a byte inside the first frame of @path whose first plane is
        stored as one raw zstd block (RFC 8878: the frame header, then
        3-byte block headers), which castfs reads in place; its decoded
        range is returned."""
        frames, _ = seek_table(path)
        data = bytearray(read(path))
        coff = doff = 0
        for csize, dsize, _ in frames:
            fhd = data[coff + 4]
            single = (fhd >> 5) & 1
            at = (coff + 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
                  + (single, 2, 4, 8)[fhd >> 6])
            h = int.from_bytes(data[at:at + 3], "little")
            if dsize and (h >> 1) & 3 == 0 and h >> 3 == dsize // 2:
                data[at + 3 + 100] ^= 0x08
                with open(path, "wb") as f:
                    f.write(data)
                return doff, doff + dsize
            coff += csize
            doff += dsize
        raise AssertionError("no raw plane in " + path)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.ctx.__exit__(None, None, None)
        cls.wctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def m(self, *p):
        return self.mnt.join(*p)

    def test_listing(self):
        names = set(os.listdir(self.m()))
        for shown in ("p.safetensors", "i.safetensors", "corrupt.safetensors",
                      "g.safetensors", "misnamed.safetensors.zst",
                      "both.safetensors", "both.safetensors.zst",
                      "plainzst.safetensors.zst", "lying.safetensors.zst",
                      "p.fp8.safetensors", "p.safetensors.tensors"):
            self.assertIn(shown, names)
        for hidden in ("p.safetensors.zst", "i.safetensors.zst", "plainzst.safetensors",
                       "lying.safetensors", "plainzst.fp8.safetensors"):
            self.assertNotIn(hidden, names)
        st = os.stat(self.m("p.safetensors"))
        self.assertEqual(st.st_size, os.path.getsize(os.path.join(self.src, "u.safetensors")))

    def test_original_bytes(self):
        orig = read(os.path.join(self.src, "u.safetensors"))
        for name in ("p", "i", "g"):
            with self.subTest(name=name):
                self.assertEqual(read(self.m(name + ".safetensors")), orig)
                tl.check_ranges(self, self.m(name + ".safetensors"), orig, count=100)
        # A plain file wins over its pack; the pack is then raw bytes.
        self.assertEqual(read(self.m("both.safetensors")), orig)
        self.assertEqual(read(self.m("both.safetensors.zst")),
                         read(os.path.join(self.src, "both.safetensors.zst")))

    def test_every_view_equals_uncompressed(self):
        rng = random.Random(5)
        for v in self.views:
            for name in ("p", "i", "g"):
                with self.subTest(view=v, src=name):
                    ref = read(self.m("u.%s.safetensors" % v))
                    path = self.m("%s.%s.safetensors" % (name, v))
                    self.assertEqual(os.path.getsize(path), len(ref))
                    self.assertEqual(read(path), ref)
                    tl.check_ranges(self, path, ref, rng, count=40)
                    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                                          access=mmap.ACCESS_READ) as mm:
                        for _ in range(20):
                            off = rng.randrange(len(ref))
                            self.assertEqual(mm[off:off + 4096], ref[off:off + 4096])

    def test_concurrent_readers(self):
        """Threads reading overlapping ranges at once (frames shared while
        being decoded) all get the uncompressed file's bytes."""
        import threading
        jobs = [("p", v) for v in ("", "fp8.", "nf4.")] + [("g", "fp8.")]
        refs = {v: read(self.m("u.%ssafetensors" % v)) for _, v in jobs}
        errors = []

        def worker(seed):
            rng = random.Random(seed)
            for _ in range(60):
                name, v = jobs[rng.randrange(len(jobs))]
                ref = refs[v]
                fd = os.open(self.fresh.join("%s.%ssafetensors" % (name, v)),
                             os.O_RDONLY)
                try:
                    off = rng.randrange(len(ref))
                    n = rng.randrange(1, 300000)
                    if os.pread(fd, n, off) != ref[off:off + n]:
                        errors.append((name, v, off, n))
                finally:
                    os.close(fd)

        # A mount of its own: the kernel has none of its pages cached.
        with tl.Mount(self.src) as fresh:
            self.fresh = fresh
            threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with open(fresh.join(".castfs", "stats")) as f:
                zst = json.load(f)["zst"]
        self.assertGreater(zst["frames_decoded"], 0)
        self.assertEqual(errors, [])

    def test_loaders_read_packed_views(self):
        got = load_file(self.m("p.safetensors"))
        self.assertEqual(set(got), set(self.tensors))
        for k, t in self.tensors.items():
            self.assertTrue(torch.equal(got[k], t), k)
        for v, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16),
                      ("fp32", torch.float32), ("fp8", torch.float8_e4m3fn)):
            got = load_file(self.m("p.%s.safetensors" % v))
            for k, t in self.tensors.items():
                if not t.is_floating_point() or got[k].dtype != dt:
                    continue
                with self.subTest(view=v, tensor=k):
                    want = t.to(dt)
                    self.assertTrue(torch.equal(got[k].view(torch.uint8),
                                                want.view(torch.uint8)), k)

    def test_tensor_tree(self):
        base = self.m("p.safetensors.tensors", "model", "layers", "1", "mlp", "down_proj")
        arr = np.load(os.path.join(base, "weight.npy"))
        np.testing.assert_array_equal(arr, self.tensors[
            "model.layers.1.mlp.down_proj.weight"].numpy())
        ref = self.m("u.safetensors.tensors", "model", "layers", "1", "mlp", "down_proj",
                     "weight.raw")
        self.assertEqual(read(os.path.join(base, "weight.raw")), read(ref))

    def test_rejected_packs(self):
        with open(self.m(".castfs", "rejected")) as f:
            rej = {os.path.basename(r["path"]): r for r in json.load(f)}
        self.assertIn("no seek table", rej["plainzst.safetensors.zst"]["reason"])
        self.assertIn("seek table", rej["lying.safetensors.zst"]["reason"])
        self.assertIn("sizelie.safetensors.zst", rej)
        self.assertIn("grouped", rej["misnamed.safetensors.zst"]["reason"])
        self.assertIn("grouping marker: checksum mismatch",
                      rej["gmark.safetensors.zstg"]["reason"])
        self.assertNotIn("gmark.safetensors", os.listdir(self.m()))
        shutil.copy(os.path.join(self.src, "gmark.safetensors.zstg"),
                    self.work)
        r = castfs("unpack", os.path.join(self.work, "gmark.safetensors.zstg"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("checksum mismatch", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work,
                                                     "gmark.safetensors")))
        # A fresh mount knows them before any listing.
        with tl.Mount(self.src) as fresh:
            with open(fresh.join(".castfs", "rejected")) as f:
                again = {os.path.basename(r["path"]) for r in json.load(f)}
        self.assertEqual(again, set(rej))
        self.assertNotIn("sizelie.safetensors", os.listdir(self.m()))
        self.assertNotIn("p.safetensors.zst", rej)

    def test_shifted_table_never_serves_a_byte(self):
        """Past the lying frame, every read fails (EIO), whether it comes
        in order or jumps there first; no read returns a wrong byte."""
        orig = read(os.path.join(self.src, "u.safetensors"))
        frames, _ = seek_table(os.path.join(self.src, "shifted.safetensors.zst"))
        past = frames[0][1] + frames[1][1] + 8  # frame 2, by the table
        for order in ("jump", "in order"):
            with tl.Mount(self.src) as fresh:
                path = fresh.join("shifted.safetensors")
                self.assertEqual(os.path.getsize(path), len(orig))
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                try:
                    offs = [past + 4096, 0] if order == "jump" else \
                        list(range(0, len(orig), 4096))
                    failed = 0
                    for off in offs:
                        try:
                            got = os.pread(fd, 4096, off & ~4095)
                        except OSError as e:
                            self.assertEqual(e.errno, errno.EIO)
                            failed += 1
                            continue
                        self.assertEqual(got, orig[off & ~4095:][:4096],
                                         (order, off))
                    self.assertGreater(failed, 0, order)
                finally:
                    os.close(fd)

    def test_corrupt_frame_fails_its_range_only(self):
        lo, hi = self.corrupt_range
        path = self.m("corrupt.safetensors")
        fd = os.open(path, os.O_RDONLY)
        try:
            with self.assertRaises(OSError) as cm:
                os.pread(fd, 100, lo + 10)
            self.assertEqual(cm.exception.errno, errno.EIO)
            orig = read(os.path.join(self.src, "u.safetensors"))
            self.assertEqual(os.pread(fd, 4096, 0), orig[:4096])
        finally:
            os.close(fd)
        with open(self.m(".castfs", "stats")) as f:
            zst = json.load(f)["zst"]
        self.assertGreater(zst["frame_errors"], 0)
        self.assertGreater(zst["frames_decoded"], 0)
        self.assertLessEqual(zst["cached_bytes"], 16 << 20)
        # the daemon still serves its neighbours
        self.assertEqual(read(self.m("p.safetensors")), orig)

    def test_corrupt_raw_plane_fails_its_range_only(self):
        """A grouped pack's raw plane is read where it lies in the frame,
        and still checked: a byte changed there fails that frame's range
        with EIO (the fp8 view of its tensor too), the rest reads."""
        lo, hi = self.graw_range
        orig = self.graw_orig
        fd = os.open(self.m("graw.safetensors"), os.O_RDONLY)
        try:
            with self.assertRaises(OSError) as cm:
                os.pread(fd, 100, lo + 10)
            self.assertEqual(cm.exception.errno, errno.EIO)
            # whole pages only: a page holding a byte of the frame fails
            before, after = lo & ~4095, (hi + 4095) & ~4095
            self.assertEqual(os.pread(fd, before, 0), orig[:before])
            self.assertEqual(os.pread(fd, 4096, after), orig[after:after + 4096])
        finally:
            os.close(fd)
        with self.assertRaises(OSError) as cm:
            read(self.m("graw.fp8.safetensors"))
        self.assertEqual(cm.exception.errno, errno.EIO)

    def test_zz_source_untouched(self):
        after = {f: read(os.path.join(self.src, f)) for f in os.listdir(self.src)}
        self.assertEqual(after, self.before)



class PackedLlamaCase(unittest.TestCase):
    """A mount of packed_llama(SEED, *PACK_FLAGS) beside its plain
    copy; cls.plain is the plain folder."""
    SEED, PACK_FLAGS = 0, ()

    @classmethod
    def setUpClass(cls):
        cls.ctx = tl.tempdir()
        cls.src = cls.ctx.__enter__()
        cls.plain = packed_llama(cls.src, cls.SEED, *cls.PACK_FLAGS)
        cls.mnt = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.ctx.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc


class PackedModelDir(PackedLlamaCase):
    """A sharded transformers model whose shards are all packed gets
    DIR.<view>/ whose files equal those of the same model uncompressed,
    and from_pretrained of DIR.nf4 loads the same weights."""

    def test_shards_are_packed(self):
        names = os.listdir(os.path.join(self.src, "packed"))
        self.assertTrue(any(n.endswith(".safetensors.zst") for n in names))
        self.assertFalse(any(n.endswith(".safetensors") for n in names))

    def test_view_dirs_equal_uncompressed(self):
        for v in ("", ".fp8", ".nf4", ".int8", ".bf16"):
            with self.subTest(view=v):
                plain = self.mnt.join("plain" + v)
                packed = self.mnt.join("packed" + v)
                self.assertEqual(sorted(os.listdir(packed)), sorted(os.listdir(plain)))
                for n in os.listdir(plain):
                    if os.path.isdir(os.path.join(plain, n)):
                        continue
                    self.assertEqual(read(os.path.join(packed, n)),
                                     read(os.path.join(plain, n)), n)

    def test_from_pretrained_nf4(self):
        from transformers import AutoModelForCausalLM

        def weights(path):
            m = AutoModelForCausalLM.from_pretrained(path)
            sd = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
            del m
            gc.collect()  # the loader's mmaps keep the mount busy
            return sd

        got, want = weights(self.mnt.join("packed.nf4")), weights(self.mnt.join("plain.nf4"))
        self.assertEqual(set(got), set(want))
        for k in want:
            self.assertEqual(got[k].dtype, want[k].dtype, k)
            self.assertTrue(torch.equal(got[k], want[k]), k)



class PackedChange(unittest.TestCase):
    """A pack replaced while mounted (castfs pack --force renames a new one
    in place) is a new identity: the shown file and its views follow it."""

    def test_repack_is_seen(self):
        old = {"w": torch.full((64, 64), 1.5, dtype=torch.bfloat16)}
        new = {"w": torch.full((64, 64), -2.5, dtype=torch.bfloat16)}
        with tl.tempdir() as src, tl.tempdir() as work:
            packs = []
            for i, tensors in enumerate((old, new)):
                path = os.path.join(work, "%d.safetensors" % i)
                save_file(tensors, path)
                r = castfs("pack", "--no-progress", path)
                self.assertEqual(r.returncode, 0, r.stderr)
                packs.append(path + ".zst")
            # Only the pack ever appears in the source directory.
            zst = os.path.join(src, "m.safetensors.zst")
            shutil.copy(packs[0], zst)
            mnt = tl.Mount(src)
            try:
                got = load_file(mnt.join("m.fp32.safetensors"))["w"].clone()
                self.assertTrue(torch.equal(got, old["w"].float()))
                shutil.copy(packs[1], zst + ".tmp")
                os.rename(zst + ".tmp", zst)
                deadline = time.time() + 10
                while True:
                    try:
                        got = load_file(mnt.join("m.fp32.safetensors"))["w"].clone()
                    except OSError:
                        got = None
                    if (got is not None and torch.equal(got, new["w"].float())) \
                            or time.time() > deadline:
                        break
                    time.sleep(0.1)
                self.assertIsNotNone(got)
                self.assertTrue(torch.equal(got, new["w"].float()))
                self.assertEqual(read(mnt.join("m.safetensors")), read(packs[1][:-4]))
            finally:
                got = None
                gc.collect()  # load_file's tensors map the mounted file
                self.assertEqual(mnt.unmount(), 0)


if __name__ == "__main__":
    tl.main()
