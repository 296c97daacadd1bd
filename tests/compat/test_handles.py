# SPDX-License-Identifier: MIT
"""File handles (what an NFS server keeps for its clients) stay valid:
open_by_handle_at() of a handle taken before the daemon was restarted
opens the same object in the new daemon, which has never seen the node:
the kernel asks LOOKUP(id, ".") and castfs finds the object whose id it
is. Files, views, tensor-tree files and directories are tried."""
import ctypes
import os
import unittest

import torch
from safetensors.torch import save_file

import castfs_testlib as tl

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


def handle_of(path):
    fh = FileHandle(handle_bytes=128)
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(AT_FDCWD, path.encode(), ctypes.byref(fh),
                              ctypes.byref(mount_id), 0) != 0:
        raise OSError(ctypes.get_errno(), "name_to_handle_at " + path)
    return fh


def open_handle(mount_path, fh, flags=os.O_RDONLY):
    mfd = os.open(mount_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), flags)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "open_by_handle_at")
        return fd
    finally:
        os.close(mfd)


def read_fd(fd):
    out = b""
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return out
        out += b


PATHS = ("m.safetensors", "m.fp8.safetensors", "m.bf16.safetensors",
         "sub/s.fp16.safetensors", "m.safetensors.tensors/layer/w.npy",
         "notes.txt")


class Handles(unittest.TestCase):
    def test_handles_survive_a_restart(self):
        with tl.tempdir() as top:
            src, mnt = os.path.join(top, "src"), os.path.join(top, "mnt")
            os.makedirs(os.path.join(src, "sub"))
            os.mkdir(mnt)
            save_file({"layer.w": torch.randn(33, 17).to(torch.bfloat16),
                       "layer.b": torch.randn(17)},
                      os.path.join(src, "m.safetensors"))
            save_file({"x": torch.randn(8, 8)},
                      os.path.join(src, "sub", "s.safetensors"))
            with open(os.path.join(src, "notes.txt"), "w") as f:
                f.write("hello\n")
            first = tl.Mount(src, mountpoint=mnt)
            try:
                handles, content = {}, {}
                for p in PATHS + ("sub",):
                    handles[p] = handle_of(first.join(p))
                for p in PATHS:
                    with open(first.join(p), "rb") as f:
                        content[p] = f.read()
                    fd = open_handle(first.path, handles[p])
                    self.assertEqual(read_fd(fd), content[p], p)
                    os.close(fd)
            finally:
                # Keep the mount point: the new daemon mounts on it.
                self.assertEqual(self.restart(first), 0)
            second = tl.Mount(src, mountpoint=mnt)
            try:
                for p in PATHS:
                    fd = open_handle(second.path, handles[p])
                    self.assertEqual(read_fd(fd), content[p], p)
                    os.close(fd)
                fd = open_handle(second.path, handles["sub"],
                                 os.O_RDONLY | os.O_DIRECTORY)
                self.assertIn("s.safetensors", os.listdir(fd))
                os.close(fd)
            finally:
                second.close()

    @staticmethod
    def restart(m):
        """Stop @m's daemon (its caller-owned mount point stays)."""
        return m.unmount()


if __name__ == "__main__":
    tl.main()
