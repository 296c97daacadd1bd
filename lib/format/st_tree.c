/* SPDX-License-Identifier: MIT */
/*
 * The structure of a lexed safetensors header as a flat array of 16-byte
 * nodes. It replaces cJSON here because cJSON spends ~80 bytes and two
 * allocations on every value: a 100 MB header of one-digit shape entries
 * (valid JSON) cost ~4 GB to parse; this costs 16 bytes a value, in one
 * growing array. Strings and numbers are not copied: the lexer's tokens
 * (st_lex.c) already hold them, in document order.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "format/st_internal.h"

struct st_parser {
	const struct st_lex *lx;
	struct st_tree *t;
	size_t pos; /* the next byte of the text */
	size_t tok; /* the next string token */
	size_t at; /* where the JSON is invalid */
};

#define ST_KIND_SHIFT 56

/* A node of @kind (value @v) appended to the tree, its index in *@out
 * (node 0 is the root, never a child or a next, so 0 there is "none"). */
static int st_node_new(struct st_tree *t, enum st_kind kind, uint64_t v,
		       uint32_t *out)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap + t->cap / 2 : 64;
		struct st_node *nv = realloc(t->node, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		t->node = nv;
		t->cap = cap;
	}
	t->node[t->n] = (struct st_node){
		.v = (uint64_t)kind << ST_KIND_SHIFT | v,
	};
	/* a node takes at least one byte of a header of < 4 GiB */
	*out = (uint32_t)t->n++;
	return 0;
}

enum st_kind st_node_kind(const struct st_tree *t, uint32_t i)
{
	return (enum st_kind)(t->node[i].v >> ST_KIND_SHIFT);
}

uint64_t st_node_num(const struct st_tree *t, uint32_t i)
{
	return t->node[i].v & ((UINT64_C(1) << ST_KIND_SHIFT) - 1);
}

/* Invalid JSON at the current byte; cJSON's convention for the end of
 * the text (its last byte) is kept for the message. */
static int st_bad(struct st_parser *p)
{
	size_t len = p->lx->len;

	p->at = p->pos < len ? p->pos : len ? len - 1 : 0;
	return -EINVAL;
}

static void st_ws(struct st_parser *p)
{
	p->pos = castfs_json_skip_ws(p->lx->js, p->lx->len, p->pos);
}

/* The byte at the current position after whitespace, or -1 at the end. */
static int st_peek(struct st_parser *p)
{
	st_ws(p);
	return p->pos < p->lx->len ? p->lx->js[p->pos] : -1;
}

/* A string: the lexer's next token, which starts after this quote. */
static void st_skip_string(struct st_parser *p)
{
	const struct st_str *s = &p->lx->str[p->tok++];

	assert(p->tok <= p->lx->nstr && s->off == p->pos + 1);
	p->pos = (size_t)s->off + s->len + 1;
}

static bool st_literal(struct st_parser *p, const char *lit)
{
	size_t n = strlen(lit);

	if (p->lx->len - p->pos < n || memcmp(p->lx->js + p->pos, lit, n))
		return false;
	p->pos += n;
	return true;
}

static int st_value(struct st_parser *p, uint32_t *out);

/* The members of an object or the elements of an array, after its
 * opening byte, as children of node @parent. */
static int st_members(struct st_parser *p, uint32_t parent, bool object)
{
	const int close = object ? '}' : ']';
	uint32_t prev = 0;

	if (st_peek(p) == close) {
		p->pos++;
		return 0;
	}
	for (;;) {
		uint32_t child;
		int rc;

		if (object) {
			if (st_peek(p) != '"')
				return st_bad(p);
			st_skip_string(p);
			if (st_peek(p) != ':')
				return st_bad(p);
			p->pos++;
		}
		rc = st_value(p, &child);
		if (rc)
			return rc;
		if (prev)
			p->t->node[prev].next = child;
		else
			p->t->node[parent].child = child;
		prev = child;
		rc = st_peek(p);
		p->pos += rc == ',' || rc == close;
		if (rc == close)
			return 0;
		if (rc != ',')
			return st_bad(p);
	}
}

static int st_value(struct st_parser *p, uint32_t *out)
{
	int c = st_peek(p);
	enum st_kind kind;
	uint64_t v = 0;

	if (c == '{' || c == '[') {
		int rc = st_node_new(p->t, c == '{' ? ST_OBJECT : ST_ARRAY, 0,
				     out);

		p->pos++;
		/* nesting is capped by the lexer (ST_MAX_DEPTH) */
		return rc ? rc : st_members(p, *out, c == '{');
	}
	if (c == '"') {
		st_skip_string(p);
		kind = ST_STRING;
	} else if (c >= '0' && c <= '9') {
		/* the lexer proved it digits only, <= 2^53 */
		while (p->pos < p->lx->len && p->lx->js[p->pos] >= '0' &&
		       p->lx->js[p->pos] <= '9')
			v = v * 10 + (uint64_t)(p->lx->js[p->pos++] - '0');
		kind = ST_NUMBER;
	} else if (st_literal(p, "null")) {
		kind = ST_NULL;
	} else if (st_literal(p, "true") || st_literal(p, "false")) {
		kind = ST_BOOL;
	} else {
		return st_bad(p);
	}
	return st_node_new(p->t, kind, v, out);
}

int st_tree_parse(const struct st_lex *lx, struct st_tree *t)
{
	struct st_parser p = { .lx = lx, .t = t };
	uint32_t root = 0;
	int rc;

	*t = (struct st_tree){ 0 };
	rc = st_value(&p, &root);
	if (rc == -EINVAL)
		rc = castfs_diag_set(lx->d, -EINVAL,
				     "invalid JSON near header byte %zu", p.at);
	if (!rc && st_peek(&p) >= 0)
		rc = castfs_diag_set(
			lx->d, -EINVAL,
			"byte 0x%02x after the JSON object at header byte %zu",
			lx->js[p.pos], p.pos);
	if (rc)
		st_tree_free(t);
	return rc;
}

void st_tree_free(struct st_tree *t)
{
	free(t->node);
	*t = (struct st_tree){ 0 };
}
