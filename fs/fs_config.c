// SPDX-License-Identifier: MIT
/*
 * The -o config / --config file: the one loader the daemon and the
 * sub-commands share.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"

/* A config file, whole; NULL with errno set on failure. */
static char *read_small_file(const char *path, size_t *len)
{
	struct stat st;
	char *buf = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC), saved;
	ssize_t got;

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0)
		goto out_close;
	if (!S_ISREG(st.st_mode) || st.st_size > (16 << 20)) {
		errno = EINVAL;
		goto out_close;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		goto out_close;
	got = read(fd, buf, (size_t)st.st_size);
	if (got != st.st_size) {
		free(buf);
		buf = NULL;
		errno = got < 0 ? errno : EIO;
		goto out_close;
	}
	buf[got] = '\0';
	*len = (size_t)got;
out_close:
	saved = errno;
	close(fd);
	errno = saved;
	return buf;
}

int castfs_fs_config_read(const char *path, char **text, size_t *len,
			  struct castfs_diag *d)
{
	*text = read_small_file(path, len);
	return *text ? 0 : castfs_diag_set(d, -errno, "%s", strerror(errno));
}

int castfs_fs_views_parse(struct castfs_views *vs, const char *json, size_t len,
			  struct castfs_diag *d)
{
	int rc = castfs_views_builtin(vs);

	return rc || !json ? rc : castfs_views_load(vs, json, len, d);
}

int castfs_fs_views_load(struct castfs_views *vs, const char *config,
			 struct castfs_diag *d)
{
	size_t len = 0;
	char *json = NULL;
	int rc = config ? castfs_fs_config_read(config, &json, &len, d) : 0;

	if (!rc)
		rc = castfs_fs_views_parse(vs, json, len, d);
	free(json);
	return rc;
}
