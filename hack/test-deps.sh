#!/usr/bin/env bash
# Installs the Debian packages the tests run for real: binaries, and the
# Python libraries of the crawler recipes; then the Crawlee recipe's
# node_modules (hack/crawlee-modules.sh). `make test` calls it; so does
# .ci/run on a fresh machine. Only what is missing is installed, so a
# prepared machine pays nothing. Not root: prints the missing packages and
# exits 1, since those tests fail without them.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
	genisoimage      # isoinfo: an independent reader of the seed ISO
	xorriso          # a second ISO reader (seed fuzzing reads back what it built)
	libvirt-clients  # virt-xml-validate: libvirt's own schemas for domain/volume XML
	libxml2-utils    # xmllint, which virt-xml-validate runs
	cloud-init       # cloud-init's own MIME parser for vendor-data
	squid            # a real squid for every rendered squid.conf
	python3-scrapy   # the Scrapy recipe in docs/examples/scrapy, run by test/recipes
	python3-requests # the requests recipe in docs/examples/requests, likewise
)

missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
install_missing() {
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
		echo "test-deps: missing Debian packages: ${missing[*]} (install them, or run as root)" >&2
		exit 1
	fi
	echo "test-deps: installing ${missing[*]}" >&2
	apt-get update -qq >&2
	# policy-rc.d keeps package scripts from starting squid as a system service.
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
		chmod +x /usr/sbin/policy-rc.d
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
}
[ ${#missing[@]} -eq 0 ] || install_missing

# The Crawlee recipe's node_modules, from the npm registry into the user
# cache (the recipe tests run without a network).
hack/crawlee-modules.sh >/dev/null
