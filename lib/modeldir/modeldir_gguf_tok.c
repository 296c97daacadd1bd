/* SPDX-License-Identifier: MIT */
/*
 * The tokenizer of a GGUF file of a causal-LM folder (modeldir_gguf.c):
 * tokenizer.json's BPE vocabulary, merges and pre-tokenizer as the
 * tokenizer.ggml.* KVs convert_hf_to_gguf.py writes (docs/FORMATS.md "GGUF
 * of model directories"); the special tokens and chat template follow
 * (modeldir_gguf_spec.c). A tokenizer castfs cannot name exactly is
 * refused.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/strbuf.h"
#include "modeldir/modeldir_gguf_tok.h"

/* llama.cpp token types (llama_token_type). */
enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5 };

/*
 * The pre-tokenizers castfs names for llama.cpp (tokenizer.ggml.pre), each
 * recognised by its tokenizer.json structure and the exact regex that
 * llama.cpp's llama-vocab.cpp reimplements for that name (it quotes the
 * tokenizer.json original). convert_hf_to_gguf.py instead hashes the
 * token ids of a fixed text (chkhsh), which only known published
 * tokenizers match; a tokenizer with the same pre-tokenizer trained
 * elsewhere gets the same name here (docs/FORMATS.md).
 */
struct pre_kind {
	const char *name; /* tokenizer.ggml.pre */
	const char *regex; /* Split pattern; NULL: ByteLevel's own (gpt2) */
	bool ignore_merges; /* llama.cpp sets it for this name */
	bool nfc; /* an NFC normalizer is accepted (llama.cpp skips it) */
};

static const struct pre_kind pre_kinds[] = {
	{ "gpt-2", NULL, false, false },
	{ "llama-bpe",
	  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
	  "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
	  "\\s+(?!\\S)|\\s+",
	  true, false },
	{ "qwen2",
	  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
	  "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
	  "\\s+(?!\\S)|\\s+",
	  false, true },
};

static bool is_type(const cJSON *o, const char *key, const char *want)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");

	return cJSON_IsString(t) && !strcmp(t->valuestring, want);
}

/* A ByteLevel pre-tokenizer without prefix space, using its own (gpt2)
 * regex when @regex, else none. */
static bool byte_level(const cJSON *pre, bool regex)
{
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
	const cJSON *aps =
		cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
	const cJSON *re = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");

	if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel") ||
	    !cJSON_IsFalse(aps))
		return false;
	return regex ? !re || cJSON_IsTrue(re) : cJSON_IsFalse(re);
}

/* Sequence [Split(@regex, Isolated, not inverted), ByteLevel(no regex)]. */
static bool split_then_bytes(const cJSON *pre, const char *regex)
{
	const cJSON *seq =
		cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
	const cJSON *sp = cJSON_GetArrayItem(seq, 0);
	const cJSON *pat = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(sp, "pattern"), "Regex");
	const cJSON *beh = cJSON_GetObjectItemCaseSensitive(sp, "behavior");
	const cJSON *inv = cJSON_GetObjectItemCaseSensitive(sp, "invert");
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(sp, "type");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(pre, "type");

	return cJSON_IsString(t) && !strcmp(t->valuestring, "Sequence") &&
	       cJSON_IsArray(seq) && cJSON_GetArraySize(seq) == 2 &&
	       cJSON_IsString(st) && !strcmp(st->valuestring, "Split") &&
	       cJSON_IsString(pat) && !strcmp(pat->valuestring, regex) &&
	       cJSON_IsString(beh) && !strcmp(beh->valuestring, "Isolated") &&
	       cJSON_IsFalse(inv) &&
	       byte_level(cJSON_GetArrayItem(seq, 1), false);
}

