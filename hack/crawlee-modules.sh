#!/usr/bin/env bash
# Installs the Crawlee recipe's node_modules (docs/examples/crawlee) from the
# npm registry into the user cache, keyed by the package-lock's hash, never
# into the clone, and prints the directory holding node_modules. A second
# run with the same lock pays nothing. test/recipes runs the recipe against
# it (in a network namespace without the registry, hence this step before
# the tests: hack/test-deps.sh calls it).
set -euo pipefail
cd "$(dirname "$0")/.."

lock=docs/examples/crawlee/package-lock.json
for tool in node npm sha256sum; do
	command -v "$tool" >/dev/null || { echo "crawlee-modules: $tool not found (install Node.js 20 or newer with npm)" >&2; exit 1; }
done
hash=$(sha256sum "$lock" | cut -c1-16)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator/crawlee/$hash"
if [ ! -f "$dir/.installed" ]; then
	mkdir -p "${dir%/*}"
	# Installed beside and renamed into place: a run cut short leaves no
	# half-filled directory that looks installed.
	tmp=$(mktemp -d "${dir%/*}/.tmp-XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	cp docs/examples/crawlee/package.json "$lock" "$tmp/"
	echo "crawlee-modules: npm ci into $dir" >&2
	(cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
	touch "$tmp/.installed"
	rm -rf "$dir"
	mv "$tmp" "$dir"
fi
echo "$dir"
