# SPDX-License-Identifier: MIT
# fs/: the daemon, its supervisor and the sub-commands (castfs info,
# convert, pack, unpack, reload).
bin_PROGRAMS += fs/castfs
fs_castfs_SOURCES = fs/main.c fs/fs.h fs/fs_ops.c fs/fs_mount.c \
	fs/fs_lease.c fs/fs_watch.c fs/fs_watchq.c fs/fs_watchq.h fs/fs_dircache.c fs/fs_log.c fs/fs_config.c fs/fs_fh.c fs/fs_io.c fs/fs_pt.c \
	fs/fs_super.c fs/cli.h fs/cli_common.c fs/cli_info.c fs/cli_info_gguf.c \
	fs/cli_convert.c fs/cli_pack.c fs/cli_qopts.c fs/cli_shards.c
fs_castfs_CFLAGS = $(AM_CFLAGS) $(FUSE_CFLAGS)
fs_castfs_LDADD = $(LIBCASTFS_LIBS) $(FUSE_LIBS)
