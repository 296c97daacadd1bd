# SPDX-License-Identifier: MIT
"""Stoppable work: SIGTERM stops the daemon within a second or two even
while a read is inside a pass over a whole tensor (docs/RELIABILITY.md,
"Scale and resource bounds"). The nf4 view's double-quantisation
statistics of a 1 TiB BF16 weight take one pass over all of it (minutes
here), and so do the nvfp4 view's global scale and the fp8_scaled view's
per-tensor scale; the weight is a sparse file (truncate), so the pass is
real work and costs no disk. Before, the daemon kept computing and did not
exit (20 s and more); other requests are answered meanwhile.

The nf4 view lays the bytes that need those statistics out last
(docs/FORMATS.md), so its header and its codes are read at once: before,
any read of its first page waited for the whole pass. The nvfp4 and
fp8_scaled views lay their tensor-wide scales out last too: their codes
need the scale, but a header read no longer does; so does fp8_dynamic
its channel scales.

A reader killed while it waits on such a pass stops it too, though the
kernel sends no FUSE_INTERRUPT for its request: read-ahead and
asynchronous O_DIRECT reads are background requests, and the daemon
looks whether the task that made one has ended or has SIGKILL pending.
Before, the pass ran on (minutes) after its only reader was gone, and a
killed O_DIRECT reader could not exit until it ended."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import unittest

import castfs_testlib as tl

STOP_BOUND_S = 2.0
SHAPE = [1 << 20, 1 << 19]  # BF16: 1 TiB
TALL = [1 << 28, 1 << 12]  # BF16: 1 TiB


WEIGHT = "model.layers.0.mlp.down_proj.weight"
EMBED = "model.embed_tokens.weight"
EMBED_SHAPE = [1024, 4096]  # BF16: 8 MiB, more than any read-ahead


def write_sparse(path, embed=False, shape=SHAPE):
    """A valid safetensors file: a header naming one 1 TiB BF16 weight
    of @shape (and, with @embed, an 8 MiB embedding before it, which no
    view quantises), then a hole (zeros) of that size."""
    n = shape[0] * shape[1] * 2
    e = EMBED_SHAPE[0] * EMBED_SHAPE[1] * 2 if embed else 0
    head = {WEIGHT: {"dtype": "BF16", "shape": shape,
                     "data_offsets": [e, e + n]}}
    if embed:
        head[EMBED] = {"dtype": "BF16", "shape": EMBED_SHAPE,
                       "data_offsets": [0, e]}
    hdr = json.dumps(head).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
        f.truncate(8 + len(hdr) + e + n)


def write_sources(src):
    write_sparse(os.path.join(src, "big.safetensors"))
    write_sparse(os.path.join(src, "wide.safetensors"), embed=True)
    # Rows narrow enough for fp8_dynamic's channel scales (a row must fit
    # a tile): 2^28 of them.
    write_sparse(os.path.join(src, "tall.safetensors"), shape=TALL)


def cpu_s(pid):
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_in_next_second(pid, settle):
    """CPU seconds @pid spends in the second after @settle seconds."""
    time.sleep(settle)
    start = cpu_s(pid)
    time.sleep(1.0)
    return cpu_s(pid) - start


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


Env = tl.ModuleSource()


def setUpModule():
    Env.start(write_sources)


def tearDownModule():
    Env.stop()


class TestStop(unittest.TestCase):
    def wait_for_pass(self, daemon, reader):
        """Until the daemon has spent half a CPU second on @reader's read:
        the pass is running, and the reader still waits for it."""
        before = cpu_s(daemon)
        deadline = time.time() + 30
        while cpu_s(daemon) < before + 0.5 and time.time() < deadline:
            time.sleep(0.1)
        self.assertIsNone(reader.poll(), "the pass ended already")

    def stop_during_pass(self, options, view_name="nf4"):
        m = tl.Mount(Env.src, options=options)
        reader = None
        try:
            daemon = m.daemon()
            view = m.join("big.%s.safetensors" % view_name)
            # The nf4 view's last bytes need the statistics; every
            # code of the others needs their scale.
            reader = subprocess.Popen(
                [sys.executable, "-c",
                 "import os; fd = os.open(%r, os.O_RDONLY); "
                 "n = os.fstat(fd).st_size; "
                 "os.pread(fd, 8, n - 8 if %r == 'nf4' else n // 2)"
                 % (view, view_name)],
                stderr=subprocess.DEVNULL)
            self.wait_for_pass(daemon, reader)
            # Neighbours keep working while it runs.
            t = time.time()
            os.stat(m.join("big.safetensors"))
            self.assertLess(time.time() - t, STOP_BOUND_S)
            t = time.time()
            m.proc.send_signal(signal.SIGTERM)
            try:
                m.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.fail("the daemon did not stop within 20 s")
            while alive(daemon) and time.time() - t < 20:
                time.sleep(0.02)
            took = time.time() - t
            sys.stderr.write("%s %s: stopped %.2f s after SIGTERM\n"
                             % (view_name, options, took))
            self.assertFalse(alive(daemon))
            self.assertLess(took, STOP_BOUND_S)
        finally:
            if m.proc and m.proc.poll() is None:
                m.proc.kill()
            subprocess.run(["fusermount3", "-u", "-z", m.path],
                           stderr=subprocess.DEVNULL, check=False)
            if reader:
                reader.kill()
                reader.wait()
            m.proc = None
            if m.tmp:
                shutil.rmtree(m.tmp, ignore_errors=True)

    def kill_reader_during_pass(self, direct):
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            daemon = m.proc.pid
            view = m.join("big.nf4.safetensors")
            # The last pages of the nf4 view need the statistics. A
            # buffered read's page comes by read-ahead, an O_DIRECT one
            # by an asynchronous request: both background requests.
            code = ("import mmap, os; "
                    "fd = os.open(%r, os.O_RDONLY | %s); "
                    "b = mmap.mmap(-1, 4096); "
                    "os.preadv(fd, [b], (os.fstat(fd).st_size - 8192) "
                    "& ~4095)" % (view, "os.O_DIRECT" if direct else "0"))
            reader = subprocess.Popen([sys.executable, "-c", code],
                                      stderr=subprocess.DEVNULL)
            try:
                self.wait_for_pass(daemon, reader)
                # A killed O_DIRECT reader cannot exit before its
                # request's reply: before, it waited for the whole pass.
                reader.kill()
                t = time.time()
                try:
                    reader.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    m.proc.kill()  # else it waits minutes, and so do we
                    self.fail("the killed reader waited on the pass")
                sys.stderr.write("reader gone %.2f s after SIGKILL\n"
                                 % (time.time() - t))
            finally:
                reader.kill()
                reader.wait()
            # Given a second to notice, the daemon then spends (nearly)
            # nothing: the pass alone is a core's worth.
            spent = cpu_in_next_second(daemon, 1.0)
            sys.stderr.write("%s reader killed: daemon CPU %.2f s in the "
                             "second after\n"
                             % ("O_DIRECT" if direct else "buffered", spent))
            self.assertLess(spent, 0.25)
            # The daemon and its neighbours keep working.
            with open(m.join(".castfs/stats")) as f:
                self.assertIn("memory", json.load(f))
            os.stat(m.join("big.safetensors"))

    def test_header_and_codes_do_not_wait(self):
        """The nf4 view's header and codes need no statistics: reading
        them starts no pass, and the statistics' bytes come last."""
        code = ("import json, os, struct, sys; "
                "fd = os.open(sys.argv[1], os.O_RDONLY); "
                "size = os.fstat(fd).st_size; "
                "n = struct.unpack('<Q', os.pread(fd, 8, 0))[0]; "
                "head = json.loads(os.pread(fd, n, 8)); "
                "mid = os.pread(fd, 1 << 20, size // 4); "
                "print(json.dumps([size, n, head, "
                "mid == b'\\x77' * (1 << 20)]))")
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            daemon = m.proc.pid
            t = time.time()
            # A subprocess: a reader stuck behind a pass fails the test
            # in seconds (killed, it stops the pass), not in minutes.
            try:
                out = subprocess.run(
                    [sys.executable, "-c", code,
                     m.join("big.nf4.safetensors")],
                    capture_output=True, timeout=10, check=True).stdout
            except subprocess.TimeoutExpired:
                self.fail("the header and codes waited on the statistics")
            took = time.time() - t
            sys.stderr.write("nf4 header and 1 MiB of codes: %.2f s "
                             "(with the reader's start)\n" % took)
            self.assertLess(took, STOP_BOUND_S + 1.0)
            size, n, head, zeros = json.loads(out)
            name = WEIGHT
            # Zeros quantise to nf4 code 7 (0.0), two to a byte.
            self.assertTrue(zeros)
            codes = head[name]["data_offsets"]
            for late in (".absmax", ".nested_absmax",
                         ".quant_state.bitsandbytes__nf4"):
                self.assertGreaterEqual(
                    head[name + late]["data_offsets"][0], codes[1], late)
            self.assertEqual(max(v["data_offsets"][1] for k, v in
                                 head.items() if k != "__metadata__"),
                             size - 8 - n)
            # No pass was started behind the reader's back.
            self.assertLess(cpu_in_next_second(daemon, 0.5), 0.25)

    def test_headers_of_scaled_views_do_not_wait(self):
        """NVFP4's global scale and fp8_scaled's per-tensor scale need a
        pass over their weight. Laid out last, behind the embedding that
        neither view quantises, they are out of a header read's reach:
        the header and the embedding are read at once. Before, the F32
        scales came first (the writer's order) and the first 8 bytes
        waited for the pass. fp8_dynamic's channel scales (BF16, one per
        row) need only their rows, but 1 MiB of them spans 4 GiB of this
        weight's rows: they lie last too, so the header and the first
        MiB after it (the codes) are read at once; before, that MiB was
        the scales' and took 16 s here."""
        code = ("import json, os, struct, sys; "
                "fd = os.open(sys.argv[1], os.O_RDONLY); "
                "size = os.fstat(fd).st_size; "
                "n = struct.unpack('<Q', os.pread(fd, 8, 0))[0]; "
                "head = json.loads(os.pread(fd, n, 8)); "
                "a = sys.argv[2]; "
                "first = head[a]['data_offsets'] if a else [0]; "
                "data = os.pread(fd, 1 << 20, 8 + n + first[0]); "
                "print(json.dumps([size, n, head, "
                "data == bytes(1 << 20)]))")
        # Per view: the file, the tensor read after the header ("": the
        # bytes right after it), the late tensors (the scales, and
        # fp8_scaled's 27-byte marker that would misalign its scale:
        # docs/FORMATS.md) and the first one's dtype.
        mod = WEIGHT[:-len(".weight")]
        cases = {
            "nvfp4": ("wide", EMBED, (WEIGHT + "_global_scale",
                                      WEIGHT + "_scale"), "F32"),
            "fp8_scaled": ("wide", EMBED, (WEIGHT + "_scale",
                                           mod + ".comfy_quant"), "F32"),
            "fp8_dynamic": ("tall", "", (WEIGHT + "_scale",), "BF16"),
        }
        with tl.Mount(Env.src, options=["nosupervise"]) as m:
            daemon = m.proc.pid
            for view, (stem, first, late, dtype) in cases.items():
                with self.subTest(view=view):
                    t = time.time()
                    try:
                        out = subprocess.run(
                            [sys.executable, "-c", code,
                             m.join("%s.%s.safetensors" % (stem, view)),
                             first],
                            capture_output=True, timeout=10,
                            check=True).stdout
                    except subprocess.TimeoutExpired:
                        self.fail("the header waited on the scale's pass")
                    took = time.time() - t
                    sys.stderr.write("%s header and 1 MiB of %s: %.2f s\n"
                                     % (view, first or "data", took))
                    self.assertLess(took, STOP_BOUND_S + 1.0)
                    size, n, head, zeros = json.loads(out)
                    self.assertTrue(zeros)
                    self.assertEqual(head[late[0]]["dtype"], dtype)
                    ts = {k: v["data_offsets"] for k, v in head.items()
                          if k != "__metadata__"}
                    self.assertLessEqual(set(late), set(ts))
                    self.assertEqual(
                        max(ts[k][1] for k in ts if k not in late),
                        min(ts[k][0] for k in late))
                    self.assertEqual(max(e for b, e in ts.values()),
                                     size - 8 - n)
            # No pass was started behind the readers' backs.
            self.assertLess(cpu_in_next_second(daemon, 0.5), 0.25)

    def test_killed_buffered_reader_stops_the_pass(self):
        self.kill_reader_during_pass(direct=False)

    def test_killed_direct_reader_stops_the_pass(self):
        self.kill_reader_during_pass(direct=True)

    def test_sigterm_unsupervised(self):
        self.stop_during_pass(["nosupervise"])

    def test_sigterm_supervised(self):
        self.stop_during_pass([])

    def test_sigterm_in_tensor_wide_scales(self):
        # NVFP4's global scale, ComfyUI fp8's per-tensor scale
        # (plan_gen_f8.c, fp4_gscale()).
        for view in ("nvfp4", "fp8_scaled"):
            with self.subTest(view=view):
                self.stop_during_pass(["nosupervise"], view)


if __name__ == "__main__":
    tl.main()
