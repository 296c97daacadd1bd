/* SPDX-License-Identifier: MIT */
/*
 * castfs info: the header summary and tensor table of a checkpoint, of a
 * view of one (computed with the mount's engine), or one tensor's .info.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/escape.h"
#include "tensors/tensor_files.h"
#include "view/qsrc.h"

struct info_opts {
	const char *view;
	const char *config;
	const char *tensor;
};

static void info_usage(FILE *f)
{
	fprintf(f,
		"usage: castfs info [--view VIEW] [--config FILE] "
		"[--tensor NAME] FILE...\n\n"
		"Print the header summary and tensor table of each safetensors "
		"FILE,\nor the KVs and tensor table of a FILE.gguf.\n\n"
		"    --view VIEW     show FILE as view VIEW would convert it\n"
		"                    (X.VIEW.safetensors names work too when "
		"only\n"
		"                    X.safetensors exists)\n"
		"    --config FILE   JSON file defining more views\n"
		"    -t, --tensor NAME  print the .info text of one tensor\n"
		"    -h, --help      this help\n\n"
		"Exit status: 0, 1 if a FILE could not be read or is not a "
		"valid\ncheckpoint, or the output could not be written (the "
		"reason goes to\nstderr), 2 for usage errors.\nSee "
		"castfs-info(1).\n");
}

static void print_dtypes(const struct castfs_header *h)
{
	size_t count[CASTFS_DTYPE_COUNT] = { 0 };
	const char *sep = "";

	for (size_t i = 0; i < h->ntensors; i++)
		count[h->tensors[i].dtype]++;
	printf("dtypes:");
	for (int i = CASTFS_DTYPE_COUNT - 1; i >= 0; i--) {
		if (!count[i])
			continue;
		printf("%s %s %zu", sep,
		       castfs_dtype_name((enum castfs_dtype)i), count[i]);
		sep = ",";
	}
	putchar('\n');
}

static void print_summary(const struct castfs_tfile_ctx *c, uint64_t size)
{
	const struct castfs_header *h = c->h;
	uint64_t elems = 0;
	char *meta = castfs_meta_json(h, NULL);

	for (size_t i = 0; i < h->ntensors; i++)
		elems += h->tensors[i].nelems;
	printf("file: ");
	cli_put_name(c->file, strlen(c->file));
	if (c->view) {
		printf("\nview: %s of ", c->view);
		cli_put_name(c->src_file, strlen(c->src_file));
	}
	printf("\nsize: %" PRIu64 " bytes\n"
	       "header: %" PRIu64 " bytes (8 + %" PRIu64 " of JSON)\n"
	       "data: %" PRIu64 " bytes at offset %" PRIu64 "\n"
	       "tensors: %zu\nelements: %" PRIu64 "\n",
	       size, h->data_start, h->header_len, h->data_len, h->data_start,
	       h->ntensors, elems);
	print_dtypes(h);
	printf("metadata: %s", meta ? meta : "?\n");
	free(meta);
}

static int name_width(const struct castfs_header *h)
{
	size_t w = 4;

	for (size_t i = 0; i < h->ntensors; i++)
		w = CASTFS_MAX(w,
			       (size_t)cli_name_cols(h->tensors[i].name,
						     h->tensors[i].name_len));
	return (int)CASTFS_MIN(w, 64);
}

/* A source's quantized layout: one line, and the scheme of a tensor. */
static void print_quant(const struct castfs_qsrc *q, int rc,
			const struct castfs_diag *d)
{
	if (rc)
		printf("quantized: refused: %s\n",
		       d->msg[0] ? d->msg : strerror(-rc));
	else if (q->nint8)
		printf("quantized: bitsandbytes LLM.int8, %zu weight%s "
		       "dequantized\n",
		       q->nint8, q->nint8 == 1 ? "" : "s");
	else if (q->nct4)
		printf("quantized: compressed-tensors NVFP4/MXFP4, %zu packed "
		       "weight%s dequantized by the views\n",
		       q->nct4, q->nct4 == 1 ? "" : "s");
	else if (q->ncomfy)
		printf("quantized: ComfyUI scaled fp8, %zu weight%s dequantized "
		       "in the view's dtype\n",
		       q->ncomfy, q->ncomfy == 1 ? "" : "s");
	else if (q->nfp8)
		printf("quantized: FP8 block, %zu weight%s dequantized by "
		       "the views\n",
		       q->nfp8, q->nfp8 == 1 ? "" : "s");
	else if (q->nmxfp4)
		printf("quantized: MXFP4 (gpt-oss), %zu expert weight%s "
		       "dequantized by every view\n",
		       q->nmxfp4, q->nmxfp4 == 1 ? "" : "s");
	else if (q->nbnb4)
		printf("quantized: bitsandbytes 4-bit, %zu weight%s "
		       "dequantized by the cast views\n",
		       q->nbnb4, q->nbnb4 == 1 ? "" : "s");
	else if (q->nctw4)
		printf("quantized: compressed-tensors pack-quantized int4, "
		       "%zu weight%s dequantized by the cast views\n",
		       q->nctw4, q->nctw4 == 1 ? "" : "s");
}

