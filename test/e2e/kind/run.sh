#!/usr/bin/env bash
# test/e2e/kind/run.sh — `make test-e2e-kind`: the e2e suite (test/e2e)
# against the operator deployed in a kind cluster the way users install it
# (image, cert-manager, kustomize config/default), driving a real hypervisor
# on the LAN.
#
# Needs: docker, kind, kubectl, go, internet (kind node image, cert-manager
# manifest, the manager image's base images), and a KVM host reachable over
# SSH from this machine and from the kind node (through Docker's NAT), whose
# guests' addresses (bridged or routed) are reachable from both too.
# It cannot run on the offline CI machine (no pullable images there): that
# one runs `make test-e2e`, the same suite against the same kind of host.
#
# Required environment (the names the suite reads, see test/e2e/e2eutil):
#   KVM_TEST_ADDRESS       host[:port] of the hypervisor's sshd
#   KVM_TEST_KEY           private key file for KVM_TEST_USER (default root)
#   KVM_TEST_POOL          libvirt storage pool           (default: default)
#   KVM_TEST_NETWORK       libvirt network or host bridge (default: default)
#   KVM_TEST_NETWORK_MODE  network | bridge               (default: network)
#   KVM_TEST_DOMAIN_TYPE   kvm | qemu                     (default: kvm)
# Optional:
#   KVM_TEST_KNOWN_HOSTS   known_hosts file for KVM_TEST_ADDRESS; without
#                          it the host key is fetched with ssh-keyscan (trust
#                          on first use: only on a network you trust)
#   KVM_TEST_PROBE_URL     URL answering 204, reachable from the guests
#                          (default http://connectivitycheck.gstatic.com/generate_204)
#   KVM_TEST_IMAGE_URL + KVM_TEST_IMAGE_CHECKSUM: a guest image with squid,
#                          cloud-init and qemu-guest-agent; without them the
#                          image is built with test/e2e/infra/guest-image.sh
#                          (root, Debian) and served by the suite to the
#                          kind node on the kind network's gateway address
#   KVM_TEST_SSHD_STOP_CMD / KVM_TEST_SSHD_START_CMD: how to cut the
#                          operator's SSH access to the host and restore it
#                          (the suite checks TCPUnreachable and the heal).
#                          Default: a self-removing iptables REJECT (tcp-reset)
#                          of the SSH port on the host for E2E_OUTAGE_SECONDS
#                          (60), and a bounded wait until SSH answers again.
#                          It briefly blocks every SSH client of that host.
#   KIND_CLUSTER (proxy-operator-e2e), KIND_KEEP=1 (keep the cluster),
#   IMG (proxy-operator:e2e), CERT_MANAGER_VERSION (v1.19.1)
set -euo pipefail
E2E_TAG=e2e-kind
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

HERE=$E2E_ROOT/test/e2e/kind
OUT=$E2E_ROOT/bin/e2e-kind
RUN=$OUT/run-$(date +%Y%m%d-%H%M%S)
KIND_CLUSTER=${KIND_CLUSTER:-proxy-operator-e2e}
IMG=${IMG:-proxy-operator:e2e}
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.19.1}
NS=proxy-operator-system
DEPLOY=proxy-operator-controller-manager
mkdir -p "$RUN"
T0=$(e2e_now)

for tool in docker kind kubectl go ssh; do
	command -v "$tool" >/dev/null || e2e_die "$tool is required"
done
[ -n "${KVM_TEST_ADDRESS:-}" ] || e2e_die "KVM_TEST_ADDRESS is not set (the LAN hypervisor's SSH host[:port])"
[ -n "${KVM_TEST_KEY:-}" ] || e2e_die "KVM_TEST_KEY is not set (SSH private key file)"
export KVM_TEST_USER=${KVM_TEST_USER:-root}
export KVM_TEST_PROBE_URL=${KVM_TEST_PROBE_URL:-http://connectivitycheck.gstatic.com/generate_204}
case "$KVM_TEST_ADDRESS" in
\[*\]:*) HV_HOST=${KVM_TEST_ADDRESS%:*} HV_PORT=${KVM_TEST_ADDRESS##*:} HV_HOST=${HV_HOST#\[} HV_HOST=${HV_HOST%\]} ;;
*:*:*) HV_HOST=$KVM_TEST_ADDRESS HV_PORT=22 ;; # bare IPv6
*:*) HV_HOST=${KVM_TEST_ADDRESS%:*} HV_PORT=${KVM_TEST_ADDRESS##*:} ;;
*) HV_HOST=$KVM_TEST_ADDRESS HV_PORT=22 ;;
esac
if [ -z "${KVM_TEST_KNOWN_HOSTS:-}" ]; then
	KVM_TEST_KNOWN_HOSTS=$RUN/known_hosts
	e2e_log "no KVM_TEST_KNOWN_HOSTS: trusting the host key ssh-keyscan reports for $HV_HOST:$HV_PORT"
	ssh-keyscan -p "$HV_PORT" -t ed25519,ecdsa,rsa "$HV_HOST" 2>/dev/null >"$KVM_TEST_KNOWN_HOSTS"
	[ -s "$KVM_TEST_KNOWN_HOSTS" ] || e2e_die "ssh-keyscan got no host key from $HV_HOST:$HV_PORT"
