/* SPDX-License-Identifier: MIT */
/*
 * castfs info FILE.gguf: the header of a GGUF file (castfs's views on a
 * mount, or any other) as format/gguf_read.c parses it: the format line,
 * every KV (arrays by element type and count) and the tensor table.
 * Reads only the header.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common/escape.h"
#include "view/view.h"
#include "format/gguf_read.h"
#include "plan/plan.h"

/* Strings longer than this are cut in the listing (a chat template). */
#define SHOW_MAX 72

static int print_quoted(const char *s, uint64_t n);

/* Name @s as it is when plain (nothing escaped, no space), else quoted
 * like print_quoted(); padded to @width columns. */
static void print_ident(const char *s, int width)
{
	size_t n = strlen(s);
	int w;

	if (!cli_name_plain(s, n))
		w = print_quoted(s, n);
	else
		w = printf("%s", s);
	printf("%*s", width > w ? width - w : 0, "");
}

/* @s (@n bytes) quoted, what cli_quote_next() escapes as \xHH, cut after
 * SHOW_MAX bytes. Returns the columns of the quoted string. */
static int print_quoted(const char *s, uint64_t n)
{
	size_t k = n > SHOW_MAX ? SHOW_MAX : (size_t)n;
	int cols = cli_put_quoted(s, k);

	if (k < n)
		printf("... (%" PRIu64 " bytes)", n);
	return cols;
}

static void print_kv(const struct castfs_gguf_kv *kv)
{
	const char *tn = castfs_gguf_vtype_name(kv->type);

	printf("  ");
	print_ident(kv->key, 0);
	printf(" %s = ", tn);
	switch (kv->type) {
	case CASTFS_GGUF_V_STRING:
		print_quoted(kv->str, kv->str_len);
		break;
	case CASTFS_GGUF_V_ARRAY:
		printf("[%s x %" PRIu64 "]",
		       castfs_gguf_vtype_name(kv->arr_type), kv->arr_n);
		break;
	case CASTFS_GGUF_V_BOOL:
		printf("%s", kv->v.u ? "true" : "false");
		break;
	case CASTFS_GGUF_V_F32:
		printf("%.9g", kv->v.f); /* enough to read back the float */
		break;
	case CASTFS_GGUF_V_F64:
		printf("%.17g", kv->v.f);
		break;
	case CASTFS_GGUF_V_I8:
	case CASTFS_GGUF_V_I16:
	case CASTFS_GGUF_V_I32:
	case CASTFS_GGUF_V_I64:
		printf("%" PRId64, kv->v.i);
		break;
	default:
		printf("%" PRIu64, kv->v.u);
		break;
	}
	putchar('\n');
}

static const char *type_name(uint32_t t, char buf[16])
{
	const char *n = castfs_gguf_type_name(t, NULL, NULL);

	if (n)
		return n;
	snprintf(buf, 16, "type%u", t);
	return buf;
}

/* "tensors: N (q8_0 14, f32 6)": counts per type, in type order. */
static void print_type_counts(const struct castfs_gguf_file *f)
{
	const char *sep = "";
	char buf[16];

	printf("tensors: %" PRIu64 " (", f->ntensors);
	for (uint32_t t = 0; t < 64; t++) {
		uint64_t n = 0;

		for (uint64_t i = 0; i < f->ntensors; i++)
			n += f->t[i].type == t;
		if (n)
			printf("%s%s %" PRIu64, sep, type_name(t, buf), n);
		sep = n ? ", " : sep;
	}
	printf(")\n");
}

static void print_gguf(const char *name, const struct castfs_gguf_file *f)
{
	char buf[16];

	printf("file: ");
	cli_put_name(name, strlen(name));
	putchar('\n');
	printf("format: GGUF v%u, %" PRIu64 " bytes, alignment %u, data at "
	       "%" PRIu64 "\n",
	       f->version, f->size, f->alignment, f->data_start);
	printf("kvs: %" PRIu64 "\n", f->nkv);
	for (uint64_t i = 0; i < f->nkv; i++)
		print_kv(&f->kv[i]);
	print_type_counts(f);
	printf("  %-40s %-6s %-24s %12s %12s\n", "name", "type", "ne", "offset",
	       "bytes");
	for (uint64_t i = 0; i < f->ntensors; i++) {
		const struct castfs_gguf_ti *t = &f->t[i];
		char ne[96];
		int k = 0;

		ne[0] = '\0';
		for (uint32_t j = 0; j < t->ndim && k < 80; j++)
			k += snprintf(ne + k, sizeof(ne) - (size_t)k,
				      "%s%" PRIu64, j ? "," : "[", t->ne[j]);
		snprintf(ne + k, sizeof(ne) - (size_t)k, "]");
		printf("  ");
		print_ident(t->name, 40);
		printf(" %-6s %-24s %12" PRIu64 " %12" PRIu64 "\n",
		       type_name(t->type, buf), ne, t->offset, t->nbytes);
	}
}

bool cli_is_gguf_file(const char *path)
{
	size_t n = strlen(path);
	struct stat st;

	return n > 5 && !strcmp(path + n - 5, ".gguf") && !stat(path, &st) &&
	       S_ISREG(st.st_mode);
}

