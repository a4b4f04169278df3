#!/bin/sh
# Installs the real parts that the demo and the tests run, from Debian's packages:
# a standalone Glance, qemu-img and zstd; with "test", also diskimage-builder (it
# brings debootstrap; a debian-minimal build also runs sudo and mkfs.ext4 on the
# host). Does nothing when they are present.
#   usage: deps.sh [demo|test]
set -eu

missing=""
need() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
need glance-api glance-api
need glance-manage glance-api
need qemu-img qemu-utils
need zstd zstd
if [ "${1:-demo}" = test ]; then
	need disk-image-create python3-diskimage-builder
	need sudo sudo
	# mkfs.ext4 lives in sbin, which a non-root PATH may lack.
	[ -x /sbin/mkfs.ext4 ] || [ -x /usr/sbin/mkfs.ext4 ] || missing="$missing e2fsprogs"
fi

[ -z "$missing" ] && exit 0
pkgs=$(echo $missing | tr ' ' '\n' | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ]; then
	echo "missing packages:$missing" >&2
	echo "run as root, or: sudo apt-get install -y $pkgs" >&2
	exit 1
fi
echo "installing: $pkgs (a few minutes the first time)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q $pkgs
# Debian starts glance-api as a system service on install; the tests run their own.
if command -v systemctl >/dev/null 2>&1; then
	systemctl disable --now glance-api >/dev/null 2>&1 || true
fi
