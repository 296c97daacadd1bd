/* SPDX-License-Identifier: MIT */
/* Placeholders until the info and convert sub-commands land. */
#include <stdio.h>

#include "cli.h"

int castfs_cli_info(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "castfs info: not implemented yet\n");
	return 2;
}

int castfs_cli_convert(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "castfs convert: not implemented yet\n");
	return 2;
}
