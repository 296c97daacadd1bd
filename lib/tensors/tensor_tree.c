/* SPDX-License-Identifier: MIT */
/*
 * Tensor names as paths (docs/TENSOR_TREE.md) and the sorted index of a
 * header's tensors that the tensor-tree directories are served from.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensors/tensor_tree.h"

/* "%+" ends a component whose part goes on in the next component. */
#define CONT_MARK "%+"
#define CONT_LEN 2u

static bool needs_escape(unsigned char c)
{
	/* '/' and NUL cannot be in a component, '%' is the escape itself,
	 * and control bytes would garble ls and terminals. */
	return c == '/' || c == '%' || c < 0x20 || c == 0x7f;
}

/* Escape one dot-free part of a name into @o; its length. */
static size_t enc_part(const unsigned char *p, size_t n, char *o)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t k = 0;

	if (n == 0) {
		o[0] = '%'; /* an empty part: "a..b", a leading dot */
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		if (needs_escape(p[i])) {
			o[k++] = '%';
			o[k++] = hex[p[i] >> 4];
			o[k++] = hex[p[i] & 15];
		} else {
			o[k++] = (char)p[i];
		}
	}
	return k;
}

/* May a long part be cut before byte @q of its encoding @s? */
static bool cut_ok(const char *s, size_t q, bool utf8)
{
	unsigned char c = (unsigned char)s[q];

	if (s[q - 1] == '%' || (q >= 2 && s[q - 2] == '%'))
		return false; /* inside a %XX escape */
	return !utf8 || c < 0x80 || c >= 0xc0;
}

/* Copy encoded part @s (@n bytes) to @o, cut into components. */
static size_t put_chunked(const char *s, size_t n, char *o)
{
	const size_t max = CASTFS_TPATH_COMPONENT_MAX;
	size_t k = 0;

	while (n > max) {
		size_t q = max - CONT_LEN;

		/* Not inside an escape, and not inside a UTF-8 character
		 * unless the name is not UTF-8 at all. */
		while (!cut_ok(s, q, q > max - CONT_LEN - 8))
			q--;
		memcpy(o + k, s, q);
		k += q;
		memcpy(o + k, CONT_MARK "/", CONT_LEN + 1);
		k += CONT_LEN + 1;
		s += q;
		n -= q;
	}
	memcpy(o + k, s, n);
	return k + n;
}

int castfs_tpath_encode(const char *name, size_t len, char **out,
			size_t *out_len)
{
	const unsigned char *p = (const unsigned char *)name;
	char *path, *tmp;
	size_t k = 0, start = 0;

	/* Escapes triple a byte; markers add < 2%; dots add at most 2. */
	if (len > (SIZE_MAX - 16) / 4)
		return -ENOMEM;
	path = malloc(4 * len + 16);
	tmp = malloc(3 * len + 1);
	if (!path || !tmp) {
		free(path);
		free(tmp);
		return -ENOMEM;
	}
	for (size_t i = 0; i <= len; i++) {
		if (i < len && p[i] != '.')
			continue;
		k += put_chunked(tmp, enc_part(p + start, i - start, tmp),
				 path + k);
		if (i < len)
			path[k++] = '/';
		start = i + 1;
	}
	free(tmp);
	path[k] = '\0';
	*out = path;
	*out_len = k;
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Unescape component body @s (@n bytes) onto @o; bytes written or -1. */
static ssize_t dec_body(const char *s, size_t n, char *o)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		int hi, lo;

		if (s[i] == '.')
			return -1;
		if (s[i] != '%') {
			o[k++] = s[i];
			continue;
		}
		if (i + 2 >= n || (hi = hexval(s[i + 1])) < 0 ||
		    (lo = hexval(s[i + 2])) < 0)
			return -1;
		o[k++] = (char)(hi << 4 | lo);
		i += 2;
	}
	return (ssize_t)k;
}

/* Lenient decoding; castfs_tpath_decode() checks that it round-trips. */
static int decode_loose(const char *path, size_t len, char *name,
			size_t *name_len)
{
	size_t k = 0, i = 0;
	bool cont = false;

	while (i < len) {
		const char *c = path + i, *slash = memchr(c, '/', len - i);
		size_t cl = slash ? (size_t)(slash - c) : len - i;
		bool more = cl >= CONT_LEN &&
			    !memcmp(c + cl - CONT_LEN, CONT_MARK, CONT_LEN);
		ssize_t got;

		if (more)
			cl -= CONT_LEN;
		if (cl == 1 && c[0] == '%' && !cont && !more) {
			got = 0; /* an empty part */
		} else {
			got = cl ? dec_body(c, cl, name + k) : -1;
			if (got < 0)
				return -EINVAL;
		}
		k += (size_t)got;
		i += cl + (more ? CONT_LEN : 0) + (slash ? 1 : 0);
		if (!more && slash)
			name[k++] = '.';
		if (slash && i == len)
			return -EINVAL; /* a trailing '/' */
		cont = more;
	}
	if (cont || len == 0)
		return -EINVAL;
	*name_len = k;
	return 0;
}

