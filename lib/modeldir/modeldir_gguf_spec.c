/* SPDX-License-Identifier: MIT */
/*
 * The special-token KVs of a GGUF file of a causal-LM folder, as gguf-py's
 * SpecialVocab (convert_hf_to_gguf.py's _set_vocab_gpt2) finds and writes
 * them: the ids of bos/eos/unk/sep/pad/mask (and eot/eom) from
 * tokenizer_config.json, else config.json; add_bos/add_eos/add_sep from
 * tokenizer.json's post_processor and tokenizer_config.json; the chat
 * template(s). docs/FORMATS.md "GGUF of model directories".
 *
 * SpecialVocab's rules are followed step by step, Python's truthiness and
 * equality included, because llama.cpp reads only what it writes: a
 * missing bos id or add_bos flag makes it pick its own defaults.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/escape.h"
#include "common/strbuf.h"
#include "modeldir/modeldir_gguf_tok.h"
#include "modeldir/modeldir_internal.h"

/* SpecialVocab.special_token_types, eot and eom appended on demand. */
enum {
	SV_BOS,
	SV_EOS,
	SV_UNK,
	SV_SEP,
	SV_PAD,
	SV_CLS,
	SV_MASK,
	SV_EOT,
	SV_EOM,
	SV_N
};

static const char *const sv_name[SV_N] = { "bos", "eos",  "unk", "sep", "pad",
					   "cls", "mask", "eot", "eom" };

/* GGUFWriter's add_<typ>_token_id keys; cls has no handler (skipped). */
static const char *const sv_id_key[SV_N] = {
	"tokenizer.ggml.bos_token_id",	   "tokenizer.ggml.eos_token_id",
	"tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
	"tokenizer.ggml.padding_token_id", NULL,
	"tokenizer.ggml.mask_token_id",	   "tokenizer.ggml.eot_token_id",
	"tokenizer.ggml.eom_token_id",
};

/* Its add_add_<typ>_token keys: only these three exist. */
static const char *const sv_add_key[SV_N] = {
	[SV_BOS] = "tokenizer.ggml.add_bos_token",
	[SV_EOS] = "tokenizer.ggml.add_eos_token",
	[SV_SEP] = "tokenizer.ggml.add_sep_token",
};

/* What SpecialVocab accumulates; both dicts keep insertion order. */
struct sv {
	const cJSON *tc; /* tokenizer_config.json, or NULL */
	bool tc_truthy; /* a non-empty object (Python's `if tokenizer_config`) */
	const cJSON *ov[SV_N]; /* tokenizer_config["<typ>_token"] = ... */
	bool has_ov[SV_N];
	int types[SV_N], ntypes;
	int id_order[SV_N], nids;
	uint32_t id[SV_N];
	bool has_id[SV_N];
	int add_order[SV_N], nadd;
	bool add[SV_N], has_add[SV_N];
};

/* Python's bool(x) of a JSON value (NULL: absent, i.e. None). */
static bool truthy(const cJSON *x)
{
	if (!x || cJSON_IsNull(x) || cJSON_IsFalse(x))
		return false;
	if (cJSON_IsNumber(x))
		return x->valuedouble != 0;
	if (cJSON_IsString(x))
		return x->valuestring[0] != '\0';
	if (cJSON_IsArray(x) || cJSON_IsObject(x))
		return x->child != NULL;
	return true;
}

static bool is_none(const cJSON *x)
{
	return !x || cJSON_IsNull(x);
}

/* Python's a == b of two JSON values. */
static bool py_eq(const cJSON *a, const cJSON *b)
{
	if (is_none(a) || is_none(b))
		return is_none(a) && is_none(b);
	return cJSON_Compare(a, b, true);
}

/* tokenizer_config.get("<typ>_token"), as SpecialVocab may have set it. */
static const cJSON *tc_get(const struct sv *s, int t)
{
	char key[16];

	if (s->has_ov[t])
		return s->ov[t];
	snprintf(key, sizeof(key), "%s_token", sv_name[t]);
	return cJSON_GetObjectItemCaseSensitive(s->tc, key);
}

