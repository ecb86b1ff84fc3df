#!/usr/bin/env bash
# Prints the path of a golangci-lint that includes kube-api-linter as a module
# plugin (kubeapilinter in .golangci.yml), building it on first use.
#
# `golangci-lint custom` would clone golangci-lint from GitHub, which an
# offline CI machine cannot reach; kube-api-linter publishes the same binary
# as a Go package (its cmd/golangci-lint-kube-api-linter: golangci-lint's
# main plus the plugin import), so it is built here from the Go module proxy
# with golangci-lint pinned. The binary goes to a cache in the user's cache
# directory, outside any clone, keyed by both versions and the Go toolchain
# (golangci-lint refuses code newer than the Go that built it), so only the
# first run on a machine pays (a few minutes on 2 cores).
set -euo pipefail

GOLANGCI_LINT_VERSION="${GOLANGCI_LINT_VERSION:-v2.15.0}"
# kube-api-linter has no releases; the module proxy serves pseudo-versions.
KUBE_API_LINTER_VERSION="${KUBE_API_LINTER_VERSION:-v0.0.0-20260716143926-092fe0c72997}"

CACHE="${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}"
DIR="$CACHE/tools/golangci-lint-${GOLANGCI_LINT_VERSION}-kal-${KUBE_API_LINTER_VERSION##*-}-$(go env GOVERSION)-$(go env GOOS)-$(go env GOARCH)"
BIN="$DIR/golangci-lint"

if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

log() { echo "golangci-lint.sh: $*" >&2; }
log "building golangci-lint $GOLANGCI_LINT_VERSION with kube-api-linter $KUBE_API_LINTER_VERSION into $DIR"
mkdir -p "$DIR"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOWORK=off
go mod init golangci-lint-kube-api-linter >/dev/null 2>&1
go get "github.com/golangci/golangci-lint/v2@$GOLANGCI_LINT_VERSION" \
  "sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter@$KUBE_API_LINTER_VERSION" 2>"$work/get.log" \
  || { cat "$work/get.log" >&2; exit 1; }
# The plugin's own go.mod asks for an older golangci-lint; the build must be the pinned one.
got="$(go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)"
[ "$got" = "$GOLANGCI_LINT_VERSION" ] || { log "resolved golangci-lint $got, want $GOLANGCI_LINT_VERSION"; exit 1; }
go build -o "$DIR/golangci-lint.tmp" sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter
mv "$DIR/golangci-lint.tmp" "$BIN"
echo "$BIN"
