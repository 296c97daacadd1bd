/* SPDX-License-Identifier: MIT */
/*
 * The control directory /.castfs: live stats (JSON, and Prometheus text in
 * metrics), the effective configuration, the rejected source files, the
 * derived files refused and the version. Content is generated at open;
 * the walks of the source tree are kept until it changes (ns_ctlshare.c).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/escape.h"
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

/* A bounded walk of the source tree, and what it read. */
struct scan {
	struct castfs_ns *ns;
	size_t budget; /* files (or directories) it may still visit */
	struct ns_ctlstamp *stamp;
	cJSON *arr; /* the refusals found, for refused_dir() */
};

/* Source directory @dir opened for a bounded walk, or NULL when the
 * walk stops here (too deep, budget spent, not openable). */
static DIR *scan_open(struct scan *w, const char *dir, int depth)
{
	struct stat st;
	DIR *dp;
	int fd;

	if (depth > SCAN_MAX_DEPTH || !w->budget)
		return NULL;
	fd = ns_src_open(w->ns, dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return NULL;
	/* Before reading it: a name added after shows as a newer mtime. */
	if (fstat(fd, &st) == 0)
		ns_ctlstamp_dir(w->stamp, dir, &st);
	else
		w->stamp->broken = true;
	dp = fdopendir(fd);
	if (!dp)
		close(fd);
	return dp;
}

static void scan_dir(struct scan *w, const char *dir, int depth);

static void scan_entry(struct scan *w, const char *dir, DIR *dp,
		       const struct dirent *de, int depth)
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
		scan_dir(w, path, depth + 1);
	} else {
		/* Rejected files are cached (and logged) as a side effect. */
		if (ns_ckpt_valid(w->ns, path, &st, &ck) == 0)
			ns_ckpt_put(w->ns, ck);
		w->budget--;
	}
	free(path);
}

/*
 * Read the header of every *.safetensors file below @dir through the
 * checkpoint cache, so that the rejected ones are all known, not only
 * those a listing happened to show. Headers are read once per identity.
 */
static void scan_dir(struct scan *w, const char *dir, int depth)
{
	struct dirent *de;
	DIR *dp = scan_open(w, dir, depth);

	if (!dp)
		return;
	while (w->budget && (de = readdir(dp))) {
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			scan_entry(w, dir, dp, de, depth);
	}
	closedir(dp);
}

static char *ctl_rejected(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	struct scan w = { .ns = ns, .budget = SCAN_MAX_FILES, .stamp = s };

	castfs_stats_count(ns->stats, CASTFS_SCTR_CTL_WALKS, 1);
	scan_dir(&w, "", 0);
	ns_ctlstamp_cache(ns, s);
	return ns_ckpt_rejected_json(ns);
}

/* ---- /.castfs/refused ---- */

int ns_refusal_add(cJSON *arr, const char *path, const char *vname,
		   const char *reason)
{
	cJSON *last = cJSON_GetArrayItem(arr, cJSON_GetArraySize(arr) - 1);
	const cJSON *lp = cJSON_GetObjectItemCaseSensitive(last, "path");
	const cJSON *lr = cJSON_GetObjectItemCaseSensitive(last, "reason");
	char *p = castfs_escape(path, strlen(path));
	char *why = castfs_escape_text(reason, strlen(reason));
	cJSON *o = NULL, *views = NULL;
	int rc = -ENOMEM;

	if (!p || !why)
		goto out;
	if (cJSON_IsString(lp) && !strcmp(lp->valuestring, p) &&
	    cJSON_IsString(lr) && !strcmp(lr->valuestring, why)) {
		views = cJSON_GetObjectItemCaseSensitive(last, "views");
	} else if ((o = cJSON_CreateObject()) &&
		   cJSON_AddStringToObject(o, "path", p) &&
		   (views = cJSON_AddArrayToObject(o, "views")) &&
		   cJSON_AddStringToObject(o, "reason", why)) {
		cJSON_AddItemToArray(arr, o);
		o = NULL;
	} else {
		views = NULL;
	}
	if (views && cJSON_AddItemToArray(views, cJSON_CreateString(vname)))
		rc = 0;
out:
	cJSON_Delete(o);
	free(p);
	free(why);
	return rc;
}

int ns_list_too_long(struct ns_list *l, const char *dir, const char *src,
		     const char *vname, const char *name, size_t len,
		     const char *reason)
{
	char *path, *shown, why[1280];
	int rc;

	if (!l->too_long)
		return 0; /* a listing: the name cannot exist, nothing to say */
	path = ns_path_join(dir, src, strlen(src));
	shown = castfs_escape(name, len);
	rc = path && shown ? 0 : -ENOMEM;
	if (!rc && !reason) {
		/* The name escaped as a path is, so that its bytes come back
		 * by the documented rule (at most 4 bytes a byte). */
		snprintf(why, sizeof(why),
			 "name too long: %s would be %zu bytes, past "
			 "NAME_MAX %d",
			 shown, len, NAME_MAX);
		reason = why;
	}
	if (!rc)
		rc = ns_refusal_add(l->too_long, path, vname, reason);
	free(shown);
	free(path);
	return rc;
}