/* The pre-tokenizer of @tok castfs names, or NULL. */
static const struct pre_kind *find_pre(const cJSON *tok)
{
	const cJSON *pre =
		cJSON_GetObjectItemCaseSensitive(tok, "pre_tokenizer");

	for (size_t i = 0; i < sizeof(pre_kinds) / sizeof(pre_kinds[0]); i++) {
		const struct pre_kind *k = &pre_kinds[i];

		if (k->regex ? split_then_bytes(pre, k->regex) :
			       byte_level(pre, true))
			return k;
	}
	return NULL;
}

/* The tokenizer's pre-tokenizer as llama.cpp names it, if everything else
 * about it is what llama.cpp does for that name. */
/* BPE settings llama.cpp's BPE has no place for: a subword prefix or a
 * word suffix (its merges would not match the text), a dropout
 * (Hugging Face then tokenizes at random). Empty or null is none. */
static int check_bpe_extras(const cJSON *model, struct castfs_diag *d)
{
	static const char *const keys[] = { "continuing_subword_prefix",
					    "end_of_word_suffix", "dropout" };

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const cJSON *v =
			cJSON_GetObjectItemCaseSensitive(model, keys[i]);

		if (v && !cJSON_IsNull(v) &&
		    !(cJSON_IsString(v) && !v->valuestring[0]))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: tokenizer.json BPE %s "
					       "is not supported",
					       keys[i]);
	}
	return 0;
}

static int check_tokenizer(const cJSON *tok, const struct pre_kind **pk,
			   struct castfs_diag *d)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
	const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tok, "normalizer");
	const cJSON *bf =
		cJSON_GetObjectItemCaseSensitive(model, "byte_fallback");
	const cJSON *im =
		cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");

	if (!is_type(tok, "model", "BPE") || (bf && !cJSON_IsFalse(bf)))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tokenizer.json is not a "
				       "byte-level BPE model");
	*pk = find_pre(tok);
	if (!*pk || !is_type(tok, "decoder", "ByteLevel"))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tokenizer.json pre-tokenizer is "
				       "not one castfs names for llama.cpp "
				       "(gpt-2, llama-bpe, qwen2)");
	if (norm && !cJSON_IsNull(norm) &&
	    !((*pk)->nfc && is_type(tok, "normalizer", "NFC")))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tokenizer.json has a normalizer");
	if ((*pk)->ignore_merges != cJSON_IsTrue(im))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: tokenizer.json ignore_merges "
				       "differs from llama.cpp's %s",
				       (*pk)->name);
	return check_bpe_extras(model, d);
}

/* One token of the vocabulary, by id; @own is @s when allocated here. */
struct tok_ent {
	const char *s;
	size_t len;
	int type;
	char *own;
};

static int vocab_set(struct tok_ent *v, uint32_t n, double id, const char *s,
		     size_t len, int type, struct castfs_diag *d)
{
	if (id < 0 || id >= n || id != (double)(uint32_t)id)
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: token id %.0f outside vocab_size",
				       id);
	free(v[(uint32_t)id].own);
	v[(uint32_t)id] = (struct tok_ent){ s, len, type, NULL };
	return 0;
}

/* The byte a ByteLevel alphabet code point @c stands for, or -1: bytes
 * that print as Latin-1 are themselves, the others 256 + their rank. */
static int bl_byte(uint32_t c)
{
	int rank = 0;

	for (int b = 0; b < 256; b++) {
		bool self = (b >= '!' && b <= '~') ||
			    (b >= 0xa1 && b <= 0xac) || b >= 0xae;

		if (self ? c == (uint32_t)b : c == 256u + (uint32_t)rank)
			return b;
		rank += !self;
	}
	return -1;
}

/* The code point of UTF-8 @s at *@i (advanced); tokenizer.json is valid
 * UTF-8, as cJSON gives it. */
static uint32_t utf8_next(const unsigned char *s, size_t len, size_t *i)
{
	uint32_t c = s[(*i)++];
	int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;

	c &= more ? 0x3fu >> more : 0x7fu;
	while (more-- && *i < len)
		c = c << 6 | (s[(*i)++] & 0x3fu);
	return c;
}

