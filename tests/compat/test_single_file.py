# SPDX-License-Identifier: MIT
"""diffusers from_single_file on single-file views of an original-layout
(LDM) checkpoint: a tiny SD-shaped UNet2DConditionModel saved in bf16 and
float32 under the "model.diffusion_model.*" names, loaded offline with a
local config=, gives the same parameters through castfs's X.fp8 view as
loading the source with torch_dtype=float8_e4m3fn (diffusers casting
itself), and through X.fp16 / X.bf16 the same as torch_dtype=float16 /
bfloat16 — bit for bit, every parameter, no key messages.
"""
import os
import shutil
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from diffusers import UNet2DConditionModel
        from safetensors.torch import save_file
    import ldm_unet
    from test_modeldir import assert_same, captured, KEY_TROUBLE
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)


class Env:
    root = None
    mnt = None
    sd = None  # the diffusers-named float32 state dict


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-sf-")
    src = os.path.join(Env.root, "src")
    os.mkdir(src)
    torch.manual_seed(5)
    unet = UNet2DConditionModel(**ldm_unet.TINY_SD_UNET)
    unet.save_config(os.path.join(Env.root, "unet_config"))
    names = ldm_unet.ldm_names(unet.config, unet.state_dict().keys())
    Env.sd = {k: v.contiguous() for k, v in unet.state_dict().items()}
    sd = {names[k]: v for k, v in Env.sd.items()}
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()},
              os.path.join(src, "sd_unet.safetensors"))
    save_file(sd, os.path.join(src, "sd_unet32.safetensors"))
    Env.mnt = tl.Mount(src)


def tearDownModule():
    import gc
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    out = Env.mnt.output() if rc else ""
    shutil.rmtree(Env.root, ignore_errors=True)
    if rc:
        raise AssertionError("castfs exited with %d: %s" % (rc, out))


def load(path, dtype):
    with captured() as msgs:
        m = UNet2DConditionModel.from_single_file(
            path, config=os.path.join(Env.root, "unet_config"),
            torch_dtype=dtype)
    return m, [x for x in msgs if KEY_TROUBLE.search(x)]


class TestFromSingleFile(unittest.TestCase):

    def check(self, stem, view, dtype):
        want, trouble = load(Env.mnt.join(stem + ".safetensors"), dtype)
        self.assertEqual(trouble, [])
        # The LDM names went through diffusers' conversion back to these.
        src_dt = torch.bfloat16 if stem == "sd_unet" else torch.float32
        for k, v in want.state_dict().items():
            assert_same(self, v, Env.sd[k].to(src_dt).to(dtype), k)
        got, trouble = load(Env.mnt.join("%s.%s.safetensors" % (stem, view)),
                            dtype)
        self.assertEqual(trouble, [])
        a, b = got.state_dict(), want.state_dict()
        self.assertEqual(sorted(a), sorted(b))
        self.assertGreater(len(a), 600)
        for k in b:
            assert_same(self, a[k], b[k], "%s.%s: %s" % (stem, view, k))

    def test_fp8_from_bf16(self):
        self.check("sd_unet", "fp8", torch.float8_e4m3fn)

    def test_fp8_from_f32(self):
        self.check("sd_unet32", "fp8", torch.float8_e4m3fn)

    def test_fp16_from_f32(self):
        self.check("sd_unet32", "fp16", torch.float16)

    def test_bf16_from_f32(self):
        self.check("sd_unet32", "bf16", torch.bfloat16)


if __name__ == "__main__":
    torch.set_num_threads(2)
    tl.main()
