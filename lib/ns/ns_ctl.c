/* SPDX-License-Identifier: MIT */
/*
 * The control directory /.castfs: live stats (JSON, and Prometheus text in
 * metrics), the effective configuration, the rejected source files, the
 * derived files refused and the version. Content is generated at open.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ns/ns_kind_internal.h"

enum ctl_file {
	CTL_STATS,
	CTL_CONFIG,
	CTL_REJECTED,
	CTL_VERSION,
	CTL_METRICS,
	CTL_REFUSED,
	CTL_COUNT,
};

static const char *const ctl_names[CTL_COUNT] = {
	[CTL_STATS] = "stats", /* JSON */
	[CTL_CONFIG] = "config",
	[CTL_REJECTED] = "rejected",
	[CTL_VERSION] = "version",
	[CTL_METRICS] = "metrics", /* stats in the Prometheus text format */
	[CTL_REFUSED] = "refused",
};

static int ctl_dir_lookup(struct castfs_ns *ns, const struct ns_node *dir,
			  const char *name, struct ns_node *child)
{
	(void)ns;
	for (uint32_t i = 0; i < CTL_COUNT; i++) {
		if (strcmp(name, ctl_names[i]) != 0)
			continue;
		child->kind = NS_CTL_FILE;
		child->aux = i;
		child->st = dir->st;
		child->path = strdup("");
		return child->path ? 0 : -ENOMEM;
	}
	return -ENOENT;
}

static int ctl_dir_list(struct castfs_ns *ns, const struct ns_node *dir,
			struct ns_list *l)
{
	(void)ns;
	for (uint32_t i = 0; i < CTL_COUNT; i++) {
		/* The id a lookup gives: a restarted daemon finds the file
		 * of a kept id by its listing (ns_resolve). */
		struct ns_node n = { .kind = NS_CTL_FILE,
				     .aux = i,
				     .st = dir->st };
		int rc = ns_list_add(l, ctl_names[i], strlen(ctl_names[i]),
				     S_IFREG, ns_node_id(&n));

		if (rc)
			return rc;
	}
	return 0;
}

static int ctl_dir_getattr(struct castfs_ns *ns, const struct ns_node *n,
			   struct stat *st)
{
	(void)ns;
	ns_dir_stat(&n->st, n->id, st);
	return 0;
}

const struct ns_kind_ops ns_kind_ctl_dir = {
	.lookup = ctl_dir_lookup,
	.list = ctl_dir_list,
	.getattr = ctl_dir_getattr,
};

static int ctl_file_getattr(struct castfs_ns *ns, const struct ns_node *n,
			    struct stat *st)
{
	(void)ns;
	/* Size 0 like /proc: the content is made at open, read direct. */
	ns_view_stat(&n->st, 0, n->id, st);
	return 0;
}

/* Bounds of the walk that makes /.castfs/rejected complete. */
#define SCAN_MAX_DEPTH 64
#define SCAN_MAX_FILES 100000

static bool is_checkpoint_name(const char *name)
{
	static const char ext[] = ".safetensors";
	size_t len = strlen(name), el = sizeof(ext) - 1;

	return len > el && strcmp(name + len - el, ext) == 0;
}

