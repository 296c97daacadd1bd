# SPDX-License-Identifier: MIT
"""bitsandbytes on CUDA against castfs, through a mount: the GPU paths a CPU
cannot check. Runs where torch sees a CUDA device (`device` machines);
exits 77 elsewhere, as CI's machines have none.

castfs's bitsandbytes views follow bnb's rules (docs/FORMATS.md) and are
tested against its CPU backend everywhere (test_bnb.py); most checkpoints
are quantised, and most loads run, on CUDA. Here:

- Quantising views (X.nf4/fp4/nf4_nodq/fp4_nodq/int8 of test_bnb's source
  of odd shapes, ties, zeros): the 4-bit codes equal bnb's CUDA
  quantize_4bit (but where FORMATS.md says castfs differs on purpose:
  non-finite weights, and the codes of an all-zero block, whose absmax 0
  makes every code decode to 0), the absmax equals CUDA's, a double
  quantisation's statistics equal CUDA's within the nearest-entry rule,
  and CUDA's dequantize_4bit of the view's own QuantState is within the
  format's bound of the source; int8 codes and SCB equal CUDA's
  int8_vectorwise_quant.
- Model folders: test_bnb_heads' models (Mixtral, Qwen3-MoE, a
  classification head, CLIP's projection, GPT-2's Conv1D) load from
  DIR.nf4/ and DIR.int8/ with transformers on CUDA as transformers +
  bitsandbytes quantising the source on CUDA does (classes, parameters,
  logits); a diffusers UNet's unet.nf4/ and unet.int8/ load with
  diffusers on CUDA, whose bitsandbytes quantizer runs unpatched there
  (test_modeldir patches its environment check on CPU).
- bitsandbytes 4-bit sources quantised on CUDA (how such checkpoints are
  made): every bf16/fp16/fp32 view equals CUDA's dequantize_4bit, the
  kernel loaders run, bit for bit; a Llama quantised by transformers on
  CUDA loads from DIR.bf16/ with every weight equal to the kernel's.

Each check collects every difference before it asserts, so one run on a
lent machine tells all.
"""
import gc
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
        import bitsandbytes.functional as F
        from bitsandbytes.functional import QuantState
        from safetensors.torch import load_file, save_file
        import transformers as T
        import diffusers
        import test_bnb as TB
        import test_bnb4_src as B4
        import test_bnb_heads as H
        from test_modeldir import load_quietly, no_avx512_repack
        from quant_src_common import bits, load_quiet
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

# CASTFS_GPU_TEST_DEVICE=cpu runs the same checks on the CPU: a dry run of
# this file's own code before a lent machine's minutes are spent on it.
DEV = os.environ.get("CASTFS_GPU_TEST_DEVICE", "cuda")
if DEV == "cuda" and not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(tl.SKIP)

CUDA = torch.device(DEV)
Q4 = {"nf4": ("nf4", True), "fp4": ("fp4", True),
      "nf4_nodq": ("nf4", False), "fp4_nodq": ("fp4", False)}


def components(sd, k):
    """QuantState.from_dict's input for weight @k of state dict @sd."""
    return {n[len(k) + 1:]: v.to(CUDA) for n, v in sd.items()
            if n.startswith(k + ".")}


def zero_blocks(x, bs):
    """Element mask of the blocks whose absmax is 0."""
    am = TB.bnb_ref.block_absmax(x.reshape(-1).float().cpu(), bs)
    return TB.bnb_ref.expand(am == 0, bs, x.numel())