static void tc_set(struct sv *s, int t, const cJSON *v)
{
	s->ov[t] = v;
	s->has_ov[t] = true;
}

static void set_add(struct sv *s, int t, bool v)
{
	if (!s->has_add[t])
		s->add_order[s->nadd++] = t;
	s->has_add[t] = true;
	s->add[t] = v;
}

static bool has_type(const struct sv *s, int t)
{
	for (int i = 0; i < s->ntypes; i++)
		if (s->types[i] == t)
			return true;
	return false;
}

static int bad_pp(struct castfs_diag *d)
{
	return castfs_diag_set(d, -EINVAL,
			       "GGUF: tokenizer.json post_processor is not "
			       "one gguf-py reads");
}

/* x.get(@key, {}).get("id") of template item @x: *@out, NULL when absent.
 * An item that is not an object stops gguf-py (and castfs). */
static int item_id(const cJSON *x, const char *key, const cJSON **out,
		   struct castfs_diag *d)
{
	const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, key);

	*out = NULL;
	if (!cJSON_IsObject(x) || (k && !cJSON_IsObject(k)))
		return bad_pp(d);
	*out = cJSON_GetObjectItemCaseSensitive(k, "id");
	return 0;
}

/* Whether object @o's "type" is the string @want. */
static bool is_type_str(const cJSON *o, const char *want)
{
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");

	return cJSON_IsString(t) && !strcmp(t->valuestring, want);
}

/* RobertaProcessing: bos, eos and sep added; cls/sep named by it when
 * tokenizer_config.json does not. */
static void roberta(struct sv *s, const cJSON *p, const cJSON **cls,
		    const cJSON **sep, const cJSON *bos, const cJSON *eos)
{
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(p, "cls");
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(p, "sep");

	set_add(s, SV_BOS, true);
	set_add(s, SV_EOS, true);
	set_add(s, SV_SEP, true);
	if (!truthy(*cls) && s->tc_truthy)
		tc_set(s, SV_CLS, *cls = c ? cJSON_GetArrayItem(c, 0) : bos);
	if (!truthy(*sep) && s->tc_truthy)
		tc_set(s, SV_SEP, *sep = e ? cJSON_GetArrayItem(e, 0) : eos);
}

/* The special tokens SpecialVocab reads so far (its locals). */
struct sv_cur {
	const cJSON *bos, *eos, *cls, *sep, *first, *last;
};

/* TemplateProcessing "single": a leading special token is bos (added
 * when it is the configured bos or cls), a trailing one eos (the
 * configured eos moving to eot, else eom, when they differ). */
static int tmpl_single(struct sv *s, const cJSON *single, struct sv_cur *c,
		       struct castfs_diag *d)
{
	int n = cJSON_GetArraySize(single);
	int rc;

	if (n <= 1)
		return 0;
	rc = item_id(cJSON_GetArrayItem(single, 0), "SpecialToken", &c->first,
		     d);
	if (!rc && truthy(c->first)) {
		if (!s->tc_truthy)
			c->bos = c->first;
		set_add(s, SV_BOS,
			py_eq(c->first, c->bos) || py_eq(c->first, c->cls));
	}
	if (!rc)
		rc = item_id(cJSON_GetArrayItem(single, n - 1), "SpecialToken",
			     &c->last, d);
	if (rc || !truthy(c->last))
		return rc;
	if (!s->tc_truthy) {
		c->eos = c->last;
	} else if (!py_eq(c->last, c->eos)) {
		int t = !has_type(s, SV_EOT) ? SV_EOT :
			!has_type(s, SV_EOM) ? SV_EOM :
					       -1;

		if (t >= 0) {
			s->types[s->ntypes++] = t;
			tc_set(s, t, c->eos);
		}
		tc_set(s, SV_EOS, c->eos = c->last);
	}
	set_add(s, SV_EOS, py_eq(c->last, c->eos));
	return 0;
}

/* The separator of "pair" [A, sep..., B] (leading/trailing specials of
 * "single" cut off): add_sep when it is the configured sep or eos. */
