# SPDX-License-Identifier: MIT
"""Helpers shared by the reliability tests (test_rel_*.py): checkpoints
written by safetensors itself, view references computed by torch (never
by castfs), and bounded polling."""
import hashlib
import os
import time

import torch
from safetensors.torch import save, save_file

import castfs_testlib as tl

# Cast views and the torch dtype whose .to() gives their tensors (random
# normal values: no overflow, no NaN, so every torch rule agrees).
CAST_VIEWS = {"fp32": torch.float32, "fp16": torch.float16,
              "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def make_tensors(seed, scale=1):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.layers.0.weight": torch.randn(64 * scale, 96, generator=g),
        "model.layers.0.bias": torch.randn(64 * scale, generator=g),
        "emb.weight": torch.randn(32, 48 * scale, generator=g).to(torch.bfloat16),
        "norm": torch.randn(7, generator=g).to(torch.float16),
        "ids": torch.arange(10, dtype=torch.int64),
    }


def one_ckpt_source():
    """A module's source folder of one checkpoint, a.safetensors, made once
    for all its mounts: (source, setUpModule, tearDownModule)."""
    source = tl.ModuleSource()

    def set_up():
        source.start(lambda src: write_ckpt(os.path.join(src,
                                                         "a.safetensors"),
                                            1, 4))
    return source, set_up, source.stop


def write_ckpt(path, seed, scale=1):
    """Write a checkpoint; returns its tensors."""
    t = make_tensors(seed, scale)
    save_file(t, path, metadata={"format": "pt"})
    return t


def view_bytes(tensors, view):
    """The exact bytes castfs must serve for cast view @view: what the
    official writer makes of the tensors cast by torch."""
    dt = CAST_VIEWS[view]
    out = {k: (v.to(dt) if v.is_floating_point() else v)
           for k, v in tensors.items()}
    return save(out, metadata={"format": "pt"})


def view_name(stem, view):
    return "%s.%s.safetensors" % (stem, view)


def tree_digest(root):
    """A hash of every path, type, mode, size, mtime and content below
    @root (links by their target): any write inside it changes it."""
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            st = os.lstat(p)
            h.update(("%s %o %d %d\n" % (os.path.relpath(p, root), st.st_mode,
                                         st.st_size, st.st_mtime_ns)).encode())
            if os.path.islink(p):
                h.update(os.readlink(p).encode())
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def poll(cond, timeout=10.0, what="condition"):
    """Wait until cond() is true (checked every 10 ms); fail after
    @timeout seconds with @what."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0fs waiting for %s"
                                 % (timeout, what))
        time.sleep(0.01)
