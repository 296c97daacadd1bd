/* SPDX-License-Identifier: MIT */
/*
 * The FUSE low-level operations: decode the request, make one namespace
 * call, send exactly one reply. Every mutating operation gets EROFS.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fs.h"

/*
 * No reference count on open files: the kernel sends RELEASE (RELEASEDIR)
 * only after the reply to the OPEN and to every READ (READDIR) of that
 * open. Each read
 * request pins the kernel's fuse_file until its reply arrives (or the
 * connection aborts), RELEASE is sent when the last pin goes, and a request
 * resent after a restart (FUSE_NOTIFY_RESEND) keeps its pin. So a handler
 * never touches its file after replying and RELEASE may free it
 * (docs/RELIABILITY.md, "Restarts"). ThreadSanitizer sees that order
 * through the /dev/fuse fd's read and write only when it saw the fd being
 * opened, which a supervised daemon (it inherits the fd) never does; these
 * two annotations state the kernel's order to it. No code without TSan.
 */
#if defined(__SANITIZE_THREAD__)
#define CASTFS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CASTFS_TSAN 1
#endif
#endif
#ifdef CASTFS_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define last_use_before_reply(obj) __tsan_release(obj)
#define replies_before_release(obj)          \
	do {                                 \
		if (obj)                     \
			__tsan_acquire(obj); \
	} while (0)
#else
#define last_use_before_reply(obj) ((void)(obj))
#define replies_before_release(obj) ((void)(obj))
#endif

/* Per worker thread: the conversion scratch and the reply buffer. */
struct fs_thread {
	struct castfs_scratch s;
	char *out;
	size_t out_len;
	struct castfs_fs *fs;
	fuse_req_t req; /* the read in progress, or NULL */
	pid_t pid; /* the task that made it (0: not in our pid namespace) */
	int64_t next_look_ns; /* when to look at that task again; 0: never yet */
};

/* How often a long pass looks whether its reader still exists. */
#define READER_LOOK_NS 100000000L

/* The value of the status line that starts with @key, or NULL. */
static const char *status_field(const char *text, const char *key)
{
	size_t len = strlen(key);

	for (const char *l = text; l; l = strchr(l, '\n'), l = l ? l + 1 : l) {
		if (strncmp(l, key, len) == 0)
			return l + len;
	}
	return NULL;
}

/*
 * Whether task @pid has ended or is ending: no /proc entry (reaped), a
 * zombie or dead one, or SIGKILL pending. The last is the killed reader
 * of an asynchronous O_DIRECT read: it cannot exit before that read's
 * reply, so it would wait for the whole pass. Anything else that goes
 * wrong reads as alive, so that a doubt never abandons a read.
 */
