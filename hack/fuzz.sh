#!/bin/sh
# Runs every fuzz target of the module (each `func FuzzXxx` in a _test.go
# file, found anew at each run, so that a new target cannot be left out)
# for FUZZTIME each, one after the other: `make fuzz` and `make fuzz-ci`.
#
#	hack/fuzz.sh 10s
set -eu
time=${1:?usage: $0 FUZZTIME}
GO=${GO:-go}
cd "$(dirname "$0")/.."
# e2e/ is a module of its own, bin/ and e2e/.cache hold no sources of ours.
targets=$(grep -rHo --include='*_test.go' --exclude-dir=e2e --exclude-dir=bin --exclude-dir=.git \
	'^func Fuzz[A-Za-z0-9_]*' . | sed 's/:func / /' | sort)
if [ -z "$targets" ]; then
	echo "hack/fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
echo "$targets" | while read -r file name; do
	dir=$(dirname "$file")
	echo "fuzz: $name in $dir for $time"
	$GO test -run='^$' -fuzz="^$name\$" -fuzztime="$time" "$dir/"
done
