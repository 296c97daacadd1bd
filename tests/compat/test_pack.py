# SPDX-License-Identifier: MIT
"""castfs pack / unpack without a mount. Oracles outside castfs: the stock
zstd CLI decodes every pack to the original (and tests it), the seek table
is parsed here from the seekable format's spec, tensor boundaries come from
the header as Python's json reads it, and a pack written here by an
independent writer (one `zstd` run per frame plus a table built from the
spec) must unpack to the original.
"""
import glob
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import time
import unittest

import numpy as np
import torch
from safetensors.torch import save_file

import castfs_testlib as tl

SKIPPABLE = 0x184D2A5E
SEEKABLE = 0x8F92EAB1


def castfs(*args):
    return subprocess.run([tl.castfs_binary()] + list(args), capture_output=True, text=True)


def seek_table(path):
    """[(csize, dsize, checksum or None)] and the checksum flag, per the spec."""
    with open(path, "rb") as f:
        data = f.read()
    nframes, desc, magic = struct.unpack("<IBI", data[-9:])
    assert magic == SEEKABLE
    esize = 12 if desc & 0x80 else 8
    tlen = nframes * esize + 9
    start = len(data) - tlen - 8
    assert struct.unpack("<II", data[start:start + 8]) == (SKIPPABLE, tlen)
    out = []
    for i in range(nframes):
        e = data[start + 8 + i * esize:start + 8 + (i + 1) * esize]
        out.append(struct.unpack("<III", e) if esize == 12 else struct.unpack("<II", e) + (None,))
    assert sum(c for c, _, _ in out) == start
    return out, bool(desc & 0x80)


