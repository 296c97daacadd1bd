/* SPDX-License-Identifier: MIT */
/*
 * The castfs namespace: the read-only tree a mount shows over a source
 * directory (mirrored entries, converted views, tensor trees, model-directory
 * views, the control directory), addressed by stable node ids. FUSE-free:
 * fs/ maps each request onto one call here.
 */
#ifndef CASTFS_NS_H
#define CASTFS_NS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "common/err.h"
#include "plan/plan.h"
#include "view/view.h"

/* The id of the mount root (FUSE_ROOT_ID). */
#define CASTFS_NS_ROOT_ID 1u

struct castfs_ns;
struct castfs_stats;

/*
 * Optional: tells castfs when another process opens a source file for
 * writing while castfs reads it. Without it castfs relies on each source's
 * size and mtime alone, which misses a same-size rewrite within one
 * timestamp tick. fs/ implements it with file leases (fs/fs_lease.c).
 * Every function must be thread-safe.
 */
struct castfs_source_guard {
	/* Watch @fd (opened O_RDONLY). Returns 0; -EAGAIN when a writer has
	 * the file open now; another negative errno when it cannot watch
	 * (castfs then falls back on size and mtime). */
	int (*watch)(void *ctx, int fd);
	/* A read of @fd begins; false when a writer came since watch(). */
	bool (*enter)(void *ctx, int fd);
	/* That read ended; false when a writer came since watch(). */
	bool (*leave)(void *ctx, int fd);
	/* Stop watching @fd; called before it is closed. */
	void (*unwatch)(void *ctx, int fd);
	void *ctx;
};

struct castfs_ns_opts {
	const char *source; /* the source directory */
	const struct castfs_views *views; /* borrowed for the ns lifetime */
	const char *config_json; /* effective options, for /.castfs/config */
	struct castfs_stats *stats; /* counters to update; may be NULL */
	const struct castfs_source_guard *guard; /* may be NULL */
	/* Where rejected files and other events are reported; may be NULL.
	 * Called from any thread. The names a message quotes are escaped
	 * already (common/escape.h): the sink makes the line safe with
	 * castfs_escape_text_buf(), which does not escape them again. */
	void (*log)(void *ctx, const char *msg);
	void *log_ctx;
	/* Decoded bytes of packed sources kept in memory; 0: the default
	 * (CASTFS_ZCACHE_DEFAULT). */
	size_t zcache_bytes;
	/* Estimated bytes of parsed headers, plans and tensor trees the
	 * checkpoint cache keeps for checkpoints nothing uses; 0: the
	 * default (CASTFS_CKPT_CACHE_DEFAULT). */
	size_t cache_bytes;
	/* This daemon took over the connection of another (a restart or
	 * reload under the supervisor): the kernel may hold names it never
	 * answered, so the change watcher tells it about every name, not
	 * only those this daemon's lookups answered. */
	bool successor;
	/* Called with the id of a directory whose listing may have changed
	 * (a source change the watcher reported through
	 * castfs_ns_invalidate(), or a listed entry found not to be
	 * servable), so that a listing the kernel caches is dropped. Called
	 * from any thread, possibly inside a request, with no namespace lock
	 * held; may be NULL. */
	void (*listing_changed)(void *ctx, uint64_t dir);
	void *listing_ctx;
};

/* The checkpoint cache's default budget (-o cache_mb). */
#define CASTFS_CKPT_CACHE_DEFAULT ((size_t)64 << 20)

/*
 * castfs_ns_new - open the source directory and build an empty node table.
 * Returns 0, -ENOTDIR/-ENOENT/-EACCES (the source), -ENOMEM; @d says why.
 */
int castfs_ns_new(const struct castfs_ns_opts *o, struct castfs_ns **out,
		  struct castfs_diag *d);

/* castfs_ns_free - release everything; NULL is accepted. */
void castfs_ns_free(struct castfs_ns *ns);

