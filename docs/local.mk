# SPDX-License-Identifier: MIT
# Man pages and the documents shipped in the tarball.
dist_man_MANS += docs/castfs.1 docs/castfs-info.1 docs/castfs-convert.1
EXTRA_DIST += docs/MOUNTING.md docs/castfs@.service docs/MODELDIR.md \
	docs/ARCHITECTURE.md docs/STYLE.md \
	docs/TENSOR_TREE.md docs/NFS.md
