# SPDX-License-Identifier: MIT
"""What the quantized-source tests share: the llm-compressor oracle venv
(skip without it, run one of its oracle scripts), reading a folder's
tensors, quiet transformers loads, the bit patterns compared, and the
sharded saves whose modules straddle shards.

Import it inside a test's try block that turns ImportError into SKIP: it
needs torch, safetensors and transformers.
"""
import gc
import json
import os
import shutil
import subprocess
import sys
import warnings

import castfs_testlib as tl

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

from test_ct import VENV_PY  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
INDEX = "model.safetensors.index.json"


def require_venv():
    """Exit the test module with SKIP when the llm-compressor venv (the
    oracle of these tests) is not installed."""
    if not os.path.exists(VENV_PY):
        print("SKIP: no llm-compressor venv at %s (scripts/setup-llmc)"
              % VENV_PY)
        sys.exit(tl.SKIP)


def run_oracle(script, jobs, tmp):
    """Run oracle @script (next to this file) in the llm-compressor venv
    on @jobs (written as JSON under @tmp); its RESULT line parsed, or None
    when it prints none. Raises AssertionError with its output when it
    fails."""
    path = os.path.join(tmp, script + ".json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    p = subprocess.run([VENV_PY, os.path.join(HERE, script), path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("%s failed:\n%s%s" % (script, p.stdout[-3000:],
                                                   p.stderr[-6000:]))
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def bits(t):
    """The bytes of @t, compared so that NaN and -0 count."""
    return t.contiguous().view(torch.uint8)


def dir_tensors(d):
    """Every tensor of every *.safetensors file of folder @d."""
    out = {}
    for n in sorted(os.listdir(d)):
        if n.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, n)))
    return out


def load_quiet(path, **kw):
    """AutoModelForCausalLM.from_pretrained(@path) without its chatter."""
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw)


def end_module(env):
    """tearDownModule: unmount @env.mnt, remove @env.root; fails when the
    daemon did not exit cleanly."""
    gc.collect()
    rc = env.mnt.unmount() if env.mnt else 0
    if env.root:
        shutil.rmtree(env.root, ignore_errors=True)
    assert rc == 0, "castfs exited with %d" % rc


def weight_map(folder):
    """The weight_map of @folder's model.safetensors.index.json."""
    with open(os.path.join(folder, INDEX)) as f:
        return json.load(f)["weight_map"]


def split_modules(wm, leaves):
    """The packed weights of weight_map @wm whose companions (leaf names
    after "weight_", e.g. "scale") sit in another shard than the weight:
    the case a sharded test is about."""
    return [k for k in wm if k.endswith(".weight_packed") and any(
        wm.get(k[:-len("packed")] + leaf, wm[k]) != wm[k]
        for leaf in leaves)]


def shard_names(wm, shard, companions):
    """The tensors a dequantizing view's @shard holds: the source shard's
    (weight_map @wm) less the @companions (full leaf names), each
    "M.weight_packed" named "M.weight"."""
    return sorted(k[:-len("_packed")] if k.endswith("_packed") else k
                  for k, s in wm.items()
                  if s == shard and k.rsplit(".", 1)[-1] not in companions)