class Quantising(unittest.TestCase):
    """X.<bnb view> of test_bnb's source against bnb's CUDA quantisers."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.root = cls._tmp.__enter__()
        cls.src, cls.quantised = TB.make_source()
        save_file(cls.src, os.path.join(cls.root, "m.safetensors"),
                  metadata={"format": "pt"})
        cls.mnt = tl.Mount(cls.root)

    @classmethod
    def tearDownClass(cls):
        rc = cls.mnt.unmount()
        cls._tmp.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def exact_names(self):
        return sorted(k for k in self.quantised if k not in TB.NONFINITE)

    def test_4bit_equals_cuda(self):
        report = []
        for view, (qtype, nested) in Q4.items():
            got = load_file(self.mnt.join("m.%s.safetensors" % view))
            for k in self.exact_names():
                x = TB.bnb_input(self.src[k]).to(CUDA)
                n = x.numel()
                q, st = F.quantize_4bit(x, blocksize=64, quant_type=qtype,
                                        compress_statistics=nested)
                mine = TB.unpack(got[k], n)
                theirs = TB.unpack(q.cpu(), n)
                diff = (mine != theirs) & ~zero_blocks(x, 64)
                if diff.any():
                    report.append("%s %s: %d of %d codes differ, first at "
                                  "%s" % (view, k, int(diff.sum()), n,
                                          diff.nonzero()[:5].reshape(-1)
                                          .tolist()))
                qs = QuantState.from_dict(components(got, k), device=CUDA)
                if nested:
                    self.nested_apart(report, view, k, qs, st)
                elif not torch.equal(qs.absmax, st.absmax):
                    report.append("%s %s: absmax differs" % (view, k))
                # CUDA's kernel on the view's own state: within the bound.
                deq = F.dequantize_4bit(got[k].to(CUDA), qs).float().cpu()
                ref = TB.dequant_def(qs, got[k].to(CUDA)).float().cpu()
                if not torch.equal(deq, ref):
                    d = (deq != ref).sum()
                    report.append("%s %s: CUDA dequantize_4bit differs from "
                                  "its definition at %d elements" %
                                  (view, k, int(d)))
                self.within_bound(report, view, k, qtype, deq, qs)
        print("\n".join(report) or "4-bit: every code, absmax and "
              "dequantized value as CUDA's")
        self.assertEqual(report, [])

    def nested_apart(self, report, view, k, qs, st):
        """Double quantisation: offset and nested absmax as CUDA's (their
        sums' order may differ: a relative 1e-6), 8-bit absmax codes the
        same or one map entry apart at < 5 % of the blocks (FORMATS.md:
        castfs takes the nearest entry)."""
        rel = abs(float(qs.offset) - float(st.offset)) / max(
            abs(float(st.offset)), 1e-30)
        na = (qs.state2.absmax.float() - st.state2.absmax.float()).abs()
        if rel > 1e-6 or float(na.max()) > 1e-6 * float(
                st.state2.absmax.abs().max()):
            report.append("%s %s: offset %r vs CUDA %r, nested absmax "
                          "apart by %g" % (view, k, float(qs.offset),
                                           float(st.offset),
                                           float(na.max())))
        a = qs.absmax.long().cpu()
        b = st.absmax.long().cpu()
        # Where a nested block's absmax is 0 (every block absmax equal to
        # the offset: zeros, test_bnb's ties) any code decodes to the
        # offset; bnb's codes there come from 0 / 0.
        flat = (st.state2.absmax == 0).cpu().repeat_interleave(
            st.state2.blocksize)[:a.numel()]
        steps = torch.where(flat, 0, (a - b).abs())
        if int(steps.max()) > 1 or float((steps > 0).float().mean()) >= 0.05:
            report.append("%s %s: absmax codes apart at %d of %d blocks, "
                          "by up to %d" % (view, k, int((steps > 0).sum()),
                                           a.numel(), int(steps.max())))
        elif int(steps.max()):
            print("%s %s: absmax codes one entry from CUDA's at %d of %d "
                  "blocks" % (view, k, int((steps > 0).sum()), a.numel()))

    def within_bound(self, report, view, k, qtype, deq, qs):
        """|dequantized - source| <= the block's absmax * half the largest
        code gap + how far the stored absmax (8-bit when nested) is from
        the block's + the output dtype's rounding."""
        x = TB.bnb_input(self.src[k]).float().reshape(-1).cpu()
        n = x.numel()
        am = qs.absmax.float()
        if qs.nested:
            am = (F.dequantize_blockwise(qs.absmax, qs.state2) +
                  qs.offset).float()
        am = TB.bnb_ref.expand(am.cpu(), qs.blocksize, n)
        true = TB.bnb_ref.expand(TB.bnb_ref.block_absmax(x, qs.blocksize),
                                 qs.blocksize, n)
        bound = (true * TB.half_gap(qtype) * (1 + 1e-6) + (am - true).abs()
                 + TB.OUT_ULP[qs.dtype] * am + 1e-30)
        err = (deq.reshape(-1) - x).abs()
        bad = int((err > bound).sum())
        if bad:
            report.append("%s %s: %d elements beyond the bound" %
                          (view, k, bad))

    def test_int8_equals_cuda(self):
        got = load_file(self.mnt.join("m.int8.safetensors"))
        report = []
        for k in self.exact_names():
            if k in TB.FP16_OVERFLOW:
                continue
            w = self.src[k]
            if w.dtype == torch.float64:
                w = w.float()
            codes, scb, _ = F.int8_vectorwise_quant(
                w.to(CUDA).half().reshape(w.shape[0], -1))
            mod = k[:-len("weight")]
            if not torch.equal(got[k], codes.cpu().reshape(w.shape)):
                d = got[k] != codes.cpu().reshape(w.shape)
                report.append("int8 %s: %d codes differ" % (k, int(d.sum())))
            if not torch.equal(got[mod + "SCB"], scb.float().cpu()):
                report.append("int8 %s: SCB differs" % k)
        print("\n".join(report) or "int8: every code and SCB as CUDA's")
        self.assertEqual(report, [])


class HeadsCuda(H.Heads):
    """test_bnb_heads' model folders, loaded and quantised on CUDA."""
    DEVICE = DEV


