#!/usr/bin/env bash
# images.sh OUTDIR ASSETS_DIR [MANAGER_BINARY] — the node's container images,
# built, not pulled, as OCI archives for `ctr images import`
# (hack/ociimage assembles them with go-containerregistry):
#
#   pause    registry.k8s.io/pause:3.10.2: the static pause binary of
#            hack/node-assets.sh, FROM scratch, user 65535, as upstream ships it
#   smoke    localhost/proxy-operator/node-smoke:v1: the same binary, FROM
#            scratch, user 65532: a workload pod that needs nothing else
#            (node-smoke.sh)
#   manager  $IMG (default proxy-operator:dev, the Makefile's): the static
#            manager binary on what distroless/static:nonroot provides (passwd
#            and group with nonroot 65532, CA certificates, /tmp), user 65532
#   squid    localhost/proxy-operator/squid: Debian bookworm with squid
#            (squid-image.sh; cached in the user cache by recipe hash)
#
# Without MANAGER_BINARY only pause and smoke are built.
#
# Prints `export CLUSTER_...=...` lines: the archives and the references
# (squid by digest, as the provider's default is pinned).
set -euo pipefail

OUTDIR=${1:?usage: images.sh OUTDIR ASSETS_DIR [MANAGER_BINARY]}
ASSETS=${2:?usage: images.sh OUTDIR ASSETS_DIR [MANAGER_BINARY]}
MANAGER=${3:-}
IMG=${IMG:-proxy-operator:dev}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { echo "images: $*" >&2; }

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
OCIIMAGE=$OUTDIR/ociimage
(cd "$ROOT/hack/ociimage" && go build -o "$OCIIMAGE" .)

# docker.io/library/NAME:TAG for a short NAME:TAG, as the CRI resolves it.
normalize() {
	case "$1" in
	*/*/*) echo "$1" ;;
	*.*/* | localhost/* | *:*/*) echo "$1" ;;
	*/*) echo "docker.io/$1" ;;
	*) echo "docker.io/library/$1" ;;
	esac
}

"$OCIIMAGE" -o "$OUTDIR/pause.tar" -name registry.k8s.io/pause:3.10.2 \
	-file "$ASSETS/pause:/pause:0755" -user 65535:65535 -entrypoint /pause >/dev/null
SMOKE_REF=localhost/proxy-operator/node-smoke:v1
"$OCIIMAGE" -o "$OUTDIR/smoke.tar" -name "$SMOKE_REF" \
	-file "$ASSETS/pause:/smoke:0755" -user 65532:65532 -entrypoint /smoke >/dev/null
printf 'export CLUSTER_PAUSE_TAR=%q\n' "$OUTDIR/pause.tar"
printf 'export CLUSTER_SMOKE_TAR=%q\n' "$OUTDIR/smoke.tar"
printf 'export CLUSTER_SMOKE_IMAGE=%q\n' "$SMOKE_REF"
[ -n "$MANAGER" ] || exit 0

etc=$OUTDIR/manager-etc
mkdir -p "$etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$etc/group"
certs=()
[ -f /etc/ssl/certs/ca-certificates.crt ] && certs=(-file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:0644)
MANAGER_REF=$(normalize "$IMG")
"$OCIIMAGE" -o "$OUTDIR/manager.tar" -name "$MANAGER_REF" \
	-file "$MANAGER:/manager:0755" -file "$etc/passwd:/etc/passwd:0644" -file "$etc/group:/etc/group:0644" \
	"${certs[@]}" -dir /tmp:1777 -dir /home/nonroot:0755 -user 65532:65532 -workdir / -entrypoint /manager >/dev/null

# squid: built once per recipe, cached in the user cache.
read -r SQUID_TAR SQUID_IMAGE < <("$(dirname "${BASH_SOURCE[0]}")/squid-image.sh" "$OCIIMAGE")
[ -n "$SQUID_IMAGE" ] || exit 1

printf 'export CLUSTER_MANAGER_TAR=%q\n' "$OUTDIR/manager.tar"
printf 'export CLUSTER_MANAGER_IMAGE=%q\n' "$IMG"
printf 'export CLUSTER_SQUID_TAR=%q\n' "$SQUID_TAR"
printf 'export CLUSTER_SQUID_IMAGE=%q\n' "$SQUID_IMAGE"
