/* SPDX-License-Identifier: MIT */
/*
 * faultfs: a read-only passthrough FUSE filesystem that fails reads with
 * EIO, for the fault tests (docs/RELIABILITY.md). Any read of a file whose
 * name contains "fault" that reaches byte OFFSET or beyond gets EIO, as a
 * failing disk sector would. A file whose name contains "flip" reads its
 * byte OFFSET inverted from the second read that covers it on, counted per
 * open: bytes that change under a reader while size and mtime stay (castfs
 * pack's read-back check); if its name also contains "moved", its mtime
 * then shows a second later, as a writer's would, until it is opened
 * again. Everything else is passed through, uncached.
 *
 *   faultfs SOURCE MOUNTPOINT OFFSET [FUSE options...]
 */
#define FUSE_USE_VERSION 31
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int src_fd = -1;
static off_t fault_off;

/* A *moved* file's byte was inverted since it was last opened. */
static int moved_flipped;

/* An open file: its source descriptor, and how many reads of it have
 * covered fault_off. */
struct ff_file {
	int fd;
	int flip_reads;
};

/* FUSE paths start with '/': relative to the source directory. */
static const char *rel(const char *path)
{
	return path[1] ? path + 1 : ".";
}

static int ff_getattr(const char *path, struct stat *st,
		      struct fuse_file_info *fi)
{
	(void)fi;
	if (fstatat(src_fd, rel(path), st, AT_SYMLINK_NOFOLLOW))
		return -errno;
	if (strstr(path, "moved") &&
	    __atomic_load_n(&moved_flipped, __ATOMIC_RELAXED))
		st->st_mtim.tv_sec++;
	return 0;
}

static int ff_readlink(const char *path, char *buf, size_t len)
{
	ssize_t n = readlinkat(src_fd, rel(path), buf, len - 1);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static int ff_readdir(const char *path, void *buf, fuse_fill_dir_t fill,
		      off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	int fd = openat(src_fd, rel(path), O_RDONLY | O_DIRECTORY);
	struct dirent *de;
	DIR *dp;

	(void)off, (void)fi, (void)flags;
	if (fd < 0 || !(dp = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while ((de = readdir(dp)))
		fill(buf, de->d_name, NULL, 0, 0);
	closedir(dp);
	return 0;
}

static int ff_open(const char *path, struct fuse_file_info *fi)
{
	struct ff_file *f;
	int fd;

	if ((fi->flags & O_ACCMODE) != O_RDONLY)
		return -EROFS;
	fd = openat(src_fd, rel(path), O_RDONLY);
	if (fd < 0)
		return -errno;
	f = calloc(1, sizeof(*f));
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
	f->fd = fd;
	fi->fh = (uint64_t)(uintptr_t)f;
	if (strstr(path, "moved"))
		__atomic_store_n(&moved_flipped, 0, __ATOMIC_RELAXED);
	fi->direct_io = 1; /* every read reaches us: no cache hides a fault */
	return 0;
}

static int ff_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	struct ff_file *f = (struct ff_file *)(uintptr_t)fi->fh;
	ssize_t n;

	if (strstr(path, "fault") && off + (off_t)size > fault_off)
		return -EIO;
	n = pread(f->fd, buf, size, off);
	if (n > 0 && strstr(path, "flip") && off <= fault_off &&
	    fault_off < off + n &&
	    __atomic_fetch_add(&f->flip_reads, 1, __ATOMIC_RELAXED) > 0) {
		buf[fault_off - off] ^= (char)0xFF;
		if (strstr(path, "moved"))
			__atomic_store_n(&moved_flipped, 1, __ATOMIC_RELAXED);
	}
	return n < 0 ? -errno : (int)n;
}

static int ff_release(const char *path, struct fuse_file_info *fi)
{
	struct ff_file *f = (struct ff_file *)(uintptr_t)fi->fh;

	(void)path;
	close(f->fd);
	free(f);
	return 0;
}

static const struct fuse_operations ff_ops = {
	.getattr = ff_getattr,
	.readlink = ff_readlink,
	.readdir = ff_readdir,
	.open = ff_open,
	.read = ff_read,
	.release = ff_release,
};

int main(int argc, char **argv)
{
	char *fargv[64];
	int fargc = 0;

	if (argc < 4 || argc > 60) {
		fprintf(stderr, "usage: %s SOURCE MOUNTPOINT OFFSET [opts]\n",
			argv[0]);
		return 2;
	}
	src_fd = open(argv[1], O_RDONLY | O_DIRECTORY);
	if (src_fd < 0) {
		perror(argv[1]);
		return 1;
	}
	fault_off = strtoll(argv[3], NULL, 0);
	fargv[fargc++] = argv[0];
	fargv[fargc++] = argv[2];
	for (int i = 4; i < argc; i++)
		fargv[fargc++] = argv[i];
	fargv[fargc] = NULL;
	return fuse_main(fargc, fargv, &ff_ops, NULL);
}
