/* SPDX-License-Identifier: MIT */
/*
 * castfs convert: write a view to a real file with the mount's engine (the
 * same plan, the same kernels: the bytes equal the mounted view's), into a
 * temporary file next to the output that is renamed over it when whole.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "modeldir/modeldir.h"
#include "plan/plan.h"
#include "view/qsrc.h"

#define CHUNK_LEN (4u << 20) /* bytes per castfs_plan_read() */

struct conv_opts {
	const char *md_dir; /* a model folder to write as one GGUF file */
	const char *view;
	const char *config;
	const char *out;
	int progress; /* 1 on, 0 off, -1 when stderr is a terminal */
};

static void convert_usage(FILE *f)
{
	fprintf(f,
		"usage: castfs convert FILE --view VIEW -o OUT [--config FILE]\n"
		"                      [--progress | --no-progress]\n\n"
		"Write FILE as view VIEW converts it to OUT, with the engine of "
		"the\nmount: OUT is byte-identical to the mounted "
		"X.VIEW.safetensors.\nOUT appears whole or not at all "
		"(temporary file, fsync, rename).\nFILE may also be named "
		"X.VIEW.safetensors when only X.safetensors\nexists; then "
		"--view may be left out. Where only the pack\n"
		"X.safetensors.zst (or .zstg) exists, it is read instead.\n\n"
		"    --view VIEW      the view (castfs --help lists them)\n"
		"    -o, --output OUT the file to write (replaced if it "
		"exists)\n"
		"    --config FILE    JSON file defining more views\n"
		"    --progress       show a progress bar (default: when "
		"stderr is a\n"
		"                     terminal)\n"
		"    --no-progress    never show one\n"
		"    -h, --help       this help\n\n"
		"Exit status: 0, 1 on failure (the reason goes to stderr), 2 "
		"for\nusage errors. Interrupted (Ctrl-C), it removes OUT's "
		"temporary file\nand ends by the signal. See "
		"castfs-convert(1).\n");
}

static const char *human(uint64_t n, char *buf, size_t len)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

static void show_progress(uint64_t done, uint64_t total, double t0)
{
	static double last;
	double t = cli_now_s(), frac = total ? (double)done / (double)total : 1;
	char a[32], b[32], r[32], bar[31];
	int fill = (int)(frac * 30);

	if (done < total && t - last < 0.1)
		return;
	last = t;
	memset(bar, '#', (size_t)fill);
	memset(bar + fill, '-', (size_t)(30 - fill));
	bar[30] = '\0';
	fprintf(stderr, "\r[%s] %3d%% %s / %s  %s/s ", bar, (int)(frac * 100),
		human(done, a, sizeof(a)), human(total, b, sizeof(b)),
		human((uint64_t)((double)done / CASTFS_MAX(t - t0, 1e-3)), r,
		      sizeof(r)));
	if (done == total)
		fputc('\n', stderr);
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Produce every byte of @plan into @fd. Returns 0 or prints why not. */
static int conv_copy(const struct castfs_reader *r, const char *path,
		     const struct castfs_plan *plan, int fd,
		     const struct conv_opts *o)
{
	struct castfs_scratch sc;
	uint8_t *buf = malloc(CHUNK_LEN);
	double t0 = cli_now_s();
	uint64_t off = 0;
	int rc = buf ? castfs_scratch_init(&sc) : -ENOMEM;

	while (!rc && off < plan->size && !cli_interrupted()) {
		size_t n = (size_t)CASTFS_MIN(plan->size - off, CHUNK_LEN);
		ssize_t got = castfs_plan_read(plan, r, &sc, buf, n, off);

		if (got < 0 || (size_t)got != n) {
			rc = got < 0 ? (int)got : -EIO;
			fprintf(stderr,
				"\ncastfs convert: %s: output bytes "
				"[%" PRIu64 ", %" PRIu64 "): %s\n",
				path, off, off + n, strerror(-rc));
			break;
		}
		rc = write_all(fd, buf, n);
		if (rc)
			fprintf(stderr, "\ncastfs convert: %s: %s\n", o->out,
				strerror(-rc));
		off += n;
		if (o->progress)
			show_progress(off, plan->size, t0);
	}
	if (buf)
		castfs_scratch_fini(&sc);
	free(buf);
	return rc || cli_interrupted() ? -1 : 0;
}

static bool is_source(const struct cli_src *s, const char *out)
{
	struct stat st;

	return stat(out, &st) == 0 && st.st_dev == s->st.st_dev &&
	       st.st_ino == s->st.st_ino;
}

int cli_slurp(const char *dir, const char *name, char **out, size_t *len)
{
	char *path = NULL, *buf = NULL;
	FILE *f;
	long n;
	int rc = -errno;

	*out = NULL;
	*len = 0;
	if (asprintf(&path, "%s/%s", dir, name) < 0)
		return -ENOMEM;
	f = fopen(path, "rb");
	free(path);
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
	    fread(buf, 1, (size_t)n, f) == (size_t)n) {
		buf[n] = '\0';
		*out = buf;
		*len = (size_t)n;
		rc = 0;
	} else {
		free(buf);
		rc = -EIO;
	}
	fclose(f);
	return rc;
}