/*
 * castfs_ns_lookup - resolve @name in directory @parent ("." and ".." too).
 * On success *@id is the child's node id, @st its attributes, and the
 * node's lookup count is incremented (FUSE semantics: undone by forget).
 * Returns 0, -ENOENT, -ENOTDIR, -ESTALE (unknown @parent), -ENAMETOOLONG,
 * or the source's errno. Thread-safe.
 */
int castfs_ns_lookup(struct castfs_ns *ns, uint64_t parent, const char *name,
		     uint64_t *id, struct stat *st);

struct castfs_dirent;

/*
 * castfs_ns_lookup_listed - castfs_ns_lookup() of entry @de of a listing
 * of @parent (READDIRPLUS): a name castfs derives is not looked for among
 * the source directory's entries, where the listing found none (the
 * watcher tells the kernel when one appears). Same returns.
 */
int castfs_ns_lookup_listed(struct castfs_ns *ns, uint64_t parent,
			    const struct castfs_dirent *de, uint64_t *id,
			    struct stat *st);

/*
 * castfs_ns_lookup_ahead - do for entries @ents[0..@n) of a listing of
 * @parent what their lookups will need (parses, plans), without looking
 * them up: no node is made and nothing is counted, so it is for a reader
 * that is about to ask (`ls -l` reading a listing with its attributes).
 * Errors are left for the lookups to meet. Thread-safe.
 */
void castfs_ns_lookup_ahead(struct castfs_ns *ns, uint64_t parent,
			    const struct castfs_dirent *ents, size_t n);

/* castfs_ns_forget - drop @n lookups of @id. Thread-safe. */
void castfs_ns_forget(struct castfs_ns *ns, uint64_t id, uint64_t n);

/* castfs_ns_held - whether the kernel holds node @id (a lookup not yet
 * forgotten). Thread-safe. */
bool castfs_ns_held(struct castfs_ns *ns, uint64_t id);

/* castfs_ns_getattr - attributes of @id. Returns 0, -ESTALE, or errno. */
int castfs_ns_getattr(struct castfs_ns *ns, uint64_t id, struct stat *st);

struct statvfs;

/* castfs_ns_statfs - the source filesystem's figures, flagged read-only. */
int castfs_ns_statfs(struct castfs_ns *ns, struct statvfs *sv);

/* castfs_ns_readlink - target of symlink @id into @buf (NUL-terminated).
 * Returns 0, -EINVAL (not a link), -ENAMETOOLONG, -ESTALE. */
int castfs_ns_readlink(struct castfs_ns *ns, uint64_t id, char *buf,
		       size_t len);

/* A directory listing, snapshotted at opendir. */
struct castfs_dirent {
	char *name;
	mode_t type; /* S_IFDIR, S_IFREG, S_IFLNK */
	/* A name castfs derives (a view, a tensor tree), not an entry of
	 * the source directory, which had none of that name when listed. */
	bool derived;
	uint64_t ino; /* the node id a lookup gives, where cheap to know */
};

struct castfs_dir {
	size_t n;
	struct castfs_dirent *ents;
	void *arena; /* private */
	/* Private: owners besides the first (a listing kept per identity is
	 * shared by every open handle; castfs_dir_free() drops one). */
	_Atomic unsigned refs;
	/* Private: where it is kept for other opens (ns_dirshare.c), or
	 * NULL. */
	struct ns_dirshare *share;
};

/* castfs_ns_opendir - list directory @id, "." and ".." first.
 * Returns 0, -ENOTDIR, -ESTALE, -ENOMEM, or the source's errno. */
int castfs_ns_opendir(struct castfs_ns *ns, uint64_t id,
		      struct castfs_dir **out);

