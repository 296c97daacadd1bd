# SPDX-License-Identifier: MIT
"""bitsandbytes views against the real bitsandbytes, on CPU, through a mount.

- Every view (nf4, fp4, nf4_nodq, fp4_nodq, int8) read whole, by random
  ranges and through mmap equals the reference materialisation of bnb_ref.py
  (a torch re-implementation of docs/FORMATS.md, independent of the C code).
- Every quantised weight loads with bitsandbytes (Params4bit.from_prequantized
  / QuantState.from_dict and dequantize_4bit; Linear8bitLt.load_state_dict
  and int8_vectorwise_dequant), dequantises within the format's bound of the
  source, and its codes agree with bnb's own quantize_4bit /
  int8_vectorwise_quant of the same input (rates are printed).
- Tensor names, dtypes, shapes and the quant_state JSON match what
  bitsandbytes' Linear4bit / Linear8bitLt state_dict() writes.
Exits 77 when FUSE, torch, safetensors or bitsandbytes is unavailable.
"""
import json
import mmap
import os
import random
import sys
import unittest
import warnings

import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the hub
try:
    import torch
    from safetensors.torch import load, save_file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import bitsandbytes as bnb
        import bitsandbytes.functional as F
    import bnb_check as bc
    import bnb_ref
    import oracle
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

OUT_ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11,
           torch.float32: 0.0}


def half_gap(qtype):
    """The largest half distance between neighbouring code values."""
    v = bnb_ref.code_table(qtype).sort().values
    return ((v[1:] - v[:-1]) / 2).max().item()


