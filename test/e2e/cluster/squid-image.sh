#!/usr/bin/env bash
# squid-image.sh OCIIMAGE — the kubernetes provider's squid image for the
# test node, from Debian packages (as the e2e guest image is built): bookworm
# minbase with squid (mmdebstrap), user 13 (proxy, as the provider runs it),
# one layer, assembled with OCIIMAGE (hack/ociimage). Built once per recipe
# (this script and the image tool, hashed) into the user cache, like the
# guest image. Prints "ARCHIVE REFERENCE@DIGEST".
set -euo pipefail

OCIIMAGE=${1:?usage: squid-image.sh OCIIMAGE}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
CACHE="${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}/node/images"
SUITE=bookworm
REPO=localhost/proxy-operator/squid
log() { echo "squid-image: $*" >&2; }

HASH=$(cat "${BASH_SOURCE[0]}" "$ROOT/hack/ociimage/main.go" "$ROOT/hack/ociimage/go.sum" | sha256sum | cut -c1-16)
OUT=$CACHE/squid-$SUITE-$HASH.tar
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
if [ ! -f "$OUT.digest" ]; then
	t=$(date +%s)
	if ! command -v mmdebstrap >/dev/null; then
		log "installing mmdebstrap"
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends mmdebstrap >&2
	fi
	work=$(mktemp -d "$CACHE/.build.XXXXXX")
	trap 'rm -rf --one-file-system "$work"' EXIT
	# The machine's Debian sources when it has them (they may name a mirror).
	sources=("deb http://deb.debian.org/debian $SUITE main" "deb http://deb.debian.org/debian-security $SUITE-security main")
	[ -f /etc/apt/sources.list.d/debian.sources ] && sources=(/etc/apt/sources.list.d/debian.sources)
	log "root filesystem: mmdebstrap $SUITE minbase + squid"
	# unshare -m: mmdebstrap's /proc, /sys, /dev mounts die with it.
	unshare --mount --propagation private \
		mmdebstrap --variant=minbase --mode=root --format=directory \
		--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
		--aptopt='APT::Install-Recommends "false"' \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--include=squid "$SUITE" "$work/root" "${sources[@]}" >&2
	# The kubelet provides these per pod; the build machine's must not leak in.
	rm -f "$work/root/etc/resolv.conf" "$work/root/etc/hostname" "$work/root/etc/hosts"
	rm -rf "$work/root/var/lib/apt/lists"/* "$work/root/var/cache/apt"/*
	tar --numeric-owner --sort=name -C "$work/root" -cf "$work/rootfs.tar" .
	# No entrypoint: the provider runs `squid -N -f <its config>`.
	"$OCIIMAGE" -o "$work/squid.tar" -name "$REPO:$SUITE-$HASH" -layer-tar "$work/rootfs.tar" \
		-user 13:13 -env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin >"$work/digest"
	mv "$work/squid.tar" "$OUT"
	mv "$work/digest" "$OUT.digest"
	log "built in $(($(date +%s) - t)) s: $OUT"
fi
echo "$OUT $REPO@$(cat "$OUT.digest")"
