# SPDX-License-Identifier: MIT
"""castfs re-exported over NFS by nfs-ganesha (FSAL VFS), read back with the
userspace NFS client of libnfs-utils, NFSv3 and NFSv4.

Everything runs on this machine (shared/reference/NFS.md): the FUSE mount
is made first, then a private network + mount namespace whose only
interface is `lo` holds rpcbind, ganesha.nfsd and every client, so that no
port or /run file is shared with the host or with another test. The raw
checkpoint, two views and a tensor-tree file read through NFS must be the
bytes the FUSE mount serves, and those must be the official writer's bytes.

Restarts of the FUSE daemon under a running ganesha: the last test here
(clients reading through kills and a reload); NFS handles kept across
restarts, including LOOKUP(id, ".") after eviction: test_nfs_handles.py.

Exits 77 (SKIP) only when a prerequisite is missing: FUSE, ganesha.nfsd
with FSAL VFS, rpcbind, the libnfs utilities, iproute2, or namespaces.
"""
import glob
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import torch
from safetensors.torch import save, save_file

import castfs_testlib as tl

PSEUDO = "/castfs"
SERVER = "127.0.0.1"
TOOLS = ("ganesha.nfsd", "rpcbind", "nfs-cat", "nfs-cp", "nfs-ls", "unshare",
         "nsenter", "ip")
FSAL_VFS = ("/usr/lib/*/ganesha/libfsalvfs.so", "/usr/lib*/ganesha/libfsalvfs.so",
            "/usr/local/lib*/ganesha/libfsalvfs.so",
            "/usr/local/lib/*/ganesha/libfsalvfs.so")
NPY_NAME = "model.layers.0.mlp.up_proj.weight"
NPY_PATH = "model.safetensors.tensors/model/layers/0/mlp/up_proj/weight.npy"
# The longest one whole-file nfs-cat may take while the daemon is killed
# every 100-500 ms (test_restart's local bound is 20 s; here a client
# process, a mount and ganesha come on top).
NFS_STALL_BOUND_S = 30.0


def missing_prerequisite():
    """A reason to skip, or None. Only absent software or privileges."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return "%s not installed" % tool
    if not any(glob.glob(p) for p in FSAL_VFS):
        return "ganesha's FSAL VFS (nfs-ganesha-vfs) not installed"
    try:
        r = subprocess.run(["unshare", "--mount", "--net", "true"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=30)
    except subprocess.TimeoutExpired:
        return "unshare --mount --net did not return"
    if r.returncode != 0:
        return "unshare --mount --net unusable: %s" % r.stderr.decode().strip()
    return None


def wait_for(what, cond, timeout, interval=0.05, detail=lambda: ""):
    """Poll @cond until it returns true; fail after @timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %gs waiting for %s%s"
                                 % (timeout, what, detail()))
        time.sleep(interval)


def stop(proc, sig=signal.SIGTERM, timeout=10):
    """Signal @proc and reap it; SIGKILL after @timeout seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def drop_page_cache_until(until):
    """Drop clean pages (also of open files) until @until, when root; else
    nothing."""
    while os.geteuid() == 0 and time.time() < until:
        tl.drop_caches(1)
        time.sleep(0.2)


def tail(path, n=30):
    """The end of ganesha's log, without the line it writes for each
    client connection closed."""
    try:
        with open(path, errors="replace") as f:
            lines = [l for l in f if "svc_vc_wait" not in l]
        return "".join(lines[-n:])
    except OSError as e:
        return str(e)


class Ganesha:
    """rpcbind + ganesha.nfsd exporting @export read-only at PSEUDO, inside a
    private network + mount namespace held by a `sleep` process."""

    def __init__(self, export, work):
        self.export = export
        self.work = work
        self.run_dir = os.path.join(work, "run")
        self.recovery = os.path.join(work, "recovery")
        self.conf = os.path.join(work, "ganesha.conf")
        self.log = os.path.join(work, "ganesha.log")
        self.pidfile = os.path.join(work, "ganesha.pid")
        self.holder = self.rpcbind = self.ganesha = None
        os.mkdir(self.run_dir)
        os.chmod(self.run_dir, 0o755)  # rpcbind drops to its own user
        os.mkdir(self.recovery)
        with open(self.conf, "w") as f:
            f.write(self.config())

    def config(self):
        return """\
