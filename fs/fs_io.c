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
#include <linux/fuse.h>
#include <string.h>
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

/*
 * FUSE_PARALLEL_DIROPS, asked for by castfs_op_init(): libfuse before
 * 3.16 never puts it in its INIT reply (libfuse#861), so the kernel held
 * one lock per directory across every LOOKUP and READDIR in it. A
 * first lookup of a view can build a plan (a GGUF file's header parses
 * its tokenizer: seconds), and every other name of that directory, for
 * every process and NFS client, waited behind it. The reply to the INIT
 * whose request offered the flag gets it: the daemon serves any two
 * requests at once already (lookups of different directories always
 * could run together).
 */
#define IO_PARALLEL_DIROPS (1u << 18) /* FUSE_PARALLEL_DIROPS */
#define IO_INIT_EXT (1u << 30) /* FUSE_INIT_EXT: flags2 is valid */

/* The INIT request being answered (0: none seen) and whether it offered
 * parallel directory operations. The one place that reads INIT and
 * amends its reply: passthrough (fs_pt.c) is told of both from here. */
static uint64_t io_init_unique;
static bool io_init_dirops;

/* Note an INIT request: what it offers decides its reply's amendments. */
static void io_saw_init(const void *buf, size_t len)
{
	const struct fuse_in_header *h = buf;
	uint32_t in[5] = { 0 }; /* major, minor, max_readahead, flags, flags2 */

	if (len < sizeof(*h) + 4 * sizeof(uint32_t) || h->opcode != FUSE_INIT)
		return;
	memcpy(in, (const char *)buf + sizeof(*h),
	       (len >= sizeof(*h) + sizeof(in) ? 5 : 4) * sizeof(uint32_t));
	if (!(in[3] & IO_INIT_EXT))
		in[4] = 0;
	__atomic_store_n(&io_init_dirops, (in[3] & IO_PARALLEL_DIROPS) != 0,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&io_init_unique, h->unique, __ATOMIC_RELEASE);
	if (io_pt)
		castfs_pt_saw_init(io_pt, in[0], in[1], in[4]);
}

/* Amend the reply to the INIT noted: FUSE_PARALLEL_DIROPS if offered,
 * then what passthrough asks for. */
static void io_amend_init(struct iovec *iov, int count)
{
	const struct fuse_out_header *h = iov[0].iov_base;
	uint64_t unique = __atomic_load_n(&io_init_unique, __ATOMIC_ACQUIRE);
	uint32_t flags;
	char *out;

	if (!unique || count < 2 || iov[0].iov_len < sizeof(*h) ||
	    h->unique != unique || h->error ||
	    iov[1].iov_len < 4 * sizeof(uint32_t))
		return;
	if (__atomic_load_n(&io_init_dirops, __ATOMIC_RELAXED)) {
		/* fuse_init_out: major, minor, max_readahead, flags. */
		out = (char *)iov[1].iov_base + 3 * sizeof(uint32_t);
		memcpy(&flags, out, sizeof(flags));
		flags |= IO_PARALLEL_DIROPS;
		memcpy(out, &flags, sizeof(flags));
	}
	if (io_pt)
		castfs_pt_amend_init(io_pt, iov[1].iov_base, iov[1].iov_len);
}

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
	if (n > 0)
		castfs_fs_io_saw(buf, (size_t)n);
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	(void)userdata;
	io_amend_init(iov, count);
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
	io_saw_init(buf, len);
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
