/* SPDX-License-Identifier: MIT */
/* What every fuzz target shares: the libFuzzer entry point and a check
 * that aborts (a crash the fuzzer records) when an oracle disagrees. */
#ifndef CASTFS_FUZZ_H
#define CASTFS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                       \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                              \
			abort();                                               \
		}                                                              \
	} while (0)

#endif