/*
 * castfs_ns_dir_cacheable - whether the listing of directory @id may be
 * cached by the kernel across opens: 1 for a source directory, a
 * model-directory view and a tensor tree's directory (every change of
 * their listing is reported through castfs_ns_opts.listing_changed), 2
 * for such a directory this daemon has not been asked to open before (a
 * listing the kernel kept may be a previous daemon's, of other listed
 * views after `castfs reload`: to be dropped, then cached), 0 for another
 * directory (listed per open: /.castfs) or an id this daemon does not
 * know yet.
 * Returns -ENOTDIR for a file. Lists nothing. Thread-safe.
 */
int castfs_ns_dir_cacheable(struct castfs_ns *ns, uint64_t id);

/* castfs_dir_hold - one more share of @dir, which the caller holds (for
 * use past the reply that may let the handle go); castfs_dir_free() drops
 * it. Returns @dir. Thread-safe. */
struct castfs_dir *castfs_dir_hold(struct castfs_dir *dir);

/*
 * castfs_dir_off - the offset a listing hands out after entry @i of @dir
 * (READDIR's d_off, what telldir() returns): the name's hash above its
 * position. A listing made again once the directory changed (the kernel
 * asks at that offset with the handle of a listing it no longer has, or
 * a restarted daemon's handle) goes on after the same name, where a bare
 * position went on after another entry, skipping or repeating names
 * that never changed (a bug hunt: find and tar missed files while a
 * download ran). Nonzero, positive as an off_t.
 */
uint64_t castfs_dir_off(const struct castfs_dir *dir, size_t i);

/* castfs_dir_seek - the entry of @dir to list next after offset @off, as
 * castfs_dir_off() makes them (0: the first): after the entry of that
 * name when @dir has it (the nearest to its old position, should two
 * names share the 32-bit hash), else one before the position @off names
 * (the name is gone, and what followed it moved up one, unless more
 * changed: an entry may come twice, none is skipped for that change
 * alone). Up to @dir->n.
 * Listings of more than 2^31 entries resume by a search past that. */
size_t castfs_dir_seek(const struct castfs_dir *dir, uint64_t off);

/* castfs_dir_free - release a listing (one owner's share of it); NULL is
 * accepted. Thread-safe for a shared listing. */
void castfs_dir_free(struct castfs_dir *dir);

/* An open file: a snapshot of what it serves, valid until closed. */
struct castfs_file;

/*
 * castfs_ns_open - open file @id for reading. Returns 0, -EISDIR, -ESTALE
 * (the source changed since lookup), -ENOMEM or the source's errno.
 */
int castfs_ns_open(struct castfs_ns *ns, uint64_t id, struct castfs_file **out);

/*
 * castfs_ns_reopen - open file @id again for a handle a previous daemon
 * opened (a restart or reload), as castfs_ns_open(). A control file's text
 * is made at open, and this daemon's would not go on from where the old
 * one's stopped (a read across a reload spliced two): its reads fail with
 * -ESTALE until one starts this text at offset 0.
 */
int castfs_ns_reopen(struct castfs_ns *ns, uint64_t id,
		     struct castfs_file **out);

/*
 * castfs_file_read - bytes [@off, @off + @len) of @f into @buf using the
 * caller thread's scratch. Returns the byte count (short only at EOF), or
 * -EIO/-ESTALE when the source changed under the file (never mixed bytes),
 * or the source's errno. Thread-safe.
 */
ssize_t castfs_file_read(struct castfs_file *f, struct castfs_scratch *s,
			 void *buf, size_t len, uint64_t off);

/* castfs_file_size - the size the file was opened with. */
uint64_t castfs_file_size(const struct castfs_file *f);

/* castfs_file_is_view - true when the bytes are computed (not pass-through). */
bool castfs_file_is_view(const struct castfs_file *f);

/*
 * castfs_file_direct_io - true for files whose content is generated per
 * open (the control files): they report size 0 and must be served with
 * direct I/O so that readers see the whole snapshot. Never true for views.
 */
bool castfs_file_direct_io(const struct castfs_file *f);

