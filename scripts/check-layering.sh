#!/bin/sh
# SPDX-License-Identifier: MIT
# The layering rules of STYLE R1/R2, made mechanical: lib/ never includes
# FUSE headers, never prints or exits; fs/ includes no private lib header.
set -eu
cd "$(dirname "$0")/.."
bad=0
if grep -rnE '#include[[:space:]]*[<"]fuse' lib; then
	echo "lib/ includes a FUSE header"
	bad=1
fi
if grep -rnE '\b(printf|puts|putchar|exit|_exit|abort)[[:space:]]*\(' \
	lib --include='*.c' | grep -vE 'snprintf|vsnprintf|//|^\S+:\s*\*'; then
	echo "lib/ prints or exits: return an error to the caller instead"
	bad=1
fi
if grep -rnE '#include[[:space:]]*"[^"]*_internal\.h"' fs; then
	echo "fs/ includes a private lib header"
	bad=1
fi
exit $bad
