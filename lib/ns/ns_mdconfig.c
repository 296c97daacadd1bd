// SPDX-License-Identifier: MIT
/*
 * Model-directory views: the parsed config.json of each source directory,
 * read and parsed once per identity of the file (a 50 MB config.json was
 * read and parsed again by every listing of its parent and every stat of
 * a bitsandbytes shard). The cache itself is ns_mdtext.c.
 */
#include <errno.h>
#include <stdlib.h>

#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"

static int conf_parse(const char *text, size_t len, void *out)
{
	return castfs_md_config_read(text, len, out, NULL);
}

int ns_md_conf_new(struct ns_mdtext **out)
{
	return ns_mdtext_new(sizeof(struct castfs_md_config), conf_parse, out);
}

int ns_md_config_get(struct castfs_ns *ns, struct ns_mdtext *c, const char *dir,
		     struct castfs_md_config *out)
{
	char *path = ns_path_join(dir, "config.json", 11);
	struct castfs_md_config got;
	int rc = path ? ns_mdtext_get(ns, c, path, &got) : -ENOMEM;

	if (!rc)
		*out = got;
	free(path);
	return rc;
}

void ns_md_conf_forget(struct ns_mdtext *c, const char *dir)
{
	char *path = ns_path_join(dir, "config.json", 11);

	if (path)
		ns_mdtext_forget(c, path);
	free(path);
}