static int tmpl_pair(struct sv *s, const cJSON *pair, struct sv_cur *c,
		     struct castfs_diag *d)
{
	int n = cJSON_GetArraySize(pair), lo = 0, hi = n;
	const cJSON *x, *a, *b;
	bool add_sep = false;
	int rc;

	if (n && truthy(c->first)) {
		if ((rc = item_id(cJSON_GetArrayItem(pair, 0), "SpecialToken",
				  &x, d)))
			return rc;
		lo = py_eq(x, c->first);
	}
	if (n && truthy(c->last)) {
		if ((rc = item_id(cJSON_GetArrayItem(pair, n - 1),
				  "SpecialToken", &x, d)))
			return rc;
		hi = n - py_eq(x, c->last);
	}
	if (hi <= lo)
		return 0;
	if ((rc = item_id(cJSON_GetArrayItem(pair, lo), "Sequence", &a, d)) ||
	    (rc = item_id(cJSON_GetArrayItem(pair, hi - 1), "Sequence", &b, d)))
		return rc;
	if (!cJSON_IsString(a) || strcmp(a->valuestring, "A") ||
	    !cJSON_IsString(b) || strcmp(b->valuestring, "B") ||
	    hi - lo - 2 <= 0)
		return 0;
	/* the first separator counts without a trailing special; a second
	 * one (exactly two between A and B) always */
	if ((rc = item_id(cJSON_GetArrayItem(pair, lo + 1), "SpecialToken", &x,
			  d)))
		return rc;
	add_sep = truthy(x) && (py_eq(x, c->sep) || py_eq(x, c->eos)) &&
		  !truthy(c->last);
	if (hi - lo - 2 == 2) {
		if ((rc = item_id(cJSON_GetArrayItem(pair, lo + 2),
				  "SpecialToken", &x, d)))
			return rc;
		if (truthy(x) && (py_eq(x, c->sep) || py_eq(x, c->eos)))
			add_sep = true;
	}
	set_add(s, SV_SEP, add_sep);
	if (add_sep && !truthy(c->sep) && s->tc_truthy)
		tc_set(s, SV_SEP, c->eos);
	return 0;
}

/* One processor of the post_processor (or of its Sequence). */
static int processor(struct sv *s, const cJSON *p, struct sv_cur *c,
		     struct castfs_diag *d)
{
	const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
	const cJSON *pair = cJSON_GetObjectItemCaseSensitive(p, "pair");
	int rc;

	if (!cJSON_IsObject(p))
		return bad_pp(d);
	if (is_type_str(p, "RobertaProcessing")) {
		roberta(s, p, &c->cls, &c->sep, c->bos, c->eos);
		return 0;
	}
	if (!is_type_str(p, "TemplateProcessing"))
		return 0;
	if ((single && !cJSON_IsArray(single)) ||
	    (pair && !cJSON_IsArray(pair)))
		return bad_pp(d);
	c->first = c->last = NULL;
	rc = tmpl_single(s, single, c, d);
	return rc ? rc : tmpl_pair(s, pair, c, d);
}

/* tokenizer.json's post_processor: the add flags, and the special tokens
 * it names when tokenizer_config.json does not. */
static int post_processor(struct sv *s, const cJSON *tok, struct castfs_diag *d)
{
	const cJSON *pp =
		cJSON_GetObjectItemCaseSensitive(tok, "post_processor");
	const cJSON *list, *p;
	struct sv_cur c = { tc_get(s, SV_BOS),
			    tc_get(s, SV_EOS),
			    tc_get(s, SV_CLS),
			    tc_get(s, SV_SEP),
			    NULL,
			    NULL };
	int rc = 0;

	if (!truthy(c.bos) && truthy(c.cls) && s->tc_truthy)
		tc_set(s, SV_BOS, c.bos = c.cls);
	if (!truthy(c.eos) && truthy(c.sep) && s->tc_truthy)
		tc_set(s, SV_EOS, c.eos = c.sep);
	if (!truthy(pp))
		return 0;
	if (!cJSON_IsObject(pp))
		return bad_pp(d);
	list = cJSON_GetObjectItemCaseSensitive(pp, "processors");
	if (!list)
		return processor(s, pp, &c, d);
	if (!cJSON_IsArray(list))
		return bad_pp(d);
	cJSON_ArrayForEach(p, list) {
		if (!rc)
			rc = processor(s, p, &c, d);
	}
	return rc;
}

