# SPDX-License-Identifier: MIT
"""Model-directory views loaded by unmodified transformers and diffusers.

The models are built here with the libraries themselves (random weights,
save_pretrained): a tiny Llama (bf16, two shards), BERT (float32, one
file) and T5 (float32; transformers keeps its "wo" Linears unquantised)
with transformers; a tiny UNet2DConditionModel (bf16) and Flux
transformer (bf16, six shards) and a DDPM pipeline (model_index.json,
unet/, scheduler/) with diffusers. For every listed view of every model:

- from_pretrained on the mounted DIR.<view> loads with no load report and
  no log message about missing, unexpected or mismatched keys (captured
  from the libraries' loggers; a negative control proves the capture);
- every parameter equals the source converted the way the loader would
  see it: bit for bit for casts; for bitsandbytes, every Linear the
  loader built as Linear4bit / Linear8bitLt dequantises (through
  bitsandbytes) within the format's bound of the source, and every other
  tensor is bit-identical;
- a forward pass on fixed inputs is close to the source model's.

Also: the variant spellings (variant="fp8" over X.safetensors.index.fp8.json
and X.fp8.safetensors), the rewritten index (weight_map = the shards'
tensors, exact total_size, json.dumps(indent=2, sort_keys=True) text), and
config.json (quantization_config == BitsAndBytesConfig(...).to_dict(),
dtype rule, the rest untouched). diffusers refuses bitsandbytes on a
CPU-only machine; as docs/LOADERS.md §4.1 says, the test patches its
validate_environment (test side only) and loads with device_map="cpu".
"""
import contextlib
import gc
import json
import logging
import os
import re
import shutil
import sys
import unittest
import warnings

import bnb_check as bc
import castfs_testlib as tl

os.environ.setdefault("HF_HUB_OFFLINE", "1")
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import bitsandbytes as bnb
        import bitsandbytes.functional as F
        import transformers
        from transformers import (AutoModel, AutoModelForCausalLM, BertConfig,
                                  BertModel, LlamaConfig, LlamaForCausalLM,
                                  T5Config, T5ForConditionalGeneration)
        import diffusers
        from diffusers import (DDPMPipeline, DDPMScheduler,
                               FluxTransformer2DModel, UNet2DConditionModel,
                               UNet2DModel)
        from diffusers.quantizers.bitsandbytes import bnb_quantizer as BQ
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(tl.SKIP)

CASTS = {"bf16": torch.bfloat16, "fp16": torch.float16,
         "fp32": torch.float32, "fp8": torch.float8_e4m3fn,
         "fp8_e5m2": torch.float8_e5m2}
BNB = {"nf4": ("nf4", True), "fp4": ("fp4", True), "int8": None}
# Every bitsandbytes view of a model directory: (quant type, double quant).
BNB_ALL = {"nf4": ("nf4", True), "fp4": ("fp4", True),
           "nf4_nodq": ("nf4", False), "fp4_nodq": ("fp4", False),
           "int8": None}
INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Forward-pass closeness, relative L2 error against the source model;
# from measured errors of this setup with a margin (see the log). Largest
# measured: nf4 0.17 (t5), fp4 0.19 (t5), int8 0.017 (unet), fp8 0.11
# (unet), fp8_e5m2 0.20 (unet). The parameters themselves are checked
# exactly (codes, recomputed statistics); this only guards the wiring.
FORWARD_TOL = {"bf16": 0.01, "fp32": 0.0, "fp16": 0.002, "fp8": 0.2,
               "fp8_e5m2": 0.35, "nf4": 0.3, "nf4_nodq": 0.3, "fp4": 0.35,
               "fp4_nodq": 0.35, "int8": 0.05}

KEY_TROUBLE = re.compile(r"missing|unexpected|mismatch|not initiali|"
                         r"newly initiali|not used|were not|LOAD REPORT",
                         re.IGNORECASE)


def report(msg):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        self.msgs.append("%s: %s" % (record.name, record.getMessage()))


