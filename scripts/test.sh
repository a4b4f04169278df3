#!/bin/sh
# Runs every test under the race detector in two go test processes at once:
# the longest end-to-end tests of cmd/nodepool-builder in one, everything else
# in the other. Those tests spend most of their time waiting on the real parts
# they start (daemons, ZooKeeper, Glance), and the tests of one package run one
# after another, so two processes finish the suite in about half the time. The
# second process's output is printed once it ends; the run fails if either does.
#   usage: test.sh GO_TEST_FLAGS...   (e.g. -race -count=1 -timeout 40m)
set -u
go=${GO:-go}

# The longest tests of cmd/nodepool-builder, half a minute to several minutes
# each on a 2-core machine under -race: chosen so that the two processes end
# at about the same time.
long='^(TestPythonBuilderBesideOurs|TestPythonBuilderWithoutTheDeclaration|TestKill9|TestZooKeeperChaos|TestZooKeeperBesideAnotherBuilder|TestDaemonUploadsOnceGlanceIsBack|TestZooKeeperTwoHosts|TestZooKeeperRestartDuringUploads|TestGearmanFunctions|TestDaemonReloadsConfig|TestImageStateGauges|TestOnceZuulAndDIBImagesWithPostUploadHook)$'

out=$(mktemp) || exit 1
pid=""
stop() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	rm -f "$out"
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM HUP

"$go" test "$@" -run "$long" ./cmd/nodepool-builder/ >"$out" 2>&1 &
pid=$!
"$go" test "$@" -skip "$long" ./...
rest=$?
wait "$pid"
longest=$?
pid=""
echo "--- the longest tests of cmd/nodepool-builder:"
cat "$out"
if [ "$rest" -ne 0 ] || [ "$longest" -ne 0 ]; then
	exit 1
fi
