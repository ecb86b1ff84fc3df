#!/usr/bin/env bash
# node-assets.sh — prints a directory holding everything a real Kubernetes
# node of test/e2e/cluster runs, built from the Go module proxy and Debian
# packages only (nothing is pulled from an image registry):
#
#   kube-apiserver, etcd      hack/envtest-assets.sh's (kube-apiserver linked
#                             again with its version when that one reports none)
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl
#                             k8s.io/kubernetes at the envtest version, from
#                             the same throw-away module (hack/kube-build.sh)
#   containerd, containerd-shim-runc-v2, ctr   github.com/containerd/containerd/v2
#   runc                      Debian's runc (built with seccomp, which
#                             RuntimeDefault and so restricted Pod Security need)
#   cni/{bridge,host-local,loopback,portmap}   Debian's containernetworking-plugins
#   pause                     build/pause/linux/pause.c of k8s.io/kubernetes,
#                             static, as upstream builds the pause image's binary
#
# Each built component is cached in the user cache directory under its
# version (like the envtest binaries), so only a machine's first run pays;
# the printed directory holds symlinks to them, keyed by every version in
# it (the Debian ones included). Debian packages it needs are installed
# when missing (root).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="${ENVTEST_K8S_VERSION:-1.36.3}"
CONTAINERD_VERSION="${NODE_CONTAINERD_VERSION:-2.4.2}"
PAUSE_VERSION=3.10.2 # kubeadm's pause for this Kubernetes line

export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
CACHE="${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}"
PLATFORM="$(go env GOOS)-$(go env GOARCH)"
NODE=$CACHE/node
KUBE_DIR=$NODE/kubernetes-v$K8S_VERSION-$PLATFORM
CTRD_DIR=$NODE/containerd-v$CONTAINERD_VERSION-$PLATFORM
PAUSE_DIR=$NODE/pause-$PAUSE_VERSION-$PLATFORM
# Debian installs the plugins here (containernetworking-plugins).
DEBIAN_CNI_DIR=/usr/lib/cni

PACKAGES=(gcc libc6-dev runc containernetworking-plugins iptables)
CNI_PLUGINS=(bridge host-local loopback portmap)

debian_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }

log() { echo "node-assets: $*" >&2; }
since() { echo "$(($(date +%s) - $1)) s"; }

ensure_packages() {
	local missing=() p
	for p in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || {
		log "missing Debian packages: ${missing[*]} (install them, or run as root)"
		exit 1
	}
	log "installing ${missing[*]}"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
}

# throwaway DIR MODULE@VERSION PKG...: a module requiring MODULE, tidied for PKG...
throwaway() {
	local dir=$1 mod=$2
	shift 2
	mkdir -p "$dir"
	(
		cd "$dir"
		go mod init "node-assets-$(basename "$dir")" >/dev/null 2>&1
		{
			echo 'package tools'
			echo 'import ('
			for p in "$@"; do echo "	_ \"$p\""; done
			echo ')'
		} >tools.go
		go get "$mod" >/dev/null 2>&1
		go mod tidy >/dev/null 2>&1
	)
}

all_there() { # all_there DIR NAME...
	local d=$1 n
	shift
	for n in "$@"; do [ -x "$d/$n" ] || return 1; done
}

build_containerd() {
	all_there "$CTRD_DIR" containerd containerd-shim-runc-v2 ctr && return 0
	local t m=github.com/containerd/containerd/v2 w=$WORK/containerd
	t=$(date +%s)
	log "building containerd v$CONTAINERD_VERSION"
	throwaway "$w" "$m@v$CONTAINERD_VERSION" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
	mkdir -p "$CTRD_DIR"
	local ld="-X $m/version.Version=v$CONTAINERD_VERSION -X $m/version.Package=$m"
	# One `go build` so the three share their compiled packages. The tags
	# leave out the btrfs/devmapper/zfs snapshotters (cgo and libraries
	# this node does not use), as the upstream Makefile allows.
	(cd "$w" && CGO_ENABLED=0 go build -tags 'urfave_cli_no_docs no_btrfs no_devmapper no_zfs' -ldflags "$ld" \
		-o "$w/bin/" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr")
	mv "$w/bin/containerd" "$w/bin/containerd-shim-runc-v2" "$w/bin/ctr" "$CTRD_DIR/"
	log "containerd built in $(since "$t")"
}

build_pause() {
	all_there "$PAUSE_DIR" pause && return 0
	local src
	src="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/build/pause/linux/pause.c"
	mkdir -p "$PAUSE_DIR"
	# Upstream's flags (build/pause/Makefile); the version names its source.
	gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-k8s$K8S_VERSION" -o "$PAUSE_DIR/pause.tmp" "$src"
	mv "$PAUSE_DIR/pause.tmp" "$PAUSE_DIR/pause"
}

ensure_packages
RUNC_VERSION=$(debian_version runc)
CNI_VERSION=$(debian_version containernetworking-plugins)
OUT=$NODE/bin-k8s$K8S_VERSION-containerd$CONTAINERD_VERSION-runc$RUNC_VERSION-cni$CNI_VERSION-$PLATFORM
if [ -f "$OUT/.complete" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$NODE"
exec 9>"$NODE/.build.lock"
flock 9
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

T0=$(date +%s)
ENVTEST=$("$HERE/envtest-assets.sh")
KUBE_COMMANDS=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)
APISERVER=$ENVTEST/kube-apiserver
if ! "$APISERVER" --version | grep -qF "v$K8S_VERSION"; then
	# Built before hack/kube-build.sh stamped versions: clients and the
	# node would see v0.0.0-master. Same module and build, so it costs
	# only its link.
	KUBE_COMMANDS+=(kube-apiserver)
	APISERVER=$KUBE_DIR/kube-apiserver
fi
"$HERE/kube-build.sh" "$K8S_VERSION" "$KUBE_DIR" "${KUBE_COMMANDS[@]}"
build_containerd
build_pause

rm -rf "$OUT"
mkdir -p "$OUT/cni"
ln -s "$ENVTEST/etcd" "$APISERVER" "$OUT/"
for b in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do ln -s "$KUBE_DIR/$b" "$OUT/"; done
for b in containerd containerd-shim-runc-v2 ctr; do ln -s "$CTRD_DIR/$b" "$OUT/"; done
ln -s "$(command -v runc)" "$PAUSE_DIR/pause" "$OUT/"
for p in "${CNI_PLUGINS[@]}"; do ln -s "$DEBIAN_CNI_DIR/$p" "$OUT/cni/"; done
printf 'K8S_VERSION=%s\nCONTAINERD_VERSION=%s\nRUNC_VERSION=%s\nCNI_VERSION=%s\nPAUSE_VERSION=%s\n' \
	"$K8S_VERSION" "$CONTAINERD_VERSION" "$RUNC_VERSION" "$CNI_VERSION" "$PAUSE_VERSION" >"$OUT/versions.env"
touch "$OUT/.complete"
log "ready in $(since "$T0"): $OUT"
echo "$OUT"
