#!/usr/bin/env bash
# test/integration/run.sh — `make test-integration-kvm`: the KVM provider
# alone (no Kubernetes) against a real libvirt host over SSH.
#
# With KVM_TEST_ADDRESS set, it runs against that host as configured (see
# test/integration/kvm_test.go for the variables). Otherwise (root) it
# builds/reuses the guest image, starts the local test hypervisor
# (test/e2e/infra/hypervisor.sh up bin/itest/hv), runs the test in the root
# network namespace through the hypervisor's loopback SSH forwarder (the
# test only needs libvirt, never the guest's address), and always tears the
# hypervisor down. Exit code: the test's.
set -uo pipefail
E2E_TAG=itest
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"

run_test() {
	(cd "$E2E_ROOT" && e2e_go test -tags=integration -count=1 -timeout=30m -v ./test/integration/...)
}

if [ -n "${KVM_TEST_ADDRESS:-}" ]; then
	e2e_log "using the host at $KVM_TEST_ADDRESS"
	run_test
	exit $?
fi

e2e_require_root
OUT=$E2E_ROOT/bin/itest
STATE=$OUT/hv
mkdir -p "$OUT"
T0=$(e2e_now)
set -e
e2e_guest_image
(cd "$E2E_ROOT" && e2e_go test -c -tags=integration -o /dev/null ./test/integration) # compile errors before the hypervisor starts
set +e

RC=1
teardown() {
	local rc=$RC
	trap - EXIT INT TERM
	if ! e2e_hypervisor_down "$STATE" "$OUT/host-varlog"; then
		e2e_log "teardown left something behind (see above)"
		[ "$rc" -eq 0 ] && rc=1
	fi
	e2e_log "total $(e2e_since "$T0") s; test exit code $RC; logs: $STATE/logs, $OUT/host-varlog"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

e2e_hypervisor_up "$STATE"
run_test
RC=$?
exit "$RC"
