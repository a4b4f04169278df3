#!/bin/sh
# Prints the version of the checkout in the form Debian's tools accept, which
# make stamps into the binary (--version) and names the package and image with:
#   tag v1.2.3 on the commit               1.2.3
#   4 commits after v1.2.3                 1.2.3+git4.gabcdef1
#   a pre-release tag v1.2.3-rc1           1.2.3~rc1 (sorts before 1.2.3)
#   no tag yet                             0.0.0~git20250520123456.gabcdef1
# the last with the commit's time (UTC), so that later commits sort later;
# uncommitted changes add +dirty. Outside a git checkout it prints nothing.
set -eu

describe=$(git describe --tags --long --dirty --match 'v[0-9]*' 2>/dev/null) || describe=""
dirty=""
case "$describe" in *-dirty)
	dirty="+dirty"
	describe=${describe%-dirty} ;;
esac

if [ -z "$describe" ]; then
	hash=$(git rev-parse --short=7 HEAD 2>/dev/null) || exit 0
	git update-index -q --refresh >/dev/null 2>&1 || true
	git diff-index --quiet HEAD -- 2>/dev/null || dirty="+dirty"
	when=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)
	echo "0.0.0~git$when.g$hash$dirty"
	exit 0
fi

# v1.2.3-rc1-4-gabcdef1: the tag, the commits since it, the commit.
hash=${describe##*-}
rest=${describe%-*}
count=${rest##*-}
tag=${rest%-*}
# Debian's upstream version: no leading v, a pre-release's - becomes ~.
upstream=$(echo "${tag#v}" | tr '-' '~')
if [ "$count" = 0 ]; then
	echo "$upstream$dirty"
else
	echo "$upstream+git$count.$hash$dirty"
fi
