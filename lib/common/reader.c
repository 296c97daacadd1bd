/* SPDX-License-Identifier: MIT */
/* fd- and memory-backed implementations of struct castfs_reader. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "common/reader.h"

int castfs_reader_read(const struct castfs_reader *r, void *buf, size_t n,
		       uint64_t off)
{
	ssize_t got = r->pread(r->ctx, buf, n, off);

	if (got < 0)
		return (int)got;
	return (size_t)got == n ? 0 : -EIO;
}

static ssize_t fd_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct castfs_fd_reader *fr = ctx;
	size_t done = 0;

	while (done < n) {
		ssize_t got = pread(fr->fd, (char *)buf + done, n - done,
				    (off_t)(off + done));

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			break; /* EOF: the caller turns the short count into EIO */
		done += (size_t)got;
	}
	return (ssize_t)done;
}

void castfs_fd_reader_init(struct castfs_fd_reader *fr, int fd)
{
	fr->r.pread = fd_pread;
	fr->r.ctx = fr;
	fr->fd = fd;
}

static ssize_t mem_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	const struct castfs_mem_reader *mr = ctx;
	size_t avail;

	if (off >= mr->len)
		return 0;
	avail = mr->len - (size_t)off;
	if (n > avail)
		n = avail;
	memcpy(buf, mr->data + off, n);
	return (ssize_t)n;
}

void castfs_mem_reader_init(struct castfs_mem_reader *mr, const void *data,
			    size_t len)
{
	mr->r.pread = mem_pread;
	mr->r.ctx = mr;
	mr->data = data;
	mr->len = len;
}
