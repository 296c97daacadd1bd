# SPDX-License-Identifier: MIT
"""A sharded model whose shards are grouped packs (`castfs pack --grouped`):
each shard of DIR.fp8/ is cast from its pack's bf16 frames as planes (the
grouped reader's visit op and the fused cast; the composite reader's
forwarding of visit is tested in tests/unit/test_reader.c). Oracle:
torch's cast to float8_e4m3fn of the original weights (every F8_E4M3
tensor of the view), and the view's files equal those of the same model
left uncompressed.
"""
import os
import unittest

import torch
from safetensors.torch import load_file

import castfs_testlib as tl
from test_packed_mount import PackedLlamaCase, read


@unittest.skipUnless(tl.fuse_usable(), "FUSE not usable")
class GroupedShards(PackedLlamaCase):
    SEED, PACK_FLAGS = 1, ("--grouped",)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.want = {}
        for n in os.listdir(cls.plain):
            if n.endswith(".safetensors"):
                cls.want.update(load_file(os.path.join(cls.plain, n)))

    def test_shards_are_grouped_packs(self):
        names = os.listdir(os.path.join(self.src, "packed"))
        self.assertGreater(sum(n.endswith(".safetensors.zstg") for n in names), 1)
        self.assertFalse(any(n.endswith(".safetensors") for n in names))

    def test_fp8_dir_equals_torch(self):
        packed = self.mnt.join("packed.fp8")
        cast = 0
        for n in sorted(os.listdir(packed)):
            if not n.endswith(".safetensors"):
                continue
            got = load_file(os.path.join(packed, n))
            for k, v in got.items():
                if v.dtype != torch.float8_e4m3fn:
                    continue
                want = self.want[k].to(torch.float8_e4m3fn)
                self.assertTrue(torch.equal(v.view(torch.uint8), want.view(torch.uint8)), k)
                cast += 1
        self.assertGreater(cast, 4)

    def test_fp8_dir_equals_uncompressed(self):
        plain = self.mnt.join("plain.fp8")
        packed = self.mnt.join("packed.fp8")
        self.assertEqual(sorted(os.listdir(packed)), sorted(os.listdir(plain)))
        for n in os.listdir(plain):
            if os.path.isfile(os.path.join(plain, n)):
                self.assertEqual(read(os.path.join(packed, n)), read(os.path.join(plain, n)), n)


if __name__ == "__main__":
    tl.main()
