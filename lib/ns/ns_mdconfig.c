// SPDX-License-Identifier: MIT
/*
 * The config.json of each source directory, read and parsed once per
 * identity of the file (ns_mdtext.c), for both of its readers: the
 * checkpoint cache (the quantization_config every shard's parse checks)
 * and the model-directory kinds (model type, diffusers, quantized). Before,
 * a 50 MB config.json was read again by every listing of its parent, every
 * stat of a bitsandbytes shard and every checkpoint parse in its folder.
 */
#include <errno.h>
#include <stdlib.h>

#include "modeldir/modeldir.h"
#include "ns/ns_ckpt_internal.h"

/* What one read of a config.json gives both readers. */
struct dir_config {
	int conf_err; /* castfs_md_config_read's return */
	struct castfs_md_config conf;
	struct castfs_md_quant quant; /* zeroed when it cannot be read */
};

static int config_parse(const char *text, size_t len, void *out)
{
	struct dir_config *c = out;
	int qrc = castfs_md_quant_read(text, len, &c->quant, NULL);

	if (qrc)
		c->quant = (struct castfs_md_quant){ 0 };
	c->conf_err = castfs_md_config_read(text, len, &c->conf, NULL);
	return qrc == -ENOMEM ? qrc : c->conf_err;
}

int ns_dir_config_init(struct castfs_ns *ns)
{
	return ns_mdtext_new(sizeof(struct dir_config), config_parse,
			     &ns->dir_config);
}

/* The kept parse of @dir's config.json; the stat, read or parse error. */
static int dir_config_get(struct castfs_ns *ns, const char *dir,
			  struct dir_config *out)
{
	char *path = ns_path_join(dir, "config.json", 11);
	int rc = path ? ns_mdtext_get(ns, ns->dir_config, path, out) : -ENOMEM;

	free(path);
	return rc;
}

int ns_dir_config(struct castfs_ns *ns, const char *dir,
		  struct castfs_md_config *out)
{
	struct dir_config c;
	int rc = dir_config_get(ns, dir, &c);

	if (!rc)
		*out = c.conf;
	return rc;
}

int ns_ckpt_dir_quant(struct castfs_ns *ns, const char *dir,
		      struct castfs_md_quant *q)
{
	struct dir_config c;
	int rc = dir_config_get(ns, dir, &c);

	/* A config.json that is not an object still has no quantization
	 * to dequantize: only a failure to look is an error. */
	*q = rc && rc != -EINVAL ? (struct castfs_md_quant){ 0 } : c.quant;
	/* Being written (ESTALE) is no "none": a shard parsed meanwhile as
	 * if its folder declared nothing would be cached so. */
	return ns_err_transient(rc) ? rc : 0;
}

void ns_dir_config_forget(struct castfs_ns *ns, const char *dir)
{
	char *path = ns_path_join(dir, "config.json", 11);

	if (path)
		ns_mdtext_forget(ns->dir_config, path);
	free(path);
}