/* SpecialVocab._set_special_token: a Python int (a JSON integer or bool),
 * the first id found for its type kept. gguf-py does not bound it by the
 * vocabulary here (_set_vocab_gpt2 passes no n_vocab). */
static int set_id(struct sv *s, int t, const cJSON *v, struct castfs_diag *d)
{
	double x;

	if (cJSON_IsBool(v))
		x = cJSON_IsTrue(v);
	else if (cJSON_IsNumber(v) &&
		 v->valuedouble == (double)(int64_t)v->valuedouble)
		x = v->valuedouble;
	else
		return 0; /* not an int: ignored */
	if (x < 0 || x > UINT32_MAX)
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: %s token id %.0f is not a u32",
				       sv_name[t], x);
	if (s->has_id[t])
		return 0;
	s->has_id[t] = true;
	s->id[t] = (uint32_t)x;
	s->id_order[s->nids++] = t;
	return 0;
}

/* The "id" of the first added token of content @content (or NULL). */
static const cJSON *added_id(const cJSON *tok, const char *content)
{
	const cJSON *e;

	cJSON_ArrayForEach(
		e, cJSON_GetObjectItemCaseSensitive(tok, "added_tokens")) {
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");

		if (cJSON_IsString(c) && !strcmp(c->valuestring, content))
			return cJSON_GetObjectItemCaseSensitive(e, "id");
	}
	return NULL;
}

/* tokenizer_config.json's add_<typ>_token flags and <typ>_token names
 * (a string or {"content": ...}) looked up among the added tokens. */
static int from_tc(struct sv *s, const cJSON *tok, struct castfs_diag *d)
{
	int rc = 0;

	for (int i = 0; !rc && i < s->ntypes; i++) {
		int t = s->types[i];
		char key[24];
		const cJSON *a, *e = tc_get(s, t);

		snprintf(key, sizeof(key), "add_%s_token", sv_name[t]);
		a = cJSON_GetObjectItemCaseSensitive(s->tc, key);
		if (cJSON_IsBool(a))
			set_add(s, t, cJSON_IsTrue(a));
		if (cJSON_IsObject(e))
			e = cJSON_GetObjectItemCaseSensitive(e, "content");
		if (cJSON_IsString(e))
			rc = set_id(s, t, added_id(tok, e->valuestring), d);
	}
	return rc;
}

/* config.json's <typ>_token_id (or its text_config's) for the types
 * still without an id. */
static int from_config(struct sv *s, const cJSON *cfg, struct castfs_diag *d)
{
	const cJSON *text =
		cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
	int rc = 0;

	for (int i = 0; !rc && i < s->ntypes; i++) {
		char key[24];
		const cJSON *v;

		snprintf(key, sizeof(key), "%s_token_id", sv_name[s->types[i]]);
		v = cJSON_GetObjectItemCaseSensitive(cfg, key);
		if (is_none(v) && text && !cJSON_IsObject(text))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: config.json text_config "
					       "is not an object");
		if (is_none(v))
			v = cJSON_GetObjectItemCaseSensitive(text, key);
		rc = set_id(s, s->types[i], v, d);
	}
	return rc;
}

/* Python's open(encoding="utf-8").read() of chat_template.jinja: valid
 * UTF-8, "\r\n" and "\r" read as "\n". castfs also refuses a NUL, which
 * a GGUF string could hold but castfs's writer does not take. */
static int jinja_text(const char *what, const char *s, size_t n,
		      struct castfs_strbuf *out, struct castfs_diag *d)
{
	if (castfs_utf8_bad(s, n) != n || memchr(s, '\0', n))
		return castfs_diag_set(d, -EINVAL, "GGUF: %s is not UTF-8 text",
				       what);
	out->len = 0;
	castfs_sb_put(out, "", 0);
	for (size_t i = 0; i < n; i++) {
		if (s[i] != '\r')
			castfs_sb_put(out, s + i, 1);
		else if (i + 1 == n || s[i + 1] != '\n')
			castfs_sb_put(out, "\n", 1);
	}
	return out->oom ? -ENOMEM : 0;
}

