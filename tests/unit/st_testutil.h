/* SPDX-License-Identifier: MIT */
/* Helpers shared by the test programs that parse headers. */
#ifndef CASTFS_ST_TESTUTIL_H
#define CASTFS_ST_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "format/st_header.h"
#include "testutil.h"

/* A tensor entry of a hand-written header. */
#define TJ(n, dt, sh, off)                               \
	"\"" n "\":{\"dtype\":\"" dt "\",\"shape\":[" sh \
	"],\"data_offsets\":[" off "]}"
#define SHAPE(...)                                                          \
	(uint32_t)(sizeof((uint64_t[]){ __VA_ARGS__ }) / sizeof(uint64_t)), \
		(uint64_t[])                                                \
	{                                                                   \
		__VA_ARGS__                                                 \
	}

/* Parse whole file @f (@len bytes); *@h is NULL on failure. */
int stt_parse(const uint8_t *f, size_t len, struct castfs_header **h,
	      struct castfs_diag *d);
/* The file must fail with @rc and a diagnostic holding @phrase. */
void stt_expect_bad_file(const uint8_t *f, size_t len, int rc,
			 const char *phrase);
/* The same for a file of header @json and @data_len zero bytes. */
void stt_expect_bad(const char *json, size_t json_len, size_t data_len, int rc,
		    const char *phrase);
/* Parse, asserting success. */
struct castfs_header *stt_parse_ok(const uint8_t *f, size_t len);
struct castfs_header *stt_parse_json_ok(const char *json, size_t data_len);
struct castfs_header *stt_build_ok(struct tu_st *b);
/* stt_build_ok(), then tu_st_free(@b): the builder is consumed. */
struct castfs_header *stt_build_take(struct tu_st *b);
/* The tensor @name, asserting it exists. */
const struct castfs_tensor *stt_find(const struct castfs_header *h,
				     const char *name);
struct castfs_qsrc;
/* The classification castfs_qsrc_scan() gave tensor @name of @h. */
const struct castfs_qinfo *stt_qinfo(const struct castfs_header *h,
				     const struct castfs_qsrc *q,
				     const char *name);
/* Offsets contiguous and by_name sorted bytewise. */
void stt_check_sorted(const struct castfs_header *h);

/*
 * The worked example of reference/FORMATS.md §1.4 as the official writer
 * lays it out (a:F32[2,2], s:F32[], b:BF16[3], w:F8_E4M3[2,3], metadata
 * format=pt): its 264 header bytes and its 8-byte length prefix.
 */
extern const char worked_json[265];
extern const uint8_t worked_prefix[8];

#endif
