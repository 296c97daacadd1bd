# SPDX-License-Identifier: MIT
# ns/: the namespace: node ids, sources, the checkpoint cache, open files,
# the node kinds and the mount's facade.
lib_libcastfs_a_SOURCES += \
	lib/ns/ns.c lib/ns/ns.h lib/ns/ns_internal.h lib/ns/ns_node.c \
	lib/ns/ns_src_internal.h lib/ns/ns_ckpt_internal.h \
	lib/ns/ns_file_internal.h lib/ns/ns_kind_internal.h lib/ns/ns_tree.c \
	lib/ns/ns_ckpt.c lib/ns/ns_ckpt_lru.c \
	lib/ns/ns_ctl.c lib/ns/ns_ctlshare.c lib/ns/ns_file.c lib/ns/ns_resolve.c lib/ns/ns_src.c \
	lib/ns/ns_src_link.c \
	lib/ns/stats.c lib/ns/stats.h lib/ns/ns_tensors.c \
	lib/ns/ns_modeldir.c lib/ns/ns_mdjson.c lib/ns/ns_mdplan.c \
	lib/ns/ns_modeldir_internal.h lib/ns/ns_packed.c lib/ns/ns_pack_src.c \
	lib/ns/ns_mdtext.c lib/ns/ns_mdconfig.c lib/ns/ns_mdindex.c lib/ns/ns_mdgguf.c \
	lib/ns/ns_mdgguf_shards.c lib/ns/ns_mdxshard.c \
	lib/ns/ns_dircache.c lib/ns/ns_snap.c lib/ns/ns_rescan.c lib/ns/ns_live.c \
	lib/ns/ns_dirshare.c