/* Bytes at @s a well-formed UTF-8 sequence could start with (Unicode's
 * "maximal subpart"): how many, 0 for a byte no sequence starts with. */
static size_t utf8_part(const unsigned char *s, size_t len, size_t *need)
{
	unsigned char b = s[0], lo = 0x80, hi = 0xbf;
	size_t k;

	*need = b < 0x80 ? 1 :
		b < 0xc2 ? 0 :
		b < 0xe0 ? 2 :
		b < 0xf0 ? 3 :
		b < 0xf5 ? 4 :
			   0;
	if (b == 0xe0)
		lo = 0xa0;
	else if (b == 0xed)
		hi = 0x9f;
	else if (b == 0xf0)
		lo = 0x90;
	else if (b == 0xf4)
		hi = 0x8f;
	for (k = 1; k < *need && k < len; k++) {
		if (s[k] < lo || s[k] > hi)
			break;
		lo = 0x80;
		hi = 0xbf;
	}
	return *need ? k : 0;
}

/* @b as UTF-8 with each maximal ill-formed part one U+FFFD, as Rust's
 * String::from_utf8_lossy (the ByteLevel decoder's last step). */
static void utf8_lossy(struct castfs_strbuf *out, const unsigned char *b,
		       size_t n)
{
	for (size_t i = 0; i < n;) {
		size_t need, k = utf8_part(b + i, n - i, &need);

		if (k && k == need)
			castfs_sb_put(out, (const char *)b + i, k);
		else
			castfs_sb_put(out, "\xef\xbf\xbd", 3);
		i += k ? k : 1;
	}
}

/* Whether HF's clean_up_tokenization (transformers' decode) would change
 * @s; castfs then refuses rather than follow it. */
static bool cleanup_changes(const char *s)
{
	static const char *const pat[] = {
		" .",	" ?",  " !",  " ,",   " ' ",
		" n't", " 'm", " 's", " 've", " 're"
	};

	for (size_t i = 0; i < sizeof(pat) / sizeof(pat[0]); i++)
		if (strstr(s, pat[i]))
			return true;
	return false;
}

/*
 * Added token @s as get_vocab_base re-normalizes one that is not
 * normalized: tokenizer.decode(tokenizer.encode(s)), the token itself
 * through the ByteLevel decoder: a token all of whose characters are in
 * the byte alphabet is those bytes (invalid UTF-8 as U+FFFD), any other is
 * kept. Into @out (NUL-terminated).
 */
static void renormalize(struct castfs_strbuf *out, const char *s, size_t len)
{
	const unsigned char *u = (const unsigned char *)s;
	unsigned char *b = malloc(len ? len : 1);
	size_t i = 0, n = 0;

	out->len = 0;
	castfs_sb_put(out, "", 0); /* terminated even when nothing follows */
	while (b && i < len) {
		int byte = bl_byte(utf8_next(u, len, &i));

		if (byte < 0)
			break;
		b[n++] = (unsigned char)byte;
	}
	if (b && i == len)
		utf8_lossy(out, b, n);
	else
		castfs_sb_put(out, s, len);
	out->oom |= !b;
	free(b);
}

static bool starts_ends(const char *s, size_t len, const char *a, const char *z)
{
	size_t la = strlen(a), lz = strlen(z);

	return len >= la && len >= lz && !memcmp(s, a, la) &&
	       !memcmp(s + len - lz, z, lz);
}

/* convert_hf_to_gguf's does_token_look_special: added tokens some models
 * forget to mark special that llama.cpp must treat as control ones. */
