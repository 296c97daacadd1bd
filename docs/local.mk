# SPDX-License-Identifier: MIT
# Man pages and the documents shipped in the tarball: every docs/*.md,
# since the man pages and the README send readers to them.
dist_man_MANS += docs/castfs.1 docs/castfs-info.1 docs/castfs-convert.1
EXTRA_DIST += README.md docs/MOUNTING.md docs/castfs@.service \
	docs/MODELDIR.md docs/ARCHITECTURE.md docs/STYLE.md \
	docs/TENSOR_TREE.md docs/NFS.md docs/FORMATS.md docs/RELIABILITY.md \
	docs/BENCHMARKS.md docs/TESTING.md docs/LOADERS.md docs/FUZZING.md