/* Whether @qi's block is the whole matrix of @t: one scale per matrix. */
static bool whole_matrix(const struct castfs_tensor *t,
			 const struct castfs_qinfo *qi)
{
	return t->ndim >= 2 && qi->brows == t->shape[t->ndim - 2] &&
	       qi->bcols == t->shape[t->ndim - 1];
}

static void print_scheme(const struct castfs_header *h,
			 const struct castfs_qsrc *q,
			 const struct castfs_tensor *t)
{
	const struct castfs_qinfo *qi;

	if (!q || !q->t)
		return;
	qi = &q->t[t - h->tensors];
	if (qi->role == CASTFS_QR_SCALE) {
		printf(" scale");
	} else if (qi->role == CASTFS_QR_FP8_BLOCK) {
		const struct castfs_tensor *s = &h->tensors[qi->scale];

		if (qi->rule == CASTFS_QRULE_INT8)
			printf(" LLM.int8, %s row scale ",
			       castfs_dtype_name(s->dtype));
		else if (qi->rule == CASTFS_QRULE_NVFP4)
			printf(" nvfp4 e2m1 groups of 16, low nibble first, "
			       "%s scale / global scale ",
			       castfs_dtype_name(s->dtype));
		else if (qi->rule == CASTFS_QRULE_MXFP4)
			printf(" mxfp4 e2m1 groups of 32, low nibble first, "
			       "%s e8m0 scale ",
			       castfs_dtype_name(s->dtype));
		else if (qi->rule == CASTFS_QRULE_COMPUTE)
			printf(" comfy scaled fp8, %s scale ",
			       castfs_dtype_name(s->dtype));
		else if (qi->brows == 1 && t->ndim == 2 && t->shape[0] > 1 &&
			 qi->bcols >= t->shape[1])
			printf(" fp8 per-channel, %s scale ",
			       castfs_dtype_name(s->dtype));
		else if (s->ndim >= 2 && !whole_matrix(t, qi))
			printf(" fp8 block %" PRIu32 "x%" PRIu32 ", %s scale ",
			       qi->brows, qi->bcols,
			       castfs_dtype_name(s->dtype));
		else
			printf(" fp8 per-%s, %s scale ",
			       t->ndim == 3 ? "expert" : "tensor",
			       castfs_dtype_name(s->dtype));
		cli_put_name(s->name, s->name_len);
	} else if (qi->role == CASTFS_QR_MXFP4) {
		const struct castfs_tensor *s = &h->tensors[qi->scale];

		printf(" mxfp4 e2m1 blocks of 32, low nibble first, %s e8m0 "
		       "scale ",
		       castfs_dtype_name(s->dtype));
		cli_put_name(s->name, s->name_len);
	} else if (qi->role == CASTFS_QR_BNB4) {
		const struct castfs_q4src *s = &q->q4[qi->scale];

		printf(" bnb %s blocks of %" PRIu32 "%s, true shape [",
		       s->qtype == CASTFS_Q_NF4 ? "nf4" : "fp4", s->blocksize,
		       s->nested ? ", double-quantised absmax" : "");
		for (uint32_t i = 0; i < s->ndim; i++)
			printf("%s%" PRIu64, i ? ", " : "", s->shape[i]);
		printf("] %s", castfs_dtype_name((enum castfs_dtype)s->dtype));
	} else if (qi->role == CASTFS_QR_CTW4) {
		const struct castfs_tensor *s = &h->tensors[qi->scale];

		printf(" int4 %s, groups of %" PRIu32 ", %s scale ",
		       qi->zp ? "asymmetric (zero points)" : "symmetric",
		       qi->bcols, castfs_dtype_name(s->dtype));
		cli_put_name(s->name, s->name_len);
	}
}

static void print_row(const struct castfs_tfile_ctx *c,
		      const struct castfs_qsrc *q,
		      const struct castfs_tensor *t, int width)
{
	char *shape = castfs_tinfo_shape_str(t->ndim, t->shape), off[64];
	int n = cli_put_name(t->name, t->name_len);

	snprintf(off, sizeof(off), "[%" PRIu64 ", %" PRIu64 "]", t->begin,
		 t->end);
	printf("%*s  %-11s %-16s ", n < width ? width - n : 0, "",
	       castfs_dtype_name(t->dtype), shape ? shape : "?");
	if (c->view) {
		struct castfs_torigin o;
		char how[128];

		castfs_torigin_find(c, t, &o);
		castfs_torigin_str(&o, how, sizeof(how));
		printf("%-24s %s\n", off, how);
	} else {
		bool quant = q && q->t &&
			     q->t[t - c->h->tensors].role != CASTFS_QR_PLAIN;

		printf(quant ? "%-24s" : "%s", off);
		print_scheme(c->h, q, t);
		printf("\n");
	}
	free(shape);
}

