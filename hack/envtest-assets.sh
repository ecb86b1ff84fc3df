#!/usr/bin/env bash
# Prints a directory holding kube-apiserver and etcd for envtest (KUBEBUILDER_ASSETS).
#
# Where setup-envtest can download (a normal workstation) it is used. Where it
# cannot (an offline CI machine that only reaches the Go module proxy), both
# binaries are built from their Go modules into a version-keyed cache in the
# user's cache directory (outside any clone), so only the first run on a
# machine pays (about 8 minutes on 2 cores), however many clones it has.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="${ENVTEST_K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ENVTEST_ETCD_VERSION:-3.6.16}"

CACHE="${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}"
DIR="${ENVTEST_ASSETS_DIR:-$CACHE/envtest/${K8S_VERSION}-etcd${ETCD_VERSION}-$(go env GOOS)-$(go env GOARCH)}"

have() { [ -x "$DIR/kube-apiserver" ] && [ -x "$DIR/etcd" ]; }

if have; then echo "$DIR"; exit 0; fi
mkdir -p "$DIR"

log() { echo "envtest-assets: $*" >&2; }

# 1. setup-envtest, when it is installed and can reach its download site.
if command -v setup-envtest >/dev/null 2>&1; then
  if p=$(timeout 120 setup-envtest use -p path "$K8S_VERSION" 2>/dev/null) && [ -x "$p/kube-apiserver" ]; then
    cp "$p/kube-apiserver" "$p/etcd" "$DIR/"
    echo "$DIR"; exit 0
  fi
  log "setup-envtest could not fetch $K8S_VERSION; building from the Go module proxy"
fi

# 2. Build from the Go module proxy.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

build_etcd() {
  [ -x "$DIR/etcd" ] && return 0
  log "building etcd v$ETCD_VERSION"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init envtest-etcd >/dev/null 2>&1
  printf 'package tools\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1
  go build -o "$DIR/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$DIR/etcd.tmp" "$DIR/etcd"
}

build_apiserver() {
  [ -x "$DIR/kube-apiserver" ] && return 0
  log "building kube-apiserver v$K8S_VERSION (several minutes, once per machine)"
  # The throw-away module is shared with hack/node-assets.sh (kubelet & co.).
  "$HERE/kube-build.sh" "$K8S_VERSION" "$DIR" kube-apiserver
}

( build_etcd )
( build_apiserver )
have || { log "failed to provide kube-apiserver and etcd in $DIR"; exit 1; }
echo "$DIR"
