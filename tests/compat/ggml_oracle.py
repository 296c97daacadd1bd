# SPDX-License-Identifier: MIT
"""ggml itself as the oracle for the GGUF block formats gguf-py cannot
produce (the K-quants, and Q5_0/Q5_1 checked twice): the reference
quantisers `quantize_row_<type>_ref` of the libggml-base that
llama-cpp-python built and installed (scripts/setup pins it and builds it
for a generic x86-64, so its float code has no FMA), called through
ctypes; and llama.cpp's own `llama_model_quantize`, which makes a whole
quantised file from a GGUF file, tensor types and all.
"""
import ctypes
import glob
import os

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType as QT

_LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
# elements and bytes per block
BLOCK = {QT.Q4_K: (256, 144), QT.Q5_K: (256, 176), QT.Q6_K: (256, 210),
         QT.Q5_0: (32, 22), QT.Q5_1: (32, 24), QT.Q8_0: (32, 34),
         QT.Q4_0: (32, 18), QT.Q4_1: (32, 20)}
# llama_ftype of a file type castfs offers
FTYPE = {"q8_0": 7, "q4_0": 2, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}

_base = None


def _ggml():
    global _base
    if _base is None:
        path = sorted(glob.glob(os.path.join(_LIB, "libggml-base.so*")))[0]
        _base = ctypes.CDLL(path)
    return _base


def quantize_ref(qt, x):
    """ggml's quantize_row_<qt>_ref of float32 rows @x (2-D, each row a
    whole number of blocks): the bytes, row after row."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    per, nbytes = BLOCK[qt]
    assert x.size % per == 0
    # ggml spells the K types with a capital K: quantize_row_q4_K_ref
    fn = getattr(_ggml(), "quantize_row_%s_ref" %
                 qt.name.lower().replace("_k", "_K"))
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    out = np.zeros(x.size // per * nbytes, dtype=np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def llama_quantize(src, dst, view):
    """llama.cpp's llama_model_quantize of GGUF file @src into @dst as
    llama-quantize does for @view (no imatrix, default parameters)."""
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FTYPE[view]
    p.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(),
                                        ctypes.byref(p))
    if rc != 0:
        raise RuntimeError("llama_model_quantize returned %d" % rc)