fi
export KVM_TEST_KNOWN_HOSTS

SSH=(ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o "UserKnownHostsFile=$KVM_TEST_KNOWN_HOSTS"
	-o ConnectTimeout=10 -i "$KVM_TEST_KEY" -p "$HV_PORT" "$KVM_TEST_USER@$HV_HOST")
"${SSH[@]}" virsh -q -c qemu:///system version >/dev/null || e2e_die "cannot run virsh on $KVM_TEST_ADDRESS over SSH"

# The SSH outage, by default: reject the SSH port (tcp-reset, so a connect
# is refused and an established session dies at its next packet) for a
# bounded time, removed by the host itself; "start" waits for SSH to answer.
OUTAGE=${E2E_OUTAGE_SECONDS:-60}
RULE="INPUT -p tcp --dport $HV_PORT -m comment --comment proxy-operator-e2e -j REJECT --reject-with tcp-reset"
q() { printf '%q ' "$@"; }
if [ -z "${KVM_TEST_SSHD_STOP_CMD:-}" ]; then
	KVM_TEST_SSHD_STOP_CMD="$(q "${SSH[@]}") $(q "nohup sh -c 'sleep 1; iptables -I $RULE; sleep $OUTAGE; iptables -D $RULE' >/dev/null 2>&1 &") && sleep 2"
	KVM_TEST_SSHD_START_CMD="for i in \$(seq $((OUTAGE + 60))); do $(q "${SSH[@]}") true 2>/dev/null && exit 0; sleep 1; done; exit 1"
fi
export KVM_TEST_SSHD_STOP_CMD KVM_TEST_SSHD_START_CMD

cleanup() {
	local rc=$?
	trap - EXIT
	kubectl --kubeconfig "$OUT/kubeconfig" -n "$NS" logs "deploy/$DEPLOY" --all-containers --tail=-1 >"$RUN/manager.log" 2>&1 || true
	if [ "${KIND_KEEP:-0}" = 1 ]; then
		e2e_log "KIND_KEEP=1: cluster $KIND_CLUSTER kept (kind delete cluster --name $KIND_CLUSTER)"
	else
		kind delete cluster --name "$KIND_CLUSTER" || true
	fi
	e2e_log "total $(e2e_since "$T0") s, exit code $rc; logs: $RUN"
	exit "$rc"
}
trap cleanup EXIT

# 1. cluster
if ! kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
	kind create cluster --name "$KIND_CLUSTER" --config "$HERE/kind-config.yaml" --wait 5m
fi
kind get kubeconfig --name "$KIND_CLUSTER" >"$OUT/kubeconfig"
export KUBECONFIG=$OUT/kubeconfig

# 2. the manager image, loaded into the node
make -C "$E2E_ROOT" docker-build IMG="$IMG"
kind load docker-image "$IMG" --name "$KIND_CLUSTER"

# 3. cert-manager (the webhook serving certificate)
kubectl apply --server-side -f "https://github.com/cert-manager/cert-manager/releases/download/$CERT_MANAGER_VERSION/cert-manager.yaml"
kubectl -n cert-manager wait deployment --all --for=condition=Available --timeout=5m

# 4. the operator: config/default plus the e2e's manager flags and image
make -C "$E2E_ROOT" kustomize
OVERLAY=$OUT/overlay
mkdir -p "$OVERLAY"
cat >"$OVERLAY/kustomization.yaml" <<EOF
# Generated by test/e2e/kind/run.sh.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../../../config/default
images:
- name: proxy-operator
  newName: ${IMG%:*}
  newTag: ${IMG##*:}
patches:
- target:
    kind: Deployment
    name: $DEPLOY
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --providers=kvm
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --provider-check-interval=5s
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --proxy-probe-url=$KVM_TEST_PROBE_URL
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --proxy-probe-interval=15s
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --provision-poll-interval=2s
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --instance-tag=proxy-operator-e2e-kind
    - op: add
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: IfNotPresent
EOF
"$E2E_ROOT/bin/kustomize" build "$OVERLAY" >"$RUN/install.yaml"
kubectl apply --server-side -f "$RUN/install.yaml"
kubectl -n "$NS" rollout status "deploy/$DEPLOY" --timeout=5m

# 5. the guest image: given, or built here and served to the kind node
if [ -z "${KVM_TEST_IMAGE_URL:-}" ]; then
	e2e_require_root
	e2e_guest_image
	GW=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 '\.') ||
		e2e_die "no IPv4 gateway on docker network kind"
	export E2E_IMAGE_LISTEN=$GW:0 E2E_IMAGE_HOST=$GW
fi

# 6. the suite, against the cluster (no local control plane or manager)
(cd "$E2E_ROOT" && e2e_go test -c -tags=e2e -o bin/e2e.test ./test/e2e)
# shellcheck disable=SC2086 # E2E_GINKGO_FLAGS is a list of flags
E2E_KUBECONFIG=$OUT/kubeconfig E2E_ARTIFACTS=$RUN \
	"$E2E_ROOT/bin/e2e.test" -test.v -test.timeout=40m -ginkgo.v -ginkgo.label-filter=e2e ${E2E_GINKGO_FLAGS:-} 2>&1 | tee -i "$RUN/e2e.log"
exit "${PIPESTATUS[0]}"