def make_source():
    """Weights of every kind the views meet, with the names loaders use."""
    g = torch.Generator().manual_seed(20240607)

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    ties = torch.zeros(4, 64)
    mids, _ = bnb_ref.bounds(bnb_ref.code_table("nf4"))
    ties[:, 0] = 1.0  # absmax 1: the midpoints below are exact ties
    ties[:, 1:16] = mids
    ties[:, 16:31] = -mids
    special = rnd(9, 70, dtype=torch.float32)
    special[0, 3] = float("nan")
    special[2, 5] = float("inf")
    special[4, 0] = -float("inf")
    big = rnd(4, 64)
    big[1, 7] = 1e5  # overflows float16: the int8 view saturates it
    src = {
        # rows of 100: blocks of 64 straddle rows
        "model.layers.0.self_attn.q_proj.weight": rnd(96, 100),
        "model.layers.0.self_attn.k_proj.weight": rnd(7, 33, dtype=torch.float16),
        # 1172 blocks: 5 nested blocks, the last one partial
        "model.layers.0.mlp.up_proj.weight": rnd(300, 250, dtype=torch.float32),
        "model.layers.0.mlp.gate_proj.weight": rnd(64, 512, scale=0.02),
        "model.layers.1.mlp.down_proj.weight": torch.zeros(16, 64, dtype=torch.bfloat16),
        "model.layers.1.self_attn.o_proj.weight": special,
        "model.layers.1.self_attn.v_proj.weight": rnd(5, 40, dtype=torch.float64),
        "model.layers.2.mlp.gate_proj.weight": ties,
        "model.layers.3.mlp.up_proj.weight": big,
        "model.layers.4.mlp.up_proj.weight": rnd(8, 64).to(torch.float8_e4m3fn),
        # kept as they are
        "model.embed_tokens.weight": rnd(50, 64),
        "lm_head.weight": rnd(50, 64),
        "model.norm.weight": torch.ones(64, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": rnd(96),
        "model.patch_embed.proj.weight": rnd(8, 3, 3, 3),
        "model.layers.0.ids.weight": torch.arange(6, dtype=torch.int64).view(2, 3),
        "model.logit_scale": torch.tensor(2.5),
    }
    quantised = {k for k in src if k.startswith("model.layers.")
                 and k.endswith("proj.weight")}
    return src, quantised


NONFINITE = {"model.layers.1.self_attn.o_proj.weight"}
FP16_OVERFLOW = {"model.layers.3.mlp.up_proj.weight"}


def bnb_input(w):
    """What bnb's quantize_4bit accepts for the same values."""
    if w.dtype == torch.float64:
        return w.float()
    if w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return w.to(torch.bfloat16)
    return w


def unpack(packed, n):
    p = packed.reshape(-1)
    codes = torch.stack([p >> 4, p & 15], dim=1).reshape(-1)
    return codes[:n]


def dequant_def(st, weight):
    """bnb's definition of the weight a QuantState describes (its default
    backend): quant_map[code] * absmax', absmax' = nested_quant_map[q] *
    nested_absmax + offset when nested; float32, then cast to st.dtype."""
    n = 1
    for d in st.shape:
        n *= d
    am = st.absmax
    if st.nested:
        am = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
    codes = unpack(weight, n).long()
    out = st.code[codes] * bnb_ref.expand(am.float(), st.blocksize, n)
    return out.to(st.dtype).reshape(st.shape)


def bnb_cpu_kernel_ok(w, qtype, blocksize):
    """Whether bnb's own CPU dequantize_4bit gets its own quantize_4bit of
    w right (bnb 0.50's C++ kernel does not for some row lengths)."""
    q, st = F.quantize_4bit(bnb_input(w), blocksize=blocksize,
                            quant_type=qtype)
    mine, theirs = F.dequantize_4bit(q, st), dequant_def(st, q)
    return bool((mine.float() - theirs.float()).abs().max() <=
                2.0 ** -6 * (1e-30 + theirs.float().abs().max()))


def parts(sd, name):
    """Weight `name` (key "") and its components (keys without the prefix)."""
    pre = name + "."
    out = {k[len(pre):]: v for k, v in sd.items() if k.startswith(pre)}
    out[""] = sd[name]
    return out


def late_start(data):
    """Where the tensors that need a whole weight's statistics begin."""
    head, base = oracle.header_of(data)
    late = [v["data_offsets"][0] for k, v in head.items()
            if k.endswith((".absmax", ".nested_absmax")) or
            ".quant_state." in k]
    return base + min(late)


class Fixture:
    """m.safetensors: every kind of weight; its odd sizes would leave a
    tensor misaligned in the late run, so its views keep safetensors'
    order. a.safetensors: the same less the odd ones; its nested views
    put the statistics' bytes last (docs/FORMATS.md)."""
    dir = None
    src = None
    quantised = None
    aligned = None

    @classmethod
    def build(cls, root):
        cls.src, cls.quantised = make_source()
        cls.dir = root
        save_file(cls.src, os.path.join(root, "m.safetensors"),
                  metadata={"format": "pt"})
        odd = ("model.layers.1.self_attn.o_proj.weight", "model.logit_scale")
        cls.aligned = {k: v for k, v in cls.src.items() if k not in odd}
        save_file(cls.aligned, os.path.join(root, "a.safetensors"),
                  metadata={"format": "pt"})

    @classmethod
    def source(cls, name):
        src = cls.src if name == "m" else cls.aligned
        return src, {k for k in cls.quantised if k in src}


def report(msg):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


class TestViewsAreTheReference(unittest.TestCase):
    """Bytes of the mounted views == bnb_ref.materialise()."""

    def check_view(self, mnt, view, first=None, name="m"):
        path = mnt.join("%s.%s.safetensors" % (name, view))
        size = os.path.getsize(path)
        rng = random.Random(hash(view) & 0xffff)
        # The reference's nested map is computed here (bnb_check.py), not
        # read from the view: the bytes comparison then checks castfs' map.
        dyn = bc.dynamic_map()
        src, quantised = Fixture.source(name)
        want = bnb_ref.materialise(view, src, quantised, {"format": "pt"},
                                   dyn)
        self.assertEqual(size, len(want))
        if first:
            # The statistics' bytes lie last: read before the codes, they
            # come from a pass of their own; read after them, from what
            # the codes' reads summarised on the way.
            late = late_start(want)
            self.assertLess(late, size)
            with open(path, "rb", buffering=0) as f:
                a, b = (late, size) if first == "late" else (0, late)
                self.assertTrue(os.pread(f.fileno(), b - a, a) == want[a:b],
                                "view %s: %s first" % (view, first))
        with open(path, "rb") as f:
            head = f.read(size)
        sd = load(head)
        if bnb_ref.VIEWS[view][2]:
            self.check_dynmap(
                sd["model.layers.0.self_attn.q_proj.weight.nested_quant_map"])
        self.assertTrue(head == want, "view %s differs from the reference" % view)
        tl.check_ranges(self, path, want, rng, count=150)
        with open(path, "rb") as f:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                self.assertTrue(m[:] == want)
                for _ in range(50):
                    off = rng.randrange(size)
                    n = rng.randrange(1, 9000)
                    self.assertEqual(m[off:off + n], want[off:off + n])
        with open(path, "rb", buffering=0) as f:
            chunks = []
            while True:
                b = f.read(4093)
                if not b:
                    break
                chunks.append(b)
        self.assertTrue(b"".join(chunks) == want)

    def check_dynmap(self, dyn):
        """castfs' map is bnb's dynamic map up to float rounding."""
        ref = F.create_dynamic_map().float()
        self.assertEqual(dyn.dtype, torch.float32)
        self.assertEqual(tuple(dyn.shape), (256,))
        self.assertTrue(bool((dyn[1:] > dyn[:-1]).all()))
        self.assertEqual(dyn[127].item(), 0.0)
        self.assertEqual(dyn[255].item(), 1.0)
        self.assertLess((dyn - ref).abs().max().item(), 1e-6)

    def test_views_equal_reference(self):
        # A fresh daemon per view: every read starts cold.
        for name in ("m", "a"):
            for view in bnb_ref.VIEWS:
                with self.subTest(name=name, view=view), \
                        tl.Mount(Fixture.dir) as mnt:
                    self.check_view(mnt, view, name=name)

    def test_statistics_before_and_after_codes(self):
        for view in ("nf4", "fp4"):
            for first in ("late", "codes"):
                with self.subTest(view=view, first=first), \
                        tl.Mount(Fixture.dir) as mnt:
                    self.check_view(mnt, view, first, name="a")

    def test_statistics_last_when_aligned(self):
        """The views equal these (above); here the late run's place."""
        dyn = bc.dynamic_map()
        for name, last in (("a", True), ("m", False)):
            src, quantised = Fixture.source(name)
            want = bnb_ref.materialise("nf4", src, quantised,
                                       {"format": "pt"}, dyn)
            head, base = oracle.header_of(want)
            after = {k for k, v in head.items() if k != "__metadata__" and
                     base + v["data_offsets"][0] >= late_start(want)}
            late = set().union(*(bnb_ref.late_names(w, "nf4")
                                 for w in quantised))
            self.assertEqual(after == late, last, name)


class TestBitsandbytesLoads(unittest.TestCase):
    """The real bitsandbytes loads every quantised weight of the views."""

    @classmethod
    def setUpClass(cls):
        cls.views = {}
        with tl.Mount(Fixture.dir) as mnt:
            for view in bnb_ref.VIEWS:
                with open(mnt.join("m.%s.safetensors" % view), "rb") as f:
                    cls.views[view] = load(f.read())

    def test_4bit_loads_within_bound_and_agrees(self):
        for view, (kind, qtype, nested) in bnb_ref.VIEWS.items():
            if kind != "bnb4":
                continue
            sd = self.views[view]
            same = total = 0
            worst = 0.0
            for name in sorted(Fixture.quantised):
                s, t, w = self.check_4bit(sd, name, qtype, nested)
                same, total, worst = same + s, total + t, max(worst, w)
            report("%s: codes agree with bnb quantize_4bit: %d/%d (%.5f%%); "
                   "max error / bound %.6f" % (view, same, total,
                                               100.0 * same / total, worst))
            self.assertGreater(same / total, 0.999)
            self.assertLessEqual(worst, 1.0)

    def check_4bit(self, sd, name, qtype, nested):
        w = Fixture.src[name]
        qs = parts(sd, name)
        weight = qs.pop("")
        p = bnb.nn.Params4bit.from_prequantized(
            data=weight, quantized_stats=qs, requires_grad=False, device="cpu")
        st = p.quant_state
        self.assertEqual((st.quant_type, st.blocksize, st.nested),
                         (qtype, 64, nested))
        self.assertEqual(tuple(st.shape), tuple(w.shape))
        # The bound below holds for any stored absmax: check it first.
        bc.check_absmax(self, st, bnb_input(w).float().reshape(-1), name)
        deq = dequant_def(st, p.data)
        self.assertEqual(deq.dtype, getattr(torch, bnb_ref.state_dtype(w.dtype)))
        self.check_public_dequant(w, p, deq, qtype)
        worst = self.check_4bit_bound(w, deq, st, qtype)
        x = torch.randn(3, w.shape[1]).to(deq.dtype)
        out = bnb.matmul_4bit(x, p.t(), quant_state=st)
        ref = x.float() @ deq.float().t()
        self.assertLess((out.float() - ref).abs().max().item(),
                        1e-2 * (1 + ref.abs().max().item()))
        if name in NONFINITE:
            return 0, 0, worst
        n = w.numel()
        mine = unpack(weight, n)
        theirs = unpack(F.quantize_4bit(bnb_input(w), blocksize=64,
                                        quant_type=qtype)[0], n)
        diff = (mine != theirs).nonzero().reshape(-1)
        # bnb divides in a partial last block where full blocks multiply by
        # the reciprocal: only there may a code differ (an exact tie).
        self.assertTrue(bool((diff >= n - n % 64).all()) if n % 64 else
                        diff.numel() == 0, "%s: codes differ at %s" %
                        (name, diff[:10].tolist()))
        return n - diff.numel(), n, worst

    def check_public_dequant(self, w, p, deq, qtype):
        """F.dequantize_4bit, what loaders call, gives the definition, or
        gets bnb's own quantisation of the same weight wrong too."""
        pub = F.dequantize_4bit(p.data, p.quant_state)
        self.assertEqual((pub.dtype, pub.shape), (deq.dtype, deq.shape))
        if torch.equal(pub[torch.isfinite(deq)], deq[torch.isfinite(deq)]):
            return
        report("  bnb CPU dequantize_4bit misreads %s %s (blocksize %d); "
               "its own quantisation too: %s" %
               (tuple(w.shape), qtype, p.quant_state.blocksize,
                not bnb_cpu_kernel_ok(w, qtype, p.quant_state.blocksize)))
        self.assertFalse(bnb_cpu_kernel_ok(w, qtype, p.quant_state.blocksize))

    def check_4bit_bound(self, w, deq, st, qtype):
        """|W - x| <= absmax * half gap + |absmax' - absmax| (+ output
        rounding) per element, with absmax the block's finite absmax."""
        x = w.float().reshape(-1)
        n = x.numel()
        am = bnb_ref.block_absmax(x, 64)
        if st.nested:
            am2 = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        else:
            am2 = st.absmax
        amx, am2x = (bnb_ref.expand(a.float(), 64, n) for a in (am, am2))
        d = deq.float().reshape(-1)
        ulp = OUT_ULP[deq.dtype]
        bound = (amx * half_gap(qtype) + (am2x - amx).abs() +
                 am2x.abs() * ulp + 1e-6 * amx + 1e-30)
        fin = torch.isfinite(x)
        err = (d - x).abs()
        worst = (err[fin] / bound[fin]).max().item()
        # NaN policy: NaN -> 0.0, +-Inf -> +-absmax' (the codes of +-1.0).
        self.assertTrue(bool((d[torch.isnan(x)] == 0).all()))
        inf = torch.isinf(x)
        self.assertTrue(torch.equal(d[inf], (torch.sign(x[inf]) *
                                             am2x[inf]).to(deq.dtype).float()))
        return worst

    def test_int8_loads_within_bound_and_agrees(self):
        sd = self.views["int8"]
        same = total = 0
        worst = 0.0
        for name in sorted(Fixture.quantised):
            w = Fixture.src[name]
            mod = name[:-len("weight")]
            layer = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=False,
                                        has_fp16_weights=False).to("cpu")
            layer.load_state_dict({"weight": sd[name], "SCB": sd[mod + "SCB"],
                                   "weight_format": sd[mod + "weight_format"]})
            cb, scb = layer.weight.data, layer.weight.SCB
            self.assertEqual(cb.dtype, torch.int8)
            deq = F.int8_vectorwise_dequant(cb, scb)
            x16 = w.to(torch.float16).float()
            fin = torch.isfinite(x16)
            # Half a step, and the float32 rounding of the scale itself.
            bound = scb[:, None] / 127 * (0.5 + 1e-4) + 1e-30
            err = (deq - x16).abs()
            worst = max(worst, (err[fin] / bound.expand_as(x16)[fin]).max().item())
            if name in NONFINITE or name in FP16_OVERFLOW:
                continue
            theirs, stats, _ = F.int8_vectorwise_quant(w.to(torch.float16))
            self.assertTrue(torch.equal(stats, scb))
            same += (theirs == cb).sum().item()
            total += cb.numel()
        report("int8: codes agree with bnb int8_vectorwise_quant: %d/%d; "
               "max error / bound %.6f" % (same, total, worst))
        self.assertEqual(same, total)
        self.assertLessEqual(worst, 1.0)


