/* SPDX-License-Identifier: MIT */
/* Placeholder until tensor trees land: no X.safetensors.tensors/. */
#include <errno.h>

#include "ns_internal.h"

int ns_tensors_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		      const char *name, struct ns_node *child)
{
	(void)ns, (void)dir, (void)name, (void)child;
	return -ENOENT;
}

int ns_tensors_list(struct castfs_ns *ns, const struct ns_node *dir,
		    const char *name, struct ns_list *l)
{
	(void)ns, (void)dir, (void)name, (void)l;
	return 0;
}

const struct ns_kind_ops ns_tdir_ops, ns_tfile_ops;
