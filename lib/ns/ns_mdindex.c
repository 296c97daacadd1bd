// SPDX-License-Identifier: MIT
/*
 * Model-directory views: whether each *.safetensors.index*.json has a
 * shape castfs rewrites, checked once per identity of the file (the cache
 * is ns_mdtext.c). A listing asks for every model directory it shows, so
 * that an index castfs would refuse at open (a shard named by a path,
 * "../x" or "/x") makes no DIR.<view>/ name instead of a name that then
 * fails.
 */
#include <errno.h>
#include <stdio.h>

#include "modeldir/modeldir.h"
#include "ns/ns_modeldir_internal.h"

/* What the cache keeps of a check. */
struct ixc_out {
	struct castfs_diag d;
	size_t longest; /* the longest shard name */
};

static int ixc_parse(const char *text, size_t len, void *out)
{
	struct ixc_out *o = out;

	return castfs_md_index_check(text, len, &o->longest, &o->d);
}

int ns_md_ixc_new(struct ns_mdtext **out)
{
	return ns_mdtext_new(sizeof(struct ixc_out), ixc_parse, out);
}

int ns_md_ixc_check(struct castfs_ns *ns, struct ns_mdtext *c, const char *path,
		    size_t *longest, char *why, size_t len)
{
	struct ixc_out o = { { { 0 } }, 0 };
	int rc = ns_mdtext_get(ns, c, path, &o);

	/* Over the cap of JSON values (castfs_md_parse()): refused as a bad
	 * shape is, so that no DIR.<view>/ is listed whose index then fails
	 * E2BIG. */
	if (rc == -E2BIG)
		rc = -EINVAL;
	if (rc && why && len)
		snprintf(why, len, "%s", o.d.msg);
	if (!rc && longest)
		*longest = o.longest;
	return rc;
}