/* A reader over a plan's bytes: the GGUF view read as a file would be
 * through the mount, its header computed and nothing after it. */
struct plan_reader {
	struct castfs_reader r;
	const struct castfs_plan *plan;
	const struct castfs_reader *src;
	struct castfs_scratch sc;
};

static ssize_t plan_pread(void *ctx, void *buf, size_t n, uint64_t off)
{
	struct plan_reader *pr = ctx;

	return castfs_plan_read(pr->plan, pr->src, &pr->sc, buf, n, off);
}

int cli_info_gguf_plan(const char *shown, const struct castfs_plan *plan,
		       const struct castfs_reader *src)
{
	struct plan_reader pr = { .r = { plan_pread, &pr, NULL, NULL },
				  .plan = plan,
				  .src = src };
	struct castfs_diag d = { { 0 } };
	struct castfs_gguf_file *f = NULL;
	int rc = castfs_scratch_init(&pr.sc);

	if (!rc)
		rc = castfs_gguf_read(&pr.r, plan->size, &f, &d);
	castfs_scratch_fini(&pr.sc);
	if (rc) {
		fprintf(stderr, "castfs info: %s: %s\n", shown,
			d.msg[0] ? d.msg : strerror(-rc));
		return -1;
	}
	print_gguf(shown, f);
	castfs_gguf_file_free(f);
	return 0;
}

int cli_info_gguf(const char *path)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_gguf_file *f = NULL;
	struct castfs_fd_reader fr;
	struct stat st;
	int rc, fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "castfs info: %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	castfs_fd_reader_init(&fr, fd);
	rc = castfs_gguf_read(&fr.r, (uint64_t)st.st_size, &f, &d);
	close(fd);
	if (rc) {
		fprintf(stderr, "castfs info: %s: %s\n", path,
			d.msg[0] ? d.msg : strerror(-rc));
		return -1;
	}
	print_gguf(path, f);
	castfs_gguf_file_free(f);
	return 0;
}

/* "DIR.<q>.gguf" -> "DIR" when that is a directory (malloc'ed), else NULL. */
static char *md_dir_of(const char *arg, const char **view)
{
	size_t len = strlen(arg);
	const char *dot;
	struct stat st;
	char *dir;

	if (len <= 5 || strcmp(arg + len - 5, ".gguf") ||
	    !(dot = memrchr(arg, '.', len - 5)) || dot == arg)
		return NULL;
	dir = strndup(arg, (size_t)(dot - arg));
	if (dir && (stat(dir, &st) || !S_ISDIR(st.st_mode))) {
		free(dir);
		return NULL;
	}
	*view = dot + 1;
	return dir;
}

/* cli_info_gguf_md() of sharded folder @dir through GGUF view @view. */
static int info_shards(const char *arg, const char *dir, const char *view,
		       const struct castfs_views *vs)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *plan = NULL;
	struct cli_shards sh;
	int rc;

	if (cli_shards_open(&sh, "info", dir, vs, view))
		return -1;
	if (sh.s[0].view->kind != CASTFS_VIEW_GGUF) {
		fprintf(stderr, "castfs info: %s: not a GGUF view\n", arg);
		cli_shards_close(&sh);
		return -1;
	}
	rc = cli_shards_plan(&sh, dir, &plan, &d);
	if (rc)
		fprintf(stderr, "castfs info: %s: %s\n", arg,
			d.msg[0] ? d.msg : strerror(-rc));
	rc = rc ? -1 : cli_info_gguf_plan(arg, plan, &sh.mr.r);
	castfs_plan_free(plan);
	cli_shards_close(&sh);
	return rc;
}

int cli_info_gguf_md(const char *arg, const struct castfs_views *vs)
{
	struct castfs_diag d = { { 0 } };
	struct castfs_plan *plan = NULL;
	const char *view = NULL;
	char *weights = NULL, *dir;
	struct cli_src s;
	int rc;

	if (cli_is_gguf_file(arg) || !(dir = md_dir_of(arg, &view)))
		return 1;
	if (cli_md_is_sharded(dir)) {
		rc = info_shards(arg, dir, view, vs);
		free(dir);
		return rc;
	}
	if (cli_md_weights(dir, &weights) || !weights) {
		free(dir);
		return -1;
	}
	rc = cli_src_open(&s, "info", weights, vs, view) ? -2 : 0;
	free(weights);
	if (!rc && (!s.view || s.view->kind != CASTFS_VIEW_GGUF)) {
		fprintf(stderr, "castfs info: %s: not a GGUF view\n", arg);
		rc = -1;
	}
	if (!rc) {
		int b = cli_md_gguf_plan(&s, dir, &plan, &d);

		if (b)
			fprintf(stderr, "castfs info: %s: %s\n", arg,
				d.msg[0] ? d.msg : strerror(-b));
		rc = b ? -1 : cli_info_gguf_plan(arg, plan, s.r);
		castfs_plan_free(plan);
	}
	if (rc != -2) /* cli_src_open() closes what it opened on failure */
		cli_src_close(&s);
	free(dir);
	return rc < 0 ? -1 : rc;
}
