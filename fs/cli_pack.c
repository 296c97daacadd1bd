/* SPDX-License-Identifier: MIT */
/*
 * castfs pack / unpack: write X.safetensors.zst, a standard seekable-zstd
 * file whose frames never straddle a tensor (the header in its own frame),
 * and restore the original from one. Outputs appear whole or not at all
 * (temporary file, fsync, rename), as castfs convert's do.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common/reader.h"
#include "format/st_header.h"
#include "source/zst.h"

#define ZST_EXT ".zst"
#define ZSTG_EXT ".zstg" /* grouped packs: zstd -d does not restore them */

struct pack_opts {
	size_t frame_size;
	int level;
	bool checksums;
	bool remove; /* delete the input once the output is durable */
	bool verify; /* read the pack back against the input before it
		      * takes its name */
	bool force; /* replace an existing output */
	bool grouped; /* byte-plane frames (ZSTG_EXT) */
	unsigned threads; /* coding, reading back, decoding; 0: the online
			   * CPUs */
	int progress; /* 1 on, 0 off, -1 when stderr is a terminal */
	const char *cmd;
};

/* The output being written, and the progress bar's state. */
struct pack_out {
	struct cli_out f;
	uint64_t total;
	double t0, last;
	bool progress;
	bool line_open; /* a bar is on stderr's line, not yet ended */
	bool out_failed; /* the output, not the input, failed: name it */
};

static void pack_usage(FILE *f, const char *cmd)
{
	if (!strcmp(cmd, "unpack")) {
		fprintf(f,
			"usage: castfs unpack [--force] [--remove] "
			"[--threads N] [--[no-]progress]\n"
			"                     X.safetensors.zst|.zstg...\n\n"
			"Restore X.safetensors, byte-identical, from a pack "
			"(every frame is\ndecoded and its checksum, when the "
			"pack has them, verified;\nframes are decoded by N "
			"threads at once, by default one per CPU,\nat most "
			"16). Interrupted (Ctrl-C), it removes what it was\n"
			"writing and ends by the signal.\n");
		return;
	}
	fprintf(f,
		"usage: castfs pack [options] FILE.safetensors|DIR...\n\n"
		"Write FILE.safetensors.zst beside FILE: the standard "
		"seekable zstd\nformat (zstd -d restores FILE), one frame per "
		"piece of at most\n--frame-size bytes that never straddles a "
		"tensor, the header in a\nframe of its own. A directory packs "
		"each *.safetensors in it.\nA mount shows X.safetensors.zst as "
		"X.safetensors, with every view.\n\n"
		"    --frame-size N[K|M]  decoded bytes per frame (1M; 256K "
		"with --grouped)\n"
		"    --level N            zstd level (1; higher levels gain "
		"<1%% on weights)\n"
		"    --no-checksums       no frame checksums in the seek "
		"table (XXH64;\n"
		"                         CRC32C for tiered bf16 frames)\n"
		"    --grouped            byte-plane frames (bf16/fp32 exponent "
		"a byte):\n"
		"                         ~1.5x on bf16 instead of ~1.28x; "
		"written to\n"
		"                         FILE.safetensors.zstg, which zstd -d "
		"does not\n"
		"                         restore (castfs unpack does)\n"
		"    --threads N          frames coded (and read back) by N "
		"threads at once\n"
		"                         (default: one per CPU, at most 16; "
		"the pack is\n"
		"                         the same bytes whatever N)\n"
		"    --remove             delete FILE once the pack is on "
		"disk\n"
		"    --no-verify          do not read the pack back against "
		"FILE before\n"
		"                         it takes its name (by default every "
		"byte is\n"
		"                         compared; a pack that differs is "
		"not kept)\n"
		"    --force              replace an existing "
		"FILE.safetensors.zst\n"
		"    --[no-]progress      progress bar (default: when stderr "
		"is a terminal)\n"
		"\nExit status: 0, 1 when a file failed, 2 for usage "
		"errors. Interrupted\n(Ctrl-C), it removes what it was writing "
		"and ends by the signal.\n");
}

/* [####----]  42%  1.2 GiB / 2.9 GiB  @what  850.0 MiB/s, at most ten
 * times a second, and the last one on a line of its own. */
