#!/usr/bin/env bash
# node.sh — a real one-node Kubernetes cluster on this machine, every
# component a process in namespaces of its own, nothing pulled from a
# registry (test/e2e/cluster, make test-e2e-cluster).
#
#   node.sh up      STATE_DIR ASSETS_DIR [IMAGE.tar...]   start it, import the images
#   node.sh down    STATE_DIR   stop everything it started, by PID (safe twice)
#   node.sh env     STATE_DIR   print `export NODE_...=...` lines
#   node.sh exec    STATE_DIR -- CMD...   run CMD on the node (its netns and mount ns)
#   node.sh kubelet STATE_DIR stop|start  kubelet gone and back (containers keep
#                               running, as on a partitioned node)
#   node.sh freeze|thaw STATE_DIR POD_UID  every process of one pod stopped (cgroup
#                               freezer) and resumed: with kubelet stopped, the
#                               node of that pod lost, while the others keep
#                               running as if on other nodes
#   node.sh status  STATE_DIR   exit 0 if up
#
# ASSETS_DIR is what hack/node-assets.sh prints. Needs root.
#
# DESIGN
#   Why not kind: kind's node image boots systemd in a Docker container and
#   nothing can pull its base image here; kind and dockerd also put bridges
#   with private addresses into the root network namespace, which the tests'
#   network rule forbids. This host is cgroup v1 without systemd, which a
#   stock kind node (Debian trixie, systemd >= 256) no longer boots on. So
#   the node is what kind's node container holds, without the container:
#
#     netns pxnode-<id> + private mount namespace (a holder process keeps it)
#     ---------------------------------------------------------------------
#     node0 10.250.0.2/24 (a veth pair with both ends inside; the default
#       route points at it, so Service IPs have a route for kube-proxy's DNAT)
#     etcd 127.0.0.1:2379   kube-apiserver 10.250.0.2:6443 (advertised)
#     kube-controller-manager, kube-scheduler   kube-proxy (iptables mode)
#     containerd (/run/containerd, root STATE_DIR/containerd) + runc (seccomp)
#     kubelet (cgroupfs, cgroupRoot /pxnode-<id>)  CNI bridge cni0 10.244.0.1/24
#     pods 10.244.0.0/24, each in a netns of its own; Services 10.96.0.0/16
#
#   * Nothing is added to the root network namespace; the suite runs inside
#     the node's (`ip netns exec`), where node, pod and Service addresses exist.
#   * The mount namespace is private: /run is a fresh tmpfs (this containerd
#     never meets Docker's), /var/lib a tmpfs with the node's directories
#     bound from STATE_DIR, /var/log bound to STATE_DIR/varlog, and /sys a
#     sysfs of the node's netns with the host's cgroup v1 hierarchies mounted
#     again. Overlay, tmpfs and netns mounts of containerd and kubelet stay
#     in it and go away with it.
#   * kubelet sets six global kernel tunables (vm.overcommit_memory,
#     kernel.panic, ...) unless protectKernelDefaults, which then refuses to
#     start when they differ. They are per machine, not per namespace, and
#     this machine is shared: inside the node each is a file holding the
#     value kubelet wants, so the machine's own settings are never changed.
#   * Pods' cgroups live under /pxnode-<id> in every hierarchy; `down` kills
#     what is in them, then every process of the node's mount and network
#     namespaces, removes the cgroups and the namespace.
#
# STATE_DIR (absolute, no spaces): state.env, pki/, kubeconfig/, config/,
# etcd/, containerd/, kubelet/, cni/, varlog/, run/ (PID files), logs/.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
NODE_IP=10.250.0.2
NODE_PREFIX=24
POD_CIDR=10.244.0.0/24
POD_GATEWAY=10.244.0.1
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1
NODE_NAME=pxnode
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
HOST_PACKAGES=(iptables iproute2 util-linux openssl procps)
COMPONENTS=(kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd containerd)

log() { echo "node: $*" >&2; }
die() {
	echo "node: error: $*" >&2
	exit 1
}
usage() {
	sed -n '2,18p' "$SELF" >&2
	exit 2
}

