/* SPDX-License-Identifier: MIT */
/*
 * Test helpers: an in-memory safetensors builder that writes its own JSON
 * (independent of castfs_header_emit(), so it can check it), helpers for
 * deliberately broken files, a small PRNG and file loading.
 */
#ifndef CASTFS_TESTUTIL_H
#define CASTFS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "common/reader.h"
#include "format/st_header.h"
#include "view/view.h"

/* Where tensor data goes in the buffer. */
enum tu_layout {
	TU_LAYOUT_WRITER, /* as safetensors writes: dtype descending, name */
	TU_LAYOUT_ADDED, /* in the order of tu_st_add*() calls */
};

/* In which order tensor keys appear in the JSON. */
enum tu_key_order {
	TU_KEYS_DATA, /* data order (what the writer does) */
	TU_KEYS_REVERSE, /* reverse data order */
	TU_KEYS_SHUFFLE, /* shuffled with opts.seed */
};

struct tu_st_opts {
	enum tu_layout layout;
	enum tu_key_order keys;
	uint64_t seed;
	bool pretty; /* a space and newline around every token */
	bool meta_last; /* "__metadata__" after the tensors */
	bool fields_reversed; /* data_offsets, shape, dtype */
	unsigned align; /* pad the header to a multiple of this; 0 = 8 */
	char pad_byte; /* 0 = ' ' */
	size_t extra_pad; /* pad bytes beyond the alignment */
	const char *lead; /* bytes written before '{' (NULL: none) */
	size_t trailing; /* garbage bytes appended after the data */
};

/* Fill @n bytes of tensor data at @dst. */
typedef void (*tu_fill_fn)(uint8_t *dst, size_t n, void *ctx);

#define TU_NBYTES_AUTO SIZE_MAX

struct tu_st;

/* tu_st_new - an empty builder (default options); aborts on ENOMEM. */
struct tu_st *tu_st_new(void);
void tu_st_free(struct tu_st *b);
void tu_st_set_opts(struct tu_st *b, const struct tu_st_opts *o);

/*
 * tu_st_add_n - add a tensor; returns its index.
 * @dtype: any string (unknown names are written as given).
 * @data: @nbytes bytes, copied; NULL fills a deterministic pattern.
 * @nbytes: TU_NBYTES_AUTO computes shape x bits / 8 (0 for unknown dtypes).
 */
size_t tu_st_add_n(struct tu_st *b, const char *name, size_t name_len,
		   const char *dtype, uint32_t ndim, const uint64_t *shape,
		   const void *data, size_t nbytes);
/* tu_st_add - the same with a NUL-terminated name and automatic size. */
size_t tu_st_add(struct tu_st *b, const char *name, const char *dtype,
		 uint32_t ndim, const uint64_t *shape, const void *data);
/* tu_st_add_fill - automatic size, bytes from @fill. */
size_t tu_st_add_fill(struct tu_st *b, const char *name, const char *dtype,
		      uint32_t ndim, const uint64_t *shape, tu_fill_fn fill,
		      void *ctx);
/* tu_st_extra - raw JSON members written first in tensor @i's object,
 * e.g. "\"x\":[1,{\"y\":\"z\"}]". */
void tu_st_extra(struct tu_st *b, size_t i, const char *json);
/* tu_st_offsets - force tensor @i's data_offsets (the data is unchanged). */
void tu_st_offsets(struct tu_st *b, size_t i, uint64_t begin, uint64_t end);

/* Metadata: any call makes "__metadata__" an object (written in call order);
 * tu_st_meta_null() writes "__metadata__":null instead. */
void tu_st_meta_n(struct tu_st *b, const char *key, size_t key_len,
		  const char *value, size_t value_len);
void tu_st_meta(struct tu_st *b, const char *key, const char *value);
void tu_st_meta_null(struct tu_st *b);

/* tu_st_build - the file bytes (malloc'ed, caller frees) and their length. */
uint8_t *tu_st_build(struct tu_st *b, size_t *len);
/* Layout of the last build: tensor @i's data bytes and offsets. */
const uint8_t *tu_st_data(const struct tu_st *b, size_t i, size_t *nbytes);
void tu_st_layout(const struct tu_st *b, size_t i, uint64_t *begin,
		  uint64_t *end);

/* Broken files. tu_raw - 8-byte length (@claim, or @json_len when @claim
 * is UINT64_MAX), @json_len bytes of @json, then @data_len zero bytes. */
uint8_t *tu_raw(const void *json, size_t json_len, uint64_t claim,
		size_t data_len, size_t *len);
/* tu_raw_str - tu_raw() of a C string with its real length. */
uint8_t *tu_raw_str(const char *json, size_t data_len, size_t *len);

/* A JSON string literal of @n bytes, quotes included, independent of the
 * emitter (C0 as uppercase \u00XX); malloc'ed. */
char *tu_json_str(const char *s, size_t n);

/* splitmix64 */
uint64_t tu_rand(uint64_t *state);

/* tu_read_file - whole file, malloc'ed (NULL on error; *len set). */
uint8_t *tu_read_file(const char *path, size_t *len);

/* tu_pattern - the default fill: byte i = f(seed, i). */
void tu_pattern(uint8_t *dst, size_t n, void *seed);

/* tu_write_file - write @len bytes of @data to @dir/@name; aborts on
 * failure (a test's setup cannot go on without it). */
void tu_write_file(const char *dir, const char *name, const void *data,
		   size_t len);

/*
 * A checkpoint in memory, parsed, with the built-in views, a reader over
 * it and a scratch: what the plan tests start from. tu_fixture_init takes
 * ownership of @file (malloc'ed) and aborts if it does not parse.
 */
struct tu_fixture {
	uint8_t *file;
	size_t file_len;
	struct castfs_header *h;
	struct castfs_mem_reader mr;
	struct castfs_views views;
	struct castfs_scratch s;
};

void tu_fixture_init(struct tu_fixture *fx, uint8_t *file, size_t len);
void tu_fixture_fini(struct tu_fixture *fx);
/* The plan of built-in view @name over @fx (caller frees with
 * castfs_plan_free()); the test fails if it cannot be built. */
struct castfs_plan *tu_fixture_plan(const struct tu_fixture *fx,
				    const char *name);
/* The whole output of @p read in one call with scratch @s (malloc'ed,
 * p->size bytes); the test fails on a short or failed read. */
uint8_t *tu_fixture_read_all(struct tu_fixture *fx, const struct castfs_plan *p,
			     struct castfs_scratch *s);

#endif
