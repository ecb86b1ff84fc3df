#!/usr/bin/env bash
# test/e2e/cluster/node-smoke.sh — `make test-e2e-node`: the real node alone
# (root, offline), up, one workload pod Running, down with nothing left.
#
#   1. node binaries (hack/node-assets.sh, cached) and the pause and smoke
#      images (images.sh without a manager: FROM scratch, built, not pulled);
#   2. node.sh up: every component a process in the node's own network and
#      mount namespaces, both images imported into its containerd;
#   3. a pod of the smoke image in a namespace enforcing restricted Pod
#      Security: Ready, its address in the pod range, its processes in the
#      node's cgroups and running as the image's user;
#   4. always: node.sh down, then nothing of the node may be left: no
#      process naming the state directory, no network namespace, no cgroup,
#      no mount, no containerd state.
#
# Exit code 0 only if the pod ran and the teardown left nothing. Timings
# (NODE-TIMING lines) go to stderr and $OUT/timings.txt; component logs
# stay in $OUT/node/logs. Environment: E2E_OUT (default bin/e2e-node).
set -uo pipefail
E2E_TAG=node
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

e2e_require_root
HERE=$E2E_ROOT/test/e2e/cluster
OUT=${E2E_OUT:-$E2E_ROOT/bin/e2e-node}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STATE=$OUT/node
NS=smoke
: >"$OUT/timings.txt"
timed() { e2e_timed "$OUT/timings.txt" "$@"; }

set -e
timed node_assets eval 'ASSETS=$("$E2E_ROOT/hack/node-assets.sh")'
timed images eval 'eval "$("$HERE/images.sh" "$OUT/images" "$ASSETS")"'
set +e

RC=1
kubectl_node() { "$HERE/node.sh" exec "$STATE" -- kubectl --kubeconfig "$STATE/kubeconfig/admin.conf" "$@"; }

leftovers() { # prints what the node left behind, one line each
	local id=$1 ns=$2 h
	[ -n "$ns" ] && ip netns list | grep -qw -- "$ns" && echo "network namespace $ns"
	pgrep -af -- "$STATE/" | sed 's/^/process /'
	for h in /sys/fs/cgroup/*/; do
		[ -n "$id" ] && [ -d "${h}pxnode-$id" ] && echo "cgroup ${h}pxnode-$id"
	done
	grep -F -- "$STATE/" /proc/self/mountinfo | cut -d' ' -f5 | sed 's/^/mount /'
	[ -e "$STATE/containerd" ] && echo "containerd state $STATE/containerd"
	return 0
}

teardown() {
	local rc=$RC id ns left
	trap - EXIT INT TERM
	id=$(sed -n 's/^ID=//p' "$STATE/state.env" 2>/dev/null | tail -n1)
	ns=$(sed -n 's/^NETNS=//p' "$STATE/state.env" 2>/dev/null | tail -n1)
	timed node_down "$HERE/node.sh" down "$STATE" || rc=1
	left=$(leftovers "$id" "$ns")
	if [ -n "$left" ]; then
		e2e_log "LEFT OVER:"
		echo "$left" | sed 's/^/  /' >&2
		rc=1
	fi
	e2e_log "---- summary ----"
	sed 's/^/  /' "$OUT/timings.txt" >&2
	e2e_log "exit code $rc; node logs: $STATE/logs"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

timed node_up "$HERE/node.sh" up "$STATE" "$ASSETS" "$CLUSTER_PAUSE_TAR" "$CLUSTER_SMOKE_TAR" || exit 1

smoke_pod() {
	kubectl_node create namespace "$NS" &&
		kubectl_node label namespace "$NS" pod-security.kubernetes.io/enforce=restricted &&
		kubectl_node apply -f - <<EOF &&
apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: $NS}
spec:
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: smoke
    image: $CLUSTER_SMOKE_IMAGE
    # Imported, never pulled: nothing could be.
    imagePullPolicy: Never
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
EOF
		kubectl_node -n "$NS" wait --for=condition=Ready pod/smoke --timeout=120s
}
timed pod_ready smoke_pod || exit 1

check_pod() {
	local ip uid cg pids p ok=1
	ip=$(kubectl_node -n "$NS" get pod smoke -o 'jsonpath={.status.podIP}')
	uid=$(kubectl_node -n "$NS" get pod smoke -o 'jsonpath={.metadata.uid}')
	case "$ip" in
	10.244.0.*) e2e_log "pod smoke Running at $ip" ;;
	*)
		e2e_log "pod smoke has address '$ip', want one in 10.244.0.0/24"
		ok=0
		;;
	esac
	cg=$(sed -n 's/^CGROUP_ROOT=//p' "$STATE/state.env" | tail -n1)
	# kubelet names a pod's cgroup pod<UID> (cgroupfs driver).
	pids=$(find "/sys/fs/cgroup/pids$cg" -type d -name "pod$uid" -exec find {} -name cgroup.procs \; |
		xargs cat 2>/dev/null | sort -un | tr '\n' ' ')
	if [ -z "${pids// /}" ]; then
		e2e_log "no process in the cgroup of pod $uid under $cg"
		ok=0
	fi
	# The sandbox runs pause as 65535, the container smoke as 65532.
	local smoke_user=0 u
	for p in $pids; do
		u=$(awk '/^Uid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
		e2e_log "pod process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)(uid $u)"
		[ "$u" = 65532 ] && smoke_user=1
	done
	if [ "$smoke_user" = 0 ]; then
		e2e_log "no process of pod $uid runs as 65532 (the smoke image's user)"
		ok=0
	fi
	[ "$ok" = 1 ]
}
check_pod && RC=0