@contextlib.contextmanager
def captured():
    """Every WARNING+ log record of transformers/diffusers and every
    Python warning raised inside, as strings."""
    h = _Records()
    loggers = [logging.getLogger(n) for n in ("transformers", "diffusers")]
    for lg in loggers:
        lg.addHandler(h)
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            yield h.msgs
        h.msgs.extend(str(w.message) for w in ws)
    finally:
        for lg in loggers:
            lg.removeHandler(h)


def load_quietly(test, cls, path, **kw):
    """cls.from_pretrained(path) that must report no key trouble."""
    with captured() as msgs:
        model, info = cls.from_pretrained(path, output_loading_info=True, **kw)
    trouble = [m for m in msgs if KEY_TROUBLE.search(m)]
    test.assertEqual(trouble, [], "%s: loader reported key problems" % path)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
              "error_msgs"):
        test.assertFalse(info.get(k), "%s: %s = %s" % (path, k, info.get(k)))
    return model


def bits(t):
    return t.contiguous().view(INT[t.element_size()])


def assert_same(test, got, want, what):
    test.assertEqual(got.dtype, want.dtype, what)
    test.assertEqual(tuple(got.shape), tuple(want.shape), what)
    test.assertTrue(torch.equal(bits(got), bits(want)), "%s differs" % what)


def source_state(d):
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors") and f.count(".") == 1:
            sd.update(load_file(os.path.join(d, f)))
        elif re.match(r"^[^.]+-\d+-of-\d+\.safetensors$", f):
            sd.update(load_file(os.path.join(d, f)))
    return sd


def half_gap(qtype):
    v = F.get_4bit_type(qtype, device="cpu").float().sort().values
    return ((v[1:] - v[:-1]) / 2).max().item()


def dequant_def(st, packed):
    """bitsandbytes' definition of the weight a QuantState describes (its
    pure-torch backend): code[c] * absmax per flat block of blocksize,
    absmax = dequantize_blockwise(absmax, state2) + offset when nested.
    Used because bnb 0.50's CPU C++ dequantize_4bit gets rows shorter
    than a block wrong (e.g. [128, 32]) even for its own quantize_4bit."""
    n = st.shape.numel()
    p = packed.reshape(-1)
    codes = torch.stack([p >> 4, p & 15], dim=1).reshape(-1)[:n].long()
    am = st.absmax.float()
    if st.nested:
        am = F.dequantize_blockwise(st.absmax, st.state2).float() + st.offset
    out = st.code.float()[codes] * am.repeat_interleave(st.blocksize)[:n]
    return out.to(st.dtype), am


def bnb_kernel_ok(src, qtype):
    """Whether bnb's own CPU dequantize_4bit inverts its own quantize_4bit
    of @src as its definition says."""
    q, st = F.quantize_4bit(src, blocksize=64, quant_type=qtype)
    return torch.equal(F.dequantize_4bit(q, st).reshape(-1),
                       dequant_def(st, q)[0])


def check_4bit(test, name, mod, src, qtype, nested):
    """Dequantised as bitsandbytes defines it (and through its
    dequantize_4bit where that is right), each element is within its
    block's bound: absmax * (largest half code gap) + the error of the
    stored (double-quantised) absmax + the output dtype's rounding. That
    bound holds for any stored absmax, so the absmax (and its double
    quantisation) is recomputed from the source and the codes are those
    of bitsandbytes' own quantize_4bit (bnb_check.py)."""
    st = mod.weight.quant_state
    test.assertEqual(tuple(st.shape), tuple(src.shape), name)
    test.assertEqual(st.dtype, src.dtype, name)
    test.assertEqual((st.quant_type, st.blocksize, st.nested),
                     (qtype, 64, nested), name)
    bc.check_absmax(test, st, src.float().reshape(-1), name)
    bc.check_codes(test, mod.weight.data, src, qtype, st.blocksize, name)
    deq, am2 = dequant_def(st, mod.weight.data)
    if bnb_kernel_ok(src, qtype):
        test.assertTrue(torch.equal(
            F.dequantize_4bit(mod.weight.data, st).reshape(-1), deq), name)
    deq = deq.float()
    x = src.float().reshape(-1)
    n, bs = x.numel(), st.blocksize
    pad = (-n) % bs
    am = torch.cat([x.abs(), x.new_zeros(pad)]).view(-1, bs).amax(1)
    per = lambda v: v.repeat_interleave(bs)[:n]
    ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11,
           torch.float32: 2.0 ** -24}[src.dtype]
    bound = per(am) * half_gap(qtype) + per((am2 - am).abs()) + \
        deq.abs() * ulp + 1e-30
    err = (deq - x).abs()
    test.assertTrue(bool((err <= bound * (1 + 1e-5)).all()),
                    "%s: %d elements out of bound" % (name,
                                                      int((err > bound).sum())))