class DiffusersCuda(unittest.TestCase):
    """unet.nf4/ and unet.int8/ with diffusers on CUDA, unpatched."""

    def setUp(self):
        if DEV == "cpu":  # the dry run: as test_modeldir does on a CPU
            from diffusers.quantizers.bitsandbytes import bnb_quantizer as BQ
            for q in (BQ.BnB4BitDiffusersQuantizer,
                      BQ.BnB8BitDiffusersQuantizer):
                q.validate_environment = lambda self, *a, **k: None

    def test_unet_views(self):
        with tl.tempdir() as root:
            torch.manual_seed(0)
            unet = diffusers.UNet2DConditionModel(
                sample_size=16, in_channels=4, out_channels=4,
                layers_per_block=1, block_out_channels=(32, 64),
                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                cross_attention_dim=64, attention_head_dim=8,
                norm_num_groups=32)
            unet.to(torch.bfloat16).save_pretrained(
                os.path.join(root, "unet"))
            with tl.Mount(root) as m:
                for view, kw in (
                        ("nf4", dict(load_in_4bit=True,
                                     bnb_4bit_quant_type="nf4",
                                     bnb_4bit_use_double_quant=True,
                                     bnb_4bit_compute_dtype=torch.bfloat16)),
                        ("int8", dict(load_in_8bit=True))):
                    with self.subTest(view=view):
                        self.check(m, root, view, kw)
                    gc.collect()

    def check(self, m, root, view, kw):
        cls = diffusers.UNet2DConditionModel
        got = load_quietly(self, cls, m.join("unet." + view),
                           torch_dtype=torch.bfloat16,
                           device_map=DEV if DEV == "cpu" else None)
        ref = cls.from_pretrained(
            os.path.join(root, "unet"), torch_dtype=torch.bfloat16,
            device_map=DEV if DEV == "cpu" else None, quantization_config=diffusers.BitsAndBytesConfig(**kw))
        kinds = {n: type(x).__name__ for n, x in ref.named_modules()}
        self.assertIn("Linear4bit" if view == "nf4" else "Linear8bitLt",
                      set(kinds.values()))
        self.assertEqual({n: type(x).__name__
                          for n, x in got.named_modules()}, kinds)
        params = dict(got.named_parameters())
        for k, p in ref.named_parameters():
            self.assertEqual(params[k].device.type, DEV, k)
            self.assertTrue(torch.equal(params[k], p), (view, k))
        apart = H.stats_apart(got, ref) if view == "nf4" else (0, 0.0)
        if DEV == "cpu":
            no_avx512_repack(got)
            no_avx512_repack(ref)
        g = torch.Generator().manual_seed(2)
        x = {"sample": torch.randn(1, 4, 16, 16, generator=g),
             "timestep": torch.tensor([10]),
             "encoder_hidden_states": torch.randn(1, 8, 64, generator=g)}
        x = {k: v.to(CUDA, torch.bfloat16 if v.is_floating_point()
                     else v.dtype) for k, v in x.items()}
        with torch.no_grad():
            want = ref(**x).sample.float()
            have = got(**x).sample.float()
        if apart[0]:
            print("unet.%s: absmax one entry apart at %.2f %% of blocks" %
                  (view, 100 * apart[0]))
            self.assertLess(apart[0], 0.05)
            rel = float((have - want).norm() / want.norm())
            self.assertLess(rel, 0.01)
        else:
            self.assertTrue(torch.equal(have, want), view)