static void bar(struct pack_out *w, uint64_t done, uint64_t total,
		const char *what)
{
	double t = cli_now_s(), mib = (double)done / (1 << 20);
	double frac = total ? (double)done / (double)total : 1;
	char cells[31];
	int fill = (int)(frac * 30);

	if (!w->progress || (done < total && t - w->last < 0.1))
		return;
	w->last = t;
	w->line_open = done != total;
	memset(cells, '#', (size_t)fill);
	memset(cells + fill, '-', (size_t)(30 - fill));
	cells[30] = '\0';
	fprintf(stderr, "\r[%s] %3d%% %.1f / %.1f MiB  %s  %.1f MiB/s ", cells,
		(int)(frac * 100), mib, (double)total / (1 << 20), what,
		mib / CASTFS_MAX(t - w->t0, 1e-3));
	if (done == total)
		fputc('\n', stderr);
}

/* After each step of a run: -EINTR once Ctrl-C was pressed, which stops
 * the run; its output is then removed. */
static int go_on(void)
{
	return cli_interrupted() ? -EINTR : 0;
}

/* Packing: the ratio so far. */
static int progress(void *ctx, uint64_t in, uint64_t out)
{
	struct pack_out *w = ctx;
	char what[32];

	snprintf(what, sizeof(what), "ratio %.3f",
		 out ? (double)in / (double)out : 0.0);
	bar(w, in, w->total, what);
	return go_on();
}

/* The read-back (pack_verify()). */
static int verify_progress(void *ctx, uint64_t done, uint64_t total)
{
	bar(ctx, done, total, "verify");
	return go_on();
}

static int fd_write(void *ctx, const void *buf, size_t n)
{
	struct pack_out *w = ctx;
	const char *p = buf;

	while (n) {
		ssize_t got = write(w->f.fd, p, n);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			w->out_failed = true;
			return -errno;
		}
		p += got;
		n -= (size_t)got;
	}
	return 0;
}

/* A temporary file next to @out, with the input's permission bits @mode. */
static int out_open(struct pack_out *w, const char *out, mode_t mode)
{
	w->t0 = cli_now_s();
	return cli_out_open(&w->f, out, mode);
}

/* How a grouped pack stores a tensor of @dt. */
static uint8_t dtype_transform(enum castfs_dtype dt)
{
	if (dt == CASTFS_DTYPE_BF16)
		return CASTFS_ZST_BF16;
	if (dt == CASTFS_DTYPE_F32)
		return CASTFS_ZST_F32;
	if (castfs_dtype_bits(dt) == 16)
		return CASTFS_ZST_PLANES2;
	if (castfs_dtype_bits(dt) == 32)
		return CASTFS_ZST_PLANES4;
	return CASTFS_ZST_NONE;
}

/*
 * The offsets no frame may straddle: the header's end and each tensor's
 * begin and end, with the transform of the bytes each one starts (@tr).
 */
static uint64_t *tensor_cuts(const struct castfs_header *h, size_t *n,
			     uint8_t **tr)
{
	uint64_t *c = malloc((2 * h->ntensors + 1) * sizeof(*c));
	uint8_t *t = malloc(2 * h->ntensors + 1);

	if (!c || !t) {
		free(c);
		free(t);
		return NULL;
	}
	*n = 0;
	t[*n] = CASTFS_ZST_NONE;
	c[(*n)++] = h->data_start;
	for (size_t i = 0; i < h->ntensors; i++) {
		t[*n] = dtype_transform(h->tensors[i].dtype);
		c[(*n)++] = h->data_start + h->tensors[i].begin;
		t[*n] = CASTFS_ZST_NONE;
		c[(*n)++] = h->data_start + h->tensors[i].end;
	}
	*tr = t;
	return c; /* sorted: tensors are in data order */
}

static int fail(const struct pack_opts *o, const char *file, const char *why)
{
	fprintf(stderr, "castfs %s: %s: %s\n", o->cmd, file, why);
	return 1;
}

/* Why a run that failed with @rc and reason @d failed (at its output
 * when @out), for fail(). */
static const char *fail_reason(int rc, const struct castfs_diag *d, bool out)
{
	if (rc == -EINTR && cli_interrupted())
		return "interrupted; nothing written";
	if (d->msg[0])
		return d->msg;
	return out ? cli_out_strerror(rc) : strerror(-rc);
}

/* Pack the open safetensors @s into @out. */
/*
 * The frame size asked for, else the default: 256 KiB for grouped packs,
 * whose sequential views cost the daemon about a quarter less CPU than
 * from 1 MiB frames (BENCHMARKS.md, "Packed sources": a decoded frame and
 * its planes stay in a core's cache between decode, checksum and
 * un-grouping) at the same size, and whose random 4 KiB reads decode a
 * quarter of the bytes; 1 MiB for standard packs, as before (their
 * read path was not measured at other sizes).
 */
