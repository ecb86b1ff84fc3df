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
#   3. the Ginkgo suite (label cluster) INSIDE the node's network namespace:
#      it installs the operator with kubectl as docs/getting-started.md says
#      and checks it (cluster_test.go);
#   4. always: the node torn down (node.sh down) and checked for leftovers.
#
# Exit code: the suite's (1 also when teardown left something behind).
# Artifacts: $E2E_OUT/run-<time>/ (suite.log, timings.txt, the install
# directory, cluster dumps and pod logs on failure) and
# $E2E_OUT/node/logs/ (every component's log).
# Environment: E2E_OUT (default bin/e2e-cluster), E2E_TEST_TIMEOUT (40m),
# E2E_GINKGO_FLAGS, IMG (proxy-operator:dev).
set -uo pipefail
E2E_TAG=cluster
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

e2e_require_root
HERE=$E2E_ROOT/test/e2e/cluster
OUT=${E2E_OUT:-$E2E_ROOT/bin/e2e-cluster}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STATE=$OUT/node
RUN=$OUT/run-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
T0=$(e2e_now)
: >"$RUN/timings.txt"
timed() { e2e_timed "$RUN/timings.txt" "$@"; }

set -e
timed node_assets eval 'ASSETS=$("$E2E_ROOT/hack/node-assets.sh")'
# Static, as in the Dockerfile: the image has no libc.
timed manager_build eval '(cd "$E2E_ROOT" && CGO_ENABLED=0 go build -o "$OUT/manager" .)'
timed images eval 'eval "$("$HERE/images.sh" "$OUT/images" "$ASSETS" "$OUT/manager")"'
timed suite_build eval '(cd "$E2E_ROOT" && go test -c -tags=e2e -o "$OUT/cluster.test" ./test/e2e/cluster)'
set +e

RC=1
teardown() {
	local rc=$RC
	trap - EXIT INT TERM
	if ! timed node_down "$HERE/node.sh" down "$STATE"; then
		e2e_log "teardown left something behind (see above)"
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

e2e_log "running the cluster specs inside netns $NODE_NETNS (output also in $RUN/suite.log)"
t=$(e2e_now)
# shellcheck disable=SC2086
ip netns exec "$NODE_NETNS" env E2E_ARTIFACTS="$RUN" CLUSTER_REPO="$E2E_ROOT" \
	CLUSTER_MANAGER_IMAGE="$CLUSTER_MANAGER_IMAGE" CLUSTER_SQUID_IMAGE="$CLUSTER_SQUID_IMAGE" \
	PATH="$NODE_ASSETS:$PATH" \
	"$OUT/cluster.test" -test.v -test.timeout="${E2E_TEST_TIMEOUT:-40m}" \
	-ginkgo.v -ginkgo.label-filter=cluster ${E2E_GINKGO_FLAGS:-} 2>&1 | tee -i "$RUN/suite.log"
RC=${PIPESTATUS[0]}
echo "CLUSTER-TIMING suite=$(e2e_since "$t")s" >>"$RUN/timings.txt"
exit "$RC"
