#!/usr/bin/env bash
# Runs each fuzz target (PKG:FuzzName) for FUZZTIME. A target fails the run
# when it writes a failing input (testdata/fuzz/<FuzzName>/ in its package)
# or fails twice. A failure with no input written is Go's fuzz coordinator
# missing its own -fuzztime deadline under CPU load ("context deadline
# exceeded", golang/go#75804, fixed in go1.27): that target runs once more.
#
# hack/fuzz.sh --build-only TARGET...: compiles each package's instrumented
# test binary into the build cache and runs nothing. Fuzzing instruments every
# package a target imports (Kubernetes' libraries too), so on an empty cache
# the first target of a package spends minutes compiling before its FUZZTIME
# starts; .ci/run does this ahead, at low priority, beside `make test`.
# Either mode holds bin/.fuzz.lock for its whole run, so a build still going
# when the fuzz run starts is waited for, not compiled twice at once.
set -euo pipefail
mkdir -p bin
exec 7>bin/.fuzz.lock
flock 7

if [ "${1:-}" = --build-only ]; then
	shift
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
	for pkg in $(printf '%s\n' "${@%%:*}" | sort -u); do
		echo "fuzz: building $pkg (instrumented)"
		go test -c -fuzz=. -o "$out/fuzz.test" "$pkg"
	done
	exit 0
fi

fuzztime=${FUZZTIME:-30s}
for t in "$@"; do
	pkg=${t%%:*} fn=${t##*:}
	corpus="$pkg/testdata/fuzz/$fn"
	before=$({ find "$corpus" -type f 2>/dev/null || true; } | sort | md5sum)
	for attempt in 1 2; do
		again=""
		[ "$attempt" -eq 2 ] && again=", again"
		echo "fuzz: $fn ($pkg, $fuzztime$again)"
		log=$(mktemp)
		if go test -run='^$' -fuzz="^$fn\$" -fuzztime="$fuzztime" "$pkg" 2>&1 | tee "$log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
			rm -f "$log"
			break
		fi
		after=$({ find "$corpus" -type f 2>/dev/null || true; } | sort | md5sum)
		if [ "$before" != "$after" ] || [ "$attempt" -eq 2 ] || ! grep -q 'context deadline exceeded' "$log"; then
			rm -f "$log"
			echo "fuzz: $fn failed (failing inputs, if any, in $corpus)" >&2
			exit 1
		fi
		rm -f "$log"
		echo "fuzz: $fn: no failing input written, only the coordinator's deadline (golang/go#75804); once more" >&2
	done
done
