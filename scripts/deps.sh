#!/bin/sh
# Installs the real parts that the demo and the tests run, from Debian's packages:
# a standalone Glance, qemu-img and zstd; with "test", also diskimage-builder (it
# brings debootstrap; a debian-minimal build also runs sudo and mkfs.ext4 on the
# host), ZooKeeper (the tests run its jars with java, not the service), kazoo
# for /usr/bin/python3 (an independent ZooKeeper client for the tests), the
# Python packages nodepool 10's own code in third_party/nodepool needs under
# /usr/bin/python3 (the tests run its config validation and loading, and its
# nodepool-builder, to check ours against the real thing), and gearmand with
# the gearman and gearadmin commands (the tests run their own gearmand, not the
# service, and use the commands as an independent client),
# systemd-analyze, which checks the example systemd unit, Keystone with the
# uwsgi that serves it (the tests run their own on a loopback port, not the service),
# and the mosquitto MQTT broker with mosquitto_pub (the tests run their own broker,
# not the service, and publish with the command as an independent client),
# logrotate, which checks the example that rotates the cron example's log,
# lintian, which checks the Debian package, and podman with runc and
# mmdebstrap, which build and run the image (mmdebstrap makes its Debian base
# where no registry is reachable); podman's containers.conf gets the setting it
# needs to run containers here (see the end).
# Does nothing when they are present. Of the services Debian starts when it
# installs them, it stops and disables only those it installed itself.
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
	# internal/testenv runs the jar with java itself; the service stays off (below).
	[ -r /usr/share/java/zookeeper.jar ] || missing="$missing zookeeperd"
	need java default-jre-headless
	# Debian's kazoo is importable only by Debian's python, not a pyenv or venv one.
	/usr/bin/python3 -c 'import kazoo.client' >/dev/null 2>&1 || missing="$missing python3-kazoo"
	# nodepool's own code (third_party/nodepool), run by /usr/bin/python3 too: its
	# config (yaml, voluptuous), its builder command (daemon, extras, statsd; pbr and
	# pkg_resources for its version) and openstack driver (openstacksdk). Loading a
	# config imports every driver, so every driver's SDK is needed: paramiko and
	# cachetools (their shared state machine), boto3 (aws), requests (azure),
	# googleapiclient (gce), kubernetes (kubernetes, openshiftpods), openshift.
	for m in yaml:python3-yaml voluptuous:python3-voluptuous openstack:python3-openstacksdk \
		daemon:python3-daemon extras:python3-extras statsd:python3-statsd \
		pbr.version:python3-pbr pkg_resources:python3-pkg-resources \
		paramiko:python3-paramiko cachetools:python3-cachetools boto3:python3-boto3 \
		requests:python3-requests googleapiclient.discovery:python3-googleapi \
		kubernetes.client:python3-kubernetes openshift.dynamic:python3-openshift; do
		/usr/bin/python3 -c "import ${m%%:*}" >/dev/null 2>&1 || missing="$missing ${m#*:}"
	done
	# gearmand lives in sbin too; internal/testenv runs it, the service stays off.
	[ -x /usr/sbin/gearmand ] || missing="$missing gearman-job-server"
	need gearman gearman-tools
	# systemd-analyze checks the example systemd unit and its sandboxing.
	need systemd-analyze systemd
	# internal/testenv serves Debian's Keystone with uwsgi itself; the service stays off.
	need keystone-manage keystone
	[ -x /usr/bin/keystone-wsgi-public ] || missing="$missing keystone"
	need uwsgi uwsgi-core
	[ -r /usr/lib/uwsgi/plugins/python3_plugin.so ] || missing="$missing uwsgi-plugin-python3"
	# mosquitto lives in sbin; internal/testenv runs it, the service stays off.
	[ -x /usr/sbin/mosquitto ] || missing="$missing mosquitto"
	need mosquitto_pub mosquitto-clients
	# A real browser renders the status page once (fonts so that it shows text).
	need chromium chromium
	# The logrotate example is rotated by the real thing (the tests give it a
	# state file of their own; the host's rotations are not touched).
	need logrotate logrotate
	# make package-test: the package's checker (dpkg-deb builds it; sudo's
	# visudo checks its sudoers drop-in).
	need lintian lintian
	# make package-test: the image. Debian's podman 4.3 runs containers here
	# only with runc (crun: "cgroups in hybrid mode not supported").
	need podman podman
	need runc runc
	need mmdebstrap mmdebstrap
	[ -d /usr/share/fonts/truetype/dejavu ] || missing="$missing fonts-dejavu-core"
fi

# podman_ulimits makes podman start containers here: with Debian's default
# ulimits (nofile 1048576) setrlimit is refused. It adds default_ulimits = []
# to the [containers] table of /etc/containers/containers.conf, creating the
# file or the table when missing, and leaves the file as it is when it sets
# default_ulimits already.
podman_ulimits() {
	conf=/etc/containers/containers.conf
	if [ -f "$conf" ] && awk '/^[ \t]*\[/ { t = $0 } t ~ /^[ \t]*\[containers\]/ && /^[ \t]*default_ulimits[ \t]*=/ { f = 1 } END { exit !f }' "$conf"; then
		return 0
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "podman needs default_ulimits = [] under [containers] in $conf: run as root" >&2
		return 1
	fi
	echo "adding default_ulimits = [] under [containers] in $conf"
	if [ -f "$conf" ] && grep -q '^[[:space:]]*\[containers\][[:space:]]*$' "$conf"; then
		new=$(awk '{ print } !d && /^[ \t]*\[containers\][ \t]*$/ { print "default_ulimits = []"; d = 1 }' "$conf")
		printf '%s\n' "$new" >"$conf"
	else
		mkdir -p /etc/containers
		printf '[containers]\ndefault_ulimits = []\n' >>"$conf"
	fi
}

if [ -z "$missing" ]; then
	[ "${1:-demo}" = test ] && podman_ulimits
	exit 0
fi
pkgs=$(echo $missing | tr ' ' '\n' | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ]; then
	echo "missing packages:$missing" >&2
	echo "run as root, or: sudo apt-get install -y $pkgs" >&2
	exit 1
fi
# Debian starts glance-api, ZooKeeper (on port 2181), gearmand (on port 4730),
# Keystone (on port 5000), mosquitto (on port 1883) and the memcached that
# glance-api pulls in as system services when it installs them; the demo and the tests run their own. Those
# this run installs are stopped and disabled again below. Those installed before it are someone's
# services, which may be in use: they are left as they are.
services="glance-api:glance-api zookeeper:zookeeperd gearman-job-server:gearman-job-server keystone:keystone mosquitto:mosquitto memcached:memcached"
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
had=""
for s in $services; do
	installed "${s#*:}" && had="$had ${s#*:}"
done

echo "installing: $pkgs (a few minutes the first time)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q $pkgs

# Where systemd is not running (a container), systemctl cannot stop a
# service, so its init script does.
for s in $services; do
	svc=${s%%:*} pkg=${s#*:}
	case " $had " in *" $pkg "*) continue ;; esac
	installed "$pkg" || continue
	echo "stopping and disabling $svc, which this run installed ($pkg) and so started"
	if command -v systemctl >/dev/null 2>&1 &&
		systemctl disable --now "$svc" >/dev/null 2>&1; then
		continue
	fi
	if [ -x "/etc/init.d/$svc" ]; then
		"/etc/init.d/$svc" stop >/dev/null 2>&1 || true
		update-rc.d "$svc" disable >/dev/null 2>&1 || true
	fi
done
[ "${1:-demo}" = test ] && podman_ulimits
exit 0