class TestLayoutIsBitsandbytes(unittest.TestCase):
    """Names, dtypes, shapes and JSON as bitsandbytes' own state_dict()."""

    NAME = "model.layers.0.self_attn.q_proj.weight"

    @classmethod
    def setUpClass(cls):
        cls.views = {}
        with tl.Mount(Fixture.dir) as mnt:
            for view in bnb_ref.VIEWS:
                with open(mnt.join("m.%s.safetensors" % view), "rb") as f:
                    cls.views[view] = load(f.read())

    def bnb_state_dict(self, qtype, nested):
        w = Fixture.src[self.NAME]
        lin = bnb.nn.Linear4bit(w.shape[1], w.shape[0], bias=False,
                                compress_statistics=nested, quant_type=qtype)
        lin.weight = bnb.nn.Params4bit(w, requires_grad=False,
                                       compress_statistics=nested,
                                       quant_type=qtype)
        return lin.to("cpu").state_dict()

    def test_4bit_tensor_set_and_json(self):
        for view, (kind, qtype, nested) in bnb_ref.VIEWS.items():
            if kind != "bnb4":
                continue
            with self.subTest(view=view):
                theirs = self.bnb_state_dict(qtype, nested)
                mine = parts(self.views[view], self.NAME)
                theirs = {k[len("weight."):] if k != "weight" else "": v
                          for k, v in theirs.items()}
                self.assertEqual(sorted(mine), sorted(theirs))
                for k in mine:
                    self.assertEqual((mine[k].dtype, tuple(mine[k].shape)),
                                     (theirs[k].dtype, tuple(theirs[k].shape))
                                     if "quant_state" not in k else
                                     (theirs[k].dtype, tuple(mine[k].shape)))
                self.assertTrue(torch.equal(mine["quant_map"],
                                            theirs["quant_map"]))
                key = "quant_state.bitsandbytes__" + qtype
                self.check_json(bytes(mine[key].tolist()),
                                bytes(theirs[key].tolist()))

    def check_json(self, mine, theirs):
        a, b = json.loads(mine), json.loads(theirs)
        self.assertEqual(list(a), list(b))
        if "nested_offset" not in b:
            self.assertEqual(mine, theirs)
            return
        # Same text but for the value and the padding of nested_offset.
        num = repr(a["nested_offset"])
        head = theirs[:-1 - len(repr(b["nested_offset"]))]
        self.assertEqual(mine, head + num.encode() +
                         b" " * (bnb_ref.OFFSET_WIDTH - len(num)) + b"}")
        self.assertAlmostEqual(a["nested_offset"], b["nested_offset"],
                               delta=1e-5 * b["nested_offset"])

    def test_int8_tensor_set(self):
        w = Fixture.src[self.NAME]
        lin = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=True,
                                  has_fp16_weights=False)
        lin.weight = bnb.nn.Int8Params(w, requires_grad=False,
                                       has_fp16_weights=False)
        theirs = lin.to("cpu").state_dict()
        mod = self.NAME[:-len("weight")]
        sd = self.views["int8"]
        for k, v in theirs.items():
            if k == "bias":
                k, v = "bias", Fixture.src[mod + "bias"]
            mk = mod + k
            self.assertIn(mk, sd)
            self.assertEqual((sd[mk].dtype, tuple(sd[mk].shape)),
                             (v.dtype, tuple(v.shape)), k)
        self.assertEqual(sd[mod + "weight_format"].item(), 0)

    def test_kept_tensors_unchanged(self):
        for view, sd in self.views.items():
            for k, v in Fixture.src.items():
                if k in Fixture.quantised:
                    continue
                with self.subTest(view=view, tensor=k):
                    self.assertEqual(sd[k].dtype, v.dtype)
                    self.assertTrue(torch.equal(sd[k].view(torch.uint8),
                                                v.view(torch.uint8))
                                    if v.dim() else torch.equal(sd[k], v))