[ $# -ge 2 ] || usage
CMD=$1
STATE=$2
shift 2
case "$STATE" in
/*) ;;
*) STATE="$(pwd)/$STATE" ;;
esac
case "$STATE" in
*' '*) die "STATE_DIR must not contain spaces" ;;
/run/* | /var/run/* | /var/lib/* | /var/log*) die "STATE_DIR must not be under a directory the node overlays" ;;
esac

# ---------------------------------------------------------------- helpers ----
state_get() {
	[ -f "$STATE/state.env" ] || return 0
	sed -n "s/^$1=//p" "$STATE/state.env" | tail -n1
}
state_set() {
	touch "$STATE/state.env"
	sed -i "/^$1=/d" "$STATE/state.env"
	echo "$1=$2" >>"$STATE/state.env"
}

# pid_alive PIDFILE MARKER: the PID runs and its command line has MARKER.
pid_alive() {
	local pid
	[ -f "$1" ] || return 1
	pid=$(cat "$1" 2>/dev/null) || return 1
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

running() { # not gone and not a zombie (no fork: it runs per process)
	local st
	{ st=$(<"/proc/$1/stat"); } 2>/dev/null || return 1
	st=${st##*) }
	[ -n "$st" ] && [ "${st%% *}" != Z ]
}

# stop_pid PIDFILE MARKER [SECONDS]: TERM, wait, KILL.
stop_pid() {
	local f=$1 marker=$2 wait=${3:-10} pid i
	if pid_alive "$f" "$marker"; then
		pid=$(cat "$f")
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < wait * 10; i++)); do
			running "$pid" || break
			sleep 0.1
		done
		running "$pid" && kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do running "$pid" || break; sleep 0.1; done
	fi
	rm -f "$f"
}

holder_pid() {
	local id
	id=$(state_get ID)
	[ -n "$id" ] && pid_alive "$STATE/run/holder.pid" "pxnode-holder-$id" || return 1
	cat "$STATE/run/holder.pid"
}

# in_node CMD...: CMD inside the node's network and mount namespaces.
in_node() {
	local h
	h=$(holder_pid) || die "node in $STATE is not up"
	nsenter --target "$h" --mount --net -- env -i PATH="$ASSETS:$ASSETS/cni:/usr/sbin:/usr/bin:/sbin:/bin" \
		HOME=/root LANG=C.UTF-8 "$@"
}

# start NAME CMD...: CMD as a daemon on the node; its PID in run/NAME.pid.
start() {
	local name=$1
	shift
	setsid nsenter --target "$(holder_pid)" --mount --net -- env -i \
		PATH="$ASSETS:$ASSETS/cni:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root LANG=C.UTF-8 \
		sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$STATE/run/$name.pid" "$@" \
		</dev/null >>"$STATE/logs/$name.log" 2>&1 &
	for _ in $(seq 50); do pid_alive "$STATE/run/$name.pid" "$STATE" && return 0 || sleep 0.1; done
	die "$name did not start (see $STATE/logs/$name.log)"
}

# wait_for WHAT SECONDS CMD...: CMD succeeds within SECONDS, or die.
wait_for() {
	local what=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "$what not ready after $secs s (logs: $STATE/logs)"
}

ensure_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
}

kubectl_admin() { in_node kubectl --kubeconfig "$STATE/kubeconfig/admin.conf" "$@"; }

# --------------------------------------------------------------------- PKI ---
# cert NAME CN O [SANS] [server]: a key and a certificate signed by the CA.
cert() {
	local name=$1 cn=$2 org=$3 sans=${4:-} usage=${5:-clientAuth} subj="/CN=$2" d=$STATE/pki
	[ -n "$org" ] && subj="/O=$org/CN=$cn"
	openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$d/$name.key" \
		-out "$d/$name.csr" -subj "$subj" 2>/dev/null
	{
		echo "basicConstraints = critical, CA:FALSE"
		echo "keyUsage = critical, digitalSignature, keyEncipherment"
		echo "extendedKeyUsage = $usage"
		[ -n "$sans" ] && echo "subjectAltName = $sans"
	} >"$d/$name.ext"
	openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
		-days 2 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
	rm -f "$d/$name.csr" "$d/$name.ext"
}

kubeconfig() { # kubeconfig NAME CERT: a kubeconfig for the pki/CERT identity
	cat >"$STATE/kubeconfig/$1.conf" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pxnode
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $STATE/pki/$2.crt
    client-key: $STATE/pki/$2.key
contexts:
- name: pxnode
  context: {cluster: pxnode, user: $2}
current-context: pxnode
EOF
}

make_pki() {
	local d=$STATE/pki
	mkdir -p "$d" "$STATE/kubeconfig"
	openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$d/ca.key" \
		-out "$d/ca.crt" -days 2 -subj "/CN=pxnode-ca" 2>/dev/null
	cert apiserver kube-apiserver "" \
		"IP:$NODE_IP, IP:$API_SERVICE_IP, IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local" serverAuth
	cert kubelet-serving "system:node:$NODE_NAME" system:nodes "IP:$NODE_IP, DNS:$NODE_NAME" serverAuth
	cert admin kubernetes-admin system:masters
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
	cert kube-controller-manager system:kube-controller-manager ""
	cert kube-scheduler system:kube-scheduler ""
	cert kubelet "system:node:$NODE_NAME" system:nodes
	cert kube-proxy system:kube-proxy ""
	openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
	openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
	for n in admin kube-controller-manager kube-scheduler kubelet kube-proxy; do kubeconfig "$n" "$n"; done
}

# ----------------------------------------------------------------- configs ---
write_configs() {
	local c=$STATE/config id
	id=$(state_get ID)
	mkdir -p "$c/cni"
	cat >"$c/containerd.toml" <<EOF
# containerd 2.x, config version 3. Its own root, state and socket (inside
# the node's mount namespace), so Docker's containerd is never touched.
version = 3
root = "$STATE/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    # Imported, never pulled (node.sh up).
    sandbox = '$PAUSE_IMAGE'
[plugins.'io.containerd.cri.v1.runtime']
  # true where root lacks CAP_SYS_RESOURCE (some VM sandboxes): runc could
  # not lower a container's oom_score_adj below containerd's own (the
  # sandbox's -998, a Guaranteed pod's -997), and no pod would start.
  restrict_oom_score_adj = $(cap_sys_resource && echo false || echo true)
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '$ASSETS/runc'
        # No systemd here: cgroupfs (kubelet takes the driver from the CRI).
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['$ASSETS/cni']
    conf_dir = '$c/cni'
    max_conf_num = 1
EOF
	cat >"$c/cni/10-pxnode.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pxnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	# No DNS server for pods: nothing here resolves names, and pods must
	# not reach the machine's resolver.
	echo '# pxnode: no DNS' >"$c/resolv.conf"
	cat >"$c/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host is cgroup v1 (deprecated; kubelet 1.35+ refuses it by default).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /pxnode-$id
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $NODE_IP
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $STATE/pki/kubelet-serving.crt
tlsPrivateKeyFile: $STATE/pki/kubelet-serving.key
clusterDomain: cluster.local
resolvConf: $c/resolv.conf
failSwapOn: false
# The kernel tunables are files inside the node (see DESIGN); never error.
protectKernelDefaults: false
# One small node on a busy shared disk: no disk-pressure eviction, no image
# GC (every image is imported, none could be pulled back).
evictionHard: {nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
	cat >"$c/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE_NAME
clientConnection: {kubeconfig: $STATE/kubeconfig/kube-proxy.conf}
# nf_conntrack_max is global, not per namespace: leave it alone.
conntrack: {maxPerCore: 0}
nodePortAddresses: [primary]
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
}

cap_sys_resource() { # this process may use CAP_SYS_RESOURCE (bit 24)
	local bnd
	bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
	(((16#$bnd >> 24) & 1))
}

# ---------------------------------------------------------------- holder ---
# Runs as the holder, inside the node's netns (ip netns exec: a sysfs of that
# netns on /sys) and a private mount namespace (unshare -m).
holder_script() {
	cat <<EOF
set -eu
mount --make-rprivate /
mount --make-rshared /
# The host's cgroup hierarchies, again, on the fresh /sys.
mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
while read -r _ dir type opts _; do
	case "\$dir:\$type" in
	/sys/fs/cgroup/*:cgroup | /sys/fs/cgroup/*:cgroup2) mkdir -p "\$dir"; mount -t "\$type" -o "\$opts" "\$type" "\$dir" ;;
	esac
done </proc/1/mounts
mount -t tmpfs -o mode=0755 pxnode-run /run
mount -t tmpfs -o mode=0755 pxnode-varlib /var/lib
mkdir -p /var/lib/kubelet /var/lib/cni
mount --bind $STATE/kubelet /var/lib/kubelet
mount --bind $STATE/cni /var/lib/cni
mount --bind $STATE/varlog /var/log
for f in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
	mount --bind "$STATE/run/sysctl/\$(echo \$f | tr / .)" /proc/sys/\$f
done
ip link set lo up
ip link add node0 type veth peer name node0-peer
ip addr add $NODE_IP/$NODE_PREFIX dev node0
ip link set node0 up
ip link set node0-peer up
ip route add default dev node0
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
touch $STATE/run/holder.ready
exec -a pxnode-holder-\$1 sleep infinity
EOF
}

# fake_tunables: what kubelet would write (pkg/kubelet/cm setupKernelTunables).
fake_tunables() {
	local d=$STATE/run/sysctl
	mkdir -p "$d"
	echo 1 >"$d/vm.overcommit_memory"
	echo 0 >"$d/vm.panic_on_oom"
	echo 10 >"$d/kernel.panic"
	echo 1 >"$d/kernel.panic_on_oops"
	echo 1000000 >"$d/kernel.keys.root_maxkeys"
	echo 25000000 >"$d/kernel.keys.root_maxbytes"
}

make_cgroups() { # the kubelet's cgroupRoot in every v1 hierarchy
	local id=$1 h
	for h in /sys/fs/cgroup/*/; do
		[ -f "$h/cgroup.procs" ] || continue
		mkdir -p "$h/pxnode-$id"
	done
	# cpuset children start empty in v1; give the root all CPUs and nodes.
	if [ -d /sys/fs/cgroup/cpuset/pxnode-$id ]; then
		cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/pxnode-$id/cpuset.cpus"
		cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/pxnode-$id/cpuset.mems"
	fi
}

