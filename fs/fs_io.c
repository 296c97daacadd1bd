/* SPDX-License-Identifier: MIT */
/*
 * How the daemon reads requests from /dev/fuse: into a buffer whose first
 * pages are mapped before the first read.
 *
 * The kernel takes a request off its queue, then copies it into the
 * reader's buffer (fuse_dev_do_read); if that copy fails, the request is
 * ended with EIO for the process that made it, not left for the
 * supervisor's FUSE_NOTIFY_RESEND. The copy pins the buffer's pages, and a
 * page not mapped yet has to be faulted in, which the kernel refuses while
 * a fatal signal is pending (__get_user_pages: -EINTR). So a worker whose
 * fresh buffer (libfuse allocates one per worker thread) took its first
 * request just as the daemon was killed turned a reader's read into EIO:
 * seen under ThreadSanitizer, 5 in 22,276 reads over 1,236 kills
 * (docs/RELIABILITY.md, "Restarts"). Writing the pages a request lands in
 * before the first read means the copy never faults.
 */
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fs.h"

/*
 * The bytes written before a buffer's first read. A request of a
 * read-only mount (header and arguments: a name, an offset) fits in one
 * page; two cover a buffer that does not start on a page boundary, and
 * two more a long name. Only a BATCH_FORGET can be longer, and a forget
 * lost to a dying daemon costs nothing (it has no reply, and the next
 * daemon knows no node to forget).
 */
#define PREFAULT_BYTES (16 * 1024)

/* The buffer this thread last touched: libfuse keeps one per worker. */
static __thread const void *touched;

/* -o passthrough's state (fs_pt.c), or NULL: set before any request. */
static struct castfs_pt *io_pt;

static void touch(void *buf, size_t len)
{
	volatile char *p = buf;
	size_t n = len < PREFAULT_BYTES ? len : PREFAULT_BYTES;

	if (!n)
		return;
	for (size_t i = 0; i < n; i += 4096)
		p[i] = 0;
	p[n - 1] = 0; /* the last page when @buf is not page-aligned */
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t n;

	(void)userdata;
	if (buf != touched) {
		touch(buf, len);
		touched = buf;
	}
	n = read(fd, buf, len);
	if (io_pt && n > 0)
		castfs_pt_saw_request(io_pt, buf, (size_t)n);
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	(void)userdata;
	if (io_pt)
		castfs_pt_amend_reply(io_pt, iov, count);
	return writev(fd, iov, count);
}

/* The splice calls as libfuse makes them without custom I/O: giving them
 * keeps the capabilities it offers the kernel unchanged. */
static ssize_t io_splice(int fdin, off_t *offin, int fdout, off_t *offout,
			 size_t len, unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

void castfs_fs_io_saw(const void *buf, size_t len)
{
	if (io_pt)
		castfs_pt_saw_request(io_pt, buf, len);
}

int castfs_fs_io_attach(struct fuse_session *se, struct castfs_pt *pt)
{
	static const struct fuse_custom_io io = {
		.read = io_read,
		.writev = io_writev,
		.splice_receive = io_splice,
		.splice_send = io_splice,
	};

	io_pt = pt;
	if (pt)
		castfs_pt_attach(pt, fuse_session_fd(se));
	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}
