#!/usr/bin/env bash
# kube-build.sh VERSION OUTDIR CMD... — builds commands of k8s.io/kubernetes
# (kube-apiserver, kubelet, kubectl, ...) at VERSION (1.36.3) from the Go
# module proxy into OUTDIR, skipping those already there.
#
# `go install k8s.io/kubernetes/cmd/X@vVERSION` is refused (its go.mod
# points the k8s.io/* staging modules at ./staging), so the commands are
# built from one throw-away module that requires k8s.io/kubernetes and
# replaces every staging module with its published v0.MINOR.PATCH. That
# module is kept in the user cache (one per version, shared by
# hack/envtest-assets.sh and hack/node-assets.sh), so the packages compiled
# for kube-apiserver are reused from Go's build cache for the others.
# The release version is stamped in as the release build does
# (hack/lib/version.sh upstream); a plain `go build` reports v0.0.0-master.
set -euo pipefail

VERSION=${1:?usage: kube-build.sh VERSION OUTDIR CMD...}
OUT=${2:?usage: kube-build.sh VERSION OUTDIR CMD...}
shift 2
[ $# -gt 0 ] || { echo "kube-build.sh: no command named" >&2; exit 2; }

CACHE="${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}"
MOD=$CACHE/kube-module/v$VERSION
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
log() { echo "kube-build: $*" >&2; }

# Every command either script builds, so one go.mod serves them all.
COMMANDS=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)

mkdir -p "$MOD" "$OUT"
exec 9>"$MOD.lock"
flock 9
if [ ! -f "$MOD/.ready" ]; then
	rm -rf "$MOD" && mkdir -p "$MOD"
	(
		cd "$MOD"
		go mod init "kube-build-v$VERSION" >/dev/null 2>&1
		gomod="$(go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
		staging="v0.${VERSION#*.}"
		{
			echo "require k8s.io/kubernetes v$VERSION"
			grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
		} >>go.mod
		{
			echo 'package tools'
			echo 'import ('
			for c in "${COMMANDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
			echo ')'
		} >tools.go
		go mod tidy >/dev/null 2>&1
	)
	touch "$MOD/.ready"
fi

minor=${VERSION#*.}
minor=${minor%%.*}
LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	LDFLAGS+=" -X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=${VERSION%%.*} -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
missing=()
for c in "$@"; do [ -x "$OUT/$c" ] || missing+=("$c"); done
[ ${#missing[@]} -eq 0 ] && exit 0
# One `go build` for all of them: the packages they share (most of
# k8s.io/kubernetes) are compiled once, in parallel, rather than per command.
t=$(date +%s)
log "building ${missing[*]} v$VERSION"
tmp=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$MOD" && go build -ldflags "$LDFLAGS" -o "$tmp/" "${missing[@]/#/k8s.io/kubernetes/cmd/}")
for c in "${missing[@]}"; do mv "$tmp/$c" "$OUT/$c"; done
log "${missing[*]} built in $(($(date +%s) - t)) s"