static size_t pack_frame_size(const struct pack_opts *o)
{
	if (o->frame_size)
		return o->frame_size;
	return o->grouped ? 256u << 10 : 1u << 20;
}

/*
 * The pack just written (still under its temporary name) read back as a
 * mount reads it, against the source: a pack that differs never takes its
 * name, so neither a mount nor --remove ever trusts it.
 */
static int pack_verify(struct pack_out *w, const struct castfs_reader *src,
		       const struct pack_opts *o, struct castfs_diag *d)
{
	struct castfs_fd_reader pr;
	struct castfs_zst_verify_opts vo = {
		.progress = verify_progress,
		.progress_ctx = w,
		.threads = o->threads,
	};
	struct castfs_diag why = { { 0 } };
	struct stat st;
	int rc;

	if (fstat(w->f.fd, &st) < 0)
		return -errno;
	castfs_fd_reader_init(&pr, w->f.fd);
	w->t0 = cli_now_s();
	w->last = 0;
	rc = castfs_zst_verify(&pr.r, (uint64_t)st.st_size, src, w->total, &vo,
			       &why);
	if (rc && rc != -EINTR)
		castfs_diag_set(d, rc, "read back, %s; no pack written",
				why.msg[0] ? why.msg : strerror(-rc));
	return rc;
}

static int pack_src(const struct cli_src *s, const char *out,
		    const struct pack_opts *o)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_fd_reader fr;
	struct pack_out w = { .progress = o->progress,
			      .total = (uint64_t)s->st.st_size };
	struct castfs_writer wr = { fd_write, &w };
	struct castfs_zst_pack_opts po = { .frame_size = pack_frame_size(o),
					   .level = o->level,
					   .checksums = o->checksums,
					   .progress = progress,
					   .progress_ctx = &w,
					   .threads = o->threads };
	uint64_t *cuts;
	uint8_t *tr = NULL;
	int rc = out_open(&w, out, s->st.st_mode);

	if (rc)
		return fail(o, out, cli_out_strerror(rc));
	cuts = tensor_cuts(s->h, &po.ncuts, &tr);
	po.cuts = cuts;
	po.cut_transforms = o->grouped ? tr : NULL;
	castfs_fd_reader_init(&fr, s->fd);
	rc = cuts ? castfs_zst_pack(&fr.r, w.total, &po, &wr, &d) : -ENOMEM;
	free(cuts);
	free(tr);
	if (!rc && o->verify)
		rc = pack_verify(&w, &fr.r, o, &d);
	/* A source whose size or mtime moved says why the read-back
	 * differed better than the offset does. */
	if ((!rc || rc == -EBADMSG) && !cli_same_file(s->fd, &s->st)) {
		castfs_diag_clear(&d);
		rc = castfs_diag_set(&d, -ESTALE, "changed while being packed");
	}
	if (!rc) {
		rc = cli_out_commit(&w.f, out, o->force);
		w.out_failed = rc != 0;
	}
	cli_out_abort(&w.f);
	if (rc && w.line_open) /* the reason on a line of its own */
		fputc('\n', stderr);
	if (rc)
		return fail(o, w.out_failed ? out : s->path,
			    fail_reason(rc, &d, w.out_failed));
	return 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n > k && !strcmp(s + n - k, suffix);
}

static int pack_file(const char *path, const struct pack_opts *o,
		     const struct castfs_views *vs)
{
	struct cli_src s;
	char *out;
	int rc;

	if (!has_suffix(path, ".safetensors"))
		return fail(o, path, "not named *.safetensors");
	if (asprintf(&out, "%s%s", path, o->grouped ? ZSTG_EXT : ZST_EXT) < 0)
		return fail(o, path, strerror(ENOMEM));
	if (!o->force && cli_exists(out)) {
		rc = fail(o, out, "exists (--force replaces it)");
		goto out_free;
	}
	/* cli_src_open() would take X.safetensors.zst for a missing X: a
	 * pack is not packed again. */
	if (access(path, F_OK) != 0) {
		rc = fail(o, path, strerror(errno));
		goto out_free;
	}
	rc = 1;
	if (cli_src_open(&s, o->cmd, path, vs, NULL))
		goto out_free;
	rc = pack_src(&s, out, o);
	if (!rc && o->remove && unlink(path) < 0)
		rc = fail(o, path, strerror(errno));
	cli_src_close(&s);
out_free:
	free(out);
	return rc;
}

