#!/bin/sh
# Runs tests COUNT times under the race detector while busy processes keep all
# CPUs but one loaded (one on a single CPU), to find tests that pass only when
# the machine is idle: a sleep used as synchronisation, a polling window, a
# deadline too short for a loaded machine. The load starts before the tests and
# stops when they end, fail or are interrupted. -short leaves out the tests that
# take minutes (the real DIB build, a 256 MiB download); the timeout grows with
# COUNT, since a loaded machine runs each pass slower.
#   usage: stress.sh COUNT PACKAGE...
set -u

if [ $# -lt 2 ]; then
	echo "usage: stress.sh COUNT PACKAGE..." >&2
	exit 2
fi
count=$1
shift
case $count in
'' | *[!0-9]* | 0)
	echo "stress.sh: COUNT must be a positive number, not \"$count\"" >&2
	exit 2
	;;
esac
go=${GO:-go}

cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null) || cpus=1
case $cpus in '' | *[!0-9]*) cpus=1 ;; esac
busy=$((cpus - 1))
[ "$busy" -ge 1 ] || busy=1

pids=""
stop() {
	for pid in $pids; do
		kill "$pid" 2>/dev/null
	done
	pids=""
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM HUP

i=0
while [ "$i" -lt "$busy" ]; do
	# A background job of a script ignores SIGINT; stop ends it.
	(while :; do :; done) &
	pids="$pids $!"
	i=$((i + 1))
done

echo "stress: $busy busy process(es) on $cpus CPU(s), each package's tests $count times"
start=$(date +%s)
"$go" test -race -short -count="$count" -timeout "$((count * 5 + 5))m" "$@"
rc=$?
stop
echo "stress: go test exited $rc after $(($(date +%s) - start)) s"
exit "$rc"
