# SPDX-License-Identifier: MIT
"""compressed-tensors views of a quantized source (an FP8 block model, the
DeepSeek / Qwen3-FP8 layout) against llm-compressor run on its dequantized
bf16 model.

castfs computes fp8_dynamic, fp8_block, w4a16 and nvfp4 (its global scale
over the fused q/k/v and gate/up siblings' dequantized values) of an FP8
block weight from its values dequantized as its bf16 view has them (DeepSeek's
weight_dequant: one fp32 product per element, then bf16). The oracle:
the same model with each FP8 block weight dequantized by that rule in torch
(tests/compat/test_quant_src.py deepseek_dequant, checked there against
the bf16 view and transformers) and its quantization_config dropped, run
through llm-compressor 0.14's data-free oneshot (tests/compat/ct_oracle.py,
its own venv). DIR.<view>/ must hold the oracle's tensors (names, dtypes,
shapes, bytes) and a quantization_config compressed-tensors reads as the
oracle's. Exits 77 without FUSE, torch, transformers or the oracle venv.
"""
import json
import os
import shutil
import sys
import unittest

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import torch
    from safetensors.torch import load_file, save_file
    from test_ct import VENV_PY, run_oracle, tensors, tiny_llama
    from test_quant_src import QC, deepseek_dequant, quant_fp8_block
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

VIEWS = {"fp8_dynamic": "FP8_DYNAMIC", "fp8_block": "FP8_BLOCK",
         "w4a16": "W4A16", "nvfp4": "NVFP4A16"}


def fp8_block_model(src, out):
    """@src (a bf16 model dir) in the FP8 block layout at @out, and its
    dequantized bf16 twin at @out + ".deq" (the oracle's input)."""
    deq = out + ".deq"
    shutil.copytree(src, out)
    shutil.copytree(src, deq)
    sd = load_file(os.path.join(src, "model.safetensors"))
    q, d = {}, {}
    for k, t in sd.items():
        # One member of a fused group stays bf16 (as DeepSeek keeps some
        # layers): nvfp4 reads its stored elements beside the others'
        # dequantized ones for the group's global scale.
        if k.endswith("proj.weight") and "layers.0.self_attn.k_proj" not in k:
            q[k], q[k + "_scale_inv"] = quant_fp8_block(t)
            d[k] = deepseek_dequant(q[k], q[k + "_scale_inv"]).to(torch.bfloat16)
        else:
            q[k] = d[k] = t
    save_file(q, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(d, os.path.join(deq, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = QC
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


class CtOfQuantizedSource(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp_cm = tl.tempdir()
        cls.tmp = cls.tmp_cm.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        os.makedirs(cls.src)
        bf16 = os.path.join(cls.tmp, "bf16")
        # Widths that 128 divides (w4a16) and one that it does not (200:
        # edge blocks of the FP8 source and of fp8_block).
        tiny_llama(bf16, torch.bfloat16, 256, 200, 32, 31)
        cls.model = os.path.join(cls.src, "fp8m")
        fp8_block_model(bf16, cls.model)
        shutil.move(cls.model + ".deq", os.path.join(cls.tmp, "deq"))
        cls.ref = os.path.join(cls.tmp, "ref")
        run_oracle({"quantize": [[os.path.join(cls.tmp, "deq"),
                                  os.path.join(cls.ref, v), s, []]
                                 for v, s in VIEWS.items()]}, cls.tmp)
        cls.mnt = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.tmp_cm.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def test_ct_qsrc__tensors_equal_llm_compressor_on_the_bf16_model(self):
        for view in VIEWS:
            with self.subTest(view=view):
                got = tensors(self.mnt.join("fp8m." + view))
                want = tensors(os.path.join(self.ref, view))
                self.assertEqual(sorted(got), sorted(want))
                bad = [k for k in want if got[k] != want[k]]
                self.assertEqual(bad, [])
                # the single file is the same
                with open(self.mnt.join("fp8m", "model." + view + ".safetensors"),
                          "rb") as f1, open(self.mnt.join("fp8m." + view,
                                                          "model.safetensors"), "rb") as f2:
                    self.assertEqual(f1.read(), f2.read())

    def test_ct_qsrc__config_is_the_oracles(self):
        jobs = [[self.mnt.join("fp8m." + v, "config.json"),
                 os.path.join(self.ref, v, "config.json")] for v in VIEWS]
        for j, r in zip(jobs, run_oracle({"config": jobs}, self.tmp)["config"]):
            with self.subTest(config=j[0]):
                self.assertTrue(r["equal"], json.dumps(r, indent=1))
            with open(j[0]) as f:
                q = json.load(f)["quantization_config"]
            self.assertEqual(q["quant_method"], "compressed-tensors")


if __name__ == "__main__":
    if not os.access(VENV_PY, os.X_OK):
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)" % VENV_PY)
        sys.exit(tl.SKIP)
    tl.main()