static bool task_ended(pid_t pid)
{
	const unsigned long long kill_bit = 1ull << (SIGKILL - 1);
	const char *state, *pnd, *shd;
	char path[32], buf[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ESRCH;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 && errno == ESRCH;
	buf[n] = '\0';
	state = status_field(buf, "State:\t");
	if (state && (*state == 'Z' || *state == 'X'))
		return true;
	pnd = status_field(buf, "SigPnd:\t");
	shd = status_field(buf, "ShdPnd:\t");
	return (pnd && (strtoull(pnd, NULL, 16) & kill_bit)) ||
	       (shd && (strtoull(shd, NULL, 16) & kill_bit));
}

/*
 * Whether the task that made the read in progress has ended. The kernel
 * sends FUSE_INTERRUPT only for synchronous requests; read-ahead and
 * asynchronous O_DIRECT reads are background requests, whose reader may
 * be killed while a pass over a whole tensor runs for it (minutes for a
 * TiB). Looked at every READER_LOOK_NS, from the first time a pass asks,
 * so a read that asks nothing costs nothing. Abandoning is safe when
 * another task waits on the same pages: a page left not up to date is
 * read again by its next reader, with its own request.
 */
static bool reader_ended(struct fs_thread *t)
{
	int64_t now;

	if (t->pid <= 0)
		return false;
	now = castfs_fs_now_ns();
	if (t->next_look_ns && now < t->next_look_ns)
		return false;
	if (t->next_look_ns && task_ended(t->pid))
		return true;
	t->next_look_ns = now + READER_LOOK_NS;
	return false;
}

/* The scratch's cancel hook: a long computation stops when its reader is
 * gone (the kernel sent FUSE_INTERRUPT: a signal, a kill; or the task
 * that made a background read has ended) or the daemon is stopping
 * (SIGTERM, unmount), so neither waits for it. */
static bool read_cancelled(void *ctx)
{
	struct fs_thread *t = ctx;

	return fuse_session_exited(t->fs->se) ||
	       (t->req && (fuse_req_interrupted(t->req) || reader_ended(t)));
}

#define FS_OUT_LEN (1u << 20) /* the largest read the kernel sends */

static void thread_free(void *p)
{
	struct fs_thread *t = p;

	castfs_scratch_fini(&t->s);
	free(t->out);
	free(t);
}

int castfs_fs_thread_key_init(struct castfs_fs *fs)
{
	return -pthread_key_create(&fs->tls, thread_free);
}

static void file_close_any(void *f)
{
	castfs_file_close(f);
}

/*
 * The object of a directory fh whose listing the kernel caches: none is
 * made at OPENDIR, as the kernel asks for one (READDIR) only when its
 * cached listing is missing or was dropped (fs_dircache.c); the first
 * READDIR of the open makes it (dir_of()).
 */
static struct castfs_dir unlisted;

static void dir_release(struct castfs_dir *d)
{
	if (d != &unlisted)
		castfs_dir_free(d);
}

static void dir_free_any(void *d)
{
	dir_release(d);
}

/* The tables' shares for a request (fs/fs.h, castfs_fh_get). */
static void *dir_hold_any(void *d)
{
	return d != &unlisted ? castfs_dir_hold(d) : d;
}

static void *file_hold_any(void *f)
{
	return castfs_file_hold(f);
}

int castfs_fs_handles_init(struct castfs_fs *fs)
{
	int rc = castfs_fh_table_new(file_hold_any, &fs->files);

	return rc ? rc : castfs_fh_table_new(dir_hold_any, &fs->dirs);
}

void castfs_fs_handles_fini(struct castfs_fs *fs)
{
	castfs_fh_table_free(fs->files, file_close_any);
	castfs_fh_table_free(fs->dirs, dir_free_any);
	fs->files = NULL;
	fs->dirs = NULL;
}

static struct fs_thread *thread_get(struct castfs_fs *fs)
{
	struct fs_thread *t = pthread_getspecific(fs->tls);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->out = malloc(FS_OUT_LEN);
	if (!t->out || castfs_scratch_init(&t->s)) {
		thread_free(t);
		return NULL;
	}
	t->out_len = FS_OUT_LEN;
	t->fs = fs;
	t->s.cancelled = read_cancelled;
	t->s.cancel_ctx = t;
	pthread_setspecific(fs->tls, t);
	return t;
}

static struct castfs_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static void reply_err(fuse_req_t req, enum castfs_sop op, int rc)
{
	castfs_stats_op(fs_of(req)->stats, op, rc);
	fuse_reply_err(req, -rc);
}

/*
 * The kernel stops sending read-ahead's requests while congestion_threshold
 * background requests are queued (9, of max_background 12, when the INIT
 * reply says 0, as libfuse does unless told). A sequential reader has up to
 * two windows in flight: of a window of more than 4 MiB (four requests),
 * the part past the threshold would not be read ahead (the reader then
 * waits for it). Leave the kernel's defaults up to that, and scale both
 * past it, keeping its ratio.
 */
#define FS_KERNEL_CONGESTION 9u /* the kernel's threshold for a reply of 0 */

static void set_background(struct fuse_conn_info *conn, unsigned ra_kb)
{
	unsigned reqs = (unsigned)(((uint64_t)ra_kb * 1024u + FS_OUT_LEN - 1) /
				   FS_OUT_LEN);
	unsigned congestion = 2 * reqs + 1;

	if (congestion <= FS_KERNEL_CONGESTION)
		return;
	conn->congestion_threshold = congestion;
	conn->max_background = congestion * 4 / 3;
}

static void castfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	const struct castfs_fs *fs = userdata;

	/* Node ids are stable across restarts: NFS handles can use them. */
	if (conn->capable & FUSE_CAP_EXPORT_SUPPORT)
		conn->want |= FUSE_CAP_EXPORT_SUPPORT;
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	/* Attributes with the listing, at its start and after lookups in
	 * the directory only (castfs_op_readdirplus()). */
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
	/* Splice did not pay off at 1 MiB requests (DESIGN.md section 4). */
	conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE |
				  FUSE_CAP_SPLICE_MOVE);
	/* The kernel sets the mount's read-ahead to the lesser of this and
	 * the read_ahead_kb written before the reply (fs_mount.c), so both
	 * say the option's value. Requests stay at most FS_OUT_LEN
	 * (max_pages); a larger window is sent as more of them at once. */
	conn->max_readahead = fs->read_ahead_kb * 1024u;
	set_background(conn, fs->read_ahead_kb);
}

