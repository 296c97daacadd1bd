/* SPDX-License-Identifier: MIT */
/*
 * castfs convert of a sharded model folder (model.safetensors.index.json
 * and its shards) to one GGUF file: every shard opened like a single
 * checkpoint, read through one composite reader (docs/ARCHITECTURE.md,
 * "Sharded folders: a composite source").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "modeldir/modeldir.h"
#include "view/qsrc.h"

static const char index_name[] = "model.safetensors.index.json";

bool cli_md_is_sharded(const char *dir)
{
	struct stat st;
	char *p = NULL;
	bool yes = false;

	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return false;
	if (asprintf(&p, "%s/model.safetensors", dir) < 0)
		return false;
	if (stat(p, &st) != 0 && errno == ENOENT) {
		free(p);
		p = NULL;
		yes = asprintf(&p, "%s/%s", dir, index_name) >= 0 &&
		      stat(p, &st) == 0 && S_ISREG(st.st_mode);
	}
	free(p);
	return yes;
}

/* The shard names of the index of @dir into @sh. 0 or -1 (said why). */
static int read_index(struct cli_shards *sh, const char *cmd, const char *dir)
{
	struct castfs_diag d = { { 0 } };
	int rc = cli_slurp(dir, index_name, &sh->index, &sh->index_len);

	if (!rc && !sh->index)
		rc = -ENOENT;
	if (!rc)
		rc = castfs_md_gguf_shards(sh->index, sh->index_len, &sh->names,
					   &sh->n, &d);
	if (!rc && sh->n > CASTFS_PART_MAX)
		rc = castfs_diag_set(&d, -EINVAL, "%zu shards", sh->n);
	if (rc)
		fprintf(stderr, "castfs %s: %s/%s: %s\n", cmd, dir, index_name,
			d.msg[0] ? d.msg : strerror(-rc));
	return rc ? -1 : 0;
}

int cli_shards_open(struct cli_shards *sh, const char *cmd, const char *dir,
		    const struct castfs_views *vs, const char *view_name)
{
	memset(sh, 0, sizeof(*sh));
	if (read_index(sh, cmd, dir))
		goto fail;
	sh->s = calloc(sh->n, sizeof(*sh->s));
	sh->r = calloc(sh->n, sizeof(*sh->r));
	sh->h = calloc(sh->n, sizeof(*sh->h));
	if (!sh->s || !sh->r || !sh->h) {
		fprintf(stderr, "castfs %s: %s\n", cmd, strerror(ENOMEM));
		goto fail;
	}
	for (size_t k = 0; k < sh->n; k++) {
		char *p = NULL;
		int rc = asprintf(&p, "%s/%s", dir, sh->names[k]) < 0 ?
				 -1 :
				 cli_src_open(&sh->s[k], cmd, p, vs, view_name);

		free(p);
		if (rc)
			goto fail;
		sh->opened = k + 1;
		sh->r[k] = sh->s[k].r;
		sh->h[k] = sh->s[k].h;
	}
	castfs_multi_reader_init(&sh->mr, sh->r, sh->n);
	return 0;
fail:
	cli_shards_close(sh);
	return -1;
}

int cli_shards_plan(const struct cli_shards *sh, const char *dir,
		    struct castfs_plan **plan, struct castfs_diag *d)
{
	char *cfg = NULL, *tok = NULL, *tc = NULL, *cj = NULL, *cs = NULL;
	struct castfs_qsrc_opts qo;
	struct castfs_md_gguf_src s = {
		.index = sh->index,
		.index_len = sh->index_len,
		.shards = (const char *const *)sh->names,
		.h = sh->h,
		.nh = sh->n,
	};
	int rc = cli_slurp(dir, "config.json", &cfg, &s.config_len);

	if (!rc)
		rc = cli_slurp(dir, "tokenizer.json", &tok, &s.tokenizer_len);
	if (!rc)
		rc = cli_slurp(dir, "tokenizer_config.json", &tc,
			       &s.tok_config_len);
	if (!rc)
		rc = cli_slurp(dir, "chat_template.jinja", &cj,
			       &s.chat_jinja_len);
	if (!rc)
		rc = cli_slurp(dir, "chat_template.json", &cs,
			       &s.chat_json_len);
	if (!rc && (!cfg || !tok))
		rc = castfs_diag_set(d, -ENOENT,
				     "config.json or tokenizer.json missing");
	s.config = cfg;
	s.tokenizer = tok;
	s.tok_config = tc;
	s.chat_jinja = cj;
	s.chat_json = cs;
	/* the FP8 block size config.json gives a quantized folder */
	s.qopts = cli_qsrc_opts(sh->s[0].path, &qo);
	if (!rc)
		rc = castfs_md_gguf_plan_src(sh->s[0].view, &s, plan, d);
	free(cfg);
	free(tok);
	free(tc);
	free(cj);
	free(cs);
	return rc;
}

bool cli_shards_same(const struct cli_shards *sh)
{
	for (size_t k = 0; k < sh->n; k++)
		if (!cli_same_file(sh->s[k].fd, &sh->s[k].st))
			return false;
	return true;
}

bool cli_shards_is_source(const struct cli_shards *sh, const char *out)
{
	struct stat st;

	if (stat(out, &st) != 0)
		return false;
	for (size_t k = 0; k < sh->n; k++)
		if (st.st_dev == sh->s[k].st.st_dev &&
		    st.st_ino == sh->s[k].st.st_ino)
			return true;
	return false;
}

void cli_shards_close(struct cli_shards *sh)
{
	for (size_t k = 0; sh->s && k < sh->opened; k++)
		cli_src_close(&sh->s[k]);
	castfs_md_gguf_shards_free(sh->names, sh->n);
	free(sh->s);
	free(sh->r);
	free(sh->h);
	free(sh->index);
	memset(sh, 0, sizeof(*sh));
}