/* Each DIR/ *.safetensors (not recursing; links and others skipped). */
static int pack_dir(const char *dir, const struct pack_opts *o,
		    const struct castfs_views *vs)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, alphasort), rc = 0;

	if (n < 0)
		return fail(o, dir, strerror(errno));
	for (int i = 0; i < n; i++) {
		char *p = NULL;
		struct stat st;

		if (!cli_interrupted() &&
		    has_suffix(ents[i]->d_name, ".safetensors") &&
		    asprintf(&p, "%s/%s", dir, ents[i]->d_name) >= 0 &&
		    lstat(p, &st) == 0 && S_ISREG(st.st_mode))
			if (pack_file(p, o, vs))
				rc = 1;
		free(p);
		free(ents[i]);
	}
	free(ents);
	return rc;
}

/* Unpacking: decoded bytes written. */
static int unpack_progress(void *ctx, uint64_t done, uint64_t total)
{
	bar(ctx, done, total, "unpack");
	return go_on();
}

static int unpack_fd(int fd, const struct stat *st, const char *in,
		     const char *out, const struct pack_opts *o)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_fd_reader fr;
	struct castfs_zcache *c;
	struct castfs_zst_index *ix = NULL;
	struct pack_out w = { .f.fd = -1, .progress = o->progress };
	struct castfs_writer wr = { fd_write, &w };
	struct castfs_zst_unpack_opts uo = { .progress = unpack_progress,
					     .progress_ctx = &w,
					     .threads = o->threads };
	int rc = castfs_zcache_new(CASTFS_ZCACHE_DEFAULT, &c);

	castfs_fd_reader_init(&fr, fd);
	if (!rc)
		rc = castfs_zst_index_read(&fr.r, (uint64_t)st->st_size, c, &ix,
					   &d);
	if (!rc && castfs_zst_index_grouped(ix) != has_suffix(in, ZSTG_EXT))
		rc = castfs_diag_set(&d, -EINVAL,
				     "a grouped pack is named *" ZSTG_EXT
				     ", a standard one *" ZST_EXT);
	if (!rc) {
		rc = out_open(&w, out, st->st_mode);
		w.out_failed = rc != 0;
	}
	if (!rc) {
		w.total = castfs_zst_index_size(ix);
		rc = castfs_zst_unpack(ix, &fr.r, &uo, &wr, &d);
	}
	if (!rc && !cli_same_file(fd, st))
		rc = castfs_diag_set(&d, -ESTALE, "changed while unpacked");
	if (!rc) {
		rc = cli_out_commit(&w.f, out, o->force);
		w.out_failed = rc != 0;
	}
	cli_out_abort(&w.f);
	castfs_zst_index_free(ix);
	castfs_zcache_free(c);
	if (rc && w.line_open)
		fputc('\n', stderr);
	if (rc)
		return fail(o, w.out_failed ? out : in,
			    fail_reason(rc, &d, w.out_failed));
	return 0;
}

static int unpack_file(const char *in, const struct pack_opts *o)
{
	size_t len = strlen(in);
	char *out;
	struct stat st;
	int fd, rc;

	if (!has_suffix(in, ZST_EXT) && !has_suffix(in, ZSTG_EXT))
		return fail(o, in, "not named *" ZST_EXT " or *" ZSTG_EXT);
	out = strndup(in, len - (has_suffix(in, ZST_EXT) ? strlen(ZST_EXT) :
							   strlen(ZSTG_EXT)));
	if (!out)
		return fail(o, in, strerror(ENOMEM));
	fd = open(in, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0)
		rc = fail(o, in, strerror(errno));
	else if (!o->force && cli_exists(out))
		rc = fail(o, out, "exists (--force replaces it)");
	else
		rc = unpack_fd(fd, &st, in, out, o);
	if (!rc && o->remove && unlink(in) < 0)
		rc = fail(o, in, strerror(errno));
	if (fd >= 0)
		close(fd);
	free(out);
	return rc;
}

/* "4096", "256K", "1M": a frame size, or 0 if malformed. */
static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	unsigned shift = 0;

	if (end == s || *s == '-' || v > CASTFS_ZST_MAX_FRAME)
		return 0;
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	/* Checked before the shift: 17592186044417M wrapped to 1 MiB. */
	if (*end || v > CASTFS_ZST_MAX_FRAME >> shift)
		return 0;
	return (size_t)(v << shift);
}

/* "1".."16" into *@n; -1 if malformed. */
static int parse_threads(const char *s, unsigned *n)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (end == s || *end || v < 1 || v > 16)
		return -1;
	*n = (unsigned)v;
	return 0;
}

/* A zstd level into *@level; -1 for anything else (zstd would clamp 100
 * to its highest level, and atoi read "abc" as its default). */
