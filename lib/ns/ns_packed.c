/* SPDX-License-Identifier: MIT */
/*
 * Packed sources: X.safetensors.zst (the seekable zstd format, lib/source/)
 * is shown as X.safetensors, its original bytes, and gets every view and
 * tensor tree through the checkpoint cache, which reads it through the
 * seek table. Node paths keep the shown name "dir/X.safetensors"; the
 * checkpoint's path is the file on disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_internal.h"
#include "plan/plan_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)
/* Standard packs first: they win when both exist. */
static const char *const pack_exts[] = { ".zst", ".zstg" };

static bool ends_with(const char *s, size_t len, const char *suf)
{
	size_t n = strlen(suf);

	return len > n && memcmp(s + len - n, suf, n) == 0;
}

size_t ns_packed_ext_len(const char *name)
{
	size_t len = strlen(name);

	for (size_t i = 0; i < 2; i++) {
		size_t n = strlen(pack_exts[i]);

		if (ends_with(name, len, pack_exts[i]) &&
		    ends_with(name, len - n, st_ext))
			return n;
	}
	return 0;
}

bool ns_packed_name(const char *name)
{
	return ns_packed_ext_len(name) != 0;
}

int ns_packed_find(struct castfs_ns *ns, const char *path, char **packed,
		   struct stat *st)
{
	size_t len = strlen(path);
	int rc = -ENOENT;

	if (!ends_with(path, len, st_ext))
		return -ENOENT;
	for (size_t i = 0; rc == -ENOENT && i < 2; i++) {
		char *p = malloc(len + strlen(pack_exts[i]) + 1);

		if (!p)
			return -ENOMEM;
		memcpy(p, path, len);
		strcpy(p + len, pack_exts[i]);
		rc = ns_src_stat_in(ns, p, st);
		if (rc)
			free(p);
		else
			*packed = p;
	}
	return rc;
}

