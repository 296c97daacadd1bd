// SPDX-License-Identifier: MIT
/*
 * Which pack stands in for a checkpoint: X.safetensors.zst (or .zstg, the
 * grouped variant) is shown as X.safetensors when no plain file of that
 * name is beside it. Names and stats only; reading a pack is the
 * checkpoint cache's (ns_ckpt.c) and source/'s.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "ns/ns_src_internal.h"

static const char st_ext[] = ".safetensors";
#define ST_EXT_LEN (sizeof(st_ext) - 1)
/* Standard packs first: they win when both exist. */
static const char *const pack_exts[NS_PACK_EXTS] = { ".zst", ".zstg" };

static bool ends_with(const char *s, size_t len, const char *suf)
{
	size_t n = strlen(suf);

	return len > n && memcmp(s + len - n, suf, n) == 0;
}

size_t ns_packed_ext_len(const char *name)
{
	size_t len = strlen(name);

	for (size_t i = 0; i < NS_PACK_EXTS; i++) {
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

int ns_packed_path(const char *path, size_t i, char **out)
{
	size_t len = strlen(path);
	char *p;

	if (i >= NS_PACK_EXTS || !ends_with(path, len, st_ext))
		return -ENOENT;
	p = malloc(len + strlen(pack_exts[i]) + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p, path, len);
	strcpy(p + len, pack_exts[i]);
	*out = p;
	return 0;
}

int ns_packed_find(struct castfs_ns *ns, const char *path, char **packed,
		   struct stat *st)
{
	int rc = -ENOENT;

	for (size_t i = 0; rc == -ENOENT && i < NS_PACK_EXTS; i++) {
		char *p;

		rc = ns_packed_path(path, i, &p);
		if (rc)
			return rc;
		rc = ns_src_stat_in(ns, p, st);
		/* A pack's name is 4 or 5 bytes longer: past NAME_MAX (or
		 * PATH_MAX) there is none. Said so, the lookup of a listed
		 * view "X.fp8.safetensors" of 252 bytes or more, which asks
		 * for a pack of that name first, failed (a bug hunt). */
		if (rc == -ENAMETOOLONG)
			rc = -ENOENT;
		if (rc)
			free(p);
		else
			*packed = p;
	}
	return rc;
}

const char *ns_packed_shown(int dfd, const char *name, char *buf, size_t len)
{
	return ns_packed_stands_in(dfd, name, buf, len) ? buf : name;
}

bool ns_packed_stands_in(int dfd, const char *name, char *buf, size_t len)
{
	size_t n = strlen(name) - ns_packed_ext_len(name);
	struct stat st;

	if (!ns_packed_name(name) || n + sizeof(".zst") > len)
		return false;
	memcpy(buf, name, n);
	strcpy(buf + n, pack_exts[0]);
	/* A standard pack beside a grouped one is the one looked up. */
	if (ns_packed_ext_len(name) != strlen(pack_exts[0]) &&
	    fstatat(dfd, buf, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return false;
	buf[n] = '\0';
	return fstatat(dfd, buf, &st, AT_SYMLINK_NOFOLLOW) != 0;
}
