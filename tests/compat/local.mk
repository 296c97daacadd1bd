# SPDX-License-Identifier: MIT
# Compatibility tests: a real mount read by the real Python loaders
# (torch, safetensors, numpy/ml_dtypes, bitsandbytes, transformers,
# diffusers), file handles across a restart, NFS through nfs-ganesha, the
# command line and the control directory.
COMPAT_TESTS = tests/compat/test_casts.py tests/compat/test_hf_cache.py \
	tests/compat/test_handles.py tests/compat/test_nfs.py \
	tests/compat/test_bnb.py tests/compat/test_modeldir.py \
	tests/compat/test_single_file.py tests/compat/test_tensors.py \
	tests/compat/test_cli.py tests/compat/test_ctl.py \
	tests/compat/test_pack.py tests/compat/test_packed_mount.py \
	tests/compat/test_testlib.py tests/compat/test_casts_isa.py \
	tests/compat/test_quant_src.py tests/compat/test_ct.py \
	tests/compat/test_gguf.py tests/compat/test_gguf_llm.py \
	tests/compat/test_gguf_llamacpp.py
TESTS += $(COMPAT_TESTS)
EXTRA_DIST += tests/compat/castfs_testlib.py $(COMPAT_TESTS) \
	tests/compat/bnb_ref.py tests/compat/bnb_check.py tests/compat/oracle.py \
	tests/compat/ldm_unet.py tests/compat/ct_oracle.py

# Reliability tests under a real mount (docs/RELIABILITY.md).
REL_TESTS = tests/compat/test_rel_malformed.py \
	tests/compat/test_rel_containment.py tests/compat/test_rel_changes.py \
	tests/compat/test_rel_stress.py tests/compat/test_rel_faults.py \
	tests/compat/test_rel_lease.py tests/compat/test_restart.py \
	tests/compat/test_scale.py tests/compat/test_names.py \
	tests/compat/test_cache_budget.py tests/compat/test_stop.py
TESTS += $(REL_TESTS)
EXTRA_DIST += $(REL_TESTS) tests/compat/rel_common.py tests/tsan.supp
