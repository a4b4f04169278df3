#!/bin/sh
# Builds the Debian package from a built binary with dpkg-deb: a control tree
# of packaging/debian, the example unit with the installed paths, the example
# configs and the docs. Prints the package's path.
#   usage: deb.sh VERSION ARCH BINARY OUTDIR
set -eu
[ $# -eq 4 ] || { echo "usage: deb.sh VERSION ARCH BINARY OUTDIR" >&2; exit 2; }
version=$1 arch=$2 binary=$3 out=$4
[ -n "$version" ] || { echo "deb.sh: no version: build from a git checkout, or set VERSION" >&2; exit 2; }
src=packaging/debian
doc=usr/share/doc/nodepool-builder

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
# Files are root's and world-readable whatever the umask and the checkout's modes.
umask 022

install -D -m 0755 "$binary" "$root/usr/bin/nodepool-builder"

# The example unit, running the installed binary, writing under /var/lib/nodepool
# and /var/log/nodepool, both made by the package; and the drop-in a builder of
# diskimages links beside it, kept in step with the unit by upgrades. The copy
# among the examples is the same file, so that it runs what the package installs.
unit=$root/lib/systemd/system/nodepool-builder.service
install -d "$root/lib/systemd/system"
sed -e 's|/usr/local/bin/nodepool-builder|/usr/bin/nodepool-builder|' \
	-e 's|^# Install: cp .*|# The package installs this unit as /lib/systemd/system/nodepool-builder.service;\n# change it with a drop-in in /etc/systemd/system/nodepool-builder.service.d/.|' \
	examples/nodepool-builder.service >"$unit"
chmod 0644 "$unit"
install -D -m 0644 examples/dib.conf "$root/usr/share/nodepool-builder/dib.conf"

# /etc/nodepool is given to root:nodepool, 0750, by postinst, once the group exists.
install -d -m 0755 "$root/etc/nodepool" "$root/etc/sudoers.d"
install -m 0440 "$src/sudoers" "$root/etc/sudoers.d/nodepool-builder"
install -d -m 0755 "$root/var/lib/nodepool" "$root/var/log/nodepool"

install -d "$root/$doc/examples/cron.d" "$root/$doc/examples/logrotate.d"
install -m 0644 examples/nodepool.yaml examples/nodepool-builder.yaml "$unit" "$root/$doc/examples/"
sed 's|/usr/local/bin/nodepool-builder|/usr/bin/nodepool-builder|' examples/cron.d/nodepool-builder >"$root/$doc/examples/cron.d/nodepool-builder"
chmod 0644 "$root/$doc/examples/cron.d/nodepool-builder"
install -m 0644 examples/logrotate.d/nodepool-builder "$root/$doc/examples/logrotate.d/"
install -m 0644 "$src/copyright" "$root/$doc/copyright"
gzip -9n <README.md >"$root/$doc/README.md.gz"
gzip -9n <CHANGELOG.md >"$root/$doc/CHANGELOG.md.gz"
install -d "$root/$doc/docs"
for page in docs/*.md; do
	gzip -9n <"$page" >"$root/$doc/docs/${page#docs/}.gz"
done
# A native package's changelog: this version, dated as its commit.
{
	echo "nodepool-builder ($version) unstable; urgency=medium"
	echo
	echo "  * Built from commit $(git rev-parse HEAD 2>/dev/null || echo unknown)."
	echo
	echo " -- $(sed -n 's/^Maintainer: //p' "$src/control")  $(git log -1 --format=%aD HEAD 2>/dev/null || date -R)"
} | gzip -9n >"$root/$doc/changelog.gz"
chmod 0644 "$root/$doc/README.md.gz" "$root/$doc/CHANGELOG.md.gz" "$root/$doc/changelog.gz" "$root/$doc"/docs/*.gz

install -d "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" "$src/control" >"$root/DEBIAN/control"
echo /etc/sudoers.d/nodepool-builder >"$root/DEBIAN/conffiles"
install -m 0755 "$src/postinst" "$src/prerm" "$src/postrm" "$root/DEBIAN/"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles"

mkdir -p "$out"
deb="$out/nodepool-builder_${version}_$arch.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
