#!/bin/sh
# SPDX-License-Identifier: MIT
# Mounting from /etc/fstab (docs/MOUNTING.md): the lines the manual gives,
# "castfs#SRC MNT fuse" and "SRC MNT fuse.castfs", through mount(8) and
# mount.fuse3(8), and mount.fuse3 run directly. mount(8) runs its helpers
# without our PATH, so the test runs in a private mount namespace where a
# directory holding castfs is bound over /usr/local/bin and a test fstab
# over /etc/fstab; nothing outside the namespace changes.
#
# castfs there is a wrapper (tests/fuse/fstab-reap.py) that starts the real
# binary, exactly as mount.fuse3 would, as a child subreaper: the daemon
# castfs detaches stays its child, and its exit status (a sanitizer report
# at exit, a crashed serving daemon the supervisor reports) is checked
# after every unmount.
set -eu

: "${CASTFS:=$(cd "$(dirname "$0")/../.." && pwd)/fs/castfs}"

if [ -z "${CASTFS_FSTAB_NS:-}" ]; then
	[ -c /dev/fuse ] && [ -r /dev/fuse ] && [ -w /dev/fuse ] || exit 77
	command -v fusermount3 >/dev/null || exit 77
	command -v mount.fuse3 >/dev/null || exit 77
	command -v python3 >/dev/null || exit 77
	[ "$(id -u)" = 0 ] || exit 77 # mount(8) with fstab lines needs root
	unshare --mount --propagation private true 2>/dev/null || exit 77
	CASTFS_FSTAB_NS=1 CASTFS="$CASTFS" exec unshare --mount \
		--propagation private sh "$0" "$@"
fi

tmp=$(mktemp -d)
mounted=""

cleanup() {
	for m in $mounted; do
		fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || :
	done
	umount /etc/fstab 2>/dev/null || :
	umount /usr/local/bin 2>/dev/null || :
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# A small checkpoint: w = [[1, 2], [3, 4]] as F32, metadata format=pt.
mkdir "$tmp/src" "$tmp/bin"
json='{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'
n=${#json}
pad=$(((8 - n % 8) % 8))
{
	printf "\\$(printf %03o $((n + pad)))\\000\\000\\000\\000\\000\\000\\000"
	printf '%s%*s' "$json" "$pad" ""
	printf '\000\000\200\077\000\000\000\100\000\000\100\100\000\000\200\100'
} >"$tmp/src/m.safetensors"
# The fp8 view, written here from the format's definitions (not by castfs):
# safetensors' layout of {"w": F8_E4M3 [2, 2]} and the e4m3fn encodings of
# 1, 2, 3, 4 (sign 0, exponent bias 7, 3 mantissa bits): 38 40 44 48.
json='{"__metadata__":{"format":"pt"},"w":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]}}'
n=${#json}
pad=$(((8 - n % 8) % 8))
{
	printf "\\$(printf %03o $((n + pad)))\\000\\000\\000\\000\\000\\000\\000"
	printf '%s%*s' "$json" "$pad" ""
	printf '\070\100\104\110'
} >"$tmp/oracle.fp8"

mkdir "$tmp/status"
{
	echo "#!$(command -v python3)"
	sed -e "s|@CASTFS@|$CASTFS|" -e "s|@STATUS@|$tmp/status|" \
		"$(dirname "$0")/fstab-reap.py"
} >"$tmp/bin/castfs"
chmod +x "$tmp/bin/castfs"
mount --bind "$tmp/bin" /usr/local/bin
cat >"$tmp/fstab" <<EOF
castfs#$tmp/src $tmp/m1 fuse ro,allow_other,views=fp8:bf16 0 0
$tmp/src $tmp/m2 fuse.castfs ro,allow_other,views=fp8:bf16 0 0
/usr/local/bin/castfs#$tmp/src $tmp/m3 fuse ro,noauto 0 0
EOF
mount --bind "$tmp/fstab" /etc/fstab

wait_mounted() {
	i=0
	until grep -q " $1 .* fuse.castfs " /proc/self/mountinfo; do
		i=$((i + 1))
		[ $i -lt 1500 ] || fail "$1 did not mount in 30 s"
		sleep 0.02
	done
}

# Every castfs started so far has ended (after the unmounts), each with
# its detached daemon exiting 0: one status file per start.
check_exits() {
	i=0
	while [ "$(ls "$tmp/status" | grep -c '\.done$')" -lt "$1" ]; do
		i=$((i + 1))
		[ $i -lt 3000 ] || fail "castfs daemons did not exit in 60 s"
		sleep 0.02
	done
	[ "$(ls "$tmp/status" | grep -c '\.done$')" -eq "$1" ] ||
		fail "more castfs starts than mounts"
	for f in "$tmp/status"/*.done; do
		grep -qv '^exit 0 ' "$f" && fail "castfs exit: $(cat "$f")"
		grep -q '^exit 0 ' "$f" || fail "castfs exit: nothing in $f"
	done
	:
}

# The mount answers, with the views and options of its fstab line.
check_mount() {
	cmp "$1/m.safetensors" "$tmp/src/m.safetensors" || fail "$1: source"
	cmp "$1/m.fp8.safetensors" "$tmp/oracle.fp8" || fail "$1: fp8 view"
	[ -d "$1/m.safetensors.tensors/w.npy" ] && fail "$1: tree"
	[ -f "$1/m.safetensors.tensors/w.npy" ] || fail "$1: tensor tree"
	grep -q '^castfs ' "$1/.castfs/version" || fail "$1: version"
	if [ "$2" = listed ]; then
		ls "$1" | grep -qx 'm.bf16.safetensors' || fail "$1: views="
		ls "$1" | grep -qx 'm.fp16.safetensors' && fail "$1: views="
	fi
	grep " $1 " /proc/self/mountinfo | grep -q ' ro[, ]' || fail "$1: not ro"
	:
}

for m in m1 m2 m3; do
	mkdir "$tmp/$m"
done
for m in m1 m2 m3; do
	mount "$tmp/$m" || fail "mount $tmp/$m (fstab)"
	mounted="$mounted $tmp/$m"
	wait_mounted "$tmp/$m"
done
check_mount "$tmp/m1" listed
check_mount "$tmp/m2" listed
check_mount "$tmp/m3" all
for m in m1 m2 m3; do
	umount "$tmp/$m" || fail "umount $tmp/$m"
done
mounted=""
check_exits 3

# mount(8) with the type on the command line, and mount.fuse3 directly.
mount -t fuse.castfs -o ro "$tmp/src" "$tmp/m1" || fail "mount -t fuse.castfs"
mounted="$tmp/m1"
PATH="$tmp/bin:$PATH" mount.fuse3 "castfs#$tmp/src" "$tmp/m2" -o ro ||
	fail "mount.fuse3 castfs#SRC"
mounted="$mounted $tmp/m2"
wait_mounted "$tmp/m1"
wait_mounted "$tmp/m2"
check_mount "$tmp/m1" all
check_mount "$tmp/m2" all
fusermount3 -u "$tmp/m1"
fusermount3 -u "$tmp/m2"
mounted=""
check_exits 5
echo "PASS: fstab and mount.fuse3 mounts"
