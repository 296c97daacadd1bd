#!/bin/sh
# SPDX-License-Identifier: MIT
# The layer rules of docs/ARCHITECTURE.md made mechanical (STYLE R1/R2):
#  - lib/ has no .c or .h file at its top; every file is in a layer folder;
#  - a lib/ file includes only its own folder and the folders below it
#    (LAYERS, bottom first), always spelled "folder/file.h";
#  - a folder's *_internal.h is included only from its own folder;
#  - lib/ never includes FUSE headers, never prints or exits;
#  - fs/ includes no private lib header.
#
#   scripts/check-layering.sh [ROOT]     ROOT defaults to the source tree
set -eu
root=${1:-$(dirname "$0")/..}
cd "$root"

LAYERS="common format kernels quant plan view tensors modeldir ns"

rank() {
	i=0
	for l in $LAYERS; do
		[ "$l" = "$1" ] && { echo $i; return; }
		i=$((i + 1))
	done
	echo -1
}

bad=0
fail() {
	echo "check-layering: $*"
	bad=1
}

for f in lib/*.c lib/*.h; do
	[ -e "$f" ] && fail "$f: lib/ holds no file at its top; put it in a layer folder"
done

for f in $(find lib -name '*.[ch]' | sort); do
	dir=${f#lib/}
	dir=${dir%%/*}
	own=$(rank "$dir")
	[ "$own" -ge 0 ] || { fail "$f: folder lib/$dir is not a layer"; continue; }
	for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
		case $inc in
		*/*) ;;
		*) fail "$f: #include \"$inc\": spell it \"folder/file.h\""; continue ;;
		esac
		to=${inc%%/*}
		r=$(rank "$to")
		if [ "$r" -lt 0 ]; then
			fail "$f: #include \"$inc\": lib/$to is not a layer"
		elif [ "$r" -gt "$own" ]; then
			fail "$f: #include \"$inc\": $dir may not include $to (a layer above it)"
		fi
		case $inc in
		*_internal.h)
			[ "$to" = "$dir" ] ||
				fail "$f: #include \"$inc\": private to lib/$to" ;;
		esac
	done
done

if grep -rnE '#include[[:space:]]*[<"]fuse' lib; then
	fail "lib/ includes a FUSE header"
fi
if grep -rnE '\b(printf|puts|putchar|exit|_exit|abort)[[:space:]]*\(' \
	lib --include='*.c' | grep -vE 'snprintf|vsnprintf|//|^\S+:\s*\*'; then
	fail "lib/ prints or exits: return an error to the caller instead"
fi
if grep -rnE '#include[[:space:]]*"[^"]*_internal\.h"' fs; then
	fail "fs/ includes a private lib header"
fi
exit $bad
