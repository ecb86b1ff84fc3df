#!/usr/bin/env bash
# test/e2e/cluster/run.sh — `make test-e2e-cluster`: the operator installed
# into a real one-node Kubernetes cluster the way users install it, and
# kubernetes-provider Proxies served by real squid pods (root).
#
#   1. node binaries (hack/node-assets.sh: kubelet & co., containerd, runc,
#      CNI plugins, pause; built from the Go module proxy once, cached in
#      the user cache), the static manager binary, the images
#      (images.sh: manager, pause, squid; nothing is pulled), the suite;
#   2. the node (node.sh up): every component a process in a network and
#      mount namespace of its own, the images imported into its containerd;
#   3. the test hypervisor (test/e2e/infra/hypervisor.sh, the guest image
#      of infra/guest-image.sh) in its own network namespace, joined to the
#      node's by a veth pair as a LAN would join them (link_hypervisor);
#   4. the Ginkgo suite (label cluster) INSIDE the node's network namespace:
#      it installs the operator with kubectl as docs/getting-started.md says
#      and checks it (cluster_test.go), a kvm Proxy on that hypervisor too;
#   5. always: the node and the hypervisor torn down (node.sh down,
#      hypervisor.sh down) and checked for leftovers.
#
# --build-only: step 1 alone, into E2E_OUT (every cache it fills is the
# user's, so a later run finds them warm); no node, no hypervisor.
#
# Exit code: the suite's (1 also when teardown left something behind).
# Artifacts: $E2E_OUT/run-<time>/ (suite.log, timings.txt, the install
# directory, cluster dumps and pod logs on failure) and
# $E2E_OUT/node/logs/ (every component's log), $E2E_OUT/hv/logs/ and the
# run's host-varlog/ (sshd, libvirtd, qemu, the guest's serial console).
# Environment: E2E_OUT (default bin/e2e-cluster), E2E_TEST_TIMEOUT (40m),
# E2E_GINKGO_FLAGS, IMG (proxy-operator:dev).
set -uo pipefail
E2E_TAG=cluster
BUILD_ONLY=
case "${1:-}" in
--build-only) BUILD_ONLY=1 ;;
"") ;;
*)
	echo "usage: $0 [--build-only]" >&2
	exit 2
	;;
esac
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

e2e_require_root
HERE=$E2E_ROOT/test/e2e/cluster
OUT=${E2E_OUT:-$E2E_ROOT/bin/e2e-cluster}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STATE=$OUT/node
HV=$OUT/hv
RUN=$OUT/run-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
T0=$(e2e_now)
: >"$RUN/timings.txt"
timed() { e2e_timed "$RUN/timings.txt" "$@"; }

set -e
# Step 1 holds a lock in the user cache: `.ci/run` starts it ahead
# (--build-only, at the lowest priority, while `make test` runs), and the
# stage then waits for it rather than compiling the same packages beside it.
mkdir -p "$E2E_CACHE"
exec 8>"$E2E_CACHE/.cluster-build.lock"
timed build_lock flock 8
timed node_assets eval 'ASSETS=$("$E2E_ROOT/hack/node-assets.sh")'
# Static, as in the Dockerfile: the image has no libc.
timed manager_build eval '(cd "$E2E_ROOT" && e2e_go build -o "$OUT/manager" .)'
timed images eval 'eval "$("$HERE/images.sh" "$OUT/images" "$ASSETS" "$OUT/manager")"'
timed suite_build eval '(cd "$E2E_ROOT" && e2e_go test -c -tags=e2e -o "$OUT/cluster.test" ./test/e2e/cluster)'
timed guest_image e2e_guest_image
exec 8>&-
set +e
if [ "$BUILD_ONLY" ]; then
	e2e_log "built (--build-only): $(e2e_since "$T0") s"
	exit 0
fi

