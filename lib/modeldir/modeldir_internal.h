/* SPDX-License-Identifier: MIT */
/*
 * Private to the model-directory code: JSON written as Python's
 * json.dumps does (into a struct castfs_strbuf), and a scanner that finds the
 * members of a JSON object as byte spans so that edits keep the rest of
 * the text (numbers, order, spacing) exactly as it was.
 */
#ifndef CASTFS_MODELDIR_INTERNAL_H
#define CASTFS_MODELDIR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/escape.h"
#include "common/strbuf.h"

struct cJSON;

/* castfs_md_put_u64 - the decimal digits of @v. */
void castfs_md_put_u64(struct castfs_strbuf *b, uint64_t v);

/*
 * castfs_md_put_str - @n bytes of UTF-8 @s as a JSON string literal the way
 * json.dumps writes it by default (ensure_ascii: \" \\ \n \r \t \b \f,
 * other control and non-ASCII characters as lowercase \uXXXX, surrogate
 * pairs above U+FFFF). A byte that is not valid UTF-8 is written as
 * U+FFFD. NUL bytes are characters like any other.
 */
void castfs_md_put_str(struct castfs_strbuf *b, const char *s, size_t n);

/* One member of an object, as offsets into the scanned text. */
struct castfs_md_member {
	size_t lead, lead_len; /* whitespace before the key */
	size_t key, key_len; /* the key, quotes included */
	size_t val, val_len; /* the value's text */
};

/* An object: where its braces are and its members in text order. */
struct castfs_md_object {
	size_t open, close; /* offsets of '{' and '}' */
	size_t n;
	struct castfs_md_member *m;
};

/*
 * castfs_md_scan_object - the members of the object that starts at @at (a '{')
 * of the @len bytes at @js. Every offset is bounds-checked; nesting is
 * limited to 1000 levels as in cJSON. Fills @o (castfs_md_object_fini() frees
 * it). Returns 0, -EINVAL (not a well-formed object) or -ENOMEM.
 */
int castfs_md_scan_object(const char *js, size_t len, size_t at,
			  struct castfs_md_object *o);

/* castfs_md_object_fini - free what castfs_md_scan_object() allocated. */
void castfs_md_object_fini(struct castfs_md_object *o);

/* castfs_md_key_is - true if member @m's key is exactly "@key" (no escapes). */
bool castfs_md_key_is(const char *js, const struct castfs_md_member *m,
		      const char *key);

/*
 * The most values a model folder's JSON text may hold before cJSON parses
 * it: a cJSON value costs ~80 bytes, so a 64 MiB config.json of "0,"
 * (32 million values) took the daemon to 2.5 GB for a listing of its
 * parent (a bug hunt). Real config.json and index files hold thousands to
 * a few hundred thousand (DeepSeek-V3's index: ~92,000); tokenizer.json
 * (and tokenizer_config.json), parsed for the GGUF views only, holds up to
 * ~1.2 million (Llama 3's 128,256 tokens and 280,147 merges as pairs).
 */
#define CASTFS_MD_JSON_VALUES_MAX ((size_t)1 << 20)
#define CASTFS_MD_TOK_VALUES_MAX ((size_t)1 << 22)

/*
 * castfs_md_json_cap - 0 if @len bytes of @json hold at most @max JSON
 * values (castfs_json_values()), else -E2BIG (@d says so, naming the file
 * as @what). Pure.
 */
int castfs_md_json_cap(const char *json, size_t len, size_t max,
		       struct castfs_diag *d, const char *what);

/*
 * castfs_md_parse - validate @len bytes of @json (not NUL-terminated) as one
 * JSON object with cJSON, surrounded by JSON space only. With @root set,
 * *@root is the parsed tree (the caller cJSON_Delete()s it). Returns 0,
 * -EINVAL or -E2BIG (over CASTFS_MD_JSON_VALUES_MAX values; @d says why,
 * naming the file as @what).
 */
int castfs_md_parse(const char *json, size_t len, struct cJSON **root,
		    struct castfs_diag *d, const char *what);

/* castfs_md_top_object - castfs_md_scan_object() of the top-level object of text that
 * castfs_md_parse() accepted. */
int castfs_md_top_object(const char *json, size_t len,
			 struct castfs_md_object *o);

/* How the neighbours of a new member are laid out. */
struct castfs_md_style {
	const char *lead; /* whitespace before a member's key */
	size_t lead_len;
	const char *sep; /* between a key and its value */
	size_t sep_len;
	bool pretty; /* the lead holds a newline */
	const char *unit; /* one level of indentation (pretty) */
	size_t unit_len;
};

/* castfs_md_put_next - between two members (or array items) @depth levels below
 * the member styled by @s: a comma unless @first, then its lead. */
void castfs_md_put_next(struct castfs_strbuf *b,
			const struct castfs_md_style *s, int depth, bool first);

/* castfs_md_put_close - the closing @c of an object or array @depth levels down. */
void castfs_md_put_close(struct castfs_strbuf *b,
			 const struct castfs_md_style *s, int depth, char c);

struct castfs_md_ct;

/* md_put_ct - the compressed-tensors quantization_config object of @q. */
void md_put_ct(struct castfs_strbuf *b, const struct castfs_md_style *s,
	       const struct castfs_md_ct *q);

/*
 * castfs_md_ct_fp4 - whether quantization_config @qc is compressed-tensors
 * nvfp4-pack-quantized or mxfp4-pack-quantized weights in the presets'
 * form castfs dequantizes (qsrc_ct4.c): FP4 E2M1, symmetric, static,
 * tensor_group of 16 (NVFP4) or group of 32 (MXFP4), no activation
 * order, no sparsity, transform or KV-cache scheme. Pure; thread-safe.
 */
bool castfs_md_ct_fp4(const struct cJSON *qc);

struct castfs_md_gguf_src;
struct castfs_header;
struct castfs_gguf_deq;

/* The shards of a model folder as its GGUF builder reads them. */
struct castfs_md_gguf_deq {
	const struct castfs_header **h; /* [n]: bf16 view's header or stored */
	struct castfs_gguf_deq **g; /* [n]: a quantized shard's bf16 view */
	struct castfs_header **comp; /* [n]: composite headers (sharded) */
	size_t n, nquant;
};

/*
 * castfs_md_gguf_deq - every shard of @s as the GGUF builder reads it
 * (modeldir_gguf_deq.c): a quantized one as its bf16 view
 * (castfs_gguf_deq_new(); in sharded folders over the shard's composite
 * header, so FP8 scales in other shards are found and every offset is
 * the composite source's), a plain one as stored. @strict: config.json
 * declares a quantized layout (every F8 weight needs its scale). Returns
 * 0 (castfs_md_gguf_deq_fini() releases @q), -ENOTSUP for a layout the
 * GGUF quantisers do not read (@d says why), -EINVAL or -ENOMEM.
 */
int castfs_md_gguf_deq(const struct castfs_md_gguf_src *s, bool strict,
		       struct castfs_md_gguf_deq *q, struct castfs_diag *d);

/* castfs_md_gguf_deq_fini - release what castfs_md_gguf_deq() made;
 * safe on a zeroed struct. */
void castfs_md_gguf_deq_fini(struct castfs_md_gguf_deq *q);

#endif
