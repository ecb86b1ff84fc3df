#!/usr/bin/env bash
# Runs each fuzz target (PKG:FuzzName) for FUZZTIME. A target fails the run
# when it writes a failing input (testdata/fuzz/<FuzzName>/ in its package)
# or fails twice. A failure with no input written is Go's fuzz coordinator
# missing its own -fuzztime deadline under CPU load ("context deadline
# exceeded", golang/go#75804, fixed in go1.27): that target runs once more.
set -euo pipefail
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
