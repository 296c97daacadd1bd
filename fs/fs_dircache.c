/* SPDX-License-Identifier: MIT */
/*
 * Kernel-cached directory listings (FOPEN_CACHE_DIR): dropping one when
 * the namespace says its directory may list something else. The kernel
 * keeps a cached listing in the directory inode's page cache, which
 * fuse_lowlevel_notify_inval_inode(dir, 0, 0) empties; the next opendir
 * then reads the listing from the daemon again.
 */
#include <errno.h>
#include <stdint.h>

#include "fs.h"

/* Directories whose listing changed in the watcher's batch of events now
 * being handled: told to the kernel once each when the batch ends. */
struct fs_lbatch {
	uint64_t dir[256];
	size_t n;
};

static __thread struct fs_lbatch *cur_batch;

static void send_inval(struct castfs_fs *fs, uint64_t dir)
{
	/* -ENOENT: the kernel holds no inode of @dir, hence no listing. */
	if (fs->se)
		fuse_lowlevel_notify_inval_inode(fs->se, dir, 0, 0);
}

void castfs_fs_listing_changed(void *ctx, uint64_t dir)
{
	struct castfs_fs *fs = ctx;
	struct fs_lbatch *b = cur_batch;

	if (b) {
		for (size_t i = 0; i < b->n; i++) {
			if (b->dir[i] == dir)
				return;
		}
		if (b->n < sizeof(b->dir) / sizeof(b->dir[0])) {
			b->dir[b->n++] = dir;
			return;
		}
	}
	send_inval(fs, dir);
}

void castfs_fs_listing_batch(struct castfs_fs *fs, bool begin)
{
	static __thread struct fs_lbatch batch;

	if (begin) {
		batch.n = 0;
		cur_batch = &batch;
		return;
	}
	cur_batch = NULL;
	/* After every event of the batch was applied: a listing read again
	 * between two of them would miss the second. */
	for (size_t i = 0; i < batch.n; i++)
		send_inval(fs, batch.dir[i]);
	batch.n = 0;
}
