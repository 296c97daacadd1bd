# SPDX-License-Identifier: MIT
"""Checks of bitsandbytes 4-bit statistics computed outside castfs.

The element bound of a 4-bit weight (absmax * half a code gap) only means
something when the stored absmax is the block's absmax: these helpers
recompute every statistic from the source with torch/numpy and compare.

- dynamic_map(): bitsandbytes' create_dynamic_map() (bitsandbytes 0.50.2
  functional.py) with torch.linspace evaluated as torch's scalar CPU kernel
  does (RangeFactoriesKernel.cpp: start + step * i below the middle,
  end - step * (steps - 1 - i) above it, in float32), in numpy. It is the
  map docs/FORMATS.md says castfs stores; the real create_dynamic_map()
  differs from it by at most two float32 ulps (vectorised linspace).
- check_absmax(): stored absmax == the block's finite absmax (no double
  quantisation), or, with double quantisation: the offset is the mean of
  the block absmax, the nested absmax the largest |absmax - offset| of each
  256 blocks, and each 8-bit code the nearest map entry.
- check_codes(): the 4-bit codes equal bitsandbytes' own quantize_4bit of
  the same input.
"""
import numpy as np
import torch

NESTED = 256


def _linspace_scalar(start, end, steps):
    f = np.float32
    start, end = f(start), f(end)
    step = f(f(end - start) / f(steps - 1))
    half = steps // 2
    out = [f(start + f(step * f(i))) if i < half else
           f(end - f(step * f(steps - 1 - i))) for i in range(steps)]
    return np.array(out, dtype=np.float32)


def dynamic_map():
    """bnb's create_dynamic_map(signed=True, 7, 8), scalar linspace."""
    data = []
    for i in range(7):
        b = _linspace_scalar(0.1, 1.0, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / np.float32(2)
        s = np.float32(10.0 ** (-6 + i))
        data += (s * means).astype(np.float32).tolist()
        data += (-s * means).astype(np.float32).tolist()
    data += [0.0, 1.0]
    data.sort()
    return torch.tensor(np.array(data, dtype=np.float32))


def block_absmax(x, bs):
    """Largest finite |x| per block of @bs elements of flat float32 @x."""
    n = x.numel()
    a = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
    pad = torch.zeros((-n) % bs, dtype=torch.float32)
    return torch.cat([a, pad]).view(-1, bs).amax(dim=1)


def check_dynamic_map(test, code, what):
    """The stored nested map: exactly dynamic_map(), and within two float32
    ulps of the real create_dynamic_map()."""
    import bitsandbytes.functional as F
    want = dynamic_map()
    test.assertEqual(code.dtype, torch.float32, what)
    test.assertTrue(torch.equal(code.view(torch.int32),
                                want.view(torch.int32)),
                    "%s: nested map is not bnb's dynamic map" % what)
    real = F.create_dynamic_map().float()
    m = torch.maximum(code.abs(), real.abs())
    ulp = torch.nextafter(m, torch.tensor(2.0)) - m
    test.assertTrue(bool(((code - real).abs() <= 2 * ulp).all()), what)


def check_absmax(test, st, x, what):
    """@st (a bnb QuantState) stores the statistics of flat float32 @x."""
    am = block_absmax(x, st.blocksize)
    if not st.nested:
        test.assertEqual(st.absmax.dtype, torch.float32, what)
        test.assertTrue(torch.equal(st.absmax.view(torch.int32),
                                    am.view(torch.int32)),
                        "%s: absmax is not the block absmax" % what)
        return
    nb = am.numel()
    offset = torch.tensor(float(am.double().mean()), dtype=torch.float32)
    test.assertEqual(float(st.offset), float(offset),
                     "%s: offset is not the mean absmax" % what)
    v = am - offset
    ng = (nb + NESTED - 1) // NESTED
    pad = torch.zeros(ng * NESTED - nb, dtype=torch.float32)
    nested = torch.cat([v.abs(), pad]).view(ng, NESTED).amax(dim=1)
    test.assertTrue(torch.equal(st.state2.absmax.float(), nested),
                    "%s: nested absmax is not max |absmax - offset|" % what)
    check_dynamic_map(test, st.state2.code, what)
    s = v * (1.0 / nested.clamp(min=1e-38)).repeat_interleave(NESTED)[:nb]
    code = st.state2.code.double()
    dist = (code[None, :] - s.double()[:, None]).abs()
    got = dist.gather(1, st.absmax.long().view(-1, 1)).view(-1)
    # Nearest entry; a value within rounding of a midpoint may go either way.
    slack = s.double().abs() * 2.0 ** -22 + 1e-12
    bad = got > dist.min(dim=1).values + slack
    test.assertFalse(bool(bad.any()), "%s: absmax codes not nearest at %s" %
                     (what, bad.nonzero().view(-1)[:8].tolist()))


def unpack(packed, n):
    p = packed.reshape(-1)
    return torch.stack([p >> 4, p & 15], dim=1).reshape(-1)[:n]


def check_codes(test, packed, x_in, qtype, blocksize, what):
    """4-bit codes == bitsandbytes' quantize_4bit of @x_in (a tensor bnb
    accepts); bnb divides in a partial last block where full blocks
    multiply by the reciprocal, so only there may an exact tie differ."""
    import bitsandbytes.functional as F
    n = x_in.numel()
    theirs = unpack(F.quantize_4bit(x_in, blocksize=blocksize,
                                    quant_type=qtype)[0], n)
    diff = (unpack(packed, n) != theirs).nonzero().reshape(-1)
    tail = n - n % blocksize if n % blocksize else n
    test.assertTrue(bool((diff >= tail).all()),
                    "%s: codes differ from bnb at %s" % (what,
                                                         diff[:10].tolist()))
    return n - diff.numel(), n