# link_hypervisor joins the node's network namespace and the hypervisor's
# as a LAN joins a cluster to its KVM hosts: a veth pair (LINK_NODE the
# node's end, LINK_HV the hypervisor's), routes to the guests' network
# (hypervisor.sh's NAT network e2e, 10.77.0.0/24 on pxbr0) and back to the
# pods and the node's addresses (the suite's origin among them), the
# hypervisor's sshd on LINK_HV:22 (it listens on 127.0.0.1:22 only, so a
# DNAT there, which route_localnet allows), and the guests' network open
# to new connections from the node (libvirt's NAT rules admit only
# replies). Nothing is added to the root namespace; the pair goes with
# either namespace.
LINK_NODE=10.252.0.1
LINK_HV=10.252.0.2
link_hypervisor() {
	local n=$NODE_NETNS h=$KVM_TEST_NETNS
	ip link add pxcl-node netns "$n" type veth peer name pxcl-hv netns "$h" &&
		ip -n "$n" addr add "$LINK_NODE/30" dev pxcl-node && ip -n "$n" link set pxcl-node up &&
		ip -n "$h" addr add "$LINK_HV/30" dev pxcl-hv && ip -n "$h" link set pxcl-hv up &&
		ip -n "$n" route add 10.77.0.0/24 via "$LINK_HV" &&
		ip -n "$h" route add "$NODE_POD_CIDR" via "$LINK_NODE" &&
		ip -n "$h" route add 10.250.0.0/16 via "$LINK_NODE" &&
		ip netns exec "$n" sysctl -qw net.ipv4.ip_forward=1 &&
		ip netns exec "$h" sysctl -qw net.ipv4.conf.pxcl-hv.route_localnet=1 &&
		ip netns exec "$h" iptables -t nat -I PREROUTING -i pxcl-hv -d "$LINK_HV" -p tcp --dport 22 -j DNAT --to-destination 127.0.0.1:22 &&
		ip netns exec "$h" iptables -I FORWARD -i pxcl-hv -o pxbr0 -d 10.77.0.0/24 -j ACCEPT &&
		echo "$LINK_HV $(cut -d' ' -f1,2 "$HV/ssh_host_ed25519_key.pub")" >"$RUN/kvm_known_hosts"
}

RC=1
teardown() {
	local rc=$RC
	trap - EXIT INT TERM
	if ! timed node_down "$HERE/node.sh" down "$STATE"; then
		e2e_log "teardown left something behind (see above)"
		[ "$rc" -eq 0 ] && rc=1
	fi
	if ! timed hypervisor_down e2e_hypervisor_down "$HV" "$RUN/host-varlog"; then
		e2e_log "the hypervisor's teardown left something behind (see above)"
		[ "$rc" -eq 0 ] && rc=1
	fi
	if [ -n "${NODE_NETNS:-}" ] && ip netns list | grep -qw -- "$NODE_NETNS"; then
		e2e_log "LEFT OVER: network namespace $NODE_NETNS"
		[ "$rc" -eq 0 ] && rc=1
	fi
	if pgrep -f -- "$STATE/" >/dev/null; then
		e2e_log "LEFT OVER: processes: $(pgrep -af -- "$STATE/" | tr '\n' ';')"
		[ "$rc" -eq 0 ] && rc=1
	fi
	echo
	e2e_log "---- summary ----"
	sed 's/^/  /' "$RUN/timings.txt" >&2
	e2e_log "total wall time $(e2e_since "$T0") s; suite exit code $RC"
	e2e_log "logs: $RUN (suite.log, timings.txt); node components: $STATE/logs"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

timed node_up "$HERE/node.sh" up "$STATE" "$ASSETS" "$CLUSTER_PAUSE_TAR" "$CLUSTER_MANAGER_TAR" "$CLUSTER_SQUID_TAR" || exit 1
eval "$("$HERE/node.sh" env "$STATE")"
timed hypervisor_up e2e_hypervisor_up "$HV"
timed link_hypervisor link_hypervisor || e2e_die "joining the node and the hypervisor failed"

e2e_log "running the cluster specs inside netns $NODE_NETNS (output also in $RUN/suite.log)"
t=$(e2e_now)
# shellcheck disable=SC2086
ip netns exec "$NODE_NETNS" env E2E_ARTIFACTS="$RUN" CLUSTER_REPO="$E2E_ROOT" \
	CLUSTER_MANAGER_IMAGE="$CLUSTER_MANAGER_IMAGE" CLUSTER_SQUID_IMAGE="$CLUSTER_SQUID_IMAGE" \
	KVM_TEST_ADDRESS="$LINK_HV:22" KVM_TEST_KNOWN_HOSTS="$RUN/kvm_known_hosts" CLUSTER_LINK_NODE="$LINK_NODE" \
	PATH="$NODE_ASSETS:$PATH" \
	"$OUT/cluster.test" -test.v -test.timeout="${E2E_TEST_TIMEOUT:-40m}" \
	-ginkgo.v -ginkgo.label-filter=cluster ${E2E_GINKGO_FLAGS:-} 2>&1 | tee -i "$RUN/suite.log"
RC=${PIPESTATUS[0]}
echo "CLUSTER-TIMING suite=$(e2e_since "$t")s" >>"$RUN/timings.txt"
exit "$RC"
