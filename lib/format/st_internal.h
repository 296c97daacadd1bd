/* SPDX-License-Identifier: MIT */
/* Private to the safetensors header code: the lexer and shared helpers. */
#ifndef CASTFS_ST_INTERNAL_H
#define CASTFS_ST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ST_MAX_DEPTH 127 /* serde_json fails on the 128th nested container */
#define ST_MAX_INT (UINT64_C(1) << 53)
#define ST_SHOW 56 /* a name quoted in a message, cut to ~44 bytes */
#define ST_META "__metadata__"

struct st_span {
	const char *p;
	size_t n;
};

struct st_str {
	uint32_t off, len; /* the raw body between the quotes */
	uint32_t dec; /* its decoded length */
};

struct st_lex {
	const uint8_t *js;
	size_t len;
	struct st_str *str; /* every string, in document order */
	size_t nstr, cap;
	struct castfs_diag *d;
};

/* Rust's str ordering: bytewise, a proper prefix first. */
int st_cmp_bytes(const char *a, size_t an, const char *b, size_t bn);

/* Sort @v; return the index of an entry equal to its predecessor, or @n. */
size_t st_first_dup(struct st_span *v, size_t n);

/* Quote @n bytes of @s for a message (printable ASCII, else \\xNN, cut). */
const char *st_show(char out[ST_SHOW], const char *s, size_t n);

/* Decode the raw body of a JSON string into @out (at most @cap bytes);
 * returns the decoded length. The body must have passed the lexer. */
size_t st_decode(const uint8_t *raw, size_t n, char *out, size_t cap);

/* The lexer pass: UTF-8, '{' first, strings without raw control bytes,
 * integers only, <= 2^53, nesting <= ST_MAX_DEPTH. Fills lx->str. */
int st_lex(struct st_lex *lx);

/* The structure of a lexed header (st_tree.c): node 0 is the root; a
 * child or next of 0 is none. */
enum st_kind { ST_NULL, ST_BOOL, ST_NUMBER, ST_STRING, ST_ARRAY, ST_OBJECT };

struct st_node {
	uint32_t next; /* the next sibling */
	uint32_t child; /* the first child of an array or object */
	uint64_t v; /* the kind (top byte) and a number's value */
};

struct st_tree {
	struct st_node *node;
	size_t n, cap;
};

/* Parse the text of @lx (which passed st_lex()) into @t: one JSON value
 * and only whitespace after it. An object's members are its children, in
 * document order; their keys, like every string, are the lexer's tokens,
 * met in the same order (pre-order). */
int st_tree_parse(const struct st_lex *lx, struct st_tree *t);
void st_tree_free(struct st_tree *t);
enum st_kind st_node_kind(const struct st_tree *t, uint32_t i);
uint64_t st_node_num(const struct st_tree *t, uint32_t i);

#endif