/* A template KV as GGUFWriter.add_string writes it: nothing for an empty
 * one (a bug hunt: castfs wrote ""). */
static void tmpl_str(struct castfs_gguf_w *w, const char *key, const char *val)
{
	if (val[0])
		castfs_gguf_kv_str(w, key, val);
}

/* GGUFWriter.add_chat_template's name: every character but an ASCII
 * letter or digit one "_": one per UTF-8 code point, and one per byte
 * that is not UTF-8 (Python reads a file name's with surrogateescape,
 * one character each). */
static void tmpl_name(const char *name, struct castfs_strbuf *out)
{
	size_t n = strlen(name), i = 0;

	out->len = 0;
	castfs_sb_put(out, "", 0);
	while (i < n) {
		unsigned char c = (unsigned char)name[i];
		size_t k = castfs_utf8_len(name + i, n - i);
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			     (c >= '0' && c <= '9');

		castfs_sb_put(out, alnum ? name + i : "_", 1);
		i += k ? k : 1;
	}
}

/* List entry @i's filtered name into @nb and its template, or NULL when
 * add_chat_template skips it (no name, no template). */
static int tmpl_entry(const cJSON *e, struct castfs_strbuf *nb,
		      const char **tmpl, struct castfs_diag *d)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");

	*tmpl = NULL;
	if (!cJSON_IsObject(e) || (n && !cJSON_IsString(n)) ||
	    (!is_none(t) && !cJSON_IsString(t)))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: a chat_template list entry is "
				       "not {name, template} strings");
	tmpl_name(n ? n->valuestring : "", nb);
	if (nb->oom)
		return -ENOMEM;
	if (nb->len && !is_none(t))
		*tmpl = t->valuestring;
	return 0;
}

/*
 * A chat_template list as add_chat_template writes it: each named one as
 * tokenizer.chat_template.<name> (a repeated name: the last template, in
 * the first one's place, as GGUFWriter overwrites a key), their names as
 * tokenizer.chat_templates (gguf-py's order is a Python set's, arbitrary;
 * castfs's is the list's), then "default" as tokenizer.chat_template.
 */
static int tmpl_list(struct castfs_gguf_w *w, const cJSON *list,
		     struct castfs_diag *d)
{
	struct castfs_strbuf nb = { 0 }, ob = { 0 }, key = { 0 };
	const char *def = NULL, *t, *u;
	int rc = 0, n = cJSON_GetArraySize(list), names = 0;

	for (int pass = 0; !rc && pass < 2; pass++) {
		if (pass)
			castfs_gguf_kv_array(w, "tokenizer.chat_templates",
					     CASTFS_GGUF_T_STRING, names);
		for (int i = 0; !rc && i < n; i++) {
			bool first = true;
			const char *last;

			rc = tmpl_entry(cJSON_GetArrayItem(list, i), &nb, &t,
					d);
			if (rc || !t)
				continue;
			if (!strcmp(nb.p, "default")) {
				def = t;
				continue;
			}
			last = t;
			for (int j = 0; !rc && j < n; j++) {
				rc = tmpl_entry(cJSON_GetArrayItem(list, j),
						&ob, &u, d);
				if (!rc && u && !strcmp(ob.p, nb.p)) {
					first &= j >= i;
					last = u;
				}
			}
			if (rc || !first)
				continue;
			if (pass) {
				castfs_gguf_arr_str(w, nb.p, nb.len);
				continue;
			}
			names++;
			key.len = 0;
			castfs_sb_printf(&key, "tokenizer.chat_template.%s",
					 nb.p);
			if (key.oom)
				rc = -ENOMEM;
			else
				tmpl_str(w, key.p, last);
		}
		if (!names)
			break; /* no tokenizer.chat_templates */
	}
	if (!rc && def)
		tmpl_str(w, "tokenizer.chat_template", def);
	castfs_sb_fini(&nb);
	castfs_sb_fini(&ob);
	castfs_sb_fini(&key);
	return rc;
}