static bool looks_special(const char *s, size_t len)
{
	static const char *const names[] = { "<pad>", "<mask>", "<2mass>",
					     "[@BOS@]" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (len == strlen(names[i]) && !memcmp(s, names[i], len))
			return true;
	return starts_ends(s, len, "<|", "|>") ||
	       starts_ends(s, len, "<\xef\xbd\x9c", "\xef\xbd\x9c>") ||
	       starts_ends(s, len, "<unused", ">");
}

/* @s (@len) with every U+2581 a space, as get_vocab_base pre-normalizes
 * user-defined tokens; into @out. */
static void spaces(struct castfs_strbuf *out, const char *s, size_t len)
{
	out->len = 0;
	castfs_sb_put(out, "", 0); /* terminated even when nothing follows */
	for (size_t i = 0; i < len; i++) {
		if (i + 3 <= len && !memcmp(s + i, "\xe2\x96\x81", 3)) {
			castfs_sb_put(out, " ", 1);
			i += 2;
		} else {
			castfs_sb_put(out, s + i, 1);
		}
	}
}

/* Whether tc's clean_up_tokenization_spaces is true (transformers 5's
 * default is false). */
static bool cleans_up(const cJSON *tc)
{
	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
		tc, "clean_up_tokenization_spaces"));
}

/*
 * Added token @e as get_vocab_base writes it: re-normalized when not
 * normalized (tokenizers' default: normalized unless special), CONTROL
 * when special or looking special, else USER_DEFINED with U+2581 as
 * spaces. The string is allocated when it differs from the content.
 */
static int added_one(struct tok_ent *v, uint32_t n, const cJSON *e,
		     const cJSON *tc, struct castfs_strbuf *t,
		     struct castfs_strbuf *u, struct castfs_diag *d)
{
	const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
	bool sp = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
	const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "normalized");
	const struct castfs_strbuf *r = t;
	struct tok_ent *e_own;
	int type, rc;

	if (!cJSON_IsNumber(id) || !cJSON_IsString(c))
		return castfs_diag_set(d, -EINVAL, "GGUF: added token");
	if (cJSON_IsBool(nm) ? cJSON_IsTrue(nm) : !sp) {
		t->len = 0;
		castfs_sb_puts(t, c->valuestring);
	} else {
		renormalize(t, c->valuestring, strlen(c->valuestring));
		if (cleans_up(tc) && t->p && strcmp(t->p, c->valuestring) &&
		    cleanup_changes(t->p))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: added token %s decodes "
					       "differently with "
					       "clean_up_tokenization_spaces",
					       c->valuestring);
	}
	if (t->oom)
		return -ENOMEM;
	type = sp || looks_special(t->p, t->len) ? TOK_CONTROL :
						   TOK_USER_DEFINED;
	if (type == TOK_USER_DEFINED) {
		spaces(u, t->p, t->len);
		r = u;
	}
	if (r->oom)
		return -ENOMEM;
	if (!strcmp(r->p, c->valuestring))
		return vocab_set(v, n, id->valuedouble, c->valuestring,
				 strlen(c->valuestring), type, d);
	rc = vocab_set(v, n, id->valuedouble, "", 0, type, d);
	if (rc)
		return rc;
	e_own = &v[(uint32_t)id->valuedouble];
	if (!(e_own->own = strdup(r->p)))
		return -ENOMEM;
	e_own->s = e_own->own;
	e_own->len = r->len;
	return 0;
}

/*
 * Tokens in id order as convert_hf_to_gguf's get_vocab_base: the BPE
 * vocabulary, then the added tokens (added_one()); ids up to vocab_size
 * without one are "[PAD<i>]", UNUSED (write_tokens()).
 */
/* Whether vocabulary id @id (valid or not) already has a token. */
static bool vocab_taken(const struct tok_ent *v, uint32_t n, double id)
{
	return id >= 0 && id < n && id == (double)(uint32_t)id &&
	       v[(uint32_t)id].s;
}

