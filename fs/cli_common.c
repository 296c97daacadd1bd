/* SPDX-License-Identifier: MIT */
/* What the sub-commands share: views, and opening a checkpoint or view. */
#include <errno.h>
#include <time.h>
#include <libgen.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fs.h"
#include "common/escape.h"
#include "common/reader.h"
#include "format/st_side.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)

int cli_views_load(struct castfs_views *vs, const char *cmd, const char *config)
{
	struct castfs_diag d = { { 0 } };
	int rc = castfs_fs_views_load(vs, config, &d);

	if (rc) {
		fprintf(stderr, "castfs %s: %s%s%s\n", cmd,
			config ? config : "", config ? ": " : "",
			d.msg[0] ? d.msg : strerror(-rc));
		return -1;
	}
	return 0;
}

/* "dir/X.<view>.safetensors" -> "dir/X.safetensors" and the view;
 * "dir/X.<q>.gguf" -> "dir/X.safetensors" and the view "<q>.gguf" (GGUF
 * views are named with their extension). */
static int split_view_name(const char *arg, const struct castfs_views *vs,
			   char **path, const struct castfs_view **view)
{
	size_t len = strlen(arg), stem;
	const char *dot, *slash = strrchr(arg, '/');

	if (len > 5 && !strcmp(arg + len - 5, ".gguf")) {
		stem = len - 5;
		dot = memrchr(arg, '.', stem);
		if (!dot || dot == arg || (slash && dot <= slash + 1))
			return -ENOENT;
		*view = castfs_views_find(vs, dot + 1,
					  (size_t)(arg + len - dot - 1));
		if (!*view)
			return -ENOENT;
		if (asprintf(path, "%.*s%s", (int)(dot - arg), arg, st_ext) < 0)
			return -ENOMEM;
		return 0;
	}
	if (len <= ST_EXT_LEN || strcmp(arg + len - ST_EXT_LEN, st_ext))
		return -ENOENT;
	stem = len - ST_EXT_LEN;
	dot = memrchr(arg, '.', stem);
	if (!dot || dot == arg || (slash && dot <= slash + 1))
		return -ENOENT;
	*view = castfs_views_find(vs, dot + 1, (size_t)(arg + stem - dot - 1));
	if (!*view)
		return -ENOENT;
	if (asprintf(path, "%.*s%s", (int)(dot - arg), arg, st_ext) < 0)
		return -ENOMEM;
	return 0;
}

/* The name a view of @path is shown under: "dir/X.<view>.safetensors". */
static char *view_shown(const char *path, const char *view)
{
	size_t len = strlen(path), vl = strlen(view);
	bool gguf = vl > 5 && !strcmp(view + vl - 5, ".gguf");
	char *s;

	if (len > ST_EXT_LEN && !strcmp(path + len - ST_EXT_LEN, st_ext))
		len -= ST_EXT_LEN;
	/* GGUF views carry their own extension */
	if (asprintf(&s, "%.*s.%s%s", (int)len, path, view,
		     gguf ? "" : st_ext) < 0)
		return NULL;
	return s;
}

static int src_fail(struct cli_src *s, const char *cmd, const char *file,
		    const char *why)
{
	fprintf(stderr, "castfs %s: %s: %s\n", cmd, file, why);
	cli_src_close(s);
	return -1;
}

/*
 * Open checkpoint @*path, or, when no file has that name, the pack that a
 * mount shows under it (X.safetensors.zst, else .zstg: the mount's order,
 * ns_pack_src.c); *@path then names the pack. Returns the fd or -1 (errno
 * that of @*path).
 */
static int open_or_pack(char **path)
{
	static const char *const exts[] = { ".zst", ".zstg" };
	size_t len = strlen(*path);
	int fd = open(*path, O_RDONLY | O_CLOEXEC);

	if (fd >= 0 || errno != ENOENT || len <= ST_EXT_LEN ||
	    strcmp(*path + len - ST_EXT_LEN, st_ext))
		return fd;
	for (size_t i = 0; i < 2; i++) {
		char *p;

		if (asprintf(&p, "%s%s", *path, exts[i]) < 0)
			break;
		fd = open(p, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			free(*path);
			*path = p;
			return fd;
		}
		free(p);
	}
	errno = ENOENT;
	return -1;
}

/* Find what @arg names: the file itself, or a view of its sibling, either
 * of them as a pack when only the pack exists. */
static int src_resolve(struct cli_src *s, const char *cmd, const char *arg,
		       const struct castfs_views *vs, const char *view_name)
{
	if (view_name) {
		s->view = castfs_views_find(vs, view_name, strlen(view_name));
		if (!s->view) {
			fprintf(stderr,
				"castfs %s: unknown view '%s' "
				"(castfs --help lists them)\n",
				cmd, view_name);
			return -1;
		}
	}
	s->fd = open(arg, O_RDONLY | O_CLOEXEC);
	if (s->fd < 0 && errno == ENOENT && !view_name &&
	    split_view_name(arg, vs, &s->path, &s->view) == 0) {
		s->fd = open_or_pack(&s->path);
		s->shown = strdup(arg);
	} else {
		s->path = strdup(arg);
		if (s->fd < 0 && errno == ENOENT && s->path)
			s->fd = open_or_pack(&s->path);
		s->shown = s->view ? view_shown(arg, s->view->name) :
				     strdup(arg);
	}
	if (s->fd < 0)
		return src_fail(s, cmd, s->path ? s->path : arg,
				strerror(errno));
	if (!s->path || !s->shown)
		return src_fail(s, cmd, arg, strerror(ENOMEM));
	return 0;
}