/* Append {"name": @name, "template": @text} to @list. */
static int tmpl_add(cJSON *list, const char *name, const char *text)
{
	cJSON *e = cJSON_CreateObject();

	if (!e || !cJSON_AddStringToObject(e, "name", name) ||
	    !cJSON_AddStringToObject(e, "template", text) ||
	    !cJSON_AddItemToArray(list, e)) {
		cJSON_Delete(e);
		return -ENOMEM;
	}
	return 0;
}

/* pathlib's stem of additional_chat_templates/@file, a "*.jinja" (but
 * ".jinja" alone has no suffix), into @stem. */
static void xtmpl_stem(const char *file, struct castfs_strbuf *stem)
{
	size_t n = strlen(file);

	stem->len = 0;
	castfs_sb_put(stem, file, n > 6 ? n - 6 : n);
	castfs_sb_put(stem, "", 0);
}

/* The name gguf-py gives additional_chat_templates/@file: its stem
 * filtered as GGUFWriter does. */
static void xtmpl_name(const char *file, struct castfs_strbuf *nb,
		       struct castfs_strbuf *stem)
{
	xtmpl_stem(file, stem);
	tmpl_name(stem->oom ? "" : stem->p, nb);
}

/* Whether two files of @in's additional_chat_templates/ give one name
 * (gguf-py keeps whichever it globs last, in directory order). */
static int xtmpl_clash(const struct castfs_md_tok_src *in,
		       struct castfs_diag *d)
{
	struct castfs_strbuf a = { 0 }, b = { 0 }, stem = { 0 };
	int rc = 0;

	for (size_t i = 0; !rc && i < in->nxtmpl; i++) {
		xtmpl_name(in->xtmpl[i].name, &a, &stem);
		for (size_t j = i + 1; !rc && j < in->nxtmpl; j++) {
			xtmpl_name(in->xtmpl[j].name, &b, &stem);
			if (a.oom || b.oom || stem.oom)
				rc = -ENOMEM;
			else if (!strcmp(a.p, b.p))
				rc = castfs_diag_set(
					d, -EINVAL,
					"GGUF: additional_chat_templates/%s "
					"and %s are both named '%s'",
					in->xtmpl[i].name, in->xtmpl[j].name,
					a.p);
		}
	}
	castfs_sb_fini(&a);
	castfs_sb_fini(&b);
	castfs_sb_fini(&stem);
	return rc;
}

/*
 * chat_template.jinja with additional_chat_templates/ *.jinja beside it:
 * SpecialVocab's list, "default" (chat_template.jinja) then each file by
 * its stem, which tmpl_list() writes. A file that is not readable text
 * stops convert_hf_to_gguf.py, and is refused.
 */
static int tmpl_files(struct castfs_gguf_w *w,
		      const struct castfs_md_tok_src *in, struct castfs_diag *d)
{
	struct castfs_strbuf tb = { 0 }, stem = { 0 }, what = { 0 };
	cJSON *list;
	int rc;

	if (in->xtmpl_why)
		return castfs_diag_set(d, -EINVAL, "%s", in->xtmpl_why);
	list = cJSON_CreateArray();
	rc = list ? xtmpl_clash(in, d) : -ENOMEM;

	if (!rc)
		rc = jinja_text("chat_template.jinja", in->jinja, in->jinja_len,
				&tb, d);
	if (!rc)
		rc = tmpl_add(list, "default", tb.p);
	for (size_t i = 0; !rc && i < in->nxtmpl; i++) {
		const struct castfs_md_xtmpl *x = &in->xtmpl[i];

		what.len = 0;
		castfs_sb_printf(&what, "additional_chat_templates/%s",
				 x->name);
		xtmpl_stem(x->name, &stem);
		if (what.oom || stem.oom)
			rc = -ENOMEM;
		else if (!x->text)
			rc = castfs_diag_set(d, -EINVAL,
					     "GGUF: %s is not a readable file",
					     what.p);
		else
			rc = jinja_text(what.p, x->text, x->len, &tb, d);
		if (!rc)
			rc = tmpl_add(list, stem.p, tb.p);
	}
	if (!rc)
		rc = tmpl_list(w, list, d);
	cJSON_Delete(list);
	castfs_sb_fini(&tb);
	castfs_sb_fini(&stem);
	castfs_sb_fini(&what);
	return rc;
}

