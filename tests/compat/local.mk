# SPDX-License-Identifier: MIT
# Compatibility tests: a real mount read by the real Python loaders
# (torch, safetensors, numpy/ml_dtypes, bitsandbytes, transformers,
# diffusers), file handles across a restart, NFS through nfs-ganesha, the
# command line and the control directory.
COMPAT_TESTS = tests/compat/test_casts.py tests/compat/test_hf_cache.py \
	tests/compat/test_handles.py tests/compat/test_nfs.py \
	tests/compat/test_nfs_handles.py \
	tests/compat/test_bnb.py tests/compat/test_modeldir.py \
	tests/compat/test_single_file.py tests/compat/test_tensors.py \
	tests/compat/test_cli.py tests/compat/test_ctl.py tests/compat/test_metrics.py \
	tests/compat/test_pack.py tests/compat/test_packed_mount.py \
	tests/compat/test_packed_memory.py \
	tests/compat/test_pack_choice.py \
	tests/compat/test_testlib.py tests/compat/test_casts_isa.py \
	tests/compat/test_quant_src.py tests/compat/test_ct.py \
	tests/compat/test_gguf.py tests/compat/test_gguf_llm.py \
	tests/compat/test_gguf_llamacpp.py tests/compat/test_gguf_md_cache.py \
	tests/compat/test_gguf_pretok.py tests/compat/test_gguf_tokmeta.py \
	tests/compat/test_gguf_info.py \
	tests/compat/test_gguf_kquant.py tests/compat/test_mxfp4_src.py \
	tests/compat/test_ct_src.py tests/compat/test_quant_src_block.py \
	tests/compat/test_ct4_src.py \
	tests/compat/test_quant_src_comfy.py tests/compat/test_quant_src_int8.py \
	tests/compat/test_comfy_fp8.py tests/compat/test_ct_qsrc.py \
	tests/compat/test_md_index_refused.py tests/compat/test_gguf_shards.py \
	tests/compat/test_name_max.py \
	tests/compat/test_bnb4_src.py tests/compat/test_ct_w4_src.py \
	tests/compat/test_requant.py tests/compat/test_quant_src_xshard.py \
	tests/compat/test_gguf_qsrc.py tests/compat/test_gguf_qsrc_ct.py \
	tests/compat/test_bnb_heads.py tests/compat/test_ct_moe.py \
	tests/compat/test_hardlinks.py tests/compat/test_md_arch.py \
	tests/compat/test_gpu_bnb.py tests/compat/test_big_metadata.py \
	tests/compat/test_md_shard_swap.py tests/compat/test_inplace_rewrite.py \
	tests/compat/test_gguf_build_mem.py tests/compat/test_gguf_budget.py
TESTS += $(COMPAT_TESTS)
EXTRA_DIST += tests/compat/castfs_testlib.py $(COMPAT_TESTS) \
	tests/compat/bnb_ref.py tests/compat/bnb_check.py tests/compat/oracle.py \
	tests/compat/layout_ref.py \
	tests/compat/ldm_unet.py tests/compat/ct_oracle.py \
	tests/compat/ggml_oracle.py tests/compat/ct_src_oracle.py \
	tests/compat/ct4_src_oracle.py \
	tests/compat/ct_w4_oracle.py tests/compat/quant_src_common.py \
	tests/compat/nfs_handle_client.py

# Reliability tests under a real mount (docs/RELIABILITY.md).
REL_TESTS = tests/compat/test_rel_malformed.py \
	tests/compat/test_rel_containment.py tests/compat/test_rel_changes.py \
	tests/compat/test_rel_link_perm.py \
	tests/compat/test_rel_stress.py tests/compat/test_rel_faults.py \
	tests/compat/test_rel_lease.py tests/compat/test_restart.py \
	tests/compat/test_stop_signal.py tests/compat/test_sup_ready.py \
	tests/compat/test_parallel_dirops.py \
	tests/compat/test_rel_mapped.py \
	tests/compat/test_scale.py tests/compat/test_names.py \
	tests/compat/test_rel_watch.py tests/compat/test_cache_budget.py \
	tests/compat/test_stop.py tests/compat/test_gen_shared.py \
	tests/compat/test_gen_range.py \
	tests/compat/test_watch_seen.py tests/compat/test_seen_race.py \
	tests/compat/test_watch_expire.py \
	tests/compat/test_noxattr.py \
	tests/compat/test_info_path.py tests/compat/test_dircache.py \
	tests/compat/test_tree_dircache.py \
	tests/compat/test_readdirplus.py tests/compat/test_readdir_offsets.py \
	tests/compat/test_dirshare.py \
	tests/compat/test_ctlshare.py tests/compat/test_passthrough.py
TESTS += $(REL_TESTS)
EXTRA_DIST += $(REL_TESTS) tests/compat/rel_common.py tests/tsan.supp

# A fresh link of the daemon at $(RELINK_OUT) with build id $(RELINK_ID)
# (hex), from this build's objects and flags: test_restart reloads a mount
# to a rebuilt binary, as an upgrade does.
castfs-relink: $(fs_castfs_OBJECTS) $(fs_castfs_DEPENDENCIES)
	$(AM_V_CCLD)$(CCLD) $(fs_castfs_CFLAGS) $(CFLAGS) $(AM_LDFLAGS) \
		$(LDFLAGS) -Wl,--build-id=0x$(RELINK_ID) -o $(RELINK_OUT) \
		$(fs_castfs_OBJECTS) $(fs_castfs_LDADD) $(LIBS)
.PHONY: castfs-relink

# A sharded model of grouped packs: the composite reader forwards visit.
COMPAT_TESTS += tests/compat/test_packed_shards_grouped.py
