# SPDX-License-Identifier: MIT
"""NFS file handles of names no listing shows survive castfs restarts.

An NFS client (nfs_handle_client.py: libnfs, NFSv3 and NFSv4) opens, once,
an unlisted view (`-o views=bf16` hides fp8), a file in a model
directory's view `DIR.fp8/` and a tensor file of a view's tree; it never
looks them up again, every later read goes by the NFS file handle it got
then. Expected bytes come from torch + safetensors and numpy, not castfs.

What each phase exercises:
1. `kill -9` of the serving daemon, then the page cache dropped (else
   the kernel answers ganesha from it and castfs sees nothing): ganesha
   keeps its fds on the FUSE mount, so the new daemon gets READ with an
   fh it never issued for a node id it has never seen, and reopens the
   file by id (a search, lib/ns).
2. `castfs reload`: the same, into a daemon started from the binary on
   disk.
3. NFSv3 only: ganesha is stopped (its cache and every fd it held go),
   the kernel's caches are dropped, the daemon is killed, the caches are
   dropped again and ganesha started anew. The client's old v3 handles
   then reach ganesha as bytes only: it calls open_by_handle_at on the
   FUSE mount, and as no inode is cached the kernel sends
   LOOKUP(id, ".") to a daemon that never saw the ids. (NFSv4 is not
   taken through a ganesha restart: with Graceless its open state is
   gone and libnfs 4.0 does not reclaim it, BAD_STATEID, whatever the
   filesystem below does; docs/NFS.md.)

Exits 77 (SKIP) when a prerequisite of test_nfs is missing, or when not
root (dropping caches).
"""
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
from safetensors.torch import save, save_file

import castfs_testlib as tl
import test_nfs as tn

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "nfs_handle_client.py")


def daemons(sup):
    try:
        with open("/proc/%d/task/%d/children" % (sup, sup)) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def one_daemon(sup, other_than=()):
    """Wait until the supervisor has exactly one daemon, not in
    @other_than; its pid."""
    def one():
        d = daemons(sup)
        return d[0] if len(d) == 1 and d[0] not in other_than else None
    return tn.wait_for("a single new castfs daemon", one, 60)


def drop_caches():
    os.sync()
    tl.drop_caches(3)


def references():
    """Source tensors written to @src later; {path: bytes} the views must
    be, by torch/safetensors and numpy."""
    g = torch.Generator().manual_seed(11)
    a = {"model.embed_tokens.weight": torch.randn(128, 256, generator=g).to(torch.bfloat16),
         tn.NPY_NAME: torch.randn(512, 256, generator=g).to(torch.bfloat16),
         "model.norm.weight": torch.randn(256, generator=g)}
    b = {"w": torch.randn(64, 96, generator=g), "v": torch.randn(96, generator=g)}
    fp8 = lambda t: {k: v.to(torch.float8_e4m3fn) for k, v in t.items()}
    npy = io.BytesIO()  # a view's tree shows fp8 widened to float32
    np.save(npy, a[tn.NPY_NAME].to(torch.float8_e4m3fn).float().numpy())
    want = {"model.fp8.safetensors": save(fp8(a), metadata={"format": "pt"}),
            "sub.fp8/b.safetensors": save(fp8(b), metadata={"format": "pt"}),
            "model.fp8.safetensors.tensors/" + tn.NPY_PATH.split("/", 1)[1]:
            npy.getvalue()}
    return a, b, want