int cli_md_gguf_plan(const struct cli_src *s, const char *dir,
		     struct castfs_plan **plan, struct castfs_diag *d)
{
	char *cfg = NULL, *tok = NULL, *tc = NULL, *cj = NULL, *cs = NULL;
	size_t cfg_len = 0, tok_len = 0, tc_len = 0, cj_len = 0, cs_len = 0;
	int rc = cli_slurp(dir, "config.json", &cfg, &cfg_len);

	if (!rc)
		rc = cli_slurp(dir, "tokenizer.json", &tok, &tok_len);
	if (!rc)
		rc = cli_slurp(dir, "tokenizer_config.json", &tc, &tc_len);
	if (!rc)
		rc = cli_slurp(dir, "chat_template.jinja", &cj, &cj_len);
	if (!rc)
		rc = cli_slurp(dir, "chat_template.json", &cs, &cs_len);
	if (!rc && (!cfg || !tok))
		rc = castfs_diag_set(d, -ENOENT,
				     "config.json or tokenizer.json missing");
	if (!rc) {
		/* the FP8 block size config.json gives a quantized source */
		struct castfs_qsrc_opts qo;
		const struct castfs_header *one = s->h;
		struct castfs_md_gguf_src src = {
			.config = cfg,
			.config_len = cfg_len,
			.tokenizer = tok,
			.tokenizer_len = tok_len,
			.tok_config = tc,
			.tok_config_len = tc_len,
			.chat_jinja = cj,
			.chat_jinja_len = cj_len,
			.chat_json = cs,
			.chat_json_len = cs_len,
			.h = &one,
			.nh = 1,
			.qopts = cli_qsrc_opts(s->path, &qo),
		};

		rc = castfs_md_gguf_plan_src(s->view, &src, plan, d);
	}
	free(cfg);
	free(tok);
	free(tc);
	free(cj);
	free(cs);
	return rc;
}

int cli_md_weights(const char *arg, char **weights)
{
	struct stat st;
	char *p;

	*weights = NULL;
	if (stat(arg, &st) != 0 || !S_ISDIR(st.st_mode))
		return 0;
	if (asprintf(&p, "%s/model.safetensors", arg) < 0)
		return -1;
	if (stat(p, &st) != 0) {
		fprintf(stderr,
			"castfs: %s: no model.safetensors or "
			"model.safetensors.index.json\n",
			arg);
		free(p);
		return -1;
	}
	*weights = p;
	return 0;
}

/* The output file's temporary, with the mode a new file of @out gets. */
static int out_open(struct cli_out *w, const char *out)
{
	mode_t mask = umask(0);
	int rc;

	umask(mask);
	rc = cli_out_open(w, out, 0666 & ~mask);
	if (rc)
		fprintf(stderr, "castfs convert: %s: %s\n", out,
			cli_out_strerror(rc));
	return rc ? -1 : 0;
}

static int out_commit(struct cli_out *w, const char *out)
{
	int rc = cli_out_commit(w, out, true);

	if (rc)
		fprintf(stderr, "castfs convert: %s: %s\n", out,
			cli_out_strerror(rc));
	return rc ? -1 : 0;
}

/* Whether the source(s) behind a conversion are still what was read. */
typedef bool (*conv_same_fn)(const void *ctx);

static bool src_same(const void *ctx)
{
	const struct cli_src *s = ctx;

	return cli_same_file(s->fd, &s->st);
}

static bool shards_same(const void *ctx)
{
	return cli_shards_same(ctx);
}

/*
 * Write @plan, read through @r, to o->out atomically: the output appears
 * only whole, and only if the source (@same) did not change meanwhile.
 * @path names the source in messages. 0, or 1 (said why).
 */
static int conv_write(const struct castfs_reader *r, const char *path,
		      const struct castfs_plan *plan, const struct conv_opts *o,
		      conv_same_fn same, const void *ctx)
{
	struct cli_out w;
	int rc = out_open(&w, o->out);

	if (!rc)
		rc = conv_copy(r, path, plan, w.fd, o);
	if (!rc && !same(ctx)) {
		fprintf(stderr,
			"castfs convert: %s: changed while being "
			"converted\n",
			path);
		rc = -1;
	}
	if (!rc)
		rc = out_commit(&w, o->out);
	if (cli_interrupted())
		fprintf(stderr, "castfs convert: interrupted\n");
	cli_out_abort(&w);
	return rc ? 1 : 0;
}