static int read_vocab(const cJSON *tok, const cJSON *tc, uint32_t n,
		      struct tok_ent *v, struct castfs_diag *d)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
	const cJSON *added =
		cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
	struct castfs_strbuf t = { 0 }, u = { 0 };
	const cJSON *e;
	int rc = 0;

	if (!cJSON_IsObject(vocab))
		return castfs_diag_set(d, -EINVAL, "GGUF: no BPE vocab");
	cJSON_ArrayForEach(e, vocab) {
		if (!rc && !cJSON_IsNumber(e))
			rc = castfs_diag_set(d, -EINVAL, "GGUF: vocab id");
		/* Two tokens of one id: Hugging Face decodes the id as one
		 * of them, llama.cpp would hold the other. */
		if (!rc && vocab_taken(v, n, e->valuedouble))
			rc = castfs_diag_set(d, -EINVAL,
					     "GGUF: vocab id %.0f twice",
					     e->valuedouble);
		if (!rc)
			rc = vocab_set(v, n, e->valuedouble, e->string,
				       strlen(e->string), TOK_NORMAL, d);
	}
	cJSON_ArrayForEach(e, added) {
		if (!rc)
			rc = added_one(v, n, e, tc, &t, &u, d);
	}
	castfs_sb_fini(&t);
	castfs_sb_fini(&u);
	return rc;
}

static void write_tokens(struct castfs_gguf_w *w, const struct tok_ent *v,
			 uint32_t n)
{
	char pad[32];

	castfs_gguf_kv_array(w, "tokenizer.ggml.tokens", CASTFS_GGUF_T_STRING,
			     n);
	for (uint32_t i = 0; i < n; i++) {
		if (v[i].s) {
			castfs_gguf_arr_str(w, v[i].s, v[i].len);
		} else {
			int k = snprintf(pad, sizeof(pad), "[PAD%u]", i);

			castfs_gguf_arr_str(w, pad, (size_t)k);
		}
	}
	castfs_gguf_kv_array(w, "tokenizer.ggml.token_type",
			     CASTFS_GGUF_T_INT32, n);
	for (uint32_t i = 0; i < n; i++)
		castfs_gguf_arr_i32(w, v[i].s ? v[i].type : TOK_UNUSED);
}

static void free_vocab(struct tok_ent *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		free(v[i].own);
	free(v);
}

/* The BPE vocabulary's token strings, hashed (open addressing, at most
 * half full): every merge must name three of them. */
struct vset {
	const char **slot;
	size_t mask;
};

static size_t vset_at(const struct vset *s, const char *t, size_t len)
{
	size_t i = (size_t)castfs_mix64(castfs_fnv1a(CASTFS_FNV_SEED, t, len)) &
		   s->mask;

	while (s->slot[i] && (strncmp(s->slot[i], t, len) || s->slot[i][len]))
		i = (i + 1) & s->mask;
	return i;
}

static int vset_init(struct vset *s, const cJSON *vocab)
{
	size_t n = 16;
	const cJSON *e;

	while (n < 2 * (size_t)cJSON_GetArraySize(vocab))
		n *= 2;
	s->mask = n - 1;
	s->slot = calloc(n, sizeof(*s->slot));
	if (!s->slot)
		return -ENOMEM;
	cJSON_ArrayForEach(e, vocab)
		s->slot[vset_at(s, e->string, strlen(e->string))] = e->string;
	return 0;
}

static bool vset_has(const struct vset *s, const char *t, size_t len)
{
	return s->slot[vset_at(s, t, len)] != NULL;
}

/*
 * Merge @a @b (@alen, @blen bytes) as the tokenizers library builds a BPE
 * model: both parts and their concatenation must be vocabulary tokens,
 * else Hugging Face refuses the file (MergeTokenOutOfVocabulary; castfs
 * refuses continuing_subword_prefix, so the concatenation is plain).
 */
static int merge_check(const struct vset *s, const char *a, size_t alen,
		       const char *b, size_t blen, struct castfs_strbuf *cat,
		       struct castfs_diag *d)
{
	cat->len = 0;
	castfs_sb_put(cat, a, alen);
	castfs_sb_put(cat, b, blen);
	if (cat->oom)
		return -ENOMEM;
	if (!vset_has(s, a, alen) || !vset_has(s, b, blen) ||
	    !vset_has(s, cat->p, cat->len))
		return castfs_diag_set(d, -EINVAL,
				       "GGUF: a merge of tokens outside the "
				       "vocabulary ('%.*s' '%.*s'), which "
				       "Hugging Face refuses",
				       (int)(alen > 40 ? 40 : alen), a,
				       (int)(blen > 40 ? 40 : blen), b);
	return 0;
}