static void reply_entry(fuse_req_t req, uint64_t id, const struct stat *st)
{
	struct castfs_fs *fs = fs_of(req);
	struct fuse_entry_param e = {
		.ino = id,
		.generation = 1,
		.attr = *st,
		.attr_timeout = fs->timeout,
		.entry_timeout = fs->timeout,
	};

	castfs_stats_op(fs->stats, CASTFS_SOP_LOOKUP, 0);
	if (fuse_reply_entry(req, &e) == -ENOENT)
		castfs_ns_forget(fs->ns, id,
				 1); /* the lookup was interrupted */
}

static void castfs_op_lookup(fuse_req_t req, fuse_ino_t parent,
			     const char *name)
{
	struct stat st;
	uint64_t id;
	int rc = castfs_ns_lookup(fs_of(req)->ns, parent, name, &id, &st);

	if (rc)
		reply_err(req, CASTFS_SOP_LOOKUP, rc);
	else
		reply_entry(req, id, &st);
}

static void castfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	castfs_ns_forget(fs_of(req)->ns, ino, nlookup);
	castfs_pt_forget(fs_of(req)->pt, fs_of(req)->ns, ino);
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_FORGET, 0);
	fuse_reply_none(req);
}

static void castfs_op_forget_multi(fuse_req_t req, size_t count,
				   struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++) {
		castfs_ns_forget(fs_of(req)->ns, forgets[i].ino,
				 forgets[i].nlookup);
		castfs_pt_forget(fs_of(req)->pt, fs_of(req)->ns,
				 forgets[i].ino);
	}
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_FORGET, 0);
	fuse_reply_none(req);
}

static void castfs_op_getattr(fuse_req_t req, fuse_ino_t ino,
			      struct fuse_file_info *fi)
{
	struct castfs_fs *fs = fs_of(req);
	struct stat st;
	int rc = castfs_ns_getattr(fs->ns, ino, &st);

	(void)fi;
	if (rc) {
		reply_err(req, CASTFS_SOP_GETATTR, rc);
		return;
	}
	castfs_stats_op(fs->stats, CASTFS_SOP_GETATTR, 0);
	fuse_reply_attr(req, &st, fs->timeout);
}

static void castfs_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char buf[PATH_MAX + 1];
	int rc = castfs_ns_readlink(fs_of(req)->ns, ino, buf, sizeof(buf));

	if (rc) {
		reply_err(req, CASTFS_SOP_READLINK, rc);
		return;
	}
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_READLINK, 0);
	fuse_reply_readlink(req, buf);
}

static void castfs_op_open(fuse_req_t req, fuse_ino_t ino,
			   struct fuse_file_info *fi)
{
	struct castfs_fs *fs = fs_of(req);
	struct castfs_file *f;
	int rc;

	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		reply_err(req, CASTFS_SOP_OPEN, -EROFS);
		return;
	}
	rc = castfs_ns_open(fs->ns, ino, &f);
	if (rc) {
		reply_err(req, CASTFS_SOP_OPEN, rc);
		return;
	}
	fi->fh = castfs_fh_add(fs->files, f);
	if (!fi->fh) {
		castfs_file_close(f);
		reply_err(req, CASTFS_SOP_OPEN, -ENOMEM);
		return;
	}
	/* Content per node id never changes: keep the page cache. Control
	 * files are made per open and read past their size-0 attribute. An
	 * unconverted file may be read by the kernel from its source instead
	 * (-o passthrough): then there is no page cache of ours to keep. */
	rc = castfs_pt_open(fs->pt, ino, castfs_file_backing_fd(f));
	if (rc < 0) {
		castfs_file_close(castfs_fh_remove(fs->files, fi->fh));
		reply_err(req, CASTFS_SOP_OPEN, rc);
		return;
	}
	/* O_DIRECT on a passed-through file would follow the source's
	 * alignment rules (EINVAL for an odd length on ext4): its reads come
	 * to the daemon as without the option, its maps go to the source. */
	fi->direct_io = castfs_file_direct_io(f) ||
			(rc && (fi->flags & O_DIRECT));
	fi->keep_cache = !fi->direct_io && !rc;
	fi->noflush = 1;
	if (rc)
		castfs_stats_count(fs->stats, CASTFS_SCTR_PASSTHROUGH_OPENS, 1);
	last_use_before_reply(f);
	castfs_stats_op(fs->stats, CASTFS_SOP_OPEN, 0);
	if (fuse_reply_open(req, fi) == -ENOENT)
		castfs_file_close(castfs_fh_remove(fs->files, fi->fh));
	castfs_pt_open_abandon(); /* sent, or never will be */
}