class Client:
    """nfs_handle_client.py in ganesha's namespace, NFSv@version."""

    def __init__(self, server, version, paths):
        self.version = version
        self.proc = subprocess.Popen(
            server.ns(sys.executable, CLIENT, tn.SERVER, tn.PSEUDO,
                      str(version), *paths),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("NFSv%d client exited with %s" % (version, self.proc.wait()))
        assert json.loads(line)["ready"] == list(paths), line

    def read(self):
        self.proc.stdin.write("read\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("NFSv%d client died" % self.version)
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class NFSHandles(unittest.TestCase):
    def setUp(self):
        self.mount = self.server = None
        self.clients = []
        self.work = tempfile.mkdtemp(prefix="castfs-nfsh-")
        src = os.path.join(self.work, "src")
        os.makedirs(os.path.join(src, "sub"))
        a, b, self.want = references()
        save_file(a, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
        save_file(b, os.path.join(src, "sub", "b.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(src, "sub", "config.json"), "w") as f:
            json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                       "torch_dtype": "float32"}, f)
        self.mount = tl.Mount(src, options=["views=bf16"])
        self.server = tn.Ganesha(os.path.realpath(self.mount.path), self.work)
        self.server.start()

    def tearDown(self):
        try:
            for c in self.clients:
                c.close()
            if self.server:
                self.server.close()
        finally:
            try:
                if self.mount:
                    rc = self.mount.unmount()
                    self.assertEqual(rc, 0, "castfs exit status")
            finally:
                shutil.rmtree(self.work, ignore_errors=True)

    def check(self, client, what):
        got = client.read()
        for path, data in self.want.items():
            self.assertEqual(got[path], [hashlib.sha256(data).hexdigest(), len(data)],
                             "%s over NFSv%d by its old handle, %s"
                             % (path, client.version, what))

    def restart_ganesha(self):
        """A new ganesha.nfsd in the same namespace, same config."""
        s = self.server
        tn.stop(s.ganesha)
        s.ganesha = subprocess.Popen(
            s.ns("ganesha.nfsd", "-F", "-f", s.conf, "-L", s.log, "-p",
                 s.pidfile, "-N", "NIV_EVENT"), stdin=subprocess.DEVNULL)

        def answers():
            # The root's listing: none of the files under test is in it.
            try:
                return s.client("nfs-ls", s.url("", 3), timeout=10,
                                check=False).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        tn.wait_for("the new ganesha to answer", answers, 60, interval=0.2,
                    detail=lambda: "\n" + tn.tail(s.log))

    def test_handles_across_kill_reload_and_server_restart(self):
        if os.geteuid() != 0:
            raise unittest.SkipTest("dropping the kernel's caches needs root")
        sup = self.mount.proc.pid
        if not daemons(sup):
            raise unittest.SkipTest("needs the supervisor")
        listed = os.listdir(self.mount.path)
        self.assertNotIn("model.fp8.safetensors", listed)
        self.assertNotIn("sub.fp8", listed)
        paths = list(self.want)
        v3, v4 = Client(self.server, 3, paths), Client(self.server, 4, paths)
        self.clients = [v3, v4]
        for c in self.clients:
            self.check(c, "before any restart")

        old = one_daemon(sup)
        os.kill(old, signal.SIGKILL)
        new = one_daemon(sup, (old,))
        drop_caches()  # else the FUSE mount's page cache answers ganesha
        for c in self.clients:
            self.check(c, "after kill -9 of the daemon")

        r = subprocess.run([tl.castfs_binary(), "reload", self.mount.path],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        one_daemon(sup, (new,))
        drop_caches()
        for c in self.clients:
            self.check(c, "after castfs reload")

        # Phase 3, NFSv3: nothing but the client's handles is left.
        v4.close()
        tn.stop(self.server.ganesha)
        drop_caches()
        old = one_daemon(sup)
        os.kill(old, signal.SIGKILL)
        one_daemon(sup, (old,))
        drop_caches()
        self.restart_ganesha()
        self.check(v3, "after a ganesha restart, dropped caches and kill -9 "
                   "(LOOKUP(id, \".\") in a new daemon)")


if __name__ == "__main__":
    if tl.fuse_usable():
        why = tn.missing_prerequisite()
        if why:
            print("SKIP: " + why)
            sys.exit(tl.SKIP)
    tl.main()