/* A pack's extension: 0 none, 1 ".zst" (standard), 2 ".zstg" (grouped). */
static int pack_kind(const char *path)
{
	size_t n = strlen(path);

	if (n > 16 && !strcmp(path + n - 16, ".safetensors.zst"))
		return 1;
	if (n > 17 && !strcmp(path + n - 17, ".safetensors.zstg"))
		return 2;
	return 0;
}

/* Read a pack through its seek table: s->r and s->size for its bytes. */
static int src_unpack(struct cli_src *s, int kind, struct castfs_diag *d)
{
	int rc = castfs_zcache_new(CASTFS_ZCACHE_DEFAULT, &s->zc);

	if (!rc)
		rc = castfs_zst_index_read(&s->fr.r, s->size, s->zc, &s->zix,
					   d);
	if (rc)
		return rc;
	if (castfs_zst_index_grouped(s->zix) != (kind == 2))
		return castfs_diag_set(d, -EINVAL,
				       "a grouped pack is named "
				       "*.safetensors.zstg, a standard one "
				       "*.safetensors.zst");
	castfs_zst_reader_init(&s->zr, s->zix, &s->fr.r);
	s->r = &s->zr.r;
	s->size = castfs_zst_index_size(s->zix);
	return 0;
}

int cli_src_open(struct cli_src *s, const char *cmd, const char *arg,
		 const struct castfs_views *vs, const char *view_name)
{
	struct castfs_diag d = { { 0 } };
	int kind, rc;

	memset(s, 0, sizeof(*s));
	s->fd = -1;
	if (src_resolve(s, cmd, arg, vs, view_name))
		return -1;
	if (fstat(s->fd, &s->st) < 0)
		return src_fail(s, cmd, s->path, strerror(errno));
	if (!S_ISREG(s->st.st_mode))
		return src_fail(s, cmd, s->path, "not a regular file");
	castfs_fd_reader_init(&s->fr, s->fd);
	s->r = &s->fr.r;
	s->size = (uint64_t)s->st.st_size;
	kind = pack_kind(s->path);
	rc = kind ? src_unpack(s, kind, &d) : 0;
	if (!rc)
		rc = castfs_header_read(s->r, s->size, &s->h, &d);
	if (!rc)
		rc = castfs_header_read_side(s->h, s->r, &d);
	if (rc)
		return src_fail(s, cmd, s->path,
				d.msg[0] ? d.msg : strerror(-rc));
	return 0;
}

void cli_src_close(struct cli_src *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	castfs_header_free(s->h);
	s->h = NULL;
	castfs_zst_index_free(s->zix);
	s->zix = NULL;
	castfs_zcache_free(s->zc);
	s->zc = NULL;
	free(s->path);
	free(s->shown);
	s->path = s->shown = NULL;
}

bool cli_same_file(int fd, const struct stat *st)
{
	struct stat now;

	return fstat(fd, &now) == 0 && now.st_size == st->st_size &&
	       now.st_mtim.tv_sec == st->st_mtim.tv_sec &&
	       now.st_mtim.tv_nsec == st->st_mtim.tv_nsec &&
	       now.st_ctim.tv_sec == st->st_ctim.tv_sec &&
	       now.st_ctim.tv_nsec == st->st_ctim.tv_nsec;
}

double cli_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Whether @out may be replaced: absent, or a regular file (through a
 * symlink too). The output is a temporary renamed over it, so a device or
 * a FIFO (-o /dev/null as root) would be replaced by a regular file, not
 * written to: -EINVAL (cli_out_strerror() says why).
 */