/*
 * The chat template: tokenizer_config.json's "chat_template" when it has
 * the key (even null), else chat_template.jinja's text (with the files of
 * additional_chat_templates/, tmpl_files()), else chat_template.json's
 * "chat_template". A string is
 * tokenizer.chat_template; a list is tmpl_list(); anything else nothing,
 * as gguf-py ignores it. Only called with a non-empty tokenizer_config
 * (SpecialVocab reads no template without one).
 */
static int chat_template(struct castfs_gguf_w *w,
			 const struct castfs_md_tok_src *in,
			 struct castfs_diag *d)
{
	const cJSON *v =
		cJSON_GetObjectItemCaseSensitive(in->tc, "chat_template");
	struct castfs_strbuf jb = { 0 };
	cJSON *ct = NULL;
	int rc = 0;

	if (!v && in->jinja && (in->nxtmpl || in->xtmpl_why))
		return tmpl_files(w, in, d);
	if (!v && in->jinja) {
		rc = jinja_text("chat_template.jinja", in->jinja, in->jinja_len,
				&jb, d);
		if (!rc)
			tmpl_str(w, "tokenizer.chat_template", jb.p);
		castfs_sb_fini(&jb);
		return rc;
	}
	if (!v && in->ct_json) {
		/* Parsed while the tokenizer's trees are held: uncapped, a
		 * chat_template.json of "0," within the text budget cost
		 * cJSON ~80 bytes a value on top of them. */
		rc = castfs_md_json_cap(in->ct_json, in->ct_json_len,
					CASTFS_MD_JSON_VALUES_MAX, d,
					"GGUF: chat_template.json");
		if (rc)
			return rc;
		ct = cJSON_ParseWithLength(in->ct_json, in->ct_json_len);
		if (!cJSON_IsObject(ct)) {
			cJSON_Delete(ct);
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: chat_template.json is "
					       "not a JSON object");
		}
		v = cJSON_GetObjectItemCaseSensitive(ct, "chat_template");
	}
	if (cJSON_IsString(v))
		tmpl_str(w, "tokenizer.chat_template", v->valuestring);
	else if (cJSON_IsArray(v))
		rc = tmpl_list(w, v, d);
	cJSON_Delete(ct);
	return rc;
}

static void write_ids(struct castfs_gguf_w *w, const struct sv *s)
{
	for (int i = 0; i < s->nids; i++) {
		int t = s->id_order[i];

		if (sv_id_key[t])
			castfs_gguf_kv_u32(w, sv_id_key[t], s->id[t]);
	}
	for (int i = 0; i < s->nadd; i++) {
		int t = s->add_order[i];

		if (sv_add_key[t])
			castfs_gguf_kv_bool(w, sv_add_key[t], s->add[t]);
	}
}

int castfs_md_gguf_special(struct castfs_gguf_w *w,
			   const struct castfs_md_tok_src *in,
			   struct castfs_diag *d)
{
	struct sv s = { .tc = in->tc, .ntypes = SV_MASK + 1 };
	int rc;

	s.tc_truthy = cJSON_IsObject(in->tc) && in->tc->child;
	for (int t = 0; t < s.ntypes; t++)
		s.types[t] = t;
	rc = post_processor(&s, in->tok, d);
	if (!rc && s.tc_truthy)
		rc = from_tc(&s, in->tok, d);
	if (!rc)
		rc = from_config(&s, in->cfg, d);
	if (!rc)
		write_ids(w, &s);
	if (!rc && s.tc_truthy)
		rc = chat_template(w, in, d);
	return rc;
}