# ---------------------------------------------------------------------- up ---
start_kubelet() {
	start kubelet kubelet --config "$STATE/config/kubelet.yaml" --kubeconfig "$STATE/kubeconfig/kubelet.conf" \
		--hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir /var/lib/kubelet --v=1
}

cmd_up() {
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	ASSETS=${1:?usage: node.sh up STATE_DIR ASSETS_DIR [IMAGE.tar...]}
	ASSETS=$(cd "$ASSETS" && pwd)
	shift
	ensure_packages
	if holder_pid >/dev/null 2>&1 && pid_alive "$STATE/run/kubelet.pid" "$STATE"; then
		log "already up ($(state_get NETNS))"
		return 0
	fi
	[ -f "$STATE/state.env" ] && cmd_down
	local id ns t0 img
	t0=$(date +%s)
	id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	ns=pxnode-$id
	mkdir -p "$STATE"/{run,logs,etcd,containerd,kubelet,cni/ipam,varlog}
	: >"$STATE/state.env"
	state_set ID "$id"
	state_set NETNS "$ns"
	state_set ASSETS "$ASSETS"
	state_set CGROUP_ROOT "/pxnode-$id"

	log "pki and configuration"
	make_pki
	write_configs
	fake_tunables
	make_cgroups "$id"

	log "namespace $ns"
	ip netns add "$ns"
	holder_script >"$STATE/run/holder.sh"
	rm -f "$STATE/run/holder.ready"
	setsid ip netns exec "$ns" unshare --mount --propagation private \
		bash "$STATE/run/holder.sh" "$id" </dev/null >"$STATE/logs/holder.log" 2>&1 &
	echo $! >"$STATE/run/holder.pid"
	for _ in $(seq 100); do [ -f "$STATE/run/holder.ready" ] && break || sleep 0.1; done
	[ -f "$STATE/run/holder.ready" ] || die "node namespace setup failed: $(cat "$STATE/logs/holder.log")"

	log "etcd, kube-apiserver"
	start etcd etcd --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 \
		--advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
		--listen-metrics-urls http://127.0.0.1:2381 --unsafe-no-fsync --log-level warn
	start kube-apiserver kube-apiserver --etcd-servers http://127.0.0.1:2379 \
		--advertise-address "$NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--tls-cert-file "$STATE/pki/apiserver.crt" --tls-private-key-file "$STATE/pki/apiserver.key" \
		--client-ca-file "$STATE/pki/ca.crt" \
		--kubelet-client-certificate "$STATE/pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$STATE/pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$STATE/pki/ca.crt" \
		--kubelet-preferred-address-types InternalIP,ExternalIP,Hostname \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$STATE/pki/sa.pub" --service-account-signing-key-file "$STATE/pki/sa.key" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true \
		--default-not-ready-toleration-seconds "${NODE_TOLERATION_SECONDS:-10}" \
		--default-unreachable-toleration-seconds "${NODE_TOLERATION_SECONDS:-10}" \
		--profiling=false
	wait_for kube-apiserver 120 kubectl_admin get --raw /readyz

	log "kube-controller-manager, kube-scheduler"
	start kube-controller-manager kube-controller-manager \
		--kubeconfig "$STATE/kubeconfig/kube-controller-manager.conf" \
		--authentication-kubeconfig "$STATE/kubeconfig/kube-controller-manager.conf" \
		--authorization-kubeconfig "$STATE/kubeconfig/kube-controller-manager.conf" \
		--bind-address 127.0.0.1 --leader-elect=false --controllers '*' --use-service-account-credentials \
		--root-ca-file "$STATE/pki/ca.crt" --service-account-private-key-file "$STATE/pki/sa.key" \
		--cluster-cidr "$CLUSTER_CIDR" --service-cluster-ip-range "$SERVICE_CIDR" \
		--node-monitor-grace-period "${NODE_MONITOR_GRACE:-20s}"
	start kube-scheduler kube-scheduler --kubeconfig "$STATE/kubeconfig/kube-scheduler.conf" \
		--authentication-kubeconfig "$STATE/kubeconfig/kube-scheduler.conf" \
		--authorization-kubeconfig "$STATE/kubeconfig/kube-scheduler.conf" \
		--bind-address 127.0.0.1 --leader-elect=false

	log "containerd"
	start containerd containerd --config "$STATE/config/containerd.toml"
	wait_for containerd 60 in_node ctr --address /run/containerd/containerd.sock version
	for img in "$@"; do
		[ -f "$img" ] || die "no image archive $img"
		log "importing $(basename "$img")"
		in_node ctr --address /run/containerd/containerd.sock -n k8s.io images import \
			--platform "linux/$(go_arch)" "$img" >&2
	done

	log "kubelet, kube-proxy"
	start_kubelet
	start kube-proxy kube-proxy --config "$STATE/config/kube-proxy.yaml"
	wait_for "node $NODE_NAME Ready" 180 kubectl_admin wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
	wait_for "ServiceAccount default" 120 kubectl_admin -n default get serviceaccount default
	wait_for "ConfigMap kube-root-ca.crt" 120 kubectl_admin -n default get configmap kube-root-ca.crt
	state_set UP 1
	log "up in $(($(date +%s) - t0)) s: netns $ns, node $NODE_NAME $NODE_IP, kubeconfig $STATE/kubeconfig/admin.conf"
}