/*
 * castfs_file_backing_fd - the source fd whose bytes are @f's, offset for
 * offset (an unconverted file: no plan, no pack, one part), or -1. Owned
 * by @f. For kernel passthrough (fs/fs_pt.c).
 */
int castfs_file_backing_fd(const struct castfs_file *f);

/* castfs_file_hold - one more share of @f, which the caller holds (a
 * request that may outlive the handle's RELEASE); castfs_file_close()
 * drops one. Thread-safe. */
struct castfs_file *castfs_file_hold(struct castfs_file *f);

/* castfs_file_close - drop a share of @f, closing it with the last one;
 * NULL is accepted. */
void castfs_file_close(struct castfs_file *f);

/*
 * castfs_ns_getxattr - value of extended attribute @name of @id into @buf
 * (@len 0: only the size). Returns the value's length, -EOPNOTSUPP for a
 * name outside the user. namespace (checked before @id, so any id gets it),
 * -ENODATA for an unknown user. name, -ERANGE (buffer too small), -ESTALE.
 * Thread-safe.
 */
ssize_t castfs_ns_getxattr(struct castfs_ns *ns, uint64_t id, const char *name,
			   char *buf, size_t len);

/* castfs_ns_listxattr - NUL-separated names into @buf; like getxattr. */
ssize_t castfs_ns_listxattr(struct castfs_ns *ns, uint64_t id, char *buf,
			    size_t len);

/*
 * castfs_ns_invalidate - forget what is cached about source path @rel
 * (relative to the source root; "" for the root) after it changed, and
 * report through @cb each (parent id, name) pair the kernel may have cached
 * so that the caller can invalidate those entries: only pairs a lookup of
 * this daemon answered (every pair for a castfs_ns_opts.successor), the
 * kernel holding no other. Thread-safe.
 */
void castfs_ns_invalidate(struct castfs_ns *ns, const char *rel,
			  void (*cb)(void *ctx, uint64_t parent,
				     const char *name),
			  void *ctx);

/*
 * castfs_ns_invalidate_held - after change events were lost: for every
 * node whose source path @keep (called without locks) does not vouch for
 * (deleted sources included: their directory cannot be listed or stat'ed
 * any more), the cached parse is dropped and the names reported through
 * @cb (as (parent id, name), the parent the kernel knows),
 * behind the set of names lookups answered, each name's directory
 * listing reported changed. Listings of other directories are left as
 * they are. Thread-safe.
 */
void castfs_ns_invalidate_held(
	struct castfs_ns *ns, bool (*keep)(void *kctx, const char *path),
	void *kctx, void (*cb)(void *ctx, uint64_t parent, const char *name),
	void *ctx);

/*
 * castfs_ns_rescan - after change events were lost since @since
 * (CLOCK_MONOTONIC nanoseconds, no later than the loss began): read
 * each of the @n source directories @dirs again (NULL entries are
 * skipped) and report through @cb, like castfs_ns_invalidate(), only the
 * entries whose identity (type, device, inode; and for all but
 * directories size, mtime, ctime) differs from what the directory's
 * last listing found, or that are new; a directory with no such
 * snapshot (never listed, listed since @since, over the snapshots'
 * memory bound) has every entry reported. Then every name the kernel
 * may hold that is not vouched for (gone, or in a directory not
 * rescanned) is reported (castfs_ns_invalidate_held()). Stops
 * early when *@stop becomes true. Counts in /.castfs/stats
 * (rescan_entries_compared, rescan_entries_reported,
 * rescan_dirs_whole). Called without locks held (@cb may block in the
 * kernel). Thread-safe.
 */
void castfs_ns_rescan(struct castfs_ns *ns, char *const *dirs, size_t n,
		      int64_t since, const atomic_bool *stop,
		      void (*cb)(void *ctx, uint64_t parent, const char *name),
		      void *ctx);

#endif
