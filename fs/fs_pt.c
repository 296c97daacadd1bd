/* SPDX-License-Identifier: MIT */
/*
 * Kernel passthrough of unconverted files (-o passthrough; Linux >= 6.9,
 * CONFIG_FUSE_PASSTHROUGH, CAP_SYS_ADMIN). An open of a file whose bytes
 * are a source file's, offset for offset, is answered with that source as
 * its backing file: the kernel then reads and maps it without asking the
 * daemon, at the speed of the source's own page cache, where a FUSE read
 * copies every byte through the daemon (issue 16: 0.15-0.31x of the page
 * cache). Views are never passed through: their bytes are computed.
 *
 * libfuse 3.14 knows nothing of it, so the two replies that carry it are
 * amended on their way out (fs_io.c's writev): the INIT reply asks for
 * FUSE_PASSTHROUGH when the kernel offers it (fs_io.c reads the INIT and
 * finds its reply: castfs_pt_saw_init(), castfs_pt_amend_init()), and the
 * open reply of such a file gets FOPEN_PASSTHROUGH and the backing id,
 * which the open handler leaves in a thread-local for the reply it is
 * about to send.
 *
 * The kernel accepts one backing file per inode while any file of it is
 * open (a second one fails the opener's open), so a node keeps one
 * backing id from its first open until the kernel forgets the node.
 * Backing ids belong to the connection, which outlives a daemon under the
 * supervisor: each registration and close is appended to a journal the
 * supervisor keeps (a memfd), and a new daemon reads it before it
 * registers a node, so a file still open across a restart keeps its one
 * backing file.
 */
#include <errno.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/hash.h"
#include "fs.h"

/* Not in Debian 12's <linux/fuse.h> (7.38): protocol 7.40. */
#define PT_MINOR 40
#define PT_FLAGS2_PASSTHROUGH (1u << 5) /* FUSE_PASSTHROUGH, bit 37 */
#define PT_FOPEN_PASSTHROUGH (1u << 7)
#define PT_DEV_IOC_MAGIC 229

struct pt_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};

#define PT_IOC_BACKING_OPEN _IOW(PT_DEV_IOC_MAGIC, 1, struct pt_backing_map)
#define PT_IOC_BACKING_CLOSE _IOW(PT_DEV_IOC_MAGIC, 2, uint32_t)

/* fuse_init_out as 7.40 lays it out. */
struct pt_init_out {
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
};

struct pt_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

/* A journal record: node @id got backing id @backing (op 1) or lost it
 * (op 2). Appended whole with O_APPEND: records never interleave. */
struct pt_rec {
	uint64_t id;
	int32_t backing;
	uint32_t op;
};

enum { PT_REC_ADD = 1, PT_REC_DEL = 2 };

struct pt_slot {
	uint64_t id; /* node id; 0: empty */
	int32_t backing; /* > 0 */
	bool tomb;
};

struct castfs_pt {
	struct castfs_stats *stats;
	int dev_fd; /* the connection's /dev/fuse fd */
	bool on; /* asked for, offered by the kernel, not refused */
	pthread_mutex_t lock;
	struct pt_slot *slot; /* open addressing, linear probing */
	size_t cap, used; /* used: live and tombstones */
	int journal_fd; /* the supervisor's journal, or -1 */
	uint64_t journal_off; /* how much of it this daemon has applied */
};

/* The backing id the open reply this thread sends next carries. */
static __thread int32_t pending_backing;

int castfs_pt_new(struct castfs_stats *stats, struct castfs_pt **out)
{
	struct castfs_pt *pt = calloc(1, sizeof(*pt));

	if (!pt)
		return -ENOMEM;
	pt->stats = stats;
	pt->dev_fd = -1;
	pt->journal_fd = -1;
	pthread_mutex_init(&pt->lock, NULL);
	*out = pt;
	return 0;
}

void castfs_pt_free(struct castfs_pt *pt)
{
	if (!pt)
		return;
	/* The connection's end closes every backing id. */
	pthread_mutex_destroy(&pt->lock);
	free(pt->slot);
	free(pt);
}

/* Whether opens may be passed through: asked for, offered by the
 * kernel's INIT, not refused for want of CAP_SYS_ADMIN. */
static bool castfs_pt_on(const struct castfs_pt *pt)
{
	return pt && __atomic_load_n(&pt->on, __ATOMIC_ACQUIRE);
}

void castfs_pt_attach(struct castfs_pt *pt, int dev_fd)
{
	pt->dev_fd = dev_fd;
}