def boundaries(path):
    """The header's end and every tensor's begin and end (absolute)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    cuts = {8 + n}
    for k, v in hdr.items():
        if k != "__metadata__":
            cuts.update(8 + n + o for o in v["data_offsets"])
    return cuts


def make_model(path, seed=0):
    torch.manual_seed(seed)
    save_file({
        "model.layers.0.mlp.up_proj.weight": (torch.randn(384, 1000) * 0.02).bfloat16(),
        "model.layers.0.mlp.down_proj.weight": (torch.randn(1000, 384) * 0.02).to(torch.float16),
        "model.norm.weight": torch.randn(384),
        "model.empty": torch.zeros(0, 4),
        "model.odd": torch.randn(13, 7),
    }, path, metadata={"format": "pt"})


def independent_pack(src, dst, frame=65536):
    """A seekable file written without castfs: zstd CLI per frame."""
    with open(src, "rb") as f:
        data = f.read()
    entries, body = [], b""
    for off in range(0, len(data), frame):
        chunk = data[off:off + frame]
        z = subprocess.run(["zstd", "-q", "-c", "-1"], input=chunk, capture_output=True,
                           check=True).stdout
        entries.append(struct.pack("<II", len(z), len(chunk)))
        body += z
    table = b"".join(entries) + struct.pack("<IBI", len(entries), 0, SEEKABLE)
    with open(dst, "wb") as f:
        f.write(body + struct.pack("<II", SKIPPABLE, len(table)) + table)


class Pack(unittest.TestCase):
    def setUp(self):
        self.ctx = tl.tempdir()
        self.dir = self.ctx.__enter__()
        self.src = os.path.join(self.dir, "m.safetensors")
        make_model(self.src)
        with open(self.src, "rb") as f:
            self.orig = f.read()

    def tearDown(self):
        self.ctx.__exit__(None, None, None)

    def pack(self, *args):
        r = castfs("pack", "--no-progress", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return self.src + ".zst"

    def test_zstd_cli_decodes_pack(self):
        for sums in ([], ["--no-checksums"]):
            with self.subTest(sums=sums):
                z = self.pack("--force", *sums, self.src)
                out = subprocess.run(["zstd", "-d", "-c", z], capture_output=True, check=True)
                self.assertEqual(out.stdout, self.orig)
                subprocess.run(["zstd", "-t", "-q", z], check=True)
                self.assertEqual(seek_table(z)[1], not sums)

    def test_frames_never_straddle_tensors(self):
        for fs in ("4096", "64K", "1M", "100"):
            with self.subTest(frame_size=fs):
                z = self.pack("--force", "--frame-size", fs, self.src)
                frames, _ = seek_table(z)
                limit = int(fs[:-1]) * 1024 if fs.endswith(("K", "M")) else int(fs)
                limit = limit * 1024 if fs.endswith("M") else limit
                ends, at = set(), 0
                for _, d, _ in frames:
                    self.assertLessEqual(d, limit)
                    self.assertGreater(d, 0)
                    at += d
                    ends.add(at)
                self.assertEqual(at, len(self.orig))
                cuts = boundaries(self.src)
                self.assertTrue(cuts <= ends | {0}, sorted(cuts - ends))
                hdr_end = min(cuts)
                if limit >= hdr_end:
                    self.assertEqual(frames[0][1], hdr_end)  # the header alone

    def test_threads_write_the_same_pack(self):
        # small frames, so that every thread codes many
        for kind in ([], ["--grouped"]):
            packs = []
            for n in ("1", "3", "16"):
                r = castfs("pack", "--no-progress", "--force", "--frame-size", "4K",
                           "--threads", n, *kind, self.src)
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(self.src + (".zstg" if kind else ".zst"), "rb") as f:
                    packs.append(f.read())
            with self.subTest(kind=kind):
                self.assertGreater(len(seek_table(self.src + (".zstg" if kind else ".zst"))[0]), 100)
                self.assertEqual(packs[1], packs[0])
                self.assertEqual(packs[2], packs[0])
        for bad in ("0", "17", "x", ""):
            r = castfs("pack", "--no-progress", "--force", "--threads", bad, self.src)
            self.assertEqual(r.returncode, 2, bad)

    def test_unpack_restores_original(self):
        z = self.pack(self.src)
        os.rename(self.src, self.src + ".orig")
        r = castfs("unpack", "--no-progress", z)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.src, "rb") as f:
            self.assertEqual(f.read(), self.orig)

    def test_unpack_threads(self):
        """--threads N decodes the frames of a pack on N threads: the same
        original whatever N, and of a pack with two corrupted frames, the
        first in the file named, and no output."""
        big = os.path.join(self.dir, "big.safetensors")
        torch.manual_seed(3)
        save_file({"w.%d" % i: (torch.randn(1024, 1024) * 0.02).bfloat16()
                   for i in range(6)}, big)
        with open(big, "rb") as f:
            orig = f.read()
        for kind, ext in (([], ".zst"), (["--grouped"], ".zstg")):
            r = castfs("pack", "--no-progress", "--remove", "--frame-size", "256K",
                       *kind, big)
            self.assertEqual(r.returncode, 0, r.stderr)
            z = big + ext
            for n in ("1", "3", "16"):
                with self.subTest(kind=kind, threads=n):
                    r = castfs("unpack", "--no-progress", "--threads", n, z)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    with open(big, "rb") as f:
                        self.assertTrue(f.read() == orig)
                    os.remove(big)
            for bad in ("0", "17", "x"):
                r = castfs("unpack", "--no-progress", "--threads", bad, z)
                self.assertEqual(r.returncode, 2, bad)
            # the pack's own options are refused, not ignored
            for opt in (["--grouped"], ["--level", "3"], ["--frame-size", "64K"],
                        ["--no-checksums"], ["--no-verify"]):
                r = castfs("unpack", "--no-progress", *opt, z)
                self.assertEqual(r.returncode, 2, opt)
                self.assertIn("unrecognized option '%s" % opt[0], r.stderr)
                self.assertIn("usage: castfs unpack", r.stderr)
                self.assertFalse(os.path.exists(big))
            with open(z, "rb") as f:
                good = f.read()
            frames, _ = seek_table(z)
            starts = [0]
            for c, _, _ in frames:
                starts.append(starts[-1] + c)
            # frames 9 and 41 lie in different 4 MiB steps (16 frames each)
            corrupt = bytearray(good)
            for k in (41, 9):
                corrupt[starts[k] + frames[k][0] // 2] ^= 0x55
            with open(z, "wb") as f:
                f.write(corrupt)
            dstart = sum(d for _, d, _ in frames[:9])
            for n in ("1", "16"):
                with self.subTest(kind=kind, threads=n, corrupt=True):
                    r = castfs("unpack", "--no-progress", "--threads", n, z)
                    self.assertEqual(r.returncode, 1)
                    self.assertIn("frame 9 (decoded bytes %d to %d) does not decode "
                                  "or its checksum mismatches"
                                  % (dstart, dstart + frames[9][1]), r.stderr)
                    self.assertFalse(os.path.exists(big))
            with open(z, "wb") as f:
                f.write(good)
            r = castfs("unpack", "--no-progress", "--remove", z)
            self.assertEqual(r.returncode, 0, r.stderr)

    def test_unpack_reads_independent_pack(self):
        z = self.src + ".zst"
        independent_pack(self.src, z)
        os.remove(self.src)
        r = castfs("unpack", "--no-progress", z)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.src, "rb") as f:
            self.assertEqual(f.read(), self.orig)

    def test_original_stays_unless_remove(self):
        self.pack(self.src)
        self.assertTrue(os.path.exists(self.src))
        r = castfs("pack", "--no-progress", self.src)
        self.assertEqual(r.returncode, 1)
        self.assertIn("exists", r.stderr)
        self.pack("--force", "--remove", self.src)
        self.assertFalse(os.path.exists(self.src))

    def test_pack_keeps_mode(self):
        os.chmod(self.src, 0o640)
        z = self.pack(self.src)
        self.assertEqual(os.stat(z).st_mode & 0o777, 0o640)

    def test_bad_option_values_refused(self):
        """A value castfs cannot honour is a usage error naming the option,
        never silently replaced (atoi read "abc" as zstd's default level,
        and zstd clamps 100 to 22)."""
        for opt, bad in (("--level", "abc"), ("--level", "100"), ("--level", "3x"),
                         ("--level", "-200000"), ("--frame-size", "0"),
                         ("--frame-size", "1Q"), ("--frame-size", "17592186044417M"),
                         ("--frame-size", "-1"), ("--threads", "0")):
            r = castfs("pack", "--no-progress", opt, bad, self.src)
            self.assertEqual(r.returncode, 2, (opt, bad, r.stderr))
            self.assertIn("%s: invalid value '%s'" % (opt, bad), r.stderr)
            self.assertFalse(os.path.exists(self.src + ".zst"))
        # zstd's negative (fast) levels and its highest one are levels
        for level in ("-5", "22"):
            z = self.pack("--force", "--level", level, self.src)
            out = subprocess.run(["zstd", "-d", "-c", z], capture_output=True, check=True)
            self.assertEqual(out.stdout, self.orig)

    def test_long_names(self):
        """Outputs whose names are legal but long (251 bytes of 255) are
        written: the temporary name beside them is shortened to fit (it
        was the name plus 15 bytes, ENAMETOOLONG)."""
        stem = os.path.join(self.dir, "c" * 235)
        shutil.copy(self.src, stem + ".safetensors")
        r = castfs("pack", "--no-progress", "--remove", stem + ".safetensors")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = castfs("unpack", "--no-progress", stem + ".safetensors.zst")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(stem + ".safetensors", "rb") as f:
            self.assertTrue(f.read() == self.orig)
        out = stem + "xxxxx.safetensors"
        r = castfs("convert", "--no-progress", stem + ".safetensors", "--view", "fp8", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(os.path.basename(out)), 252)
        self.assertEqual([n for n in os.listdir(self.dir) if ".castfs-" in n], [])

    def test_output_failures_name_the_output(self):
        """A write that fails (here EFBIG under RLIMIT_FSIZE, as ENOSPC
        would) is reported with its reason against the output, the
        temporary file removed; so is an output that cannot take its name.
        The reason was "writing the pack", without why, against the input."""
        def small_files():
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        z = self.src + ".zst"
        for cmd, path, out in (("pack", self.src, z), ("unpack", z, self.src)):
            if cmd == "unpack":
                self.pack(self.src)
                os.rename(self.src, self.src + ".keep")
            r = subprocess.run([tl.castfs_binary(), cmd, "--no-progress", path],
                               capture_output=True, text=True, preexec_fn=small_files)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("%s: writing the %s: File too large" % (
                out, "pack" if cmd == "pack" else "output"), r.stderr)
            self.assertEqual([n for n in os.listdir(self.dir) if ".castfs-" in n], [])
            self.assertFalse(os.path.exists(out))
        os.mkdir(self.src)
        r = castfs("unpack", "--no-progress", "--force", z)
        self.assertEqual(r.returncode, 1)
        self.assertIn("%s: Is a directory" % self.src, r.stderr)
        self.assertEqual([n for n in os.listdir(self.dir) if ".castfs-" in n], [])

    def test_not_safetensors_refused(self):
        bad = os.path.join(self.dir, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x10\0\0\0\0\0\0\0{not json}      ")
        r = castfs("pack", "--no-progress", bad)
        self.assertEqual(r.returncode, 1)
        self.assertFalse(os.path.exists(bad + ".zst"))

    def hostile_unpack(self, data, why):
        z = os.path.join(self.dir, "h.safetensors.zst")
        with open(z, "wb") as f:
            f.write(data)
        r = castfs("unpack", "--no-progress", z)
        self.assertEqual(r.returncode, 1)
        self.assertIn(why, r.stderr)
        self.assertFalse(os.path.exists(z[:-4]))
        self.assertEqual(glob.glob(os.path.join(self.dir, ".*castfs-*")), [])

    def test_hostile_packs_fail_cleanly(self):
        z = self.pack(self.src)
        with open(z, "rb") as f:
            good = f.read()
        plain = subprocess.run(["zstd", "-q", "-c", self.src], capture_output=True,
                               check=True).stdout
        frames, _ = seek_table(z)
        nf = len(frames)
        first = len(good) - 9 - nf * 12
        sum_flip = bytearray(good)
        sum_flip[first + 8] ^= 1
        lie = bytearray(good)
        struct.pack_into("<I", lie, first, frames[0][0] + 1)
        corrupt = bytearray(good)
        corrupt[frames[0][0] + frames[1][0] // 2] ^= 0x55
        for data, why in ((plain, "no seek table"), (good[:-1], "no seek table"),
                          (good[: len(good) // 2], "no seek table"),
                          (bytes(lie), "seek table"),
                          (bytes(sum_flip), "frame 0 (decoded bytes 0 to %d) does not "
                           "decode or its checksum mismatches" % frames[0][1]),
                          (bytes(corrupt), "frame 1 (decoded bytes %d to %d) does not "
                           "decode" % (frames[0][1], frames[0][1] + frames[1][1]))):
            with self.subTest(why=why, n=len(data)):
                self.hostile_unpack(data, why)

    def test_grouped_round_trip(self):
        r = castfs("pack", "--no-progress", "--grouped", "--frame-size", "64K", self.src)
        self.assertEqual(r.returncode, 0, r.stderr)
        g = self.src + ".zstg"
        frames, _ = seek_table(g)
        ends, at = set(), 0
        for _, d, _ in frames:
            at += d
            ends.add(at)
        self.assertTrue(boundaries(self.src) <= ends | {0})
        # bf16 and fp16 weights are tier-coded (FORMATS.md: transforms 5
        # and 7): skippable frames, which zstd -d leaves out; it yields the
        # other frames' grouped bytes
        with open(g, "rb") as f:
            data = f.read()
        marker = data[sum(c for c, _, _ in frames[:-1]):]
        self.assertEqual(marker[8:16], b"CASTFSG1")
        xform = marker[16:16 + len(frames)]
        self.assertIn(5, xform)
        self.assertIn(7, xform)
        kept = sum(d for (_, d, _), t in zip(frames, xform) if t not in (5, 6, 7))
        out = subprocess.run(["zstd", "-d", "-c", g], capture_output=True, check=True).stdout
        self.assertEqual(len(out), kept)
        self.assertNotEqual(out, self.orig[:kept])
        os.rename(self.src, self.src + ".orig")
        r = castfs("unpack", "--no-progress", g)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.src, "rb") as f:
            self.assertEqual(f.read(), self.orig)
        # a grouped pack under the standard name is refused
        os.remove(self.src)
        os.rename(g, self.src + ".zst")
        r = castfs("unpack", "--no-progress", self.src + ".zst")
        self.assertEqual(r.returncode, 1)
        self.assertIn("grouped", r.stderr)
        self.assertFalse(os.path.exists(self.src))

    def test_info_and_convert_read_packs(self):
        for flags, ext in (([], ".zst"), (["--grouped"], ".zstg")):
            with self.subTest(ext=ext):
                self.pack("--force", *flags, self.src)
                z = self.src + ext
                a, b = castfs("info", self.src), castfs("info", z)
                self.assertEqual(b.returncode, 0, b.stderr)
                self.assertEqual(a.stdout.replace(self.src, "F"),
                                 b.stdout.replace(z, "F"))
                outs = []
                for src in (self.src, z):
                    out = os.path.join(self.dir, "out%d.safetensors" % len(outs))
                    r = castfs("convert", src, "--view", "fp8", "-o", out, "--no-progress")
                    self.assertEqual(r.returncode, 0, r.stderr)
                    with open(out, "rb") as f:
                        outs.append(f.read())
                self.assertEqual(outs[0], outs[1])
        r = castfs("pack", "--no-progress", self.src + ".zst")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not named", r.stderr)

    def test_convert_names_a_view_of_a_pack(self):
        """Only the pack exists: `convert X.fp8.safetensors` and `convert
        X.safetensors --view fp8` read it as the mount would. Oracle:
        torch's cast of the original tensors."""
        from safetensors.torch import load_file
        want = {k: v.to(torch.float8_e4m3fn) if v.is_floating_point() else v
                for k, v in load_file(self.src).items()}
        for flags, ext in (([], ".zst"), (["--grouped"], ".zstg")):
            with self.subTest(ext=ext):
                self.pack("--force", "--remove", *flags, self.src)
                self.assertFalse(os.path.exists(self.src))
                outs = []
                for args in ([self.src[:-len(".safetensors")] + ".fp8.safetensors"],
                             [self.src, "--view", "fp8"]):
                    out = os.path.join(self.dir, "out%d.safetensors" % len(outs))
                    r = castfs("convert", *args, "-o", out, "--no-progress")
                    self.assertEqual(r.returncode, 0, r.stderr)
                    got = load_file(out)
                    self.assertEqual(sorted(got), sorted(want))
                    for k, v in want.items():
                        self.assertEqual(got[k].dtype, v.dtype, k)
                        self.assertTrue(torch.equal(got[k].view(torch.uint8),
                                                    v.view(torch.uint8)), k)
                    with open(out, "rb") as f:
                        outs.append(f.read())
                self.assertEqual(outs[0], outs[1])
                # info reads it too; pack does not pack the pack again
                self.assertEqual(castfs("info", self.src).returncode, 0)
                r = castfs("pack", "--no-progress", "--grouped", "--force", self.src)
                self.assertEqual(r.returncode, 1)
                self.assertIn("No such file", r.stderr)
                r = castfs("unpack", "--no-progress", self.src + ext)
                self.assertEqual(r.returncode, 0, r.stderr)
                os.remove(self.src + ext)
                with open(self.src, "rb") as f:
                    self.assertEqual(f.read(), self.orig)

    def test_pack_directory(self):
        d = os.path.join(self.dir, "model")
        os.mkdir(d)
        make_model(os.path.join(d, "model-00001-of-00002.safetensors"), 1)
        make_model(os.path.join(d, "model-00002-of-00002.safetensors"), 2)
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write("{}")
        self.pack("--remove", d + "/")
        self.assertEqual(sorted(os.listdir(d)), [
            "config.json", "model-00001-of-00002.safetensors.zst",
            "model-00002-of-00002.safetensors.zst"])