class TestRules(unittest.TestCase):
    """A config file's rules and blocksize override the defaults."""

    def test_rules_and_blocksize(self):
        cfg = os.path.join(Fixture.dir, "..", "bnb-views.json")
        with open(cfg, "w") as f:
            json.dump({"views": {"nf4x": {
                "base": "nf4", "blocksize": 128,
                "rules": [{"match": "lm_head.weight", "convert": True},
                          {"match": "*.k_proj.weight", "convert": False}]}}}, f)
        with tl.Mount(Fixture.dir, options=["config=" + cfg]) as mnt:
            with open(mnt.join("m.nf4x.safetensors"), "rb") as f:
                sd = load(f.read())
        self.assertEqual(sd["model.layers.0.self_attn.k_proj.weight"].dtype,
                         torch.float16)
        for name in ("lm_head.weight", "model.layers.0.mlp.up_proj.weight"):
            qs = parts(sd, name)
            weight = qs.pop("")
            p = bnb.nn.Params4bit.from_prequantized(
                data=weight, quantized_stats=qs, requires_grad=False,
                device="cpu")
            self.assertEqual(p.quant_state.blocksize, 128)
            deq = dequant_def(p.quant_state, p.data).float()
            x = Fixture.src[name].float()
            am = bnb_ref.block_absmax(x.reshape(-1), 128)
            bound = bnb_ref.expand(am, 128, x.numel()) * 0.17 + 0.02
            err = (deq - x).abs().reshape(-1)
            self.assertTrue(bool((err <= bound).all()))


def main():
    with tl.tempdir() as root:
        src = os.path.join(root, "src")
        os.mkdir(src)
        Fixture.build(src)
        tl.main()


if __name__ == "__main__":
    main()