/* One merge @e as "a b" into @b, checked; the legacy string form must
 * split on its one space into two parts, as the tokenizers library
 * reads it. */
static int merge_text(const struct vset *s, const cJSON *e,
		      struct castfs_strbuf *b, struct castfs_strbuf *cat,
		      struct castfs_diag *d)
{
	const cJSON *a = cJSON_GetArrayItem(e, 0);
	const cJSON *c = cJSON_GetArrayItem(e, 1);
	const char *sp;

	b->len = 0;
	if (cJSON_IsString(e)) {
		sp = strchr(e->valuestring, ' ');
		if (!sp || strchr(sp + 1, ' '))
			return castfs_diag_set(d, -EINVAL,
					       "GGUF: a merge that is not two "
					       "tokens and a space");
		castfs_sb_put(b, e->valuestring, strlen(e->valuestring));
		return merge_check(s, e->valuestring,
				   (size_t)(sp - e->valuestring), sp + 1,
				   strlen(sp + 1), cat, d);
	}
	if (!cJSON_IsString(a) || !cJSON_IsString(c) ||
	    cJSON_GetArraySize(e) != 2)
		return castfs_diag_set(d, -EINVAL, "GGUF: a merge");
	castfs_sb_printf(b, "%s %s", a->valuestring, c->valuestring);
	return merge_check(s, a->valuestring, strlen(a->valuestring),
			   c->valuestring, strlen(c->valuestring), cat, d);
}

/* Merges as "a b", whether tokenizer.json spells them so or as pairs. */
static int write_merges(struct castfs_gguf_w *w, const cJSON *tok,
			struct castfs_diag *d)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
	const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
	struct castfs_strbuf b = { 0 }, cat = { 0 };
	struct vset s = { 0 };
	const cJSON *e;
	int rc = 0;

	if (!cJSON_IsArray(merges))
		return castfs_diag_set(d, -EINVAL, "GGUF: no BPE merges");
	rc = vset_init(&s, vocab);
	if (!rc)
		castfs_gguf_kv_array(w, "tokenizer.ggml.merges",
				     CASTFS_GGUF_T_STRING,
				     (uint64_t)cJSON_GetArraySize(merges));
	for (e = rc ? NULL : merges->child; e && !rc; e = e->next) {
		rc = merge_text(&s, e, &b, &cat, d);
		if (!rc && b.oom)
			rc = -ENOMEM;
		if (!rc)
			castfs_gguf_arr_str(w, b.p ? b.p : "", b.len);
	}
	free(s.slot);
	castfs_sb_fini(&b);
	castfs_sb_fini(&cat);
	return rc;
}

int castfs_md_gguf_tokenizer(struct castfs_gguf_w *w, uint32_t vocab_size,
			     const struct castfs_md_tok_src *in,
			     struct castfs_diag *d)
{
	const cJSON *tok = in->tok, *tc = in->tc;
	const struct pre_kind *pk = NULL;
	struct tok_ent *v;
	int rc = check_tokenizer(tok, &pk, d);

	if (rc)
		return rc;
	v = calloc(vocab_size ? vocab_size : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	castfs_gguf_kv_str(w, "tokenizer.ggml.model", "gpt2");
	castfs_gguf_kv_str(w, "tokenizer.ggml.pre", pk->name);
	rc = read_vocab(tok, tc, vocab_size, v, d);
	if (!rc)
		write_tokens(w, v, vocab_size);
	free_vocab(v, vocab_size);
	if (!rc)
		rc = write_merges(w, tok, d);
	if (!rc)
		rc = castfs_md_gguf_special(w, in, d);
	return rc;
}
