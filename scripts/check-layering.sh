#!/bin/sh
# SPDX-License-Identifier: MIT
# The layer rules of docs/ARCHITECTURE.md made mechanical (STYLE R1/R2):
#  - lib/ has no .c or .h file at its top; every file is in a layer folder;
#  - a lib/ file includes only its own folder and the folders below it
#    (LAYERS, bottom first), always spelled "folder/file.h";
#  - a folder's *_internal.h is included only from its own folder;
#  - inside ns/, a file includes only the private headers of its level and
#    the levels below it (NS_LEVELS: node, source, checkpoint cache, open
#    files, kinds, facade), and every ns/*.c has a level;
#  - lib/ never includes FUSE headers, never prints or exits;
#  - fs/ includes no private lib header.
#
#   scripts/check-layering.sh [ROOT]     ROOT defaults to the source tree
set -eu
root=${1:-$(dirname "$0")/..}
cd "$root"

LAYERS="common source format kernels quant plan view tensors modeldir ns"

# The owner order inside ns/, bottom first: "level:file ..." for the
# private headers (what a level offers) and for the .c files (who uses it).
NS_HEADERS="1:ns_internal.h 2:ns_src_internal.h 3:ns_ckpt_internal.h
4:ns_file_internal.h 5:ns_kind_internal.h 5:ns_modeldir_internal.h"
NS_FILES="1:ns_node.c 1:ns_live.c 1:ns_dircache.c 1:ns_dirshare.c 1:stats.c 2:ns_src.c 2:ns_src_link.c 2:ns_pack_src.c 2:ns_mdtext.c 3:ns_ckpt.c 3:ns_ckpt_lru.c 3:ns_mdconfig.c 4:ns_file.c
5:ns_tree.c 5:ns_tensors.c 5:ns_ctl.c 5:ns_ctlshare.c 5:ns_modeldir.c 5:ns_mdjson.c
5:ns_mdplan.c 5:ns_packed.c 5:ns_mdindex.c 5:ns_mdgguf.c 5:ns_mdgguf_shards.c 5:ns_mdxshard.c 6:ns.c
6:ns_resolve.c 6:ns_rescan.c 2:ns_snap.c"

# level_of NAME LIST: the level LIST gives NAME, or nothing.
level_of() {
	for e in $2; do
		[ "${e#*:}" = "$1" ] && { echo "${e%%:*}"; return 0; }
	done
	return 0
}

rank() {
	i=0
	for l in $LAYERS; do
		[ "$l" = "$1" ] && { echo $i; return 0; }
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

for f in lib/ns/*.c lib/ns/*.h; do
	[ -e "$f" ] || continue
	base=${f##*/}
	case $base in
	*.c) own=$(level_of "$base" "$NS_FILES") ;;
	*) own=$(level_of "$base" "$NS_HEADERS") ;;
	esac
	case $base in ns.h | stats.h) continue ;; esac
	[ -n "$own" ] || { fail "$f: no level in NS_FILES/NS_HEADERS"; continue; }
	for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"ns\/\([^"]*\)".*/\1/p' "$f"); do
		r=$(level_of "$inc" "$NS_HEADERS")
		[ -n "$r" ] || continue
		[ "$r" -le "$own" ] ||
			fail "$f: #include \"ns/$inc\": level $own may not use level $r"
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