def check_int8(test, name, mod, src):
    cb, scb = mod.weight.data, mod.weight.SCB
    test.assertEqual(cb.dtype, torch.int8, name)
    test.assertEqual(tuple(cb.shape), tuple(src.shape), name)
    x16 = src.to(torch.float16).float()
    deq = cb.float() * scb.float().view(-1, 1) / 127
    bound = scb.float().view(-1, 1) / 254 * (1 + 1e-5) + 1e-7
    test.assertTrue(bool(((deq - x16).abs() <= bound).all()), name)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def no_avx512_repack(model):
    """docs/LOADERS.md §2.4: keep Linear4bit's eval forward from
    rewriting its weights (and needing aligned shapes)."""
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False


# ---- the models ----

def build_models(root):
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=64, tie_word_embeddings=False))
    llama.to(torch.bfloat16).save_pretrained(os.path.join(root, "llama"),
                                             max_shard_size="100KB")
    bert = BertModel(BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, vocab_size=128, max_position_embeddings=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    bert.save_pretrained(os.path.join(root, "bert"))  # float32
    t5 = T5ForConditionalGeneration(T5Config(
        vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
        num_heads=4, dropout_rate=0.0))
    t5.save_pretrained(os.path.join(root, "t5"))  # float32, lm_head tied
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64, attention_head_dim=8, norm_num_groups=32)
    flux = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=64,
        pooled_projection_dim=64, axes_dims_rope=[4, 4, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with captured():
            unet.to(torch.bfloat16).save_pretrained(os.path.join(root, "unet"))
            flux.to(torch.bfloat16).save_pretrained(
                os.path.join(root, "flux"), max_shard_size="100KB")
    pipe_unet = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=32,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    DDPMPipeline(unet=pipe_unet, scheduler=DDPMScheduler(
        num_train_timesteps=10)).save_pretrained(os.path.join(root, "pipe"))


def llama_inputs():
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, 128, (2, 12), generator=g)}


def t5_inputs():
    g = torch.Generator().manual_seed(6)
    return {"input_ids": torch.randint(0, 128, (2, 12), generator=g),
            "decoder_input_ids": torch.randint(0, 128, (2, 5), generator=g)}


def forward_logits(m, inputs):
    return m(**inputs).logits


def forward_bert(m, inputs):
    return m(**inputs).last_hidden_state