static int convert_src(const struct cli_src *s, const struct conv_opts *o)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_qsrc_opts qo;
	struct castfs_plan *plan;
	int rc;

	if (is_source(s, o->out)) {
		fprintf(stderr,
			"castfs convert: %s: would overwrite the "
			"source\n",
			o->out);
		return 1;
	}
	rc = o->md_dir ? cli_md_gguf_plan(s, o->md_dir, &plan, &d) :
			 castfs_view_plan_opts(s->view, s->h,
					       cli_qsrc_opts(s->path, &qo),
					       &plan, &d);
	if (rc) {
		fprintf(stderr, "castfs convert: %s: view %s: %s\n", s->path,
			s->view->name, d.msg[0] ? d.msg : strerror(-rc));
		return 1;
	}
	rc = conv_write(s->r, s->path, plan, o, src_same, s);
	castfs_plan_free(plan);
	return rc;
}

/* The GGUF view of the sharded folder @dir into o->out. 0, or 1 (said
 * why). */
static int convert_shards(const char *dir, const struct castfs_views *vs,
			  const struct conv_opts *o)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *plan = NULL;
	struct cli_shards sh;
	char *view = NULL;
	int rc;

	/* a folder has GGUF views only: "bf16" is "bf16.gguf" there */
	if (!o->view || asprintf(&view, "%s%s", o->view,
				 strstr(o->view, ".gguf") ? "" : ".gguf") < 0) {
		fprintf(stderr, "castfs convert: %s: which view? (--view)\n",
			dir);
		return 1;
	}
	rc = cli_shards_open(&sh, "convert", dir, vs, view);
	free(view);
	if (rc)
		return 1;
	if (sh.s[0].view->kind != CASTFS_VIEW_GGUF ||
	    cli_shards_is_source(&sh, o->out)) {
		fprintf(stderr,
			"castfs convert: %s: a model folder converts to a "
			"GGUF view (--view q8_0), not over a shard\n",
			dir);
		cli_shards_close(&sh);
		return 1;
	}
	rc = cli_shards_plan(&sh, dir, &plan, &d);
	if (rc) {
		fprintf(stderr, "castfs convert: %s: view %s: %s\n", dir,
			sh.s[0].view->name, d.msg[0] ? d.msg : strerror(-rc));
		cli_shards_close(&sh);
		return 1;
	}
	rc = conv_write(&sh.mr.r, dir, plan, o, shards_same, &sh);
	castfs_plan_free(plan);
	cli_shards_close(&sh);
	return rc;
}

static int parse_opts(int argc, char **argv, struct conv_opts *o)
{
	static const struct option longopts[] = {
		{ "view", required_argument, NULL, 'w' },
		{ "output", required_argument, NULL, 'o' },
		{ "config", required_argument, NULL, 'c' },
		{ "progress", no_argument, NULL, 'p' },
		{ "no-progress", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "ho:", longopts, NULL)) != -1) {
		switch (ch) {
		case 'w':
			o->view = optarg;
			break;
		case 'o':
			o->out = optarg;
			break;
		case 'c':
			o->config = optarg;
			break;
		case 'p':
		case 'q':
			o->progress = ch == 'p';
			break;
		case 'h':
			convert_usage(stdout);
			cli_exit_help("convert");
		default:
			convert_usage(stderr);
			return -1;
		}
	}
	if (optind != argc - 1 || !o->out) {
		convert_usage(stderr);
		return -1;
	}
	if (o->progress < 0)
		o->progress = isatty(STDERR_FILENO);
	return 0;
}

int castfs_cli_convert(int argc, char **argv)
{
	struct conv_opts o = { .progress = -1 };
	struct castfs_views vs = { 0 };
	struct cli_src s;
	char *weights = NULL, *gguf_view = NULL;
	int status = 1, rc;

	if (parse_opts(argc, argv, &o))
		return 2;
	if (cli_views_load(&vs, "convert", o.config))
		goto out_views;
	if (cli_md_is_sharded(argv[optind])) {
		cli_catch_signals();
		status = convert_shards(argv[optind], &vs, &o);
		goto out_views;
	}
	if (cli_md_weights(argv[optind], &weights))
		goto out_views;
	/* a folder has GGUF views only: "bf16" is "bf16.gguf" there */
	if (weights && o.view && !strstr(o.view, ".gguf") &&
	    asprintf(&gguf_view, "%s.gguf", o.view) < 0)
		goto out_views;
	rc = cli_src_open(&s, "convert", weights ? weights : argv[optind], &vs,
			  gguf_view ? gguf_view : o.view);
	if (rc)
		goto out_views;
	if (weights) {
		o.md_dir = argv[optind];
		if (!s.view || s.view->kind != CASTFS_VIEW_GGUF) {
			fprintf(stderr,
				"castfs convert: %s: a model folder "
				"converts to a GGUF view only "
				"(--view q8_0)\n",
				argv[optind]);
			goto out_src;
		}
	}
	if (!s.view) {
		fprintf(stderr, "castfs convert: %s: which view? (--view)\n",
			s.path);
		goto out_src;
	}
	cli_catch_signals();
	status = convert_src(&s, &o);
out_src:
	cli_src_close(&s);
out_views:
	free(gguf_view);
	free(weights);
	castfs_views_fini(&vs);
	return status;
}