void castfs_pt_saw_init(struct castfs_pt *pt, uint32_t major, uint32_t minor,
			uint32_t flags2)
{
	/* Every daemon on the connection sees the same INIT and decides the
	 * same; the first one's reply is the one the kernel takes. */
	__atomic_store_n(&pt->on,
			 major == FUSE_KERNEL_VERSION && minor >= PT_MINOR &&
				 (flags2 & PT_FLAGS2_PASSTHROUGH),
			 __ATOMIC_RELEASE);
}

void castfs_pt_amend_init(struct castfs_pt *pt, void *out, size_t len)
{
	struct pt_init_out *o = out;

	if (castfs_pt_on(pt) && len >= sizeof(*o)) {
		o->flags2 |= PT_FLAGS2_PASSTHROUGH;
		/* Sources may not be stacked filesystems themselves. */
		o->max_stack_depth = 1;
	}
}

void castfs_pt_amend_reply(struct castfs_pt *pt, struct iovec *iov, int count)
{
	const struct fuse_out_header *h = iov[0].iov_base;

	if (!pt || count < 2 || iov[0].iov_len < sizeof(*h) || h->error)
		return;
	if (pending_backing && iov[1].iov_len == sizeof(struct pt_open_out)) {
		struct pt_open_out *o = iov[1].iov_base;

		o->open_flags |= PT_FOPEN_PASSTHROUGH;
		o->backing_id = pending_backing;
		pending_backing = 0;
	}
}

static size_t pt_hash(uint64_t id, size_t cap)
{
	return (size_t)castfs_mix64(id) & (cap - 1);
}

static struct pt_slot *pt_find_locked(struct castfs_pt *pt, uint64_t id)
{
	if (!pt->cap)
		return NULL;
	for (size_t i = pt_hash(id, pt->cap);; i = (i + 1) & (pt->cap - 1)) {
		struct pt_slot *s = &pt->slot[i];

		if (!s->id && !s->tomb)
			return NULL;
		if (s->id == id)
			return s;
	}
}

/* Rehash into a table at most half full of the live entries: tombstones
 * go with the rehash, so churn (files opened and forgotten for the life
 * of the mount) does not grow the table, and a shrunk set shrinks it. */