static int out_replaceable(const char *out)
{
	struct stat st;

	if (stat(out, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (S_ISDIR(st.st_mode))
		return -EISDIR;
	return S_ISREG(st.st_mode) ? 0 : -EINVAL;
}

const char *cli_out_strerror(int rc)
{
	if (rc == -EINVAL)
		return "not a regular file (the output is written to a "
		       "temporary file renamed over it)";
	return strerror(-rc);
}

int cli_out_open(struct cli_out *w, const char *out, mode_t mode)
{
	char *d, *b;
	int rc;

	w->fd = -1;
	w->tmp = NULL;
	rc = out_replaceable(out);
	if (rc)
		return rc;
	d = strdup(out);
	b = strdup(out);
	/* The name shortened to fit NAME_MAX with ".", ".castfs-XXXXXX":
	 * an output of a legal long name must not fail on its temporary. */
	if (d && b &&
	    asprintf(&w->tmp, "%s/.%.*s.castfs-XXXXXX", dirname(d),
		     NAME_MAX - 15, basename(b)) >= 0)
		w->fd = mkstemp(w->tmp);
	free(d);
	free(b);
	if (w->fd < 0 || fchmod(w->fd, mode & 07777) < 0)
		return errno ? -errno : -ENOMEM;
	return 0;
}

bool cli_exists(const char *path)
{
	/* the name itself: a dangling symbolic link exists too */
	return faccessat(AT_FDCWD, path, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

int cli_out_commit(struct cli_out *w, const char *out, bool replace)
{
	char *d = strdup(out);
	int dfd, rc = 0;

	if (fsync(w->fd) < 0)
		rc = -errno;
	if (close(w->fd) < 0 && !rc)
		rc = -errno;
	w->fd = -1;
	if (!rc && !replace && cli_exists(out))
		rc = -EEXIST;
	if (!rc)
		rc = out_replaceable(out); /* what it is now, not at the open */
	/* Without replace, nothing that appeared since the check (or a
	 * dangling link it would have followed) is renamed over. */
	if (!rc && renameat2(AT_FDCWD, w->tmp, AT_FDCWD, out,
			     replace ? 0 : RENAME_NOREPLACE) < 0) {
		rc = -errno;
		/* a filesystem without the flag: the check above stands */
		if (rc == -EINVAL && !replace)
			rc = rename(w->tmp, out) < 0 ? -errno : 0;
	}
	if (!rc) {
		free(w->tmp);
		w->tmp = NULL;
		/* The rename itself must reach the disk too. */
		dfd = d ? open(dirname(d), O_RDONLY | O_DIRECTORY) : -1;
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	free(d);
	return rc;
}

void cli_out_abort(struct cli_out *w)
{
	if (w->fd >= 0)
		close(w->fd);
	if (w->tmp)
		unlink(w->tmp);
	free(w->tmp);
	w->tmp = NULL;
	w->fd = -1;
}

/* Atomic rather than volatile sig_atomic_t: the commands' worker threads
 * read it while the handler writes it in whichever thread took the
 * signal (lock-free, so async-signal-safe). */
static atomic_int caught_signal;

static void on_signal(int sig)
{
	atomic_store(&caught_signal, sig);
}

void cli_catch_signals(void)
{
	/* SA_RESTART: the commands' reads and writes go on to the next step,
	 * where the flag is seen, instead of failing with EINTR. */
	struct sigaction sa = { .sa_handler = on_signal,
				.sa_flags = SA_RESTART };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

int cli_interrupted(void)
{
	return atomic_load(&caught_signal);
}

bool cli_name_plain(const char *s, size_t n)
{
	bool plain = strlen(s) == n && n > 0, esc;

	for (size_t i = 0; plain && i < n;) {
		size_t len = cli_quote_next(s + i, n - i, &esc);

		plain = (!esc || s[i] == '\\') && s[i] != ' ';
		i += len;
	}
	return plain;
}

int cli_name_cols(const char *s, size_t n)
{
	bool plain = cli_name_plain(s, n), esc;
	size_t cols = plain ? 0 : 2, i = 0;

	while (i < n) {
		size_t len = cli_quote_next(s + i, n - i, &esc);

		cols += !plain && esc ? 4 * len : 1;
		i += len;
	}
	return (int)CASTFS_MIN(cols, (size_t)INT32_MAX);
}

int cli_put_name(const char *s, size_t n)
{
	if (cli_name_plain(s, n)) {
		fputs(s, stdout);
		return cli_name_cols(s, n);
	}
	return cli_put_quoted(s, n);
}

int cli_stdout_close(const char *cmd)
{
	/* A write failed earlier: its errno is gone, the flag says. */
	bool failed = ferror(stdout) != 0;
	int rc = fclose(stdout), err = errno;

	if (!failed && rc == 0)
		return 0;
	fprintf(stderr, "castfs %s: write error%s%s\n", cmd, rc ? ": " : "",
		rc ? strerror(err) : "");
	return -1;
}

void cli_exit_help(const char *cmd)
{
	exit(cli_stdout_close(cmd) ? 1 : 0);
}

void cli_exit_signalled(void)
{
	int sig = cli_interrupted();

	if (!sig)
		return;
	signal(sig, SIG_DFL);
	raise(sig);
}

size_t cli_quote_next(const char *s, size_t n, bool *esc)
{
	size_t len = castfs_escape_next(s, n, esc);

	*esc = *esc || *s == '"';
	return len;
}

int cli_put_quoted(const char *s, size_t n)
{
	size_t cols = 2;
	bool esc;

	putchar('"');
	for (size_t i = 0; i < n;) {
		size_t len = cli_quote_next(s + i, n - i, &esc);

		for (size_t k = 0; k < len; k++) {
			if (esc)
				printf("\\x%02x", (unsigned char)s[i + k]);
			else
				putchar(s[i + k]);
		}
		cols += esc ? 4 * len : 1;
		i += len;
	}
	putchar('"');
	return cols > INT32_MAX ? INT32_MAX : (int)cols;
}
