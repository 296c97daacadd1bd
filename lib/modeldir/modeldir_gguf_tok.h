/* SPDX-License-Identifier: MIT */
/*
 * The tokenizer part of the GGUF files of model directories
 * (modeldir_gguf_tok.c), for modeldir_gguf.c. Private to modeldir/.
 */
#ifndef CASTFS_MODELDIR_GGUF_TOK_H
#define CASTFS_MODELDIR_GGUF_TOK_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "common/err.h"
#include "format/gguf.h"

/*
 * castfs_md_gguf_tokenizer - write the tokenizer.ggml.* KVs of
 * tokenizer.json @tok (and tokenizer_config.json @tc, or NULL) for a
 * vocabulary of @vocab_size ids to @w, as convert_hf_to_gguf.py does.
 * @tok and @tc are borrowed. Returns 0, -EINVAL with the reason in @d (a
 * tokenizer castfs cannot map exactly) or -ENOMEM. Thread-safe.
 */
int castfs_md_gguf_tokenizer(struct castfs_gguf_w *w, uint32_t vocab_size,
			     const cJSON *tok, const cJSON *tc,
			     struct castfs_diag *d);

#endif
