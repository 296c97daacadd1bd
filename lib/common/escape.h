/* SPDX-License-Identifier: MIT */
/*
 * Names from the source tree (file names, paths, reasons that quote them)
 * made safe for JSON and for log lines: valid UTF-8 with no control
 * character, reversibly.
 */
#ifndef CASTFS_ESCAPE_H
#define CASTFS_ESCAPE_H

#include <stdbool.h>
#include <stddef.h>

/*
 * castfs_utf8_len - the length of the well-formed UTF-8 sequence at @s
 * (@n bytes left, @n >= 1), or 0 if the byte at @s does not start one
 * (Unicode Table 3-7: no overlongs, surrogates or code points past
 * U+10FFFF, as Python's and Rust's decoders). Pure.
 */
size_t castfs_utf8_len(const void *s, size_t n);

/* castfs_utf8_bad - the offset of the first byte of @s (@n bytes) that is
 * not well-formed UTF-8, or @n. Pure. */
size_t castfs_utf8_bad(const void *s, size_t n);

/* castfs_json_skip_ws - the first offset of @s (@n bytes) at or after @i
 * that is not JSON whitespace (space, tab, LF, CR: what Python's
 * json.loads and serde_json allow around a value), or @n. Pure. */
size_t castfs_json_skip_ws(const void *s, size_t n, size_t i);

/*
 * castfs_json_values - an upper bound on the values a JSON parser makes of
 * @s (@n bytes): one, and one for each '[', '{' and ',' outside strings.
 * Counting stops once it passes @stop, so a caller asks cheaply whether a
 * text is over a cap before a tree parser (cJSON: ~80 bytes a value) costs
 * forty times the text's size. Pure.
 */
size_t castfs_json_values(const void *s, size_t n, size_t stop);

/*
 * castfs_escape_next - the length of the character at @s (@n >= 1 bytes
 * left: a well-formed UTF-8 sequence, or 1 for a byte that starts none),
 * and in *@esc whether castfs_escape_buf() writes it as escapes, so that
 * a printer with quoting rules of its own escapes the same characters.
 * Pure.
 */
size_t castfs_escape_next(const char *s, size_t n, bool *esc);

/*
 * castfs_escape_buf - @s (@n bytes) into @dst (@cap bytes, NUL-terminated)
 * as valid UTF-8 without control characters. Written as "\xHH" (two
 * lower-case hex digits): every byte that is not part of a well-formed
 * UTF-8 sequence (Unicode Table 3-7), the C0 controls 0x00-0x1f (newline
 * included), DEL 0x7f, both bytes of a C1 control (U+0080-U+009F, which
 * terminals obey too) and the backslash itself, so the raw bytes are
 * recovered by replacing each "\xHH" with the byte HH. Everything else is
 * copied. Output that does not fit is cut at a whole character or
 * escape. Returns the length written (without the NUL); @cap must be at
 * least 1. Pure; thread-safe.
 */
size_t castfs_escape_buf(char *dst, size_t cap, const char *s, size_t n);

/*
 * castfs_escape - castfs_escape_buf() into a malloc'ed string the caller
 * frees (at most 4 * @n + 1 bytes). NULL on -ENOMEM. Thread-safe.
 */
char *castfs_escape(const char *s, size_t n);

/*
 * castfs_escape_text_buf - castfs_escape_buf() for a message (a reason,
 * a log line) whose names were escaped where they were quoted (with
 * castfs_escape() or the parser's \xHH quoting): the same bytes are
 * written as \xHH but the backslash, which is copied, so those escapes
 * are not escaped a second time. Raw bytes a message quotes unescaped
 * still come out as valid UTF-8 without control characters; applied to
 * its own output it changes nothing. Pure; thread-safe.
 */
size_t castfs_escape_text_buf(char *dst, size_t cap, const char *s, size_t n);

/*
 * castfs_escape_text - castfs_escape_text_buf() into a malloc'ed string
 * the caller frees (at most 4 * @n + 1 bytes). NULL on -ENOMEM.
 * Thread-safe.
 */
char *castfs_escape_text(const char *s, size_t n);

#endif