/*
 * The open file of @fh. An fh this daemon never issued was issued by the
 * daemon it replaced (the kernel kept it across the restart): the file is
 * opened again by node id, which names the same bytes (but for control
 * files, whose text each open makes: see castfs_ns_reopen()).
 */
static int file_of(struct castfs_fs *fs, fuse_ino_t ino, uint64_t fh,
		   struct castfs_file **out)
{
	struct castfs_file *f = castfs_fh_get(fs->files, fh), *got;
	bool took;
	int rc;

	if (f) {
		*out = f;
		return 0;
	}
	rc = castfs_ns_reopen(fs->ns, ino, &f);
	if (rc)
		return rc;
	got = castfs_fh_adopt(fs->files, fh, f, &took);
	if (!took) /* the table has another, or none */
		castfs_file_close(f);
	if (!got)
		return -ENOMEM;
	*out = got;
	return 0;
}

static void castfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	struct fs_thread *t = thread_get(fs_of(req));
	struct castfs_file *f;
	char *buf;
	ssize_t n;
	int rc;

	rc = t ? file_of(fs_of(req), ino, fi->fh, &f) : -ENOMEM;
	if (rc) {
		reply_err(req, CASTFS_SOP_READ, rc);
		return;
	}
	buf = size <= t->out_len ? t->out : malloc(size);
	if (!buf) {
		castfs_file_close(f);
		reply_err(req, CASTFS_SOP_READ, -ENOMEM);
		return;
	}
	t->req = req;
	t->pid = fuse_req_ctx(req)->pid;
	t->next_look_ns = 0;
	n = castfs_file_read(f, &t->s, buf, size, (uint64_t)off);
	t->req = NULL;
	last_use_before_reply(f);
	if (n < 0) {
		reply_err(req, CASTFS_SOP_READ, (int)n);
	} else {
		castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_READ, 0);
		fuse_reply_buf(req, buf, (size_t)n);
	}
	if (buf != t->out)
		free(buf);
	castfs_file_close(f); /* this request's share */
}

static void castfs_op_release(fuse_req_t req, fuse_ino_t ino,
			      struct fuse_file_info *fi)
{
	struct castfs_file *f = castfs_fh_remove(fs_of(req)->files, fi->fh);

	(void)ino;
	/* Unknown to this daemon (opened by the previous one, never read
	 * since): nothing to release. */
	replies_before_release(f);
	castfs_file_close(f);
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_RELEASE, 0);
	fuse_reply_err(req, 0);
}

static void castfs_op_opendir(fuse_req_t req, fuse_ino_t ino,
			      struct fuse_file_info *fi)
{
	struct castfs_fs *fs = fs_of(req);
	struct castfs_dir *dir = &unlisted;
	int cached = castfs_ns_dir_cacheable(fs->ns, ino), rc = 0;

	if (cached == 0)
		rc = castfs_ns_opendir(fs->ns, ino, &dir);
	if (rc || cached < 0) {
		reply_err(req, CASTFS_SOP_OPENDIR, rc ? rc : cached);
		return;
	}
	fi->fh = castfs_fh_add(fs->dirs, dir);
	if (!fi->fh) {
		dir_release(dir);
		reply_err(req, CASTFS_SOP_OPENDIR, -ENOMEM);
		return;
	}
	/* The kernel keeps the listing in the directory's page cache until
	 * the namespace says it changed (castfs_fs_listing_changed()); the
	 * first open this daemon answers drops what the kernel kept (a
	 * previous daemon's listing: other views after a reload; bug hunt). */
	fi->cache_readdir = cached > 0;
	fi->keep_cache = cached == 1;
	last_use_before_reply(dir);
	castfs_stats_op(fs->stats, CASTFS_SOP_OPENDIR, 0);
	if (fuse_reply_open(req, fi) == -ENOENT)
		dir_release(castfs_fh_remove(fs->dirs, fi->fh));
}