const char *ns_packed_shown(int dfd, const char *name, char *buf, size_t len)
{
	size_t n = strlen(name) - ns_packed_ext_len(name);
	struct stat st;

	if (!ns_packed_name(name) || n >= len)
		return name;
	memcpy(buf, name, n);
	buf[n] = '\0';
	/* A plain X.safetensors wins over its pack. */
	if (fstatat(dfd, buf, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return name;
	return buf;
}

int ns_packed_stat(struct castfs_ns *ns, const char *path, struct stat *st)
{
	struct ns_ckpt *ck;
	int rc = ns_ckpt_valid(ns, path, st, &ck);

	if (rc)
		return rc;
	rc = ck->zix ? 0 : -ENOENT;
	ns_ckpt_put(ns, ck);
	return rc;
}

int ns_packed_header(struct castfs_ns *ns, struct ns_ckpt *ck, int fd,
		     uint64_t raw_size, struct castfs_diag *d)
{
	struct castfs_fd_reader fr;
	struct castfs_zst_reader zr;
	int rc;

	castfs_fd_reader_init(&fr, fd);
	rc = castfs_zst_index_read(&fr.r, raw_size, ns->zcache, &ck->zix, d);
	if (rc)
		return rc;
	/* zstd -d restores a .zst, never a grouped pack: names must say. */
	if (castfs_zst_index_grouped(ck->zix) !=
	    (ns_packed_ext_len(ck->path) == 5))
		return castfs_diag_set(d, -EINVAL,
				       "a grouped pack must be named "
				       "*.safetensors.zstg, a standard one "
				       "*.safetensors.zst");
	castfs_zst_reader_init(&zr, ck->zix, &fr.r);
	rc = castfs_header_read(&zr.r, castfs_zst_index_size(ck->zix), &ck->h,
				d);
	if (rc == -EIO)
		castfs_diag_set(d, rc,
				"a frame holding the header fails to decode "
				"or to match its size or checksum");
	return rc;
}

/* The packed checkpoint behind @n, still the identity @n was made from. */
static int packed_ck(struct castfs_ns *ns, const struct ns_node *n,
		     struct ns_ckpt **ck)
{
	struct stat st;
	int rc = ns_ckpt_valid(ns, n->path, &st, ck);

	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	if (!ns_same_file(&st, &n->st) || !(*ck)->zix) {
		ns_ckpt_put(ns, *ck);
		return -ESTALE;
	}
	return 0;
}

int ns_packed_lookup(struct castfs_ns *ns, const struct ns_node *dir,
		     const char *name, struct ns_node *child)
{
	size_t len = strlen(name);
	struct ns_ckpt *ck;
	char *path;
	int rc;

	/* "X.safetensors": only when X.safetensors.zst is a usable pack. */
	if (!ends_with(name, len, st_ext))
		return -ENOENT;
	path = ns_path_join(dir->path, name, len);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_valid(ns, path, &child->st, &ck);
	if (!rc && !ck->zix)
		rc = -ENOENT; /* a plain file appeared meanwhile */
	if (!rc)
		ns_ckpt_put(ns, ck);
	if (rc) {
		free(path);
		return rc;
	}
	child->kind = NS_PACKED;
	child->path = path;
	return 0;
}

int ns_packed_show(struct castfs_ns *ns, const struct ns_node *dir,
		   struct ns_list *l, size_t i)
{
	struct castfs_dirent *e = &l->dir->ents[i];
	size_t shown = strlen(e->name) - ns_packed_ext_len(e->name);
	struct ns_node node = { .kind = NS_PACKED };
	struct ns_ckpt *ck;
	char *path;
	int rc;

	if ((e->type != S_IFREG && e->type != S_IFLNK) ||
	    !ns_packed_name(e->name) || ns_list_has(l, e->name, shown))
		return 0; /* a plain X.safetensors wins over its pack */
	path = ns_path_join(dir->path, e->name, shown);
	if (!path)
		return -ENOMEM;
	rc = ns_ckpt_valid(ns, path, &node.st, &ck);
	free(path);
	if (rc)
		return rc == -ENOMEM ? rc : 0; /* rejected: shown as itself */
	if (ck->zix) {
		e = &l->dir->ents[i];
		e->name[shown] = '\0';
		e->type = S_IFREG;
		e->ino = ns_node_id(&node);
	}
	ns_ckpt_put(ns, ck);
	return 0;
}

static int packed_getattr(struct castfs_ns *ns, const struct ns_node *n,
			  struct stat *st)
{
	struct ns_ckpt *ck;
	int rc = packed_ck(ns, n, &ck);

	if (rc)
		return rc;
	ns_view_stat(&n->st, castfs_zst_index_size(ck->zix), n->id, st);
	ns_ckpt_put(ns, ck);
	return 0;
}

/* The original bytes: one COPY extent read through the seek table. */
static int packed_open(struct castfs_ns *ns, const struct ns_node *n,
		       struct castfs_file **out)
{
	struct castfs_producer p = { .op = CASTFS_OP_COPY };
	struct castfs_plan *plan;
	struct castfs_pb *pb;
	struct ns_ckpt *ck;
	int rc = packed_ck(ns, n, &ck);

	if (rc)
		return rc;
	rc = castfs_pb_new(&pb);
	if (!rc) {
		rc = castfs_pb_append(pb, &p, castfs_zst_index_size(ck->zix));
		if (rc)
			castfs_pb_free(pb);
	}
	if (!rc)
		rc = castfs_pb_finish_raw(pb, &plan);
	if (!rc)
		rc = ns_file_new_plan(ns, n->path, &n->st, ck, plan, plan,
				      CASTFS_STATS_PASSTHROUGH, out);
	ns_ckpt_put(ns, ck);
	return rc;
}

const struct ns_kind_ops ns_packed_ops = {
	.getattr = packed_getattr,
	.open = packed_open,
};