static void print_table(const struct castfs_tfile_ctx *c,
			const struct castfs_qsrc *q)
{
	int w = name_width(c->h);

	printf("\n%-*s  %-11s %-16s %s\n", w, "NAME", "DTYPE", "SHAPE",
	       c->view ? "DATA_OFFSETS             FROM" :
	       q && (q->nfp8 || q->nmxfp4 || q->nbnb4 || q->nctw4) ?
			 "DATA_OFFSETS             QUANTIZATION" :
			 "DATA_OFFSETS");
	for (size_t i = 0; i < c->h->ntensors; i++)
		print_row(c, q, c->h->by_name[i], w);
}

static int print_tensor(const struct castfs_tfile_ctx *c, const char *name)
{
	const struct castfs_tensor *t =
		castfs_header_find(c->h, name, strlen(name));
	char *text;

	if (!t) {
		fprintf(stderr, "castfs info: %s: no tensor '%s'\n", c->file,
			name);
		return 1;
	}
	text = castfs_tinfo_text(c, t, NULL);
	if (!text) {
		fprintf(stderr, "castfs info: %s\n", strerror(ENOMEM));
		return 1;
	}
	fputs(text, stdout);
	free(text);
	return 0;
}

/* Describe @s itself, or as its view converts it. */
static int info_src(const struct cli_src *s, const struct info_opts *o)
{
	struct castfs_tfile_ctx c = { .h = s->h, .file = s->shown };
	struct castfs_diag d = { { 0 } };
	struct castfs_header *vh = NULL;
	struct castfs_plan *plan = NULL;
	struct castfs_qsrc_opts qo;
	uint64_t size = s->size;
	int rc = 0, status;

	if (s->view) {
		rc = castfs_view_plan_opts(
			s->view, s->h, cli_qsrc_opts(s->path, &qo), &plan, &d);
		if (!rc && s->view->kind == CASTFS_VIEW_GGUF && !o->tensor) {
			status = cli_info_gguf_plan(s->shown, plan, s->r) ? 1 :
									    0;
			castfs_plan_free(plan);
			return status;
		}
		if (!rc)
			rc = castfs_plan_header(plan, &vh, &d);
		if (rc) {
			fprintf(stderr, "castfs info: %s: view %s: %s\n",
				s->path, s->view->name,
				d.msg[0] ? d.msg : strerror(-rc));
			castfs_plan_free(plan);
			return 1;
		}
		c = (struct castfs_tfile_ctx){
			.h = vh,
			.file = s->shown,
			.view = s->view->name,
			.plan = plan,
			.src_h = s->h,
			.src_file = s->path,
		};
		size = plan->size;
	}
	if (o->tensor) {
		status = print_tensor(&c, o->tensor);
	} else {
		struct castfs_qsrc q = { 0 };
		int qrc = s->view ? 0 :
				    castfs_qsrc_scan_opts(
					    s->h, cli_qsrc_opts(s->path, &qo),
					    &q, &d);

		print_summary(&c, size);
		if (!s->view)
			print_quant(&q, qrc, &d);
		print_table(&c, s->view ? NULL : &q);
		castfs_qsrc_fini(&q);
		status = 0;
	}
	castfs_header_free(vh);
	castfs_plan_free(plan);
	return status;
}

static int parse_opts(int argc, char **argv, struct info_opts *o)
{
	static const struct option longopts[] = {
		{ "view", required_argument, NULL, 'w' },
		{ "config", required_argument, NULL, 'c' },
		{ "tensor", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "ht:", longopts, NULL)) != -1) {
		switch (ch) {
		case 'w':
			o->view = optarg;
			break;
		case 'c':
			o->config = optarg;
			break;
		case 't':
			o->tensor = optarg;
			break;
		case 'h':
			info_usage(stdout);
			cli_exit_help("info");
		default:
			info_usage(stderr);
			return -1;
		}
	}
	if (optind >= argc) {
		info_usage(stderr);
		return -1;
	}
	return 0;
}

int castfs_cli_info(int argc, char **argv)
{
	struct castfs_views vs = { 0 };
	struct info_opts o = { 0 };
	int status = 0, rc;

	if (parse_opts(argc, argv, &o))
		return 2;
	if (cli_views_load(&vs, "info", o.config)) {
		castfs_views_fini(&vs);
		return 1;
	}
	for (int i = optind; i < argc; i++) {
		struct cli_src s;

		if (i > optind)
			putchar('\n');
		if (!o.view && !o.tensor && cli_is_gguf_file(argv[i])) {
			if (cli_info_gguf(argv[i]))
				status = 1;
			continue;
		}
		rc = o.view || o.tensor ? 1 : cli_info_gguf_md(argv[i], &vs);
		if (rc <= 0) {
			status = rc ? 1 : status;
			continue;
		}
		if (cli_src_open(&s, "info", argv[i], &vs, o.view)) {
			status = 1;
			continue;
		}
		if (info_src(&s, &o))
			status = 1;
		cli_src_close(&s);
	}
	castfs_views_fini(&vs);
	if (cli_stdout_close("info"))
		status = 1;
	return status;
}
