#!/bin/sh
# SPDX-License-Identifier: MIT
# Format every C file with the project's .clang-format (kernel style,
# STYLE R9), or with --check only report the files that differ (exit 1).
set -eu
cd "$(dirname "$0")/.."
# Tracked files and new ones not yet added (but not ignored ones).
files=$(git ls-files --cached --others --exclude-standard 'lib/*.c' \
	'lib/*.h' 'fs/*.c' 'fs/*.h' 'tests/*.c' 'tests/*.h')
if [ "${1:-}" = "--check" ]; then
	bad=0
	for f in $files; do
		if ! clang-format "$f" | cmp -s - "$f"; then
			echo "not formatted: $f (run scripts/format.sh)"
			bad=1
		fi
	done
	exit $bad
fi
clang-format -i $files
