/* SPDX-License-Identifier: MIT */
/* Compiler helpers shared by every module of libcastfs. */
#ifndef CASTFS_COMPILER_H
#define CASTFS_COMPILER_H

#define CASTFS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CASTFS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CASTFS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define CASTFS_LIKELY(x) __builtin_expect(!!(x), 1)
#define CASTFS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CASTFS_UNUSED __attribute__((unused))
#define CASTFS_PRINTF(f, a) __attribute__((format(printf, f, a)))

#endif