static mode_t scan_type(DIR *dp, const struct dirent *de)
{
	struct stat st;

	if (de->d_type == DT_DIR)
		return S_IFDIR;
	if (de->d_type == DT_REG)
		return S_IFREG;
	if (de->d_type != DT_UNKNOWN ||
	    fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	return st.st_mode & S_IFMT;
}

/* Source directory @dir opened for a bounded walk, or NULL when the
 * walk stops here (too deep, budget spent, not openable). */
static DIR *scan_open(struct castfs_ns *ns, const char *dir, int depth,
		      const size_t *budget)
{
	DIR *dp;
	int fd;

	if (depth > SCAN_MAX_DEPTH || !*budget)
		return NULL;
	fd = ns_src_open(ns, dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return NULL;
	dp = fdopendir(fd);
	if (!dp)
		close(fd);
	return dp;
}

static void scan_dir(struct castfs_ns *ns, const char *dir, int depth,
		     size_t *budget);

static void scan_entry(struct castfs_ns *ns, const char *dir, DIR *dp,
		       const struct dirent *de, int depth, size_t *budget)
{
	mode_t type = scan_type(dp, de);
	struct ns_ckpt *ck;
	struct stat st;
	char *path;

	if (type == S_IFREG && !is_checkpoint_name(de->d_name) &&
	    !ns_packed_name(de->d_name))
		return;
	if (type != S_IFREG && type != S_IFDIR)
		return;
	/* A pack is loaded as the checkpoint it stands in for. */
	path = ns_path_join(dir, de->d_name,
			    strlen(de->d_name) - ns_packed_ext_len(de->d_name));
	if (!path)
		return;
	if (type == S_IFDIR) {
		scan_dir(ns, path, depth + 1, budget);
	} else {
		/* Rejected files are cached (and logged) as a side effect. */
		if (ns_ckpt_valid(ns, path, &st, &ck) == 0)
			ns_ckpt_put(ns, ck);
		(*budget)--;
	}
	free(path);
}

/*
 * Read the header of every *.safetensors file below @dir through the
 * checkpoint cache, so that the rejected ones are all known, not only
 * those a listing happened to show. Headers are read once per identity.
 */
static void scan_dir(struct castfs_ns *ns, const char *dir, int depth,
		     size_t *budget)
{
	struct dirent *de;
	DIR *dp = scan_open(ns, dir, depth, budget);

	if (!dp)
		return;
	while (*budget && (de = readdir(dp))) {
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			scan_entry(ns, dir, dp, de, depth, budget);
	}
	closedir(dp);
}

static char *ctl_rejected(struct castfs_ns *ns)
{
	size_t budget = SCAN_MAX_FILES;

	scan_dir(ns, "", 0, &budget);
	return ns_ckpt_rejected_json(ns);
}

static void refused_dir(struct castfs_ns *ns, const char *dir, int depth,
			size_t *budget, cJSON *arr);

/* Ask every directory extension why it shows none of its names for
 * source directory @dir, then walk its subdirectories. */
static void refused_entry(struct castfs_ns *ns, const char *dir, int depth,
			  size_t *budget, cJSON *arr)
{
	for (size_t i = 0; ns->dir_exts[i]; i++) {
		if (ns->dir_exts[i]->refusals &&
		    ns->dir_exts[i]->refusals(ns, dir, arr))
			return; /* out of memory: the list says what it has */
	}
	(*budget)--;
	refused_dir(ns, dir, depth + 1, budget, arr);
}

/* Every directory below @dir (bounded like the rejected scan). */
static void refused_dir(struct castfs_ns *ns, const char *dir, int depth,
			size_t *budget, cJSON *arr)
{
	struct dirent *de;
	DIR *dp = scan_open(ns, dir, depth, budget);

	if (!dp)
		return;
	while (*budget && (de = readdir(dp))) {
		char *path;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    scan_type(dp, de) != S_IFDIR)
			continue;
		path = ns_path_join(dir, de->d_name, strlen(de->d_name));
		if (path)
			refused_entry(ns, path, depth, budget, arr);
		free(path);
	}
	closedir(dp);
}

/* JSON array of what the directory extensions refuse, with reasons. */
static char *ctl_refused(struct castfs_ns *ns)
{
	size_t budget = SCAN_MAX_FILES;
	cJSON *arr = cJSON_CreateArray();
	char *out;

	if (!arr)
		return NULL;
	refused_dir(ns, "", 0, &budget, arr);
	ns_ckpt_view_refusals(ns, arr); /* on -ENOMEM: what it has */
	out = cJSON_Print(arr);
	cJSON_Delete(arr);
	return out;
}

/* What the caches and the node table hold now, for stats and metrics. */
static void ctl_mem(struct castfs_ns *ns)
{
	struct castfs_stats_mem m = { .cache_budget = ns->ck_budget };
	size_t entries, bytes, nodes, forgotten;

	ns_ckpt_usage(ns, &entries, &bytes);
	ns_node_count(ns, &nodes, &forgotten);
	m.cache_entries = entries;
	m.cache_bytes = bytes;
	m.nodes = nodes;
	m.nodes_forgotten = forgotten;
	castfs_stats_set_mem(ns->stats, &m);
}

static char *ctl_text(struct castfs_ns *ns, uint32_t which)
{
	if (ns->stats && (which == CTL_STATS || which == CTL_METRICS))
		ctl_mem(ns);
	switch ((enum ctl_file)which) {
	case CTL_STATS:
		return ns->stats ? castfs_stats_json(ns->stats, ns->views) :
				   strdup("{}");
	case CTL_CONFIG:
		return strdup(ns->config_json);
	case CTL_REJECTED:
		return ctl_rejected(ns);
	case CTL_VERSION:
		return strdup(PACKAGE_NAME " " PACKAGE_VERSION);
	case CTL_METRICS:
		if (!ns->stats)
			return strdup("");
		return castfs_stats_prometheus(ns->stats, ns->views);
	case CTL_REFUSED:
		return ctl_refused(ns);
	case CTL_COUNT:
		break;
	}
	return NULL;
}

static int ctl_file_open(struct castfs_ns *ns, const struct ns_node *n,
			 struct castfs_file **out)
{
	char *text = ctl_text(ns, n->aux), *buf;
	size_t len;
	int rc;

	if (!text)
		return -ENOMEM;
	len = strlen(text);
	buf = malloc(len + 1);
	if (!buf) {
		free(text);
		return -ENOMEM;
	}
	/* One trailing newline, so that `cat` leaves the prompt alone. */
	memcpy(buf, text, len);
	if (!len || buf[len - 1] != '\n')
		buf[len++] = '\n';
	free(text);
	rc = ns_file_new_mem(ns, buf, len, out);
	free(buf);
	return rc;
}

const struct ns_kind_ops ns_kind_ctl_file = {
	.getattr = ctl_file_getattr,
	.open = ctl_file_open,
};