go_arch() { case "$(uname -m)" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac; }

# -------------------------------------------------------------------- down ---
# pids_in_cgroup ROOT: every process in the node's pod cgroups (any hierarchy).
pids_in_cgroup() {
	local root=$1 h
	for h in /sys/fs/cgroup/*/; do
		[ -d "$h${root#/}" ] || continue
		find "$h${root#/}" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -un
}

pids_in_mntns() { # every process sharing the holder's mount namespace
	local h=$1 p
	[ -e "/proc/$h/ns/mnt" ] || return 0
	for p in /proc/[0-9]*; do
		# -ef: the same namespace inode; no fork per process.
		[ "${p#/proc/}" != "$h" ] && [[ $p/ns/mnt -ef /proc/$h/ns/mnt ]] && running "${p#/proc/}" && echo "${p#/proc/}"
	done
	return 0
}

# kill_all WHAT LISTER ARG [SIGNALS]: send each signal (default TERM KILL
# KILL) in turn to what LISTER prints, until it prints nothing.
kill_all() {
	local what=$1 lister=$2 arg=$3 sigs=${4:-TERM KILL KILL} sig i left
	for sig in $sigs; do
		left=$($lister "$arg" | tr '\n' ' ')
		[ -z "${left// /}" ] && return 0
		log "ending $what ($sig): $left"
		kill -"$sig" $left 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			[ -z "$($lister "$arg")" ] && return 0
			sleep 0.1
		done
	done
	[ -z "$($lister "$arg")" ]
}

cmd_down() {
	[ -d "$STATE" ] || return 0
	local ns id cg holder c rc=0 h t
	ns=$(state_get NETNS)
	id=$(state_get ID)
	cg=$(state_get CGROUP_ROOT)
	holder=$(holder_pid 2>/dev/null || true)
	HOLDER=$holder
	# kubelet first, so nothing restarts what is stopped next.
	stop_pid "$STATE/run/kubelet.pid" "$STATE"
	# A frozen pod (node.sh freeze) would never die of its KILL.
	if [ -n "$cg" ] && [ -d "/sys/fs/cgroup/freezer${cg}" ]; then
		find "/sys/fs/cgroup/freezer${cg}" -name freezer.state | while read -r f; do echo THAWED >"$f"; done
	fi
	# A test node's pods need no grace: KILL, so nothing waits on them.
	[ -n "$cg" ] && { kill_all "pod processes" pids_in_cgroup "$cg" "KILL KILL" || rc=1; }
	for c in "${COMPONENTS[@]}"; do
		t=$(date +%s.%N)
		stop_pid "$STATE/run/$c.pid" "$STATE"
		log "stopped $c ($(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
	done
	[ -n "$holder" ] && { kill_all "node processes (containerd shims)" pids_in_mntns "$holder" "KILL KILL" || rc=1; }
	if [ -n "$ns" ] && ip netns list | grep -qw -- "$ns"; then
		kill_all "processes in $ns" ip_netns_pids "$ns" || rc=1
	fi
	[ -n "$id" ] && stop_pid "$STATE/run/holder.pid" "pxnode-holder-$id"
	if [ -n "$cg" ]; then
		for h in /sys/fs/cgroup/*/; do
			[ -d "$h${cg#/}" ] && find "$h${cg#/}" -depth -type d -exec rmdir {} + 2>/dev/null
			if [ -d "$h${cg#/}" ]; then
				log "LEFT OVER: cgroup $h${cg#/}"
				rc=1
			fi
		done
	fi
	if [ -n "$ns" ] && ip netns list | grep -qw -- "$ns"; then
		ip netns del "$ns" || rc=1
	fi
	if grep -qF -- "$STATE/" /proc/self/mountinfo; then
		log "LEFT OVER: mounts under $STATE: $(grep -F -- "$STATE/" /proc/self/mountinfo | cut -d' ' -f5 | tr '\n' ' ')"
		rc=1
	else
		# Keep logs/ for post-mortems.
		rm -rf --one-file-system "$STATE"/{run,etcd,containerd,kubelet,cni,varlog,pki,kubeconfig,config,state.env}
	fi
	[ -n "$ns" ] && log "down: $ns removed"
	return $rc
}

