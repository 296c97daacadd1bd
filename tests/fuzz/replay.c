/* SPDX-License-Identifier: MIT */
/*
 * The replay driver: without libFuzzer, a fuzz target links this main and
 * runs LLVMFuzzerTestOneInput over every file of its corpus (seeds and
 * crash repros), as zstd's regression_driver and libpsl do. Arguments are
 * files or directories; with none it replays $top_srcdir/tests/fuzz/
 * FUZZ_NAME.in, which is how `make check` runs it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;

	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -EIO;
	}
	/* An exact-size allocation, so that ASan sees reads past the end. */
	buf = malloc(n ? (size_t)n : 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		fclose(f);
		return -EIO;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replay every regular file of @dir in name order; count into *@count. */
static int replay_dir(const char *dir, unsigned *count)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, NULL), rc = 0;

	if (n < 0)
		return -errno;
	qsort(ents, (size_t)n, sizeof(*ents), name_cmp);
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
		if (!rc && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			rc = replay_file(path);
			if (rc)
				fprintf(stderr, "%s: %s\n", path,
					strerror(-rc));
			(*count)++;
		}
		free(ents[i]);
	}
	free(ents);
	return rc;
}

static int replay_path(const char *path, unsigned *count)
{
	struct stat st;

	if (stat(path, &st) < 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -errno;
	}
	if (S_ISDIR(st.st_mode))
		return replay_dir(path, count);
	(*count)++;
	return replay_file(path);
}

int main(int argc, char **argv)
{
	char def[4096];
	const char *top = getenv("top_srcdir");
	unsigned count = 0;
	int rc = 0;

	if (argc < 2) {
		snprintf(def, sizeof(def), "%s/tests/fuzz/%s.in",
			 top ? top : ".", FUZZ_NAME);
		rc = replay_path(def, &count);
	}
	for (int i = 1; !rc && i < argc; i++)
		rc = replay_path(argv[i], &count);
	if (!rc && count == 0) {
		fprintf(stderr, "%s: empty corpus\n", FUZZ_NAME);
		return 1;
	}
	printf("%s: %u inputs replayed%s\n", FUZZ_NAME, count,
	       rc ? " (error)" : "");
	return rc ? 1 : 0;
}