NFS_CORE_PARAM {
    Bind_addr = %(server)s; NFS_Port = 2049; MNT_Port = 20048;
    Protocols = 3, 4; Mount_Path_Pseudo = true;
    Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
}
NFSV4 {
    Graceless = true; Lease_Lifetime = 10;
    RecoveryBackend = fs; RecoveryRoot = %(recovery)s;
}
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
    Export_Id = 1; Path = %(export)s; Pseudo = %(pseudo)s;
    Access_Type = RO; Squash = No_Root_Squash; SecType = sys;
    Protocols = 3, 4; Transports = TCP;
    FSAL { Name = VFS; }
}
""" % {"server": SERVER, "recovery": self.recovery, "export": self.export,
       "pseudo": PSEUDO}

    def ns(self, *argv):
        """argv run inside the namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-n"] + list(argv)

    def start(self):
        own_net = os.readlink("/proc/self/ns/net")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private",
             "sleep", "infinity"], stdin=subprocess.DEVNULL)

        def unshared():
            # unshare execs sleep once the namespaces exist and the
            # propagation is private: only then may /run be covered.
            if self.holder.poll() is not None:
                raise AssertionError("unshare exited with %d" % self.holder.returncode)
            try:
                with open("/proc/%d/comm" % self.holder.pid) as f:
                    execed = f.read().strip() == "sleep"
                return execed and os.readlink(
                    "/proc/%d/ns/net" % self.holder.pid) != own_net
            except OSError:
                return False
        wait_for("the namespace holder", unshared, 10)
        # A non-loopback address on lo: without one glibc's AI_ADDRCONFIG
        # finds no address for Bind_addr = 127.0.0.1.
        for argv in (["ip", "link", "set", "lo", "up"],
                     ["ip", "-6", "addr", "add", "fd77::1/128", "dev", "lo"],
                     ["mount", "--bind", self.run_dir, "/run"]):
            subprocess.run(self.ns(*argv), check=True, timeout=30)

        self.rpcbind = subprocess.Popen(self.ns("rpcbind", "-f"),
                                        stdin=subprocess.DEVNULL)
        sock = os.path.join(self.run_dir, "rpcbind.sock")

        def rpcbind_listens():
            if self.rpcbind.poll() is not None:
                raise AssertionError("rpcbind exited with %d" % self.rpcbind.returncode)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock)
                return True
            except OSError:
                return False
            finally:
                s.close()
        wait_for("rpcbind", rpcbind_listens, 10)

        # nsenter execs the program: these are the daemons' own pids.
        self.ganesha = subprocess.Popen(
            self.ns("ganesha.nfsd", "-F", "-f", self.conf, "-L", self.log,
                    "-p", self.pidfile, "-N", "NIV_EVENT"),
            stdin=subprocess.DEVNULL)

        def answers():
            if self.ganesha.poll() is not None:
                raise AssertionError("ganesha.nfsd exited with %d:\n%s"
                                     % (self.ganesha.returncode, tail(self.log)))
            for v in (3, 4):
                try:
                    r = self.client("nfs-ls", self.url("", v), timeout=10, check=False)
                except subprocess.TimeoutExpired:
                    last.append("nfs-ls (NFSv%d) did not return in 10 s" % v)
                    return False
                if r.returncode:
                    last.append("nfs-ls (NFSv%d): %s" % (v, r.stderr.decode(errors="replace")))
                    return False
            return True
        last = []
        wait_for("ganesha to answer NFSv3 and NFSv4", answers, 30, interval=0.1,
                 detail=lambda: "; %s\nganesha log:\n%s" % (last[-1:], tail(self.log)))

    def url(self, rel, version):
        return "nfs://%s%s/%s?version=%d" % (SERVER, PSEUDO, rel, version)

    def client(self, *argv, timeout=60, check=True):
        r = subprocess.run(self.ns(*argv), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("%s failed (%d): %s\nganesha log:\n%s" % (
                " ".join(argv), r.returncode, r.stderr.decode(errors="replace"),
                tail(self.log)))
        return r

    def close(self):
        """ganesha, rpcbind, then the holder: the namespace (and its copy of
        the FUSE mount) goes away with its last process."""
        try:
            stop(self.ganesha)
        finally:
            try:
                stop(self.rpcbind)
            finally:
                stop(self.holder, signal.SIGKILL)


def write_source(src):
    """A small bf16 checkpoint (one float32 norm, so that the bf16 view
    converts something); returns its tensors."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(256, 512, generator=g).to(torch.bfloat16),
        NPY_NAME: torch.randn(1024, 512, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight":
            (1 + torch.randn(512, generator=g) / 8).to(torch.bfloat16),
        "model.norm.weight": torch.randn(512, generator=g),
        "lm_head.weight": torch.randn(300, 512, generator=g).to(torch.bfloat16),
    }
    save_file(tensors, os.path.join(src, "model.safetensors"),
              metadata={"format": "pt"})
    return tensors


class NFSExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mount = cls.server = None
        cls.work = tempfile.mkdtemp(prefix="castfs-nfs-")
        try:
            cls.src = os.path.join(cls.work, "src")
            os.mkdir(cls.src)
            cls.tensors = write_source(cls.src)
            cls.mount = tl.Mount(cls.src)
            cls.server = Ganesha(os.path.realpath(cls.mount.path), cls.work)
            cls.server.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            if cls.server:
                cls.server.close()
        finally:
            try:
                if cls.mount:
                    rc = cls.mount.unmount()
                    if rc != 0:
                        raise AssertionError("castfs exited with %d" % rc)
            finally:
                shutil.rmtree(cls.work, ignore_errors=True)

    def fuse_bytes(self, rel):
        with open(self.mount.join(rel), "rb") as f:
            return f.read()

    def nfs_reads(self, rel, version):
        """@rel read over NFS with nfs-cat and with nfs-cp."""
        cat = self.server.client("nfs-cat", self.server.url(rel, version)).stdout
        dst = os.path.join(self.work, "copy")
        if os.path.exists(dst):
            os.unlink(dst)
        self.server.client("nfs-cp", self.server.url(rel, version), dst)
        with open(dst, "rb") as f:
            cp = f.read()
        os.unlink(dst)
        return cat, cp

    def assertSameBytes(self, got, expected, what):
        if got == expected:
            return
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                  min(len(got), len(expected)))
        self.fail("%s: %d bytes, expected %d; first difference at offset %d"
                  % (what, len(got), len(expected), at))

    def check_file(self, rel, expected):
        self.assertSameBytes(self.fuse_bytes(rel), expected, rel + " through FUSE")
        for version in (3, 4):
            for how, data in zip(("nfs-cat", "nfs-cp"), self.nfs_reads(rel, version)):
                self.assertSameBytes(data, expected,
                                     "%s over NFSv%d (%s)" % (rel, version, how))

    def test_raw_checkpoint(self):
        with open(os.path.join(self.src, "model.safetensors"), "rb") as f:
            self.check_file("model.safetensors", f.read())

    def test_bf16_view(self):
        ref = save({k: t.to(torch.bfloat16) for k, t in self.tensors.items()},
                   metadata={"format": "pt"})
        self.check_file("model.bf16.safetensors", ref)

    def test_fp8_view(self):
        ref = save({k: t.to(torch.float8_e4m3fn) for k, t in self.tensors.items()},
                   metadata={"format": "pt"})
        self.check_file("model.fp8.safetensors", ref)

    def test_tensor_tree_npy(self):
        buf = io.BytesIO()
        np.save(buf, self.tensors[NPY_NAME].float().numpy())
        self.check_file(NPY_PATH, buf.getvalue())

    def nfs_listing(self, rel, version):
        out = self.server.client("nfs-ls", self.server.url(rel, version)).stdout
        entries = {}
        for line in out.decode().splitlines():
            # mode nlink uid gid size name
            fields = line.split(None, 5)
            self.assertEqual(len(fields), 6, line)
            entries[fields[5]] = (fields[0][0], int(fields[4]))
        return entries

    def test_listing(self):
        names = ("model.safetensors", "model.bf16.safetensors",
                 "model.fp8.safetensors", "model.safetensors.tensors")
        expect = {}
        for name in os.listdir(self.mount.path):
            st = os.lstat(self.mount.join(name))
            kind = "d" if os.path.isdir(self.mount.join(name)) else "-"
            expect[name] = (kind, st.st_size)
        for name in names:
            self.assertIn(name, expect)
        for version in (3, 4):
            got = self.nfs_listing("", version)
            for name in names:
                self.assertIn(name, got, "NFSv%d listing" % version)
            # Directory sizes are whatever the FUSE mount says, files exact.
            self.assertEqual(sorted(got), sorted(expect), "NFSv%d" % version)
            for name, (kind, size) in expect.items():
                self.assertEqual(got[name][0], kind, (version, name))
                if kind == "-":
                    self.assertEqual(got[name][1], size, (version, name))
            sub = self.nfs_listing("model.safetensors.tensors/model/layers/0/mlp/up_proj",
                                   version)
            self.assertIn("weight.npy", sub)
            self.assertEqual(sub["weight.npy"][1],
                             os.path.getsize(self.mount.join(NPY_PATH)))

    def test_y_clients_share_one_conversion(self):
        """Four clients (NFSv3 and NFSv4) read one large view at once: every
        copy is torch's bytes, and castfs converts the view about once
        (its bytes served, /.castfs/stats, stay near one view size: the
        FUSE mount's page cache serves the other clients)."""
        g = torch.Generator().manual_seed(5)
        big = {"w%d" % i: torch.randn(2048, 4096, generator=g) for i in range(4)}
        save_file(big, os.path.join(self.src, "big.safetensors"),
                  metadata={"format": "pt"})
        want = hashlib.sha256(save({k: t.to(torch.float16) for k, t in big.items()},
                                   metadata={"format": "pt"})).hexdigest()
        size = os.path.getsize(self.mount.join("big.fp16.safetensors"))
        out = [None] * 4

        def client(i):
            r = self.server.client("nfs-cat", self.server.url(
                "big.fp16.safetensors", 3 + i % 2), timeout=600)
            out[i] = hashlib.sha256(r.stdout).hexdigest()
        import threading
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        t0 = time.monotonic()
        # The FUSE mount's page cache shares one conversion: no drop meanwhile.
        with tl.caches_kept():
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
        secs = time.monotonic() - t0
        self.assertEqual(out, [want] * 4)
        with open(self.mount.join(".castfs", "stats")) as f:
            served = json.load(f)["views"]["fp16"]["bytes"]
        print("nfs shared view: 4 clients x %.0f MiB in %.1f s (%.0f MiB/s "
              "aggregate); castfs served %.2f x the view" % (
                  size / 2 ** 20, secs, 4 * size / 2 ** 20 / secs,
                  served / size), file=sys.stderr)
        self.assertLess(served, 1.5 * size)
        os.unlink(os.path.join(self.src, "big.safetensors"))

    def test_z_clients_read_through_daemon_kills_and_a_reload(self):
        """NFSv3 and NFSv4 clients keep reading views while castfs's daemon
        is killed every 100-500 ms and then replaced by `castfs reload`:
        every read completes with the reference bytes. (Named to run
        last; the restarts must be invisible to the other tests anyway.)"""
        fp8 = save({k: t.to(torch.float8_e4m3fn) for k, t in self.tensors.items()},
                   metadata={"format": "pt"})
        buf = io.BytesIO()  # fp8 widened to float32, as the tree shows it
        np.save(buf, self.tensors[NPY_NAME].to(torch.float8_e4m3fn).float().numpy())
        # A view's tensor tree is never listed: only lookups find it.
        files = {"model.fp8.safetensors": fp8,
                 "model.fp8.safetensors.tensors/" + NPY_PATH.split("/", 1)[1]:
                 buf.getvalue()}
        until = time.time() + 8
        bad, done, secs = [], [], [0.0]

        def client(version):
            while time.time() < until:
                for rel, want in files.items():
                    t0 = time.monotonic()
                    r = self.server.client("nfs-cat", self.server.url(rel, version),
                                           timeout=120, check=False)
                    secs[0] = max(secs[0], time.monotonic() - t0)
                    if r.returncode or r.stdout != want:
                        bad.append("%s NFSv%d: rc %d, %d bytes" % (
                            rel, version, r.returncode, len(r.stdout)))
                    done.append(rel)
        import threading
        threads = [threading.Thread(target=client, args=(v,)) for v in (3, 4, 3, 4)]
        # Without this the FUSE mount's page cache (views keep it) serves
        # ganesha every read after the first, and only LOOKUP/OPEN/GETATTR
        # would reach the restarted daemons. A thread of its own: a drop
        # can take a second, the kills keep their pace.
        threads.append(threading.Thread(target=drop_page_cache_until, args=(until,)))
        for t in threads:
            t.start()
        sup, kills = self.mount.proc.pid, 0
        rng = __import__("random").Random(3)
        while time.time() < until - 3:
            time.sleep(rng.uniform(0.1, 0.5))
            with open("/proc/%d/task/%d/children" % (sup, sup)) as f:
                for pid in f.read().split():
                    os.kill(int(pid), signal.SIGKILL)
                    kills += 1
        r = subprocess.run([tl.castfs_binary(), "reload", self.mount.path],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        for t in threads:
            t.join(timeout=300)
            self.assertFalse(t.is_alive(), "an NFS client hung")
        self.assertEqual(bad[:5], [])
        self.assertGreater(kills, 5)
        self.assertGreater(len(done), 8)
        # A whole-file nfs-cat (a process, a mount, the reads) across kills.
        self.assertLess(secs[0], NFS_STALL_BOUND_S, "an NFS read stalled too long")
        print("nfs restart: %d kills + 1 reload, %d whole-file NFS reads, all "
              "exact, longest %.2f s" % (kills, len(done), secs[0]), file=sys.stderr)


if __name__ == "__main__":
    if tl.fuse_usable():
        why = missing_prerequisite()
        if why:
            print("SKIP: " + why)
            sys.exit(tl.SKIP)
    tl.main()
