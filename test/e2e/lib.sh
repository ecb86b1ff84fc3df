# shellcheck shell=bash
# lib.sh — set-up steps shared by test/e2e/run.sh (make test-e2e),
# hack/demo/demo.sh (make demo) and test/integration/run.sh
# (make test-integration-kvm). Source it; set E2E_TAG for the log prefix.
#
# Everything here runs as root on the machine: the guest image is built with
# mmdebstrap, and the test hypervisor (test/e2e/infra/hypervisor.sh) runs
# libvirtd, sshd and the guests in a network namespace of its own.

E2E_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
E2E_INFRA=$E2E_ROOT/test/e2e/infra
# The guest image cache: guest-image.sh names images by the hash of its
# recipe, so a changed recipe builds a new one and an unchanged one is reused.
# It lives in the user's cache directory, outside the clone, so every clone on
# the machine (CI's fresh ones included) shares it.
E2E_CACHE=${PROXY_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxy-operator}
E2E_IMAGE_DIR=${E2E_IMAGE_DIR:-$E2E_CACHE/e2e-images}
E2E_TAG=${E2E_TAG:-e2e}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# e2e_go ARGS: go, in the one build configuration of every binary these
# scripts build (the manager, the suites): the image's, static
# (CGO_ENABLED=0, as the Dockerfile builds it), which make vet and make
# build use too. A second configuration would compile every package the
# manager imports once more.
e2e_go() { CGO_ENABLED=0 go "$@"; }

e2e_log() { echo "$E2E_TAG: $*" >&2; }
e2e_die() {
	e2e_log "error: $*"
	exit 1
}

e2e_now() { date +%s.%N; }
e2e_since() { awk -v a="$1" -v b="$(e2e_now)" 'BEGIN { printf "%.1f", b - a }'; }

# e2e_timed FILE NAME CMD...: runs CMD and records its wall time as
# "<TAG>-TIMING NAME=SECONDSs" on stderr and in FILE; returns CMD's status.
e2e_timed() {
	local file=$1 name=$2 t rc
	shift 2
	t=$(e2e_now)
	"$@"
	rc=$?
	echo "${E2E_TAG^^}-TIMING $name=$(e2e_since "$t")s" | tee -a "$file" >&2
	return $rc
}

e2e_require_root() {
	[ "$(id -u)" -eq 0 ] || e2e_die "must run as root (it runs libvirtd, qemu and sshd in a network namespace it creates)"
}

# e2e_build_manager: bin/manager (make build does the same).
e2e_build_manager() {
	(cd "$E2E_ROOT" && e2e_go build -o bin/manager .) || e2e_die "building the manager failed"
}

# e2e_envtest_assets: exports KUBEBUILDER_ASSETS (kube-apiserver + etcd;
# built from the Go module proxy into the user cache on first use). test/envtestutil
# gives kube-apiserver --advertise-address=127.0.0.1, which it needs inside
# the hypervisor's network namespace (no default route there).
e2e_envtest_assets() {
	KUBEBUILDER_ASSETS=$("$E2E_ROOT/hack/envtest-assets.sh") || e2e_die "no envtest binaries (hack/envtest-assets.sh)"
	export KUBEBUILDER_ASSETS
}

# e2e_guest_image: exports KVM_TEST_IMAGE (built once, then cached).
e2e_guest_image() {
	local t
	t=$(e2e_now)
	KVM_TEST_IMAGE=$("$E2E_INFRA/guest-image.sh" "$E2E_IMAGE_DIR") || e2e_die "building the guest image failed"
	export KVM_TEST_IMAGE
	e2e_log "guest image $KVM_TEST_IMAGE ($(e2e_since "$t") s)"
}

# e2e_hypervisor_up STATE_DIR: starts the test hypervisor (installing its
# Debian packages when missing) and exports its KVM_TEST_* variables.
e2e_hypervisor_up() {
	local t
	t=$(e2e_now)
	"$E2E_INFRA/hypervisor.sh" up "$1" || e2e_die "hypervisor.sh up $1 failed (logs: $1/logs)"
	eval "$("$E2E_INFRA/hypervisor.sh" env "$1")"
	e2e_log "hypervisor up in $(e2e_since "$t") s: netns $KVM_TEST_NETNS, ssh $KVM_TEST_ADDRESS, domain type $KVM_TEST_DOMAIN_TYPE"
}

# e2e_hypervisor_down STATE_DIR [KEEP_DIR]: copies the host's /var/log
# (libvirtd and qemu logs, which `down` deletes) into KEEP_DIR, stops the
# hypervisor, and checks nothing of it is left: no namespace, no process
# naming STATE_DIR. Returns 1 when something is.
e2e_hypervisor_down() {
	local state=$1 keep=${2:-} ns left=0
	ns=$(sed -n 's/^NETNS=//p' "$state/state.env" 2>/dev/null | tail -n1)
	if [ -n "$keep" ] && [ -d "$state/varlog" ]; then
		mkdir -p "$keep"
		cp -a "$state/varlog/." "$keep/" 2>/dev/null || true
	fi
	"$E2E_INFRA/hypervisor.sh" down "$state" || left=1
	if [ -n "$ns" ] && ip netns list | grep -qw -- "$ns"; then
		e2e_log "LEFT OVER: network namespace $ns"
		left=1
	fi
	if pgrep -f -- "$state/" >/dev/null; then
		e2e_log "LEFT OVER: processes: $(pgrep -af -- "$state/" | tr '\n' ';')"
		left=1
	fi
	if [ -n "$ns" ] && pgrep -f -- "pxe2e-holder-$ns" >/dev/null; then
		e2e_log "LEFT OVER: namespace holder of $ns"
		left=1
	fi
	return $left
}