class Bnb4SourcesCuda(unittest.TestCase):
    """4-bit checkpoints quantised on CUDA, served dequantized."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.root = cls._tmp.__enter__()
        cls.srcdir = os.path.join(cls.root, "src")
        os.mkdir(cls.srcdir)
        cls.singles = {
            name: B4.make_single(
                os.path.join(cls.srcdir, name + ".safetensors"), *args,
                seed=i, device=CUDA)
            for i, (name, args) in enumerate(B4.SINGLES.items())}
        torch.manual_seed(11)
        plain = os.path.join(cls.root, "plain")
        T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=97, hidden_size=128, intermediate_size=256,
            num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)).to(
                torch.bfloat16).save_pretrained(plain)
        cls.model = load_quiet(plain, device_map=DEV,
                               quantization_config=T.BitsAndBytesConfig(
                                   load_in_4bit=True,
                                   bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16))
        cls.model.save_pretrained(os.path.join(cls.srcdir, "llama-nf4"),
                                  max_shard_size="60KB")
        cls.mnt = tl.Mount(cls.srcdir)

    @classmethod
    def tearDownClass(cls):
        del cls.model
        gc.collect()
        rc = cls.mnt.unmount()
        cls._tmp.__exit__(None, None, None)
        assert rc == 0, "castfs exited with %d" % rc

    def test_single_files_equal_the_kernel(self):
        report = []
        for name, sd in self.singles.items():
            weights = [k[:k.index(B4.STATE)] for k in sd if B4.STATE in k]
            for v, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16),
                          ("fp32", torch.float32)):
                got = load_file(self.mnt.join("%s.%s.safetensors" %
                                              (name, v)))
                for w in weights:
                    qs = QuantState.from_dict(components(sd, w), device=CUDA)
                    want = F.dequantize_4bit(sd[w].to(CUDA), qs).to(dt).cpu()
                    if not torch.equal(bits(got[w]), bits(want)):
                        d = got[w].float() != want.float()
                        report.append("%s.%s %s: %d of %d differ from CUDA's "
                                      "dequantize_4bit" % (
                                          name, v, w, int(d.sum()),
                                          d.numel()))
        print("\n".join(report) or "bnb4 sources: every view as CUDA's "
              "dequantize_4bit")
        self.assertEqual(report, [])

    def test_model_folder_equals_the_kernel(self):
        view = self.mnt.join("llama-nf4.bf16")
        got = {}
        for n in sorted(os.listdir(view)):
            if n.endswith(".safetensors"):
                got.update(load_file(os.path.join(view, n)))
        ref = {}
        for name, mod in self.model.named_modules():
            w = getattr(mod, "weight", None)
            if getattr(w, "quant_state", None) is not None:
                ref[name + ".weight"] = F.dequantize_4bit(
                    w.data, w.quant_state).cpu()
        self.assertEqual(len(ref), 14)
        bad = [k for k, t in ref.items()
               if got[k].dtype != torch.bfloat16 or
               not torch.equal(bits(got[k]), bits(t))]
        self.assertEqual(bad, [])
        model = load_quiet(view, device_map=DEV)
        ids = torch.arange(20, device=CUDA).reshape(1, 20)
        with torch.no_grad():
            a = model(ids).logits.float()
            b = self.model(ids).logits.float()
        # the same weights; bnb's 4-bit matmul and a bf16 one may round
        # apart, never by much
        rel = float((a - b).norm() / b.norm())
        print("llama-nf4.bf16: logits %.2e apart (relative) from the "
              "quantised model's on CUDA" % rel)
        self.assertLess(rel, 0.02)
        del model
        gc.collect()


if __name__ == "__main__":
    tl.main()