static int parse_level(const char *s, int *level)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < INT_MIN || v > INT_MAX ||
	    !castfs_zst_level_valid((int)v))
		return -1;
	*level = (int)v;
	return 0;
}

/* The threads that code and read back a pack, or decode one: one per
 * online CPU (the library takes at most 16). */
static unsigned online_cpus(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	return cpus < 1 ? 1u : (unsigned)cpus;
}

static int opt_set(struct pack_opts *o, int ch, const char *arg)
{
	switch (ch) {
	case 'f':
		o->frame_size = parse_size(arg);
		return o->frame_size ? 0 : -1;
	case 'l':
		return parse_level(arg, &o->level);
	case 'n':
		o->checksums = false;
		return 0;
	case 'j':
		return parse_threads(arg, &o->threads);
	case 'r':
		o->remove = true;
		return 0;
	case 'V':
		o->verify = false;
		return 0;
	case 'F':
		o->force = true;
		return 0;
	case 'g':
		o->grouped = true;
		return 0;
	case 'p':
	case 'q':
		o->progress = ch == 'p';
		return 0;
	default:
		return -1;
	}
}

/* The options both commands take, then the pack's own: unpack's table
 * ends before those, so getopt refuses them there ("unrecognized
 * option") instead of their being dropped without a word. */
#define COMMON_OPTS 6
static const struct option pack_longopts[] = {
	{ "remove", no_argument, NULL, 'r' },
	{ "force", no_argument, NULL, 'F' },
	{ "threads", required_argument, NULL, 'j' },
	{ "progress", no_argument, NULL, 'p' },
	{ "no-progress", no_argument, NULL, 'q' },
	{ "help", no_argument, NULL, 'h' },
	{ "frame-size", required_argument, NULL, 'f' },
	{ "level", required_argument, NULL, 'l' },
	{ "no-checksums", no_argument, NULL, 'n' },
	{ "no-verify", no_argument, NULL, 'V' },
	{ "grouped", no_argument, NULL, 'g' },
	{ NULL, 0, NULL, 0 },
};

/* The long name of option @ch in @opts. */
static const char *opt_name(const struct option *opts, int ch)
{
	while (opts->name && opts->val != ch)
		opts++;
	return opts->name ? opts->name : "?";
}

static int parse_opts(int argc, char **argv, struct pack_opts *o)
{
	struct option unpack_longopts[COMMON_OPTS + 1] = { { 0 } };
	const struct option *longopts = pack_longopts;
	int ch;

	if (!strcmp(o->cmd, "unpack")) {
		memcpy(unpack_longopts, pack_longopts,
		       COMMON_OPTS * sizeof(*unpack_longopts));
		longopts = unpack_longopts;
	}
	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (ch == 'h') {
			pack_usage(stdout, o->cmd);
			cli_exit_help(o->cmd);
		}
		if (opt_set(o, ch, optarg)) {
			if (ch != '?') /* getopt said why for those */
				fprintf(stderr,
					"castfs %s: --%s: invalid value '%s'\n",
					o->cmd, opt_name(longopts, ch), optarg);
			pack_usage(stderr, o->cmd);
			return -1;
		}
	}
	if (optind >= argc) {
		pack_usage(stderr, o->cmd);
		return -1;
	}
	if (o->progress < 0)
		o->progress = isatty(STDERR_FILENO);
	if (!o->threads)
		o->threads = online_cpus();
	return 0;
}

int castfs_cli_pack(int argc, char **argv)
{
	struct pack_opts o = { .level = 1,
			       .checksums = true,
			       .verify = true,
			       .progress = -1,
			       .cmd = "pack" };
	struct castfs_views vs = { 0 };
	int status = 0;

	if (parse_opts(argc, argv, &o))
		return 2;
	if (cli_views_load(&vs, "pack", NULL))
		return 1;
	cli_catch_signals();
	for (int i = optind; i < argc && !cli_interrupted(); i++) {
		struct stat st;
		int rc;

		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
			rc = pack_dir(argv[i], &o, &vs);
		else
			rc = pack_file(argv[i], &o, &vs);
		if (rc)
			status = 1;
	}
	castfs_views_fini(&vs);
	return status;
}

int castfs_cli_unpack(int argc, char **argv)
{
	struct pack_opts o = { .progress = -1, .cmd = "unpack" };
	int status = 0;

	if (parse_opts(argc, argv, &o))
		return 2;
	cli_catch_signals();
	for (int i = optind; i < argc && !cli_interrupted(); i++)
		if (unpack_file(argv[i], &o))
			status = 1;
	return status;
}
