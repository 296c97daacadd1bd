/* SPDX-License-Identifier: MIT */
/* The sub-commands of the castfs binary and what they share. */
#ifndef CASTFS_CLI_H
#define CASTFS_CLI_H

#include <stdbool.h>
#include <sys/stat.h>

#include "format/st_header.h"
#include "source/zst.h"
#include "view/view.h"

/* castfs info FILE...: header summary and tensor table. Exit status. */
int castfs_cli_info(int argc, char **argv);

/* castfs convert FILE --view V -o OUT: materialise a view. Exit status. */
int castfs_cli_convert(int argc, char **argv);

/*
 * castfs pack FILE|DIR...: write FILE.zst, a seekable-zstd pack, beside each
 * safetensors file. Exit status.
 */
int castfs_cli_pack(int argc, char **argv);

/* castfs unpack FILE.zst...: restore each original. Exit status. */
int castfs_cli_unpack(int argc, char **argv);

/* ---- shared by the sub-commands (fs/cli_common.c) ---- */

/*
 * cli_views_load - the built-in views plus those of JSON file @config
 * (may be NULL) into @vs. Prints what is wrong on stderr. Returns 0 or -1.
 */
int cli_views_load(struct castfs_views *vs, const char *cmd,
		   const char *config);

/* A checkpoint opened by a sub-command, possibly seen through a view. */
struct cli_src {
	char *path; /* the safetensors file read */
	char *shown; /* the name to show: FILE, or X.<view>... */
	int fd;
	struct stat st;
	struct castfs_header *h;
	const struct castfs_view *view; /* NULL: the file itself */
	/* The checkpoint's bytes: @fr over @fd, or for a pack (*.zst,
	 * *.zstg) @zr decoding it through @zix. */
	const struct castfs_reader *r;
	uint64_t size; /* the checkpoint's size (decoded for a pack) */
	struct castfs_fd_reader fr;
	struct castfs_zcache *zc;
	struct castfs_zst_index *zix;
	struct castfs_zst_reader zr;
};

/*
 * cli_src_open - open @arg and read its header: the file itself, through
 * view @view_name when given, or, when @arg does not exist and is named
 * X.<view>.safetensors, X.safetensors through that view. A file named
 * *.safetensors.zst or *.safetensors.zstg is read as the pack it is. Prints
 * "castfs CMD: FILE: reason" on stderr on failure. Returns 0 or -1.
 */
int cli_src_open(struct cli_src *s, const char *cmd, const char *arg,
		 const struct castfs_views *vs, const char *view_name);

/* cli_src_close - release what cli_src_open() got; safe twice. */
void cli_src_close(struct cli_src *s);

/* cli_is_gguf_file - @path is an existing regular file named *.gguf. */
bool cli_is_gguf_file(const char *path);

/* cli_info_gguf - print the GGUF header of file @path (cli_info_gguf.c).
 * Prints "castfs info: FILE: reason" on stderr on failure. 0 or -1. */
int cli_info_gguf(const char *path);

struct castfs_plan;

/*
 * cli_md_weights - a model folder @arg (a directory) is read from its one
 * checkpoint, "model.safetensors": its path, malloc'ed, into *@weights;
 * NULL for a file. Sharded folders are cli_shards_*'s. Returns 0 or -1
 * (said why on stderr). In cli_convert.c.
 */
int cli_md_weights(const char *arg, char **weights);

/* cli_slurp - the whole of file @dir/@name, malloc'ed and NUL-terminated,
 * into *@out (@len bytes); *@out NULL when it does not exist. 0 or -errno.
 * In cli_convert.c. */
int cli_slurp(const char *dir, const char *name, char **out, size_t *len);

/* ---- sharded model folders (cli_shards.c) ---- */

/* The shards of a model folder, each open as a checkpoint. */
struct cli_shards {
	char *index; /* model.safetensors.index.json */
	size_t index_len;
	char **names; /* castfs_md_gguf_shards() order */
	size_t n, opened;
	struct cli_src *s; /* per shard */
	const struct castfs_reader **r; /* s[k].r */
	const struct castfs_header **h; /* s[k].h */
	struct castfs_multi_reader mr; /* part k: shard k */
};

/* cli_md_is_sharded - @dir is a folder without model.safetensors but with
 * model.safetensors.index.json. */
bool cli_md_is_sharded(const char *dir);

/* cli_shards_open - open every shard the index of folder @dir names,
 * through view @view_name (cli_src_open()). Prints "castfs CMD: FILE:
 * reason" on failure. 0 or -1; on failure nothing is held. */
int cli_shards_open(struct cli_shards *sh, const char *cmd, const char *dir,
		    const struct castfs_views *vs, const char *view_name);

/* cli_shards_plan - the GGUF plan of folder @dir over @sh (read through
 * sh->mr), castfs_md_gguf_plan_src(). 0 or -errno, the reason in @d. */
int cli_shards_plan(const struct cli_shards *sh, const char *dir,
		    struct castfs_plan **plan, struct castfs_diag *d);

/* cli_shards_same - every shard is still the identity it was opened as. */
bool cli_shards_same(const struct cli_shards *sh);

/* cli_shards_is_source - @out is one of the shards. */
bool cli_shards_is_source(const struct cli_shards *sh, const char *out);

/* cli_shards_close - release what cli_shards_open() got; safe twice. */
void cli_shards_close(struct cli_shards *sh);

