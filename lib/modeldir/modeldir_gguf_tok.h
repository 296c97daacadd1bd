/* SPDX-License-Identifier: MIT */
/*
 * The tokenizer part of the GGUF files of model directories
 * (modeldir_gguf_tok.c, modeldir_gguf_spec.c), for modeldir_gguf.c.
 * Private to modeldir/.
 */
#ifndef CASTFS_MODELDIR_GGUF_TOK_H
#define CASTFS_MODELDIR_GGUF_TOK_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "format/gguf.h"
#include "modeldir/modeldir.h"

/* The folder's files the tokenizer KVs are made of. Borrowed. */
struct castfs_md_tok_src {
	const cJSON *tok; /* tokenizer.json */
	const cJSON *tc; /* tokenizer_config.json, or NULL */
	const cJSON *cfg; /* config.json */
	const char *jinja; /* chat_template.jinja's bytes, or NULL */
	size_t jinja_len;
	const char *ct_json; /* chat_template.json's text, or NULL */
	size_t ct_json_len;
	const struct castfs_md_xtmpl *xtmpl; /* additional_chat_templates/ */
	size_t nxtmpl;
	const char *xtmpl_why; /* refuse if they are read, or NULL */
};

/*
 * castfs_md_gguf_tokenizer - write the tokenizer.* KVs of the files @in
 * for a vocabulary of @vocab_size ids to @w, as convert_hf_to_gguf.py
 * does. Returns 0, -EINVAL with the reason in @d (a tokenizer castfs
 * cannot map exactly) or -ENOMEM. Thread-safe.
 */
int castfs_md_gguf_tokenizer(struct castfs_gguf_w *w, uint32_t vocab_size,
			     const struct castfs_md_tok_src *in,
			     struct castfs_diag *d);

/*
 * castfs_md_gguf_special - the KVs gguf-py's SpecialVocab adds after the
 * merges: special token ids, add_* flags and chat template(s), from @in
 * (modeldir_gguf_spec.c). Returns 0, -EINVAL (@d says why) or -ENOMEM.
 * Thread-safe.
 */
int castfs_md_gguf_special(struct castfs_gguf_w *w,
			   const struct castfs_md_tok_src *in,
			   struct castfs_diag *d);

#endif
