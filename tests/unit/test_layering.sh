#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/check-layering.sh must pass on the tree and fail on each planted
# violation of the layer rules (a copy of lib/ and fs/ is edited, never the
# tree itself).
set -eu
top=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
check=$top/scripts/check-layering.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fresh() {
	rm -rf "$tmp/t"
	mkdir -p "$tmp/t"
	cp -R "$top/lib" "$top/fs" "$tmp/t/"
}

# expect_fail WHAT FILE LINE: plant LINE at the top of FILE; the check
# must fail and name FILE.
expect_fail() {
	fresh
	f=$tmp/t/$2
	{ printf '%s\n' "$3"; cat "$f"; } >"$f.new" && mv "$f.new" "$f"
	if out=$(sh "$check" "$tmp/t" 2>&1); then
		echo "FAIL: $1 not caught"
		exit 1
	fi
	case $out in
	*"$2"*) echo "ok: $1" ;;
	*) echo "FAIL: $1 caught without naming $2: $out"; exit 1 ;;
	esac
}

fresh
sh "$check" "$tmp/t" || { echo "FAIL: the tree itself does not pass"; exit 1; }
echo "ok: the tree passes"

expect_fail "an upward include" lib/common/err.c '#include "ns/ns.h"'
expect_fail "an include from a layer above (plan -> view)" \
	lib/plan/plan_read.c '#include "view/view.h"'
expect_fail "another folder's private header" lib/view/view.c \
	'#include "plan/plan_internal.h"'
expect_fail "an include not spelled folder/file.h" lib/view/view.c \
	'#include "view.h"'
expect_fail "a FUSE header in lib/" lib/plan/plan.c '#include <fuse_lowlevel.h>'
expect_fail "a print in lib/" lib/plan/plan.c 'static void p(void) { printf("x"); }'
expect_fail "fs/ using a private header" fs/fs_ops.c \
	'#include "ns/ns_internal.h"'
expect_fail "a lower ns level using a higher one" lib/ns/ns_ckpt.c \
	'#include "ns/ns_kind_internal.h"'

fresh
echo '/* stray */' >"$tmp/t/lib/stray.c"
if sh "$check" "$tmp/t" >/dev/null 2>&1; then
	echo "FAIL: a file at the top of lib/ not caught"
	exit 1
fi
echo "ok: a file at the top of lib/"

fresh
echo '/* new */' >"$tmp/t/lib/ns/ns_new.c"
if sh "$check" "$tmp/t" >/dev/null 2>&1; then
	echo "FAIL: an ns/ file without a level not caught"
	exit 1
fi
echo "ok: an ns/ file without a level"