int castfs_tpath_decode(const char *path, size_t len, char **out,
			size_t *out_len)
{
	char *name = malloc(len + 1), *again;
	size_t n, again_len;
	int rc;

	if (!name)
		return -ENOMEM;
	rc = decode_loose(path, len, name, &n);
	if (!rc)
		rc = castfs_tpath_encode(name, n, &again, &again_len);
	if (rc) {
		free(name);
		return rc;
	}
	/* Only the one spelling castfs makes names a tensor. */
	if (again_len != len || memcmp(again, path, len) != 0)
		rc = -EINVAL;
	free(again);
	if (rc) {
		free(name);
		return rc;
	}
	name[n] = '\0';
	*out = name;
	*out_len = n;
	return 0;
}

/* ---- the index ---- */

/* Compare @s (@sl bytes) with @k (@kl bytes) followed by '/' if @slash. */
static int key_cmp(const char *s, size_t sl, const char *k, size_t kl,
		   bool slash)
{
	size_t m = sl < kl ? sl : kl;
	int c = memcmp(s, k, m);

	if (c || !slash)
		return c ? c : (sl > kl) - (sl < kl);
	if (sl <= kl)
		return -1; /* s is a prefix of k + "/" */
	return (unsigned char)s[kl] - (unsigned char)'/';
}

/* The first entry not below the key. */
static size_t lower_bound(const struct castfs_ttree *tt, const char *k,
			  size_t kl, bool slash)
{
	size_t lo = 0, hi = tt->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (key_cmp(tt->e[mid].path, tt->e[mid].path_len, k, kl,
			    slash) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int entry_cmp(const void *a, const void *b)
{
	const struct castfs_ttree_entry *x = a, *y = b;

	return key_cmp(x->path, x->path_len, y->path, y->path_len, false);
}

void castfs_ttree_free(struct castfs_ttree *tt)
{
	if (!tt)
		return;
	for (size_t i = 0; i < tt->n; i++)
		free((char *)(uintptr_t)tt->e[i].path);
	free(tt->e);
	free(tt);
}

int castfs_ttree_build(const struct castfs_header *h, struct castfs_ttree **out)
{
	struct castfs_ttree *tt = calloc(1, sizeof(*tt));
	int rc = 0;

	if (!tt)
		return -ENOMEM;
	tt->e = calloc(h->ntensors ? h->ntensors : 1, sizeof(*tt->e));
	if (!tt->e) {
		free(tt);
		return -ENOMEM;
	}
	for (; tt->n < h->ntensors; tt->n++) {
		const struct castfs_tensor *t = &h->tensors[tt->n];
		struct castfs_ttree_entry *e = &tt->e[tt->n];
		char *p;

		rc = castfs_tpath_encode(t->name, t->name_len, &p,
					 &e->path_len);
		if (rc)
			break;
		e->path = p;
		e->t = t;
	}
	if (rc) {
		castfs_ttree_free(tt);
		return rc;
	}
	/* Names are unique and encoding is one-to-one: no equal paths. */
	qsort(tt->e, tt->n, sizeof(*tt->e), entry_cmp);
	*out = tt;
	return 0;
}

const struct castfs_ttree_entry *
castfs_ttree_find(const struct castfs_ttree *tt, const char *path, size_t len)
{
	size_t i = lower_bound(tt, path, len, false);

	if (i < tt->n && tt->e[i].path_len == len &&
	    memcmp(tt->e[i].path, path, len) == 0)
		return &tt->e[i];
	return NULL;
}

static bool below(const struct castfs_ttree_entry *e, const char *dir,
		  size_t len)
{
	if (len == 0)
		return true;
	return e->path_len > len + 1 && memcmp(e->path, dir, len) == 0 &&
	       e->path[len] == '/';
}

bool castfs_ttree_is_dir(const struct castfs_ttree *tt, const char *dir,
			 size_t len)
{
	size_t i;

	if (len == 0)
		return true;
	i = lower_bound(tt, dir, len, true);
	return i < tt->n && below(&tt->e[i], dir, len);
}

int castfs_ttree_children(const struct castfs_ttree *tt, const char *dir,
			  size_t len,
			  int (*cb)(void *ctx, const char *name, size_t len,
				    const struct castfs_ttree_entry *leaf),
			  void *ctx)
{
	size_t skip = len ? len + 1 : 0;
	const char *last = NULL;
	size_t last_len = 0;

	for (size_t i = len ? lower_bound(tt, dir, len, true) : 0;
	     i < tt->n && below(&tt->e[i], dir, len); i++) {
		const struct castfs_ttree_entry *e = &tt->e[i];
		const char *rest = e->path + skip;
		size_t rl = e->path_len - skip;
		const char *slash = memchr(rest, '/', rl);
		int rc;

		if (!slash) {
			rc = cb(ctx, rest, rl, e);
		} else {
			/* Entries under one sub-directory are adjacent. */
			rl = (size_t)(slash - rest);
			if (last && last_len == rl && !memcmp(last, rest, rl))
				continue;
			last = rest;
			last_len = rl;
			rc = cb(ctx, rest, rl, NULL);
		}
		if (rc)
			return rc;
	}
	return 0;
}