/* The listing of @fh; like file_of(), a previous daemon's fh is listed
 * again (offsets name the entry to go on after: castfs_dir_off()). */
static int dir_of(struct castfs_fs *fs, fuse_ino_t ino, uint64_t fh,
		  struct castfs_dir **out)
{
	struct castfs_dir *was = castfs_fh_get(fs->dirs, fh), *d, *got;
	bool took;
	int rc;

	if (was && was != &unlisted) {
		*out = was;
		return 0;
	}
	rc = castfs_ns_opendir(fs->ns, ino, &d);
	if (rc)
		return rc;
	/* Two READDIRs of one fh at once (a request resent while this
	 * daemon still answers it) get the same shared listing: the one
	 * not taken by the table drops its reference, same pointer or not
	 * (a leak LeakSanitizer found in daemons retired by reloads). */
	got = was ? castfs_fh_swap(fs->dirs, fh, was, d, &took) :
		    castfs_fh_adopt(fs->dirs, fh, d, &took);
	if (!took)
		castfs_dir_free(d);
	if (!got)
		return -ENOMEM;
	*out = got;
	return 0;
}

static void castfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			      off_t off, struct fuse_file_info *fi)
{
	struct fs_thread *t = thread_get(fs_of(req));
	struct castfs_dir *dir;
	size_t pos = 0;
	int rc = t ? dir_of(fs_of(req), ino, fi->fh, &dir) : -ENOMEM;

	if (rc) {
		reply_err(req, CASTFS_SOP_READDIR, rc);
		return;
	}
	size = size < t->out_len ? size : t->out_len;
	for (size_t i = castfs_dir_seek(dir, (uint64_t)off);
	     off >= 0 && i < dir->n; i++) {
		struct stat st = { .st_ino = dir->ents[i].ino,
				   .st_mode = dir->ents[i].type };
		size_t need = fuse_add_direntry(req, t->out + pos, size - pos,
						dir->ents[i].name, &st,
						(off_t)castfs_dir_off(dir, i));

		if (need > size - pos)
			break;
		pos += need;
	}
	last_use_before_reply(dir);
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_READDIR, 0);
	fuse_reply_buf(req, t->out, pos);
	dir_release(dir); /* this request's share */
}

/*
 * One entry of a READDIRPLUS reply at @buf (@left bytes): a looked-up
 * entry with its attributes if @lookup, else a plain one, as are "." and
 * ".." (which the kernel never counts as a lookup) and an entry whose
 * lookup failed (its own LOOKUP will say why). Returns the bytes it takes
 * (more than @left: nothing written, nothing looked up); *@id the node
 * looked up, or 0.
 */
static size_t add_plus(fuse_req_t req, char *buf, size_t left,
		       fuse_ino_t parent, const struct castfs_dirent *de,
		       off_t next, bool lookup, uint64_t *id)
{
	struct castfs_fs *fs = fs_of(req);
	struct fuse_entry_param e = { .attr = { .st_ino = de->ino,
						.st_mode = de->type } };
	size_t need = fuse_add_direntry_plus(req, NULL, 0, de->name, &e, next);

	*id = 0;
	if (need > left)
		return need;
	if (lookup && strcmp(de->name, ".") && strcmp(de->name, "..") &&
	    castfs_ns_lookup_listed(fs->ns, parent, de, id, &e.attr) == 0) {
		e.ino = *id;
		e.generation = 1;
		e.attr_timeout = fs->timeout;
		e.entry_timeout = fs->timeout;
	}
	return fuse_add_direntry_plus(req, buf, left, de->name, &e, next);
}

/*
 * A READDIR that gives each entry's attributes (and counts as its
 * LOOKUP): `ls -l` of a directory never listed costs no LOOKUP round
 * trip per entry. The kernel asks it (READDIRPLUS_AUTO) for the start of
 * every listing and after lookups or stats in the directory since its
 * last READDIR. The start is answered plain: a listing nobody stats
 * (`ls -f`, os.listdir) then looks up nothing (no node, no plan built, no
 * name the watcher must tell the kernel about), while `ls -l`, which
 * stats each entry as it reads, looks up that first reply's entries and
 * gets attributes with every later one.
 */