/* cli_md_gguf_plan - the GGUF plan of model folder @dir whose weights @s
 * has open through a GGUF view (castfs_md_gguf_plan()). 0 or -errno with
 * the reason in @d. */
int cli_md_gguf_plan(const struct cli_src *s, const char *dir,
		     struct castfs_plan **plan, struct castfs_diag *d);

/* cli_info_gguf_plan - the same for the GGUF view of @plan over @src,
 * shown as @shown: only the header's bytes are computed. 0 or -1. */
int cli_info_gguf_plan(const char *shown, const struct castfs_plan *plan,
		       const struct castfs_reader *src);

/* cli_info_gguf_md - "DIR.<q>.gguf" that does not exist beside model
 * folder DIR/: print the header of that GGUF file as castfs computes it.
 * 1 when @arg is not such a name, 0 done, -1 failed (said why). */
int cli_info_gguf_md(const char *arg, const struct castfs_views *vs);
struct castfs_qsrc_opts;

/*
 * cli_qsrc_opts - fill @o with the FP8 weight_block_size that the
 * config.json beside safetensors file @path declares (none when it is
 * absent or unreadable: castfs's default). Returns @o.
 */
const struct castfs_qsrc_opts *cli_qsrc_opts(const char *path,
					     struct castfs_qsrc_opts *o);

/* cli_same_file - true if @fd is still the identity in @st (size, mtime
 * and ctime: a writer can put size and mtime back, not the ctime, which
 * is also what a mount counts as a new version). */
bool cli_same_file(int fd, const struct stat *st);

/* ---- an output file written whole, then renamed into place ---- */

struct cli_out {
	char *tmp; /* the temporary name, unlinked unless renamed */
	int fd;
};

/* cli_now_s - a monotonic clock in seconds, for progress rates. */
double cli_now_s(void);

/* cli_out_open - a temporary file beside @out with permission bits @mode.
 * Returns 0 or a negative errno (-EINVAL when @out exists and is no
 * regular file, -EISDIR for a directory); cli_out_abort() cleans up either
 * way. */
int cli_out_open(struct cli_out *w, const char *out, mode_t mode);

/* cli_out_strerror - what a cli_out_open()/cli_out_commit() error means
 * (-EINVAL: the output exists and is no regular file). */
const char *cli_out_strerror(int rc);

/* cli_out_commit - fsync and close the file, rename it over @out (-EEXIST
 * when @out exists and @replace is false) and fsync the directory.
 * Returns 0 or a negative errno. */
int cli_out_commit(struct cli_out *w, const char *out, bool replace);

/* cli_exists - whether the name @path exists, not following a final
 * symbolic link (a dangling one is a name that exists). */
bool cli_exists(const char *path);

/* cli_out_abort - close and unlink what was not committed; safe twice. */
void cli_out_abort(struct cli_out *w);

/*
 * cli_quote_next - the length of the character at @s (@n bytes left), and
 * in *@esc whether `castfs info` writes it as \xHH escapes: what
 * castfs_escape_buf() escapes (bytes that are not UTF-8, C0 and C1
 * controls, DEL, the backslash; a terminal obeys CSI U+009B as it does
 * ESC [), and quotes.
 */
size_t cli_quote_next(const char *s, size_t n, bool *esc);

/* cli_put_quoted - @n bytes of @s between quotes, what cli_quote_next()
 * escapes as \xHH; returns the columns taken (one per character, four per
 * escaped byte, the quotes). */
int cli_put_quoted(const char *s, size_t n);

/* cli_put_name - name or path @s (@n bytes) as it is when nothing in it is
 * escaped (a backslash aside: unquoted, it says nothing) and it holds no
 * space, else quoted by cli_put_quoted(): names may hold quotes and
 * control characters. Returns the columns taken. */
int cli_put_name(const char *s, size_t n);

/* cli_name_plain - whether cli_put_name() prints @s as it is, unquoted. */
bool cli_name_plain(const char *s, size_t n);

/* cli_name_cols - the columns cli_put_name() takes for @s: one per
 * character (a UTF-8 sequence, or a byte that is none), four per escaped
 * byte, and the quotes; tables line up on them, not on bytes (wide CJK
 * characters aside). */
int cli_name_cols(const char *s, size_t n);

/*
 * cli_stdout_close - flush and close stdout, where @cmd printed its output:
 * a write that failed there (a full disk, an I/O error) is reported on
 * stderr as "castfs CMD: write error: REASON", or a redirect to a full
 * disk would leave a cut output behind an exit status of 0. Returns 0, or
 * -1 after that message.
 */
int cli_stdout_close(const char *cmd);

/* cli_exit_help - exit once @cmd's --help (or --version) text is on stdout:
 * 0, or 1 after cli_stdout_close()'s message when it could not be written
 * (`castfs info --help > /dev/full` said 0 over an empty file). */
_Noreturn void cli_exit_help(const char *cmd);

/* ---- Ctrl-C: outputs are removed, then the signal ends the process ---- */

/* cli_catch_signals - from now on SIGINT, SIGTERM and SIGHUP only mark the
 * run interrupted (cli_interrupted()), so that the command stops at its
 * next step and removes its temporary output instead of leaving it. */
void cli_catch_signals(void);

/* cli_interrupted - the signal caught, or 0. Any thread may ask. */
int cli_interrupted(void);

/* cli_exit_signalled - if a signal was caught, end the process by it now
 * (its default action), so that a shell or xargs running castfs sees
 * the interruption and stops too; otherwise return. */
void cli_exit_signalled(void);

#endif
