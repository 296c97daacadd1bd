/* SPDX-License-Identifier: MIT */
/*
 * castfs info / convert of one file of a model directory: the FP8 block
 * size the directory's config.json declares, as the daemon reads it.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "modeldir/modeldir.h"
#include "view/qsrc.h"

/* The largest config.json read (a model's is a few kB). */
#define CLI_CONFIG_MAX (1u << 20)

/* The text of config.json next to @path, or NULL; *@len its length. */
static char *sibling_config(const char *path, size_t *len)
{
	const char *slash = strrchr(path, '/');
	size_t dir = slash ? (size_t)(slash - path + 1) : 0, n = 0;
	char *p = malloc(dir + sizeof("config.json"));
	char *text = p ? malloc(CLI_CONFIG_MAX) : NULL;
	int fd = -1;
	ssize_t r = 1;

	if (text) {
		memcpy(p, path, dir);
		memcpy(p + dir, "config.json", sizeof("config.json"));
		fd = open(p, O_RDONLY | O_CLOEXEC);
	}
	while (fd >= 0 && n < CLI_CONFIG_MAX && r > 0) {
		r = read(fd, text + n, CLI_CONFIG_MAX - n);
		n += r > 0 ? (size_t)r : 0;
	}
	if (fd >= 0)
		close(fd);
	free(p);
	if (fd < 0 || r < 0 || n == CLI_CONFIG_MAX) {
		free(text);
		return NULL;
	}
	*len = n;
	return text;
}

const struct castfs_qsrc_opts *cli_qsrc_opts(const char *path,
					     struct castfs_qsrc_opts *o)
{
	struct castfs_md_quant q;
	size_t len = 0;
	char *text = sibling_config(path, &len);

	*o = (struct castfs_qsrc_opts){ 0 };
	if (text && castfs_md_quant_read(text, len, &q, NULL) == 0 &&
	    q.fp8_block) {
		o->brows = q.block_rows;
		o->bcols = q.block_cols;
	}
	free(text);
	return o;
}
