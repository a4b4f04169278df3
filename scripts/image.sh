#!/bin/sh
# Builds the image NAME (and nodepool-builder:latest) from the Containerfile
# with podman. Its base, Debian's image, is the local one when there is one,
# else pulled from the registry, else, where no registry answers, made from
# Debian's packages with mmdebstrap and imported under the same name, so that
# the same Containerfile builds offline. podman keeps the base and the
# Containerfile's layers, so only the first build takes minutes.
#   usage: image.sh VERSION NAME [PODMAN-BUILD-FLAGS...]
#   e.g.   image.sh 1.2.3+git4.gabcdef1 nodepool-builder:1.2.3-git4.gabcdef1 --no-cache
# (--no-cache takes Debian's updates, which the kept layers would not).
# PODMAN_RUNTIME (default runc) is the OCI runtime podman runs the build with.
set -eu
[ $# -ge 2 ] && [ -n "$1" ] || { echo "usage: image.sh VERSION NAME [PODMAN-BUILD-FLAGS...] (build from a git checkout, or set VERSION)" >&2; exit 2; }
version=$1 name=$2
shift 2
base=docker.io/library/debian:bookworm
suite=bookworm
podman() { command podman --runtime "${PODMAN_RUNTIME:-runc}" "$@"; }

if ! podman image exists "$base" && ! podman pull -q "$base" >/dev/null 2>&1; then
	echo "image.sh: $base is neither here nor pullable: making it from Debian's packages with mmdebstrap"
	command -v mmdebstrap >/dev/null || { echo "image.sh: mmdebstrap is missing: apt-get install mmdebstrap (or make deps-test)" >&2; exit 1; }
	tar=$(mktemp)
	trap 'rm -f "$tar"' EXIT
	# minbase, as Debian's own image: essential packages and apt; the mirror
	# is Debian's, as there.
	mmdebstrap --quiet --variant=minbase --format=tar "$suite" "$tar"
	podman import --change 'CMD ["bash"]' --message "mmdebstrap --variant=minbase $suite" "$tar" "$base" >/dev/null
fi

# --network=host: apt reaches the mirror the host reaches, without a bridge.
podman build --network=host --build-arg "BASE=$base" --build-arg "VERSION=$version" \
	-t "$name" -t nodepool-builder:latest "$@" -f Containerfile .
