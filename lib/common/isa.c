/* SPDX-License-Identifier: MIT */
/* The ISA names and the CASTFS_ISA override: see isa.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/isa.h"

static const char *const isa_names[CASTFS_ISA_COUNT] = {
	[CASTFS_ISA_SCALAR] = "scalar",
	[CASTFS_ISA_AVX2] = "avx2",
	[CASTFS_ISA_AVX512] = "avx512",
};

/* Written once, under forced_once, then only read. */
static pthread_once_t forced_once = PTHREAD_ONCE_INIT;
static enum castfs_isa forced = CASTFS_ISA_COUNT;

const char *castfs_isa_name(enum castfs_isa isa)
{
	if ((unsigned)isa >= CASTFS_ISA_COUNT)
		return NULL;
	return isa_names[isa];
}

enum castfs_isa castfs_isa_from_name(const char *name)
{
	for (int i = 0; i < CASTFS_ISA_COUNT; i++) {
		if (name && strcmp(name, isa_names[i]) == 0)
			return (enum castfs_isa)i;
	}
	return CASTFS_ISA_COUNT;
}

static void forced_read(void)
{
	forced = castfs_isa_from_name(getenv("CASTFS_ISA"));
}

enum castfs_isa castfs_isa_forced(void)
{
	pthread_once(&forced_once, forced_read);
	return forced;
}

bool castfs_isa_allows(enum castfs_isa level)
{
	return level <= castfs_isa_forced();
}
