# SPDX-License-Identifier: MIT
"""compressed-tensors views of a mixture of experts (Mixtral) vs
llm-compressor (stop 41, found by a bug hunt).

transformers 5.24 builds Mixtral's router as MixtralTopKRouter, no
nn.Linear: llm-compressor's QuantizationModifier(targets="Linear") leaves it
in bf16 and lists it in "ignore". castfs quantised it as a Linear weight and
listed only lm_head: transformers then loaded fp8_dynamic's router as
unscaled fp8 codes (the routing changed, silently) and w4a16's as missing
(randomly initialised). castfs now keeps every router as it is.

The oracle is llm-compressor 0.14 in its own venv (ct_oracle.py, as
test_ct.py). It saves the experts under the names of its linearised MoE
(experts.N.gate_proj / up_proj / down_proj for the checkpoint's w1 / w3 /
w2); every other tensor keeps its name. So:

- every tensor of the oracle's file is in DIR.<view>/ byte for byte, the
  experts' under the checkpoint's names (the routers in bf16 among them),
  and the view holds nothing else;
- config.json's quantization_config, read by compressed-tensors'
  QuantizationConfig, equals the oracle's (its ignore list included).
Exits 77 when FUSE, torch, transformers or the oracle venv is unavailable.
"""
import os
import sys
import unittest

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    import torch
    import transformers as T
    from test_ct import VENV_PY, run_oracle, tensors
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

VIEWS = {"fp8_dynamic": "FP8_DYNAMIC", "w4a16": "W4A16"}
# The checkpoint's expert weights, by llm-compressor's names.
EXPERT = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def checkpoint_name(name):
    """@name of the oracle's file as the Mixtral checkpoint spells it."""
    parts = name.split(".")
    if "experts" in parts:
        i = parts.index("experts") + 2
        if i < len(parts) and parts[i] in EXPERT:
            parts[i] = EXPERT[parts[i]]
    return ".".join(parts)


class CtMoe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp_cm = tl.tempdir()
        cls.tmp = cls.tmp_cm.__enter__()
        cls.src = os.path.join(cls.tmp, "src")
        cls.ref = os.path.join(cls.tmp, "ref")
        torch.manual_seed(41)
        m = T.MixtralForCausalLM(T.MixtralConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            num_local_experts=4, num_experts_per_tok=2))
        m.to(torch.bfloat16).save_pretrained(os.path.join(cls.src, "mixtral"))
        jobs = [[os.path.join(cls.src, "mixtral"),
                 os.path.join(cls.ref, "mixtral." + v), s, []]
                for v, s in VIEWS.items()]
        run_oracle({"quantize": jobs}, cls.tmp)
        cls.mnt = tl.Mount(cls.src)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls.tmp_cm.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def test_tensors_equal_llm_compressor(self):
        for view in VIEWS:
            with self.subTest(view=view):
                want = {checkpoint_name(k): v for k, v in
                        tensors(os.path.join(self.ref,
                                             "mixtral." + view)).items()}
                got = tensors(self.mnt.join("mixtral." + view))
                router = "model.layers.0.block_sparse_moe.gate.weight"
                self.assertEqual(want[router][0], "torch.bfloat16")
                self.assertEqual(sorted(got), sorted(want))
                for k in want:
                    self.assertEqual(got[k], want[k], k)

    def test_config_equals_llm_compressor(self):
        jobs = [[self.mnt.join("mixtral." + v, "config.json"),
                 os.path.join(self.ref, "mixtral." + v, "config.json")]
                for v in VIEWS]
        res = run_oracle({"config": jobs}, self.tmp)["config"]
        for view, r in zip(VIEWS, res):
            with self.subTest(view=view):
                self.assertTrue(r["equal"], (r["ours"], r["theirs"]))
                self.assertIn("model.layers.1.block_sparse_moe.gate",
                              r["ours"]["ignore"])


if __name__ == "__main__":
    if not os.access(VENV_PY, os.X_OK):  # a skip, never a pass (as test_ct)
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)"
              % VENV_PY)
        sys.exit(tl.SKIP)
    tl.main()
