/* SPDX-License-Identifier: MIT */
/* Placeholder until model-directory views land: no DIR.<view>/. */
#include <errno.h>

#include "ns_internal.h"

int ns_modeldir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		       const char *name, struct ns_node *child)
{
	(void)ns, (void)dir, (void)name, (void)child;
	return -ENOENT;
}

int ns_modeldir_list(struct castfs_ns *ns, const struct ns_node *dir,
		     const char *name, mode_t type, struct ns_list *l)
{
	(void)ns, (void)dir, (void)name, (void)type, (void)l;
	return 0;
}

int ns_modeldir_init(struct castfs_ns *ns)
{
	(void)ns;
	return 0;
}

void ns_modeldir_fini(struct castfs_ns *ns)
{
	(void)ns;
}

void ns_modeldir_invalidate(struct castfs_ns *ns, const char *rel,
			    void (*cb)(void *ctx, uint64_t parent,
				       const char *name),
			    void *ctx)
{
	(void)ns, (void)rel, (void)cb, (void)ctx;
}

const struct ns_kind_ops ns_mdir_ops, ns_mfile_ops;