def unet_inputs():
    g = torch.Generator().manual_seed(2)
    return {"sample": torch.randn(1, 4, 16, 16, generator=g),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": torch.randn(1, 8, 64, generator=g)}


def flux_inputs():
    g = torch.Generator().manual_seed(3)
    return {"hidden_states": torch.randn(1, 16, 64, generator=g),
            "encoder_hidden_states": torch.randn(1, 8, 64, generator=g),
            "pooled_projections": torch.randn(1, 64, generator=g),
            "timestep": torch.tensor([0.5]),
            "img_ids": torch.zeros(16, 3), "txt_ids": torch.zeros(8, 3)}


def forward_diffusers(m, inputs):
    dt = next(m.parameters()).dtype
    if dt not in (torch.float32, torch.bfloat16, torch.float16):
        dt = torch.float32
    cast = {k: v.to(dt) if v.is_floating_point() and k != "timestep" else v
            for k, v in inputs.items()}
    return m(**cast).sample


class Env:
    root = None
    src = None
    mnt = None
    states = {}

    @classmethod
    def state(cls, name):
        if name not in cls.states:
            cls.states[name] = source_state(os.path.join(cls.src, name))
        return cls.states[name]


def setUpModule():
    Env.root = tl.tempfile.mkdtemp(prefix="castfs-md-")
    Env.src = os.path.join(Env.root, "src")
    os.mkdir(Env.src)
    build_models(Env.src)
    Env.mnt = tl.Mount(Env.src)
    BQ.BnB4BitDiffusersQuantizer.validate_environment = \
        lambda self, *a, **k: None
    BQ.BnB8BitDiffusersQuantizer.validate_environment = \
        lambda self, *a, **k: None


def tearDownModule():
    # Loaded models map the mounted files: let them go before unmounting.
    Env.states.clear()
    gc.collect()
    rc = Env.mnt.unmount() if Env.mnt else 0
    out = Env.mnt.output() if rc else ""
    shutil.rmtree(Env.root, ignore_errors=True)
    if rc:
        raise AssertionError("castfs exited with %d: %s" % (rc, out))


# ---- the checks ----

def expected_cast(src, view, model_dtype):
    """What the loader gives for source tensor src seen through a cast
    view, loaded in model_dtype (floating tensors only)."""
    if not src.is_floating_point():
        return src
    return src.to(CASTS[view]).to(model_dtype)


class Checks(unittest.TestCase):

    def check_cast_params(self, model, name, view, model_dtype):
        """Every tensor is the view's value, in the model's dtype (or in
        float32 where a float16 model keeps a module in float32)."""
        sd = model.state_dict()
        fp32 = ()
        if model_dtype == torch.float16:
            fp32 = getattr(model, "_keep_in_fp32_modules", None) or ()
        for k, v in Env.state(name).items():
            self.assertIn(k, sd, "%s.%s" % (name, view))
            dt = model_dtype
            if v.is_floating_point() and any(
                    k.rsplit(".", 1)[0].endswith(m) for m in fp32):
                dt = torch.float32
            assert_same(self, sd[k], expected_cast(v, view, dt),
                        "%s.%s: %s" % (name, view, k))

    def check_bnb_params(self, model, name, view, plain_dtype, skip=()):
        """Every Linear (but those whose names end with an entry of @skip)
        quantised and within bound; every other tensor bit-identical."""
        src = Env.state(name)
        seen = set()
        for mname, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            w = src.get(mname + ".weight")
            if any(mname.endswith(x) for x in skip):
                self.assertNotIsInstance(mod, (bnb.nn.Linear4bit,
                                               bnb.nn.Linear8bitLt), mname)
                continue
            if view == "int8":
                self.assertIsInstance(mod, bnb.nn.Linear8bitLt, mname)
                check_int8(self, mname, mod, w)
            else:
                self.assertIsInstance(mod, bnb.nn.Linear4bit, mname)
                check_4bit(self, mname, mod, w, *BNB_ALL[view])
            seen.add(mname + ".weight")
        self.assertTrue(seen, "no quantised Linear in %s.%s" % (name, view))
        sd = model.state_dict()
        for k, v in src.items():
            if k not in seen:
                want = v.to(plain_dtype) if v.is_floating_point() else v
                assert_same(self, sd[k], want, "%s.%s: %s" % (name, view, k))

    def check_forward(self, name, view, model, ref, fwd, inputs):
        with torch.no_grad():
            err = rel_err(fwd(model, inputs), fwd(ref, inputs))
        report("forward %s.%s: relative error %.3g" % (name, view, err))
        self.assertLessEqual(err, FORWARD_TOL[view] + 1e-6,
                             "%s.%s forward" % (name, view))


class TestTransformers(Checks):
    """transformers from_pretrained on llama.<view>/ and bert.<view>/."""

    MODELS = {"llama": (AutoModelForCausalLM, torch.bfloat16, forward_logits,
                        llama_inputs, ("lm_head",)),
              "bert": (AutoModel, torch.float32, forward_bert, llama_inputs,
                       ()),
              "t5": (T5ForConditionalGeneration, torch.float32,
                     forward_logits, t5_inputs, ("lm_head", "wo"))}

    def run_view(self, name, view):
        cls, src_dt, fwd, inputs, skip = self.MODELS[name]
        path = Env.mnt.join("%s.%s" % (name, view))
        model = load_quietly(self, cls, path)
        if view in CASTS:
            dt = CASTS[view] if view in ("bf16", "fp16", "fp32") else src_dt
            self.assertEqual(model.dtype, dt)
            self.check_cast_params(model, name, view, dt)
            ref = cls.from_pretrained(os.path.join(Env.src, name),
                                      dtype=torch.float32)
            model = model.float()
        else:
            self.assertEqual(model.dtype, src_dt)
            self.check_bnb_params(model, name, view, src_dt, skip)
            no_avx512_repack(model)
            ref = cls.from_pretrained(os.path.join(Env.src, name))
        self.check_forward(name, view, model.eval(), ref.eval(), fwd,
                           inputs())


class TestDiffusers(Checks):
    """diffusers from_pretrained on unet.<view>/ and flux.<view>/."""

    MODELS = {"unet": (UNet2DConditionModel, unet_inputs),
              "flux": (FluxTransformer2DModel, flux_inputs)}

    def run_view(self, name, view):
        cls, inputs = self.MODELS[name]
        path = Env.mnt.join("%s.%s" % (name, view))
        if view in CASTS:
            dt = CASTS[view]
            # diffusers takes float8_e4m3fn as a model dtype, not e5m2.
            load_dt = torch.bfloat16 if view == "fp8_e5m2" else dt
            model = load_quietly(self, cls, path, torch_dtype=load_dt)
            self.check_cast_params(model, name, view, load_dt)
            model = model.float()
            ref = cls.from_pretrained(os.path.join(Env.src, name),
                                      torch_dtype=torch.float32)
        else:
            model = load_quietly(self, cls, path, torch_dtype=torch.bfloat16,
                                 device_map="cpu")
            self.check_bnb_params(model, name, view, torch.bfloat16)
            no_avx512_repack(model)
            ref = cls.from_pretrained(os.path.join(Env.src, name),
                                      torch_dtype=torch.bfloat16)
        self.check_forward(name, view, model.eval(), ref.eval(),
                           forward_diffusers, inputs())


def _add_view_tests(case, names, views):
    for name in names:
        for view in views:
            def t(self, name=name, view=view):
                self.run_view(name, view)
            t.__doc__ = "%s.%s loads and matches the source" % (name, view)
            setattr(case, "test_%s_%s" % (name, view), t)


_add_view_tests(TestTransformers, ("llama", "bert", "t5"),
                list(CASTS) + list(BNB))
_add_view_tests(TestTransformers, ("llama",), ("nf4_nodq", "fp4_nodq"))
_add_view_tests(TestDiffusers, ("unet", "flux"), list(CASTS) + list(BNB))


class TestPipeline(Checks):
    """A diffusers pipeline root: model_index.json and scheduler/ pass
    through, unet/ is converted."""

    def test_pipeline_casts(self):
        for view in ("fp16", "bf16"):
            dt = CASTS[view]
            path = Env.mnt.join("pipe." + view)
            with captured() as msgs:
                pipe = DDPMPipeline.from_pretrained(path, dtype=dt)
            self.assertEqual([m for m in msgs if KEY_TROUBLE.search(m)], [])
            self.assertEqual(sorted(os.listdir(path)),
                             sorted(os.listdir(os.path.join(Env.src, "pipe"))))
            for f in ("model_index.json", "scheduler/scheduler_config.json"):
                with open(os.path.join(path, f), "rb") as a, \
                        open(os.path.join(Env.src, "pipe", f), "rb") as b:
                    self.assertEqual(a.read(), b.read(), f)
            self.check_cast_params(pipe.unet, "pipe/unet", view, dt)
            ref = UNet2DModel.from_pretrained(os.path.join(Env.src, "pipe"),
                                              subfolder="unet")
            g = torch.Generator().manual_seed(4)
            x = {"sample": torch.randn(1, 3, 16, 16, generator=g),
                 "timestep": torch.tensor([3])}
            self.check_forward("pipe", view, pipe.unet.float().eval(),
                               ref.eval(), forward_diffusers, x)


class TestVariants(Checks):
    """variant= reads X.<view>.safetensors and X.safetensors.index.<view>.json
    next to the source."""

    def test_transformers_sharded_fp8(self):
        m = load_quietly(self, AutoModelForCausalLM, Env.mnt.join("llama"),
                         variant="fp8")
        self.check_cast_params(m, "llama", "fp8", torch.bfloat16)

    def test_transformers_single_fp16(self):
        m = load_quietly(self, AutoModel, Env.mnt.join("bert"),
                         variant="fp16")
        self.check_cast_params(m, "bert", "fp16", torch.float32)

    def test_diffusers_sharded_fp8(self):
        m = load_quietly(self, FluxTransformer2DModel, Env.mnt.join("flux"),
                         variant="fp8", torch_dtype=torch.float8_e4m3fn)
        self.check_cast_params(m, "flux", "fp8", torch.float8_e4m3fn)

    def test_diffusers_single_bf16(self):
        m = load_quietly(self, UNet2DConditionModel, Env.mnt.join("unet"),
                         variant="bf16", torch_dtype=torch.bfloat16)
        self.check_cast_params(m, "unet", "bf16", torch.bfloat16)

    def test_listed_for_casts_only(self):
        names = os.listdir(Env.mnt.join("llama"))
        for v in ("fp8", "bf16", "fp16", "fp32", "fp8_e5m2"):
            self.assertIn("model.safetensors.index.%s.json" % v, names)
        self.assertNotIn("model.safetensors.index.nf4.json", names)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def eventually(fn, timeout=60.0):
    """fn() until it returns true (the daemon learns of source changes
    through inotify, asynchronously); the timeout is generous because a
    loaded machine can delay the watcher thread, and a pass returns at
    once."""
    import time
    deadline = time.time() + timeout
    while not fn() and time.time() < deadline:
        time.sleep(0.05)
    return fn()


class TestChanges(unittest.TestCase):
    """A shard rewritten under a mount: the views' index and config follow
    (new ids; the kernel's cached entries are invalidated)."""

    def test_shard_rewritten(self):
        src = os.path.join(Env.src, "llama_chg")
        shutil.copytree(os.path.join(Env.src, "llama"), src)
        index = Env.mnt.join("llama_chg.fp8",
                             "model.safetensors.index.json")
        variant = Env.mnt.join("llama_chg",
                               "model.safetensors.index.fp8.json")
        before = json.loads(read(index))
        self.assertNotIn("extra.weight", before["weight_map"])
        shard = os.path.join(src, "model-00002-of-00002.safetensors")
        sd = load_file(shard)
        sd["extra.weight"] = torch.ones(64, 64, dtype=torch.bfloat16)
        save_file(sd, shard + ".tmp", metadata={"format": "pt"})
        os.rename(shard + ".tmp", shard)
        for path, size in ((index, 4096), (variant, 4096)):
            def changed(path=path):
                try:
                    idx = json.loads(read(path))
                except OSError:
                    return False
                return "extra.weight" in idx["weight_map"]
            self.assertTrue(eventually(changed), path)
            self.assertEqual(json.loads(read(path))["metadata"]["total_size"],
                             before["metadata"]["total_size"] + size)
        view = load_file(Env.mnt.join("llama_chg.fp8",
                                      "model-00002-of-00002.safetensors"))
        assert_same(self, view["extra.weight"],
                    torch.ones(64, 64, dtype=torch.float8_e4m3fn),
                    "the rewritten shard's view")


class TestRuleQuantisesLmHead(Checks):
    """A config view whose rule quantises lm_head (FORMATS.md's own
    example): lm_head leaves llm_int8_skip_modules, so transformers builds
    it quantised (a bug hunt: listed, the int8 codes loaded into a plain
    Linear without a word, nf4 failed to load)."""

    VIEWS = {"i8lm": ("int8", {"kind": "int8"}),
             "nf4lm": ("nf4", {"base": "nf4"})}

    def test_lm_head_loaded_quantised(self):
        with tl.tempdir() as tmp:
            cfg = os.path.join(tmp, "views.json")
            rule = [{"match": "lm_head.weight", "convert": True}]
            with open(cfg, "w") as f:
                json.dump({"views": {v: dict(d, rules=rule) for v, (_, d)
                                     in self.VIEWS.items()}}, f)
            mnt = tl.Mount(Env.src, options=["config=" + cfg])
            try:
                for view, (kind, _) in self.VIEWS.items():
                    with self.subTest(view=view):
                        self.check_view(mnt, view, kind)
            finally:
                gc.collect()
                self.assertEqual(mnt.unmount(), 0)

    def check_view(self, mnt, view, kind):
        path = mnt.join("llama." + view)
        q = json.loads(read(os.path.join(path, "config.json")))[
            "quantization_config"]
        self.assertEqual(q["llm_int8_skip_modules"], ["model.embed_tokens"])
        model = load_quietly(self, AutoModelForCausalLM, path)
        self.check_bnb_params(model, "llama", kind, torch.bfloat16)
        self.assertIsInstance(model.lm_head, (bnb.nn.Linear4bit,
                                              bnb.nn.Linear8bitLt))
        no_avx512_repack(model)
        ref = AutoModelForCausalLM.from_pretrained(
            os.path.join(Env.src, "llama"))
        self.check_forward("llama", kind, model.eval(), ref.eval(),
                           forward_logits, llama_inputs())
        del model


class TestFiles(unittest.TestCase):
    """The rewritten files themselves."""

    def check_index(self, d, index):
        text = read(os.path.join(d, index)).decode()
        idx = json.loads(text)
        self.assertEqual(text, json.dumps(idx, indent=2, sort_keys=True) + "\n")
        want, total = {}, 0
        for shard in sorted(set(idx["weight_map"].values())):
            with safe_open(os.path.join(d, shard), framework="pt") as f:
                for k in f.keys():
                    t = f.get_tensor(k)
                    want[k] = shard
                    total += t.numel() * t.element_size()
        self.assertEqual(idx["weight_map"], want)
        self.assertEqual(idx["metadata"]["total_size"], total)

    def test_indexes(self):
        for name, index in (("llama", "model.safetensors.index.json"),
                            ("flux",
                             "diffusion_pytorch_model.safetensors.index.json")):
            for view in list(CASTS) + list(BNB):
                self.check_index(Env.mnt.join(name + "." + view), index)
        self.check_index(Env.mnt.join("llama"),
                         "model.safetensors.index.fp8.json")

    def test_configs(self):
        src = json.loads(read(os.path.join(Env.src, "llama", "config.json")))
        # Never null: its default keeps the model's last module, which no
        # checkpoint shows (test_bnb_heads.py); the kept 2-D weights and
        # lm_head, always.
        skip = ["lm_head", "model.embed_tokens"]
        want4 = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
            llm_int8_skip_modules=skip).to_dict()
        want8 = transformers.BitsAndBytesConfig(
            load_in_8bit=True, llm_int8_skip_modules=skip).to_dict()
        for view, q in (("nf4", want4), ("int8", want8)):
            text = read(Env.mnt.join("llama." + view, "config.json")).decode()
            cfg = json.loads(text)
            self.assertEqual(text, json.dumps(cfg, indent=2, sort_keys=True)
                             + "\n")
            self.assertEqual(cfg.pop("quantization_config"), q)
            self.assertIsInstance(q["llm_int8_threshold"], float)
            self.assertEqual(cfg, src)
        for view, dt in (("bf16", "bfloat16"), ("fp16", "float16"),
                         ("fp32", "float32"), ("fp8", "bfloat16")):
            cfg = json.loads(read(Env.mnt.join("llama." + view,
                                               "config.json")))
            self.assertEqual(cfg.pop("dtype"), dt, view)
            self.assertEqual(cfg, {k: v for k, v in src.items()
                                   if k != "dtype"})
        # diffusers configs carry no dtype: casts leave them as they are.
        self.assertEqual(read(Env.mnt.join("unet.bf16", "config.json")),
                         read(os.path.join(Env.src, "unet", "config.json")))
        ucfg = json.loads(read(Env.mnt.join("unet.nf4", "config.json")))
        self.assertEqual(ucfg["quantization_config"]["llm_int8_skip_modules"],
                         None)

    # The dtype each model was saved in: bnb_4bit_compute_dtype of its views.
    SRC_DTYPE = {"llama": torch.bfloat16, "bert": torch.float32,
                 "t5": torch.float32, "unet": torch.bfloat16,
                 "flux": torch.bfloat16}

    def test_every_bnb_config(self):
        """quantization_config of every bitsandbytes view of every model is
        what BitsAndBytesConfig(...).to_dict() gives for that view; the
        skip list names only modules the view keeps unquantised."""
        for name, dt in self.SRC_DTYPE.items():
            for view, kind in BNB_ALL.items():
                with self.subTest(model=name, view=view):
                    self.check_bnb_config(name, view, kind, dt)

    def check_bnb_config(self, name, view, kind, dt):
        d = Env.mnt.join("%s.%s" % (name, view))
        q = json.loads(read(os.path.join(d, "config.json")))[
            "quantization_config"]
        skip = q.get("llm_int8_skip_modules")
        if kind is None:
            kw = {"load_in_8bit": True}
        else:
            kw = {"load_in_4bit": True, "bnb_4bit_quant_type": kind[0],
                  "bnb_4bit_use_double_quant": kind[1],
                  "bnb_4bit_compute_dtype": dt}
        want = transformers.BitsAndBytesConfig(
            llm_int8_skip_modules=skip, **kw).to_dict()
        self.assertEqual(q, want)
        if skip is None:
            return
        quantised = set()
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(d, f), framework="pt") as st:
                    for k in st.keys():
                        if k.endswith(".SCB"):
                            quantised.add(k[:-len(".SCB")])
                        elif ".weight.quant_state." in k:
                            quantised.add(k.split(".weight.quant_state.")[0])
        for m in skip:
            self.assertFalse(any(k == m or k.endswith("." + m)
                                 for k in quantised),
                             "%s.%s skips quantised module %s" %
                             (name, view, m))

    def test_pass_through_and_sizes(self):
        for name in ("llama", "flux", "pipe"):
            for view in ("fp8", "nf4"):
                top = Env.mnt.join(name + "." + view)
                for d, _, files in os.walk(top):
                    for f in files:
                        p = os.path.join(d, f)
                        self.assertEqual(os.path.getsize(p), len(read(p)), p)
        a = Env.mnt.join("llama.fp8", "generation_config.json")
        b = Env.mnt.join("llama", "generation_config.json")
        self.assertEqual(os.stat(a).st_ino, os.stat(b).st_ino)
        self.assertEqual(read(a), read(b))

    def test_key_capture_catches_trouble(self):
        """Negative control: an unexpected and a missing key are caught."""
        d = os.path.join(Env.root, "broken_bert")
        shutil.copytree(os.path.join(Env.src, "bert"), d)
        sd = load_file(os.path.join(d, "model.safetensors"))
        sd["extra.weight"] = torch.zeros(3)
        del sd["pooler.dense.bias"]
        save_file(sd, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        with self.assertRaises(AssertionError):
            load_quietly(self, AutoModel, d)


if __name__ == "__main__":
    torch.set_num_threads(2)
    tl.main()