static void castfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
				  off_t off, struct fuse_file_info *fi)
{
	struct fs_thread *t = thread_get(fs_of(req));
	struct castfs_dir *dir;
	size_t pos = 0, nids = 0;
	/* The nodes this reply looked up, to forget if it is not delivered;
	 * a reply holds at most this many (the kernel asks again for the
	 * rest), so nothing is allocated per request. */
	uint64_t ids[256];
	struct castfs_dir *ahead = NULL;
	size_t i;
	int rc = t ? dir_of(fs_of(req), ino, fi->fh, &dir) : -ENOMEM;

	if (rc) {
		reply_err(req, CASTFS_SOP_READDIR, rc);
		return;
	}
	size = size < t->out_len ? size : t->out_len;
	i = castfs_dir_seek(dir, (uint64_t)off);
	for (; off >= 0 && i < dir->n && nids < CASTFS_ARRAY_SIZE(ids); i++) {
		uint64_t id;
		size_t need = add_plus(req, t->out + pos, size - pos, ino,
				       &dir->ents[i],
				       (off_t)castfs_dir_off(dir, i), off > 0,
				       &id);

		if (need > size - pos)
			break;
		pos += need;
		if (id)
			ids[nids++] = id;
		/* The reader is gone: what was looked up is still sent. */
		if (fuse_req_interrupted(req))
			break;
	}
	/* A reader of attributes takes these in, then asks for as many
	 * more: their lookups' parses and plans are made meanwhile, so that
	 * the reader and the daemon work at once, not in turn. */
	if (off > 0 && nids && i < dir->n)
		ahead = castfs_dir_hold(dir);
	last_use_before_reply(dir);
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_READDIR, 0);
	/* Not delivered (interrupted): the kernel counted none of them. */
	if (fuse_reply_buf(req, t->out, pos) == -ENOENT) {
		for (size_t k = 0; k < nids; k++)
			castfs_ns_forget(t->fs->ns, ids[k], 1);
	} else if (ahead) { /* the reply freed @req */
		castfs_ns_lookup_ahead(t->fs->ns, ino, ahead->ents + i,
				       CASTFS_MIN(nids, ahead->n - i));
	}
	castfs_dir_free(ahead);
	dir_release(dir); /* this request's share */
}

static void castfs_op_releasedir(fuse_req_t req, fuse_ino_t ino,
				 struct fuse_file_info *fi)
{
	struct castfs_dir *dir = castfs_fh_remove(fs_of(req)->dirs, fi->fh);

	(void)ino;
	replies_before_release(dir);
	dir_release(dir);
	fuse_reply_err(req, 0);
}

static void castfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;
	int rc = castfs_ns_statfs(fs_of(req)->ns, &sv);

	(void)ino;
	if (rc) {
		reply_err(req, CASTFS_SOP_STATFS, rc);
		return;
	}
	castfs_stats_op(fs_of(req)->stats, CASTFS_SOP_STATFS, 0);
	fuse_reply_statfs(req, &sv);
}

/* getxattr and listxattr share the FUSE size-probe protocol. */
static void reply_xattr(fuse_req_t req, enum castfs_sop op, char *buf,
			size_t size, ssize_t n)
{
	if (n < 0) {
		reply_err(req, op, (int)n);
		return;
	}
	castfs_stats_op(fs_of(req)->stats, op, 0);
	if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
}

/*
 * -o noxattr: ENOSYS makes the kernel answer every xattr call of the mount
 * itself. It is castfs's chosen answer, not a failure: counted as a
 * request, not as an error.
 */
static void reply_noxattr(fuse_req_t req, enum castfs_sop op)
{
	castfs_stats_op(fs_of(req)->stats, op, 0);
	fuse_reply_err(req, ENOSYS);
}

static void castfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			       size_t size)
{
	struct fs_thread *t = thread_get(fs_of(req));
	ssize_t n;

	if (fs_of(req)->noxattr) {
		reply_noxattr(req, CASTFS_SOP_GETXATTR);
		return;
	}
	if (!t) {
		reply_err(req, CASTFS_SOP_GETXATTR, -ENOMEM);
		return;
	}
	size = size < t->out_len ? size : t->out_len;
	n = castfs_ns_getxattr(fs_of(req)->ns, ino, name, t->out, size);
	reply_xattr(req, CASTFS_SOP_GETXATTR, t->out, size, n);
}