class Interrupt(unittest.TestCase):
    """Ctrl-C (or SIGTERM) during pack, unpack or convert: the temporary
    output is removed, nothing takes the output's name, later files are
    not started, and the process ends by the signal, as a shell loop
    running it expects. A 128 MiB checkpoint (normal bf16: coding it
    takes a while) is stopped right after its temporary file appears:
    SIGSTOP, then the signal, then SIGCONT, so it cannot finish between
    the two."""

    @classmethod
    def setUpClass(cls):
        cls.ctx = tl.tempdir()
        cls.dir = cls.ctx.__enter__()
        torch.manual_seed(5)
        cls.big = os.path.join(cls.dir, "big.safetensors")
        save_file({"w": (torch.randn(64 << 20) * 0.02).bfloat16()}, cls.big)

    @classmethod
    def tearDownClass(cls):
        cls.ctx.__exit__(None, None, None)

    def temps(self, d):
        return [n for n in os.listdir(d) if ".castfs-" in n]

    def interrupt(self, args, d, out, sig=signal.SIGINT):
        """Run castfs ARGS and send SIG once its temporary file is in D,
        before OUT exists; tried again where the run was too quick."""
        for _ in range(5):
            p = subprocess.Popen([tl.castfs_binary()] + args, stderr=subprocess.PIPE,
                                 text=True)
            while p.poll() is None and not self.temps(d):
                time.sleep(0.0005)
            if p.poll() is None:
                p.send_signal(signal.SIGSTOP)
                if not os.path.exists(out):
                    p.send_signal(sig)
                    p.send_signal(signal.SIGCONT)
                    err = p.communicate(timeout=120)[1]
                    return p.returncode, err
                p.send_signal(signal.SIGCONT)
            p.communicate(timeout=120)
            for f in [out] + [os.path.join(d, n) for n in self.temps(d)]:
                if os.path.exists(f):
                    os.unlink(f)
        self.fail("castfs %s finished before it could be stopped, five times" % args[0])

    def assert_stopped(self, rc, err, sig, d, out):
        self.assertEqual(rc, -sig, err)
        self.assertIn("interrupted", err)
        self.assertEqual(self.temps(d), [], "temporary output left behind")
        self.assertFalse(os.path.exists(out))

    def test_pack(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(sig=sig):
                out = self.big + ".zstg"
                rc, err = self.interrupt(["pack", "--no-progress", "--grouped", "--threads",
                                          "1", self.big], self.dir, out, sig)
                self.assert_stopped(rc, err, sig, self.dir, out)
                self.assertTrue(os.path.exists(self.big))

    def test_pack_directory_stops(self):
        """The first of two checkpoints interrupted: neither is packed."""
        d = os.path.join(self.dir, "two")
        os.mkdir(d)
        try:
            for n in ("a", "b"):
                os.link(self.big, os.path.join(d, n + ".safetensors"))
            out = os.path.join(d, "a.safetensors.zst")
            rc, err = self.interrupt(["pack", "--no-progress", "--threads", "1", d], d, out)
            self.assert_stopped(rc, err, signal.SIGINT, d, out)
            self.assertEqual(sorted(os.listdir(d)), ["a.safetensors", "b.safetensors"])
        finally:
            shutil.rmtree(d)

    def test_unpack(self):
        d = os.path.join(self.dir, "u")
        os.mkdir(d)
        try:
            r = castfs("pack", "--no-progress", "--grouped", self.big)
            self.assertEqual(r.returncode, 0, r.stderr)
            z = os.path.join(d, "big.safetensors.zstg")
            os.rename(self.big + ".zstg", z)
            out = z[:-len(".zstg")]
            rc, err = self.interrupt(["unpack", "--no-progress", "--threads", "1", z], d, out)
            self.assert_stopped(rc, err, signal.SIGINT, d, out)
            self.assertEqual(os.listdir(d), ["big.safetensors.zstg"])
        finally:
            shutil.rmtree(d)

    def test_convert(self):
        out = os.path.join(self.dir, "big.nf4.safetensors")
        rc, err = self.interrupt(["convert", "--no-progress", self.big, "--view", "nf4", "-o",
                                  out], self.dir, out)
        self.assert_stopped(rc, err, signal.SIGINT, self.dir, out)


if __name__ == "__main__":
    tl.main()