ip_netns_pids() { # the namespace's processes, its holder aside
	local p
	for p in $(ip netns pids "$1" 2>/dev/null); do
		[ "$p" != "${HOLDER:-}" ] && running "$p" && echo "$p"
	done
	return 0
}

cmd_env() {
	[ "$(state_get UP)" = 1 ] || die "node in $STATE is not up"
	local k v
	while read -r k v; do printf 'export %s=%q\n' "$k" "$v"; done <<EOF
NODE_NETNS $(state_get NETNS)
NODE_NAME $NODE_NAME
NODE_IP $NODE_IP
NODE_POD_CIDR $POD_CIDR
NODE_SERVICE_CIDR $SERVICE_CIDR
NODE_KUBECONFIG $STATE/kubeconfig/admin.conf
NODE_ASSETS $(state_get ASSETS)
NODE_STATE_DIR $STATE
NODE_SH $SELF
EOF
}

ASSETS=$(state_get ASSETS)
case "$CMD" in
up) cmd_up "$@" ;;
down) cmd_down ;;
env) cmd_env ;;
status) holder_pid >/dev/null && pid_alive "$STATE/run/kubelet.pid" "$STATE" ;;
exec)
	[ "${1:-}" = -- ] && shift
	[ $# -ge 1 ] || usage
	in_node "$@"
	;;
kubelet)
	case "${1:-}" in
	stop) stop_pid "$STATE/run/kubelet.pid" "$STATE" ;;
	start) pid_alive "$STATE/run/kubelet.pid" "$STATE" || start_kubelet ;;
	*) usage ;;
	esac
	;;
freeze | thaw)
	uid=${1:?usage: node.sh freeze|thaw STATE_DIR POD_UID}
	cg=$(state_get CGROUP_ROOT)
	# Through the holder's root: the caller may run where /sys has no
	# cgroups (`ip netns exec` mounts a fresh sysfs over /sys).
	h=$(holder_pid) || die "node in $STATE is not up"
	dir=$(find "/proc/$h/root/sys/fs/cgroup/freezer${cg}" -type d -name "pod$uid" -print -quit 2>/dev/null || true)
	[ -n "$dir" ] || die "no freezer cgroup of pod $uid under ${cg}"
	want=FROZEN
	[ "$CMD" = thaw ] && want=THAWED
	echo "$want" >"$dir/freezer.state"
	for _ in $(seq 100); do
		[ "$(cat "$dir/freezer.state")" = "$want" ] && exit 0
		sleep 0.1
	done
	die "pod $uid: freezer.state is $(cat "$dir/freezer.state"), want $want"
	;;
*) usage ;;
esac