int ns_list_derived(struct ns_list *l, const char *dir, const char *src,
		    const char *vname, const char *name, size_t len,
		    mode_t type, uint64_t id)
{
	if (len > NAME_MAX)
		return ns_list_too_long(l, dir, src, vname, name, len, NULL);
	if (ns_list_has(l, name, len))
		return 0;
	return ns_list_add(l, name, len, type, id);
}

static void refused_dir(struct scan *w, const char *dir, int depth);

/* Ask every directory extension why it shows none of its names for
 * source directory @dir, then walk its subdirectories. */
static void refused_entry(struct scan *w, const char *dir, int depth)
{
	struct castfs_ns *ns = w->ns;

	for (size_t i = 0; ns->dir_exts[i]; i++) {
		if (ns->dir_exts[i]->refusals &&
		    ns->dir_exts[i]->refusals(ns, dir, w->arr))
			return; /* out of memory: the list says what it has */
	}
	w->budget--;
	refused_dir(w, dir, depth + 1);
}

/*
 * The longest entry name of a directory below which none of its derived
 * names can pass NAME_MAX: the longest suffix a name gains is "." and a
 * view's name (".safetensors" stays; a tree's ".tensors" is shorter).
 * Only directories with a longer name are listed again to find them.
 */
#define NAME_SAFE_MAX (NAME_MAX - 1 - (CASTFS_VIEW_NAME_MAX - 1))

/* Every directory below @dir (bounded like the rejected scan), and the
 * names @dir leaves out for NAME_MAX. */
static void refused_dir(struct scan *w, const char *dir, int depth)
{
	size_t longest = 0;
	struct dirent *de;
	DIR *dp = scan_open(w, dir, depth);

	if (!dp)
		return;
	while (w->budget && (de = readdir(dp))) {
		size_t len = strlen(de->d_name);
		char *path;

		if (len > longest)
			longest = len;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    scan_type(dp, de) != S_IFDIR)
			continue;
		path = ns_path_join(dir, de->d_name, len);
		if (path)
			refused_entry(w, path, depth);
		free(path);
	}
	closedir(dp);
	if (longest > NAME_SAFE_MAX)
		(void)ns_tree_too_long(w->ns, dir, w->arr); /* what it has */
}

/* JSON array of what the directory extensions refuse, with reasons. */
static char *ctl_refused(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	struct scan w = { .ns = ns, .budget = SCAN_MAX_FILES, .stamp = s };
	char *out;

	w.arr = cJSON_CreateArray();
	if (!w.arr)
		return NULL;
	castfs_stats_count(ns->stats, CASTFS_SCTR_CTL_WALKS, 1);
	refused_dir(&w, "", 0);
	ns_ctlstamp_cache(ns, s);
	ns_ckpt_view_refusals(ns, w.arr); /* on -ENOMEM: what it has */
	out = cJSON_Print(w.arr);
	cJSON_Delete(w.arr);
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

static char *ctl_stats(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	(void)s;
	if (!ns->stats)
		return strdup("{}");
	ctl_mem(ns);
	return castfs_stats_json(ns->stats, ns->views);
}

static char *ctl_metrics(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	(void)s;
	if (!ns->stats)
		return strdup("");
	ctl_mem(ns);
	return castfs_stats_prometheus(ns->stats, ns->views);
}

static char *ctl_config(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	(void)s;
	return strdup(ns->config_json);
}

static char *ctl_version(struct castfs_ns *ns, struct ns_ctlstamp *s)
{
	(void)ns;
	(void)s;
	return strdup(PACKAGE_NAME " " PACKAGE_VERSION);
}

/*
 * How each file is made, and the slot it is kept in: the two that walk the
 * source tree are kept until it changes; the counters are live and the
 * others a few bytes, made per open.
 */
static const struct {
	ns_ctl_make_fn make;
	int slot;
} ctl_how[CTL_COUNT] = {
	[CTL_STATS] = { ctl_stats, -1 },
	[CTL_CONFIG] = { ctl_config, -1 },
	[CTL_REJECTED] = { ctl_rejected, 0 },
	[CTL_VERSION] = { ctl_version, -1 },
	[CTL_METRICS] = { ctl_metrics, -1 },
	[CTL_REFUSED] = { ctl_refused, 1 },
};

static int ctl_file_getattr(struct castfs_ns *ns, const struct ns_node *n,
			    struct stat *st)
{
	(void)ns;
	/* Size 0 like /proc: the content is made at open, read direct. */
	ns_view_stat(&n->st, 0, n->id, st);
	/* Those that walk the source tree name files anywhere in it and
	 * quote their headers, whatever the reader may search: the daemon's
	 * own user, who could read them all, alone reads them (a bug hunt:
	 * under allow_other, anyone read the names and header bytes of files
	 * in other users' 0700 directories). */
	if (n->aux < CTL_COUNT && ctl_how[n->aux].slot >= 0) {
		st->st_mode = S_IFREG | 0400;
		st->st_uid = geteuid();
		st->st_gid = getegid();
	}
	return 0;
}

static int ctl_file_open(struct castfs_ns *ns, const struct ns_node *n,
			 struct castfs_file **out)
{
	if (n->aux >= CTL_COUNT)
		return -ENOENT;
	return ns_ctlshare_open(ns, ctl_how[n->aux].slot, ctl_how[n->aux].make,
				out);
}

const struct ns_kind_ops ns_kind_ctl_file = {
	.getattr = ctl_file_getattr,
	.open = ctl_file_open,
};
