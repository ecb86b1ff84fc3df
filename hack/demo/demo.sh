#!/usr/bin/env bash
# hack/demo/demo.sh [up|down] — `make demo` / `make demo-down` (root).
#
# up (default), on a fresh Debian machine:
#   1. the manager, the envtest binaries and the guest image (each built
#      once; the first run installs the Debian packages, builds kube-apiserver
#      and etcd from the Go module proxy and the guest image with mmdebstrap);
#   2. the test hypervisor (test/e2e/infra/hypervisor.sh up bin/demo/hv):
#      sshd, libvirtd, NAT network "e2e" and a 204 server, all in a network
#      namespace of its own;
#   3. hack/demo (a control plane + the manager, one KVMHost, KVMImage and
#      a ProxyPool of two) inside that namespace, until the pool is
#      Available, its published proxies.txt is printed (passwords masked)
#      and a request went through each entry; then Ctrl-C deletes the pool
#      and stops.
#   With DEMO_ONCE=1 (or CI=true) it deletes the pool at once, checks its
#   VMs are gone, and tears the hypervisor down itself. Otherwise the
#   hypervisor stays up until `make demo-down`.
# down: stops the hypervisor and checks nothing is left.
set -uo pipefail
E2E_TAG=demo
source "$(dirname "${BASH_SOURCE[0]}")/../../test/e2e/lib.sh"

OUT=$E2E_ROOT/bin/demo
STATE=$OUT/hv
ONCE=0
{ [ "${DEMO_ONCE:-}" = 1 ] || [ "${CI:-}" = true ]; } && ONCE=1

down() {
	if e2e_hypervisor_down "$STATE" "$OUT/host-varlog"; then
		e2e_log "hypervisor down; nothing left running (logs kept in $STATE/logs and $OUT)"
	else
		e2e_log "teardown left something behind (see above)"
		return 1
	fi
}

case "${1:-up}" in
down)
	e2e_require_root
	down
	exit $?
	;;
up) ;;
*)
	echo "usage: $0 [up|down]" >&2
	exit 2
	;;
esac

e2e_require_root
T0=$(e2e_now)
mkdir -p "$OUT"
set -e
e2e_build_manager
e2e_envtest_assets
e2e_guest_image
(cd "$E2E_ROOT" && e2e_go build -o bin/demo/demo ./hack/demo)
set +e

if [ "$ONCE" = 1 ]; then
	trap 'down; exit $RC' EXIT
else
	trap 'e2e_log "the hypervisor stays up: make demo-down stops it"' EXIT
fi
trap 'exit 130' INT TERM
RC=1
e2e_hypervisor_up "$STATE"
e2e_log "set-up took $(e2e_since "$T0") s; starting the demo inside netns $KVM_TEST_NETNS"

ONCE_FLAG=-once=false
[ "$ONCE" = 1 ] && ONCE_FLAG=-once
# The demo catches Ctrl-C itself (it deletes the pool first); this shell
# waits for it.
trap ':' INT
ip netns exec "$KVM_TEST_NETNS" "$OUT/demo" "$ONCE_FLAG" -dir "$OUT/run" -manager "$E2E_ROOT/bin/manager"
RC=$?
trap 'exit 130' INT
e2e_log "demo exited with $RC after $(e2e_since "$T0") s in all"
exit $RC
