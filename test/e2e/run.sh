#!/usr/bin/env bash
# test/e2e/run.sh — `make test-e2e` and `make test-faults`: the real
# end-to-end suite and the fault suite on the real test hypervisor (root).
# E2E_SUITE picks the specs by Ginkgo label: e2e (default), faults (with
# the manager's orphan sweep every E2E_GC_INTERVAL, default 10s, and its
# debug log), pool (a ProxyPool under a crawler-like client), egress (the
# pools' egress promise seen from an "internet" namespace, NAT and a routed
# static block), or agent-ab (two guest images booted side by side;
# KVM_TEST_IMAGE_B is the one to compare with).
#
#   1. builds the manager, the envtest binaries (once) and the guest image
#      (once; cached by recipe hash in ~/.cache/proxy-operator/e2e-images), and compiles the
#      Ginkgo suite into bin/e2e.test;
#   2. starts the test hypervisor (test/e2e/infra/hypervisor.sh) in
#      $E2E_OUT/hv: sshd, libvirtd, NAT network "e2e" and the 204 server in
#      a network namespace of its own;
#   3. runs bin/e2e.test INSIDE that namespace (`ip netns exec`), where the
#      guests' 10.77.0.x addresses exist: the suite starts envtest's API
#      server and the manager binary on the namespace's loopback, and the
#      operator dials the namespace's sshd at 127.0.0.1:22;
#   4. always tears the hypervisor down (trap) and checks nothing is left.
#
# Exit code: the suite's (1 also when teardown left something behind).
# Artifacts: $E2E_OUT/run-<time>/ (faults-<time>/ for the fault suite:
# e2e.log, manager.log, timings.txt, timeline-*.txt, faults.md,
# failure.txt, the host's libvirt/qemu logs) and $E2E_OUT/hv/logs/ (sshd,
# forwarder, probe server, guest serial console).
#
# Environment: E2E_OUT (default bin/e2e), E2E_TEST_TIMEOUT (40m; faults and
# pool 60m),
# E2E_GINKGO_FLAGS (extra flags, e.g. -ginkgo.focus=...), and the suite's
# E2E_* tunables (test/e2e/e2eutil/config.go).
set -uo pipefail
E2E_TAG=${E2E_SUITE:-e2e}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

e2e_require_root
SUITE=${E2E_SUITE:-e2e}
case "$SUITE" in
e2e)
	LABELS='e2e'
	RUN_PREFIX=run
	TIMEOUT=40m
	;;
faults)
	LABELS='faults'
	RUN_PREFIX=faults
	TIMEOUT=60m
	export E2E_GC_INTERVAL=${E2E_GC_INTERVAL:-10s}
	# Debug: the manager logs every libvirt event it receives.
	export E2E_MANAGER_LOG_LEVEL=${E2E_MANAGER_LOG_LEVEL:-debug}
	;;
pool)
	# A ProxyPool scaled, rolled and scaled down under a crawler-like
	# client (pool_test.go): six TCG boots, four of them in sequence.
	LABELS='pool'
	RUN_PREFIX=pool
	TIMEOUT=60m
	;;
egress)
	# Egress seen from the test's own "internet" namespace (egress_test.go):
	# NAT pool of 2, then a static pool of 3 and a ban's replacement; at
	# most three TCG guests at once.
	LABELS='egress'
	RUN_PREFIX=egress
	TIMEOUT=40m
	# The manager's probe must not echo: the hypervisor's echo sits inside
	# the NAT and would measure each guest's private address, and a probe
	# that echoes is a measurement the pools' echo URL never overrides.
	PROBE_PLAIN=1
	;;
agent-ab)
	# Two guest images booted side by side (KVM_TEST_IMAGE_B: the other one).
	LABELS='agent-ab'
	RUN_PREFIX=agent-ab
	TIMEOUT=90m
	;;
*) e2e_die "E2E_SUITE=$SUITE: want e2e, faults, pool, egress or agent-ab" ;;
esac
OUT=${E2E_OUT:-$E2E_ROOT/bin/e2e}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STATE=$OUT/hv
RUN=$OUT/$RUN_PREFIX-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
T0=$(e2e_now)

set -e
e2e_build_manager
e2e_envtest_assets
e2e_guest_image
e2e_log "compiling the suite"
(cd "$E2E_ROOT" && e2e_go test -c -tags=e2e -o bin/e2e.test ./test/e2e)
set +e

RC=1
teardown() {
	local rc=$RC
	trap - EXIT INT TERM
	if ! e2e_hypervisor_down "$STATE" "$RUN/host-varlog"; then
		e2e_log "teardown left something behind (see above)"
		[ "$rc" -eq 0 ] && rc=1
	fi
	echo
	e2e_log "---- summary ----"
	[ -f "$RUN/timings.txt" ] && sed 's/^/  /' "$RUN/timings.txt" >&2
	[ -f "$RUN/faults.md" ] && sed 's/^/  /' "$RUN/faults.md" >&2
	e2e_log "total wall time $(e2e_since "$T0") s; suite exit code $RC"
	e2e_log "logs: $RUN (e2e.log, manager.log, timings.txt, failure.txt on failure, host-varlog/)"
	e2e_log "      $STATE/logs (sshd, forwarder, probe server, guest serial console)"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

e2e_hypervisor_up "$STATE"
if [ -n "${PROBE_PLAIN:-}" ]; then
	unset KVM_TEST_ECHO_URL
fi

e2e_log "running the $SUITE specs inside netns $KVM_TEST_NETNS (output also in $RUN/e2e.log)"
# shellcheck disable=SC2086
ip netns exec "$KVM_TEST_NETNS" env \
	E2E_ARTIFACTS="$RUN" E2E_MANAGER="$E2E_ROOT/bin/manager" \
	"$E2E_ROOT/bin/e2e.test" -test.v -test.timeout="${E2E_TEST_TIMEOUT:-$TIMEOUT}" \
	-ginkgo.v -ginkgo.label-filter="$LABELS" ${E2E_GINKGO_FLAGS:-} 2>&1 | tee -i "$RUN/e2e.log"
RC=${PIPESTATUS[0]}
exit "$RC"