static void castfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs_thread *t = thread_get(fs_of(req));
	ssize_t n;

	if (fs_of(req)->noxattr) {
		reply_noxattr(req, CASTFS_SOP_LISTXATTR);
		return;
	}
	if (!t) {
		reply_err(req, CASTFS_SOP_LISTXATTR, -ENOMEM);
		return;
	}
	size = size < t->out_len ? size : t->out_len;
	n = castfs_ns_listxattr(fs_of(req)->ns, ino, t->out, size);
	reply_xattr(req, CASTFS_SOP_LISTXATTR, t->out, size, n);
}

/* ---- everything that would change something ---- */

static void erofs(fuse_req_t req)
{
	reply_err(req, CASTFS_SOP_MUTATE, -EROFS);
}

static void castfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			      int to_set, struct fuse_file_info *fi)
{
	(void)ino, (void)attr, (void)to_set, (void)fi;
	erofs(req);
}

static void castfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			    mode_t mode, dev_t rdev)
{
	(void)parent, (void)name, (void)mode, (void)rdev;
	erofs(req);
}

static void castfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			    mode_t mode)
{
	(void)parent, (void)name, (void)mode;
	erofs(req);
}

static void castfs_op_unlink(fuse_req_t req, fuse_ino_t parent,
			     const char *name)
{
	(void)parent, (void)name;
	erofs(req);
}

static void castfs_op_symlink(fuse_req_t req, const char *link,
			      fuse_ino_t parent, const char *name)
{
	(void)link, (void)parent, (void)name;
	erofs(req);
}

static void castfs_op_rename(fuse_req_t req, fuse_ino_t parent,
			     const char *name, fuse_ino_t newparent,
			     const char *newname, unsigned int flags)
{
	(void)parent, (void)name, (void)newparent, (void)newname, (void)flags;
	erofs(req);
}

static void castfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			   const char *newname)
{
	(void)ino, (void)newparent, (void)newname;
	erofs(req);
}

static void castfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			    size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino, (void)buf, (void)size, (void)off, (void)fi;
	erofs(req);
}

static void castfs_op_create(fuse_req_t req, fuse_ino_t parent,
			     const char *name, mode_t mode,
			     struct fuse_file_info *fi)
{
	(void)parent, (void)name, (void)mode, (void)fi;
	erofs(req);
}

static void castfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			       const char *value, size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	erofs(req);
}

static void castfs_op_removexattr(fuse_req_t req, fuse_ino_t ino,
				  const char *name)
{
	(void)ino, (void)name;
	erofs(req);
}

static void castfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode,
				off_t offset, off_t length,
				struct fuse_file_info *fi)
{
	(void)ino, (void)mode, (void)offset, (void)length, (void)fi;
	erofs(req);
}

static void castfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent, (void)name;
	erofs(req);
}

const struct fuse_lowlevel_ops castfs_fs_ops = {
	.init = castfs_op_init,
	.lookup = castfs_op_lookup,
	.forget = castfs_op_forget,
	.forget_multi = castfs_op_forget_multi,
	.getattr = castfs_op_getattr,
	.readlink = castfs_op_readlink,
	.open = castfs_op_open,
	.read = castfs_op_read,
	.release = castfs_op_release,
	.opendir = castfs_op_opendir,
	.readdir = castfs_op_readdir,
	.readdirplus = castfs_op_readdirplus,
	.releasedir = castfs_op_releasedir,
	.statfs = castfs_op_statfs,
	.getxattr = castfs_op_getxattr,
	.listxattr = castfs_op_listxattr,
	.setattr = castfs_op_setattr,
	.mknod = castfs_op_mknod,
	.mkdir = castfs_op_mkdir,
	.unlink = castfs_op_unlink,
	.rmdir = castfs_op_rmdir,
	.symlink = castfs_op_symlink,
	.rename = castfs_op_rename,
	.link = castfs_op_link,
	.write = castfs_op_write,
	.create = castfs_op_create,
	.setxattr = castfs_op_setxattr,
	.removexattr = castfs_op_removexattr,
	.fallocate = castfs_op_fallocate,
};