static int pt_rehash_locked(struct castfs_pt *pt)
{
	struct pt_slot *old = pt->slot, *s;
	size_t ocap = pt->cap, live = 0, cap = 256;

	for (size_t i = 0; i < ocap; i++)
		live += old[i].id != 0;
	while ((live + 1) * 2 > cap)
		cap *= 2;
	s = calloc(cap, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pt->slot = s;
	pt->cap = cap;
	pt->used = 0;
	for (size_t i = 0; i < ocap; i++) {
		size_t j;

		if (!old[i].id)
			continue;
		for (j = pt_hash(old[i].id, cap); s[j].id;
		     j = (j + 1) & (cap - 1))
			;
		s[j] = old[i];
		pt->used++;
	}
	free(old);
	return 0;
}

static int pt_insert_locked(struct castfs_pt *pt, uint64_t id, int32_t backing)
{
	size_t i;
	int rc;

	if ((pt->used + 1) * 4 > pt->cap * 3) {
		rc = pt_rehash_locked(pt);
		if (rc)
			return rc;
	}
	for (i = pt_hash(id, pt->cap); pt->slot[i].id;
	     i = (i + 1) & (pt->cap - 1))
		;
	if (!pt->slot[i].tomb)
		pt->used++;
	pt->slot[i] = (struct pt_slot){ .id = id, .backing = backing };
	return 0;
}

/* A new backing id for @fd, or a negative errno. */
static int32_t pt_backing_open(struct castfs_pt *pt, int fd)
{
	struct pt_backing_map map = { .fd = fd };
	int id = ioctl(pt->dev_fd, PT_IOC_BACKING_OPEN, &map);

	return id > 0 ? id : id == 0 ? -EIO : -errno;
}

static void pt_remove_locked(struct pt_slot *s)
{
	s->id = 0;
	s->tomb = true;
}

/* Apply what other daemons of this connection journalled since the last
 * call. A torn tail (a daemon killed mid-append cannot tear one: a
 * 16-byte write(2) is whole) is left for the next call. */
static void pt_replay_locked(struct castfs_pt *pt)
{
	struct pt_rec r[256];
	ssize_t n;

	if (pt->journal_fd < 0)
		return;
	while ((n = pread(pt->journal_fd, r, sizeof(r),
			  (off_t)pt->journal_off)) >= (ssize_t)sizeof(r[0])) {
		size_t k = (size_t)n / sizeof(r[0]);

		for (size_t i = 0; i < k; i++) {
			struct pt_slot *s = pt_find_locked(pt, r[i].id);

			if (s)
				pt_remove_locked(s);
			if (r[i].op == PT_REC_ADD &&
			    pt_insert_locked(pt, r[i].id, r[i].backing))
				return; /* out of memory: retried next time */
		}
		pt->journal_off += k * sizeof(r[0]);
	}
}

static void pt_journal(struct castfs_pt *pt, uint64_t id, int32_t backing,
		       uint32_t op)
{
	struct pt_rec r = { .id = id, .backing = backing, .op = op };

	if (pt->journal_fd < 0)
		return;
	/* Our own records come back at the next replay and change nothing:
	 * they are in the order of our changes. A lost one makes a
	 * successor register the node again, which only a file open across
	 * the restart would notice. */
	(void)!write(pt->journal_fd, &r, sizeof(r));
}

void castfs_pt_set_journal(struct castfs_pt *pt, int fd)
{
	pthread_mutex_lock(&pt->lock);
	pt->journal_fd = fd;
	pt_replay_locked(pt);
	pthread_mutex_unlock(&pt->lock);
}

static void pt_backing_close(struct castfs_pt *pt, int32_t backing)
{
	uint32_t id = (uint32_t)backing;

	/* Fails only for an id that is not open: nothing to undo. */
	(void)ioctl(pt->dev_fd, PT_IOC_BACKING_CLOSE, &id);
}

int castfs_pt_open(struct castfs_pt *pt, uint64_t id, int src_fd)
{
	struct pt_slot *s;
	int32_t backing;
	int rc = 0;

	if (!castfs_pt_on(pt) || src_fd < 0)
		return 0;
	pthread_mutex_lock(&pt->lock);
	/* Registered or closed by the daemon before us, or one retiring
	 * (one pread when nothing is new). */
	pt_replay_locked(pt);
	s = pt_find_locked(pt, id);
	if (s) {
		backing = s->backing;
	} else {
		backing = pt_backing_open(pt, src_fd);
		if (backing > 0) {
			rc = pt_insert_locked(pt, id, backing);
			if (rc) {
				pt_backing_close(pt, backing);
			} else {
				pt_journal(pt, id, backing, PT_REC_ADD);
				castfs_stats_count(pt->stats,
						   CASTFS_SCTR_PT_BACKINGS, 1);
			}
		}
	}
	pthread_mutex_unlock(&pt->lock);
	if (rc)
		return rc;
	if (backing == -EPERM) {
		/* No CAP_SYS_ADMIN: the same for every file, and no file
		 * was passed through before this one. */
		__atomic_store_n(&pt->on, false, __ATOMIC_RELEASE);
		return 0;
	}
	/* A source that cannot back a FUSE file (a stacked filesystem:
	 * ELOOP; no read_iter: EINVAL) is served by the daemon, every time
	 * alike; other errors (EMFILE, ENOMEM) fail this open only. */
	if (backing == -ELOOP || backing == -EINVAL || backing == -EOPNOTSUPP)
		return 0;
	if (backing < 0)
		return backing;
	pending_backing = backing;
	return 1;
}

void castfs_pt_open_abandon(void)
{
	pending_backing = 0;
}

void castfs_pt_forget(struct castfs_pt *pt, struct castfs_ns *ns, uint64_t id)
{
	struct pt_slot *s;

	if (!castfs_pt_on(pt))
		return;
	/* No replay: every FORGET would cost a pread. What the daemons
	 * before us registered was replayed at our start, and every open
	 * replays; only an id a retiring daemon registers after our last
	 * open and whose node is then forgotten stays open until unmount. */
	pthread_mutex_lock(&pt->lock);
	s = pt_find_locked(pt, id);
	/* Unless looked up again since (a new inode of the same node id,
	 * whose next open will take this id: no inode holds it now). */
	if (s && !castfs_ns_held(ns, id)) {
		pt_backing_close(pt, s->backing);
		pt_journal(pt, id, s->backing, PT_REC_DEL);
		castfs_stats_count(pt->stats, CASTFS_SCTR_PT_CLOSED, 1);
		pt_remove_locked(s);
	}
	pthread_mutex_unlock(&pt->lock);
}
