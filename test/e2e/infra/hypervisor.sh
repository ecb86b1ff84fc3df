#!/usr/bin/env bash
# hypervisor.sh — a real libvirt/QEMU test hypervisor on this machine, reached
# like a remote KVM host: over SSH, forwarding libvirt's unix socket.
#
#   hypervisor.sh up         STATE_DIR   start it (idempotent)
#   hypervisor.sh down       STATE_DIR   stop everything it started (safe twice)
#   hypervisor.sh env        STATE_DIR   print `export KVM_TEST_...=...` lines
#   hypervisor.sh exec       STATE_DIR -- CMD...   run CMD on the "host"
#   hypervisor.sh stop-sshd  STATE_DIR   make the host unreachable over SSH
#   hypervisor.sh start-sshd STATE_DIR   make it reachable again (same port/key)
#   hypervisor.sh status     STATE_DIR   exit 0 if up
#   hypervisor.sh libvirtd   STATE_DIR stop|cont|kill|start   wedge, thaw, kill or
#                                        (re)start the host's libvirtd (fault tests)
#   hypervisor.sh rotate-host-key STATE_DIR   new sshd host key (established
#                                        sessions end), printed as a public key line
#   hypervisor.sh tmpfs-pool STATE_DIR NAME MIB   directory pool NAME on a tmpfs of
#                                        MIB MiB in the host's mount namespace;
#                                        again with another size resizes it
#   hypervisor.sh host-b     STATE_DIR up|exec -- CMD...   a second hypervisor, "host B":
#                                        its own libvirtd (socket, state, pool e2e-b)
#                                        behind the same sshd; up prints its socket
#
# DESIGN (and the network rule it obeys)
#   Traffic may go only to loopback or to hosts inside network namespaces this
#   script created; no private-range address or bridge may exist in the root
#   namespace. So the whole "hypervisor host" lives in its own namespaces:
#
#     root netns/mount ns                 host = netns pxe2e-<id> + private mount ns
#     ------------------------            -----------------------------------------
#     operator / go test                  lo 127.0.0.1 ── sshd :22 (own config/keys)
#       │ ssh 127.0.0.1:PORT              libvirtd + virtlogd (own /etc/libvirt,
#       ▼                                   /var/lib/libvirt, /run ... bind mounts)
#     socat 127.0.0.1:PORT ──nsenter──▶   bridge pxbr0 10.77.0.1/24 (libvirt NAT net
#       (no veth, no address added          "e2e", dnsmasq DHCP) ── guests
#        in the root namespace)           probe server 10.77.0.1:8204 → 204
#
#   * There is no veth pair at all: the only way in is the loopback port
#     forward (socat in the root netns, one `nsenter --net` + socat per
#     connection). Nothing is added to the root namespace but a 127.0.0.1 port.
#   * A holder process (`sleep`, argv[0] "pxe2e-holder-<id>") keeps the host's
#     private mount namespace alive. In it /run is a fresh tmpfs and libvirt's
#     directories are bind mounts into STATE_DIR, so this libvirtd never meets a
#     system libvirtd, and over SSH the host looks standard: the libvirt socket
#     is /var/run/libvirt/libvirt-sock, `virsh -c qemu:///system` works.
#   * The operator (root netns) reaches libvirt by SSH unix-socket forwarding
#     (AllowStreamLocalForwarding yes) to KVM_TEST_SOCKET. Guests' addresses
#     (10.77.0.x) exist only inside the namespace: reach them either with
#     `hypervisor.sh exec STATE_DIR -- curl -x http://GUESTIP:3128 URL`, or
#     through the same SSH connection (AllowTcpForwarding yes: direct-tcpip to
#     GUESTIP:3128), which is how a real operator would reach them too.
#   * KVM is detected by booting OVMF under `-accel kvm` for a few seconds; on
#     this machine OVMF dies under KVM, so DOMAIN_TYPE is usually `qemu` (TCG).
#     Force it with PXE2E_DOMAIN_TYPE=kvm|qemu.
#
# STATE_DIR layout (absolute path without spaces, not under /run, /etc/libvirt,
# /var/lib/libvirt, /var/log, /var/cache/libvirt):
#   state.env            KEY=VALUE facts (NETNS, SSH_PORT, DOMAIN_TYPE, ...)
#   id_ed25519[.pub]     client key for KVM_TEST_USER (root)
#   known_hosts          "[127.0.0.1]:PORT ssh-ed25519 ..." line
#   ssh_host_ed25519_key sshd host key;  sshd_config; authorized_keys
#   pool/                directory of storage pool "e2e"
#   libvirt/{etc,lib,cache,run}  the host's libvirt dirs;  varlog/ its /var/log
#   hostb/               host B (host-b up): the same layout for its libvirtd
#   run/*.pid            PIDs of everything started here
#   logs/                daemon logs (kept by `down` for post-mortems)
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
NET_NAME=e2e
POOL_NAME=e2e
BRIDGE=pxbr0
GW=10.77.0.1            # inside the namespace only
DHCP_START=10.77.0.100
DHCP_END=10.77.0.199
PROBE_PORT=8204
HOST_PACKAGES=(libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils ovmf
	openssh-server openssh-client dnsmasq-base iproute2 iptables socat util-linux procps)

log() { echo "hypervisor: $*" >&2; }
die() {
	echo "hypervisor: error: $*" >&2
	exit 1
}

usage() {
	sed -n '2,20p' "$SELF" >&2
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
/run/* | /var/run/* | /etc/libvirt* | /var/lib/libvirt* | /var/log* | /var/cache/libvirt*)
	die "STATE_DIR must not be under a directory the host namespace overlays" ;;
esac

HOSTB=$STATE/hostb # host B (cmd_hostb_up)
HOSTB_POOL=e2e-b

# ---------------------------------------------------------------- helpers ----
state_get() { # state_get KEY -> value ('' if absent)
	[ -f "$STATE/state.env" ] || return 0
	sed -n "s/^$1=//p" "$STATE/state.env" | tail -n1
}
state_set() {
	touch "$STATE/state.env"
	sed -i "/^$1=/d" "$STATE/state.env"
	echo "$1=$2" >>"$STATE/state.env"
}

# pid_alive PIDFILE MARKER: the PID in PIDFILE runs and its command line
# contains MARKER (guards against a recycled PID).
pid_alive() {
	local pid
	[ -f "$1" ] || return 1
	pid=$(cat "$1" 2>/dev/null) || return 1
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}

# running PID: exists and is not a zombie (this machine's PID 1 reaps late).
running() {
	local st
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
	[ -n "$st" ] && [ "$st" != Z ]
}

# stop_pid PIDFILE MARKER [GROUP]: TERM, wait up to 10 s, KILL. With GROUP,
# signal the process group (the socat forwarders lead their own group).
stop_pid() {
	local f=$1 marker=$2 group=${3:-} pid i target
	if pid_alive "$f" "$marker"; then
		pid=$(cat "$f")
		target=$pid
		[ -n "$group" ] && target="-$pid"
		kill -TERM -- "$target" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do
			running "$pid" || break
			sleep 0.1
		done
		running "$pid" && kill -KILL -- "$target" 2>/dev/null || true
	fi
	rm -f "$f"
}

# holder_pid [b]: PID holding the host's mount namespace (host B's with b),
# or fail.
holder_pid() {
	local ns pidf=$STATE/run/holder.pid marker=pxe2e-holder
	[ "${1:-}" = b ] && pidf=$HOSTB/run/holder.pid marker=pxe2e-hostb
	ns=$(state_get NETNS)
	[ -n "$ns" ] && pid_alive "$pidf" "$marker-$ns" || return 1
	cat "$pidf"
}

# in_holder PID CMD...: run CMD in the network and mount namespaces PID holds.
in_holder() {
	local h=$1
	shift
	nsenter --target "$h" --mount --net -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LANG=C.UTF-8 LIBVIRT_DEFAULT_URI=qemu:///system "$@"
}

# in_host CMD...: run CMD inside the host's netns and mount namespace;
# in_hostb CMD...: inside host B's.
in_host() {
	local h
	h=$(holder_pid) || die "hypervisor in $STATE is not up"
	in_holder "$h" "$@"
}

in_hostb() {
	local h
	h=$(holder_pid b) || die "host B in $STATE is not up"
	in_holder "$h" "$@"
}

ensure_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	apt-get update -qq >&2
	# No service is started by the install on a container (policy-rc.d) and we
	# never start the system units: everything runs in the namespaces below.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
}

free_port() { # a free TCP port on 127.0.0.1
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((20000 + RANDOM % 20000))
		[ -z "$(ss -Hltn "sport = :$p")" ] && {
			echo "$p"
			return 0
		}
	done
	die "no free port"
}

# ------------------------------------------------------------------ sshd -----
start_sshd() {
	local ns port
	ns=$(state_get NETNS)
	port=$(state_get SSH_PORT)
	if ! pid_alive "$STATE/run/sshd.pid" "$STATE/sshd_config"; then
		in_host mkdir -p /run/sshd
		in_host /usr/sbin/sshd -f "$STATE/sshd_config" -E "$STATE/logs/sshd.log"
		for _ in $(seq 50); do pid_alive "$STATE/run/sshd.pid" "$STATE/sshd_config" && break || sleep 0.1; done
		pid_alive "$STATE/run/sshd.pid" "$STATE/sshd_config" || die "sshd did not start (see $STATE/logs/sshd.log)"
	fi
	if ! pid_alive "$STATE/run/forward.pid" "TCP-LISTEN:$port,"; then
		[ -z "$(ss -Hltn "sport = :$port")" ] || die "port $port on 127.0.0.1 is taken"
		# Per connection: enter the namespace and connect to its sshd.
		cat >"$STATE/run/ssh-relay.sh" <<EOF
#!/bin/sh
exec nsenter --net=/run/netns/$ns socat STDIO TCP:127.0.0.1:22
EOF
		chmod +x "$STATE/run/ssh-relay.sh"
		# setsid: own process group, so stop kills the per-connection children too.
		setsid socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "EXEC:$STATE/run/ssh-relay.sh" \
			</dev/null >>"$STATE/logs/forward.log" 2>&1 &
		echo $! >"$STATE/run/forward.pid"
		for _ in $(seq 50); do [ -n "$(ss -Hltn "sport = :$port")" ] && break || sleep 0.1; done
	fi
	# Wait until an SSH banner comes back through the whole path.
	for _ in $(seq 50); do
		if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; head -c 4 <&3" 2>/dev/null | grep -q SSH-; then
			return 0
		fi
		sleep 0.2
	done
	die "sshd not reachable on 127.0.0.1:$port"
}

stop_sshd() {
	local ns p
	ns=$(state_get NETNS)
	stop_pid "$STATE/run/forward.pid" "TCP-LISTEN:" group
	stop_pid "$STATE/run/sshd.pid" "$STATE/sshd_config"
	# Established sessions outlive the listening sshd: end them too, so that an
	# operator holding a connection really loses the host.
	if [ -n "$ns" ] && ip netns list | grep -qw "$ns"; then
		for p in $(ip netns pids "$ns" 2>/dev/null); do
			[ "$(cat /proc/"$p"/comm 2>/dev/null)" = sshd ] && kill -TERM "$p" 2>/dev/null || true
		done
	fi
}

# ------------------------------------------------------------ KVM probe ------
# Boot OVMF (the firmware the guests use) under -accel kvm inside the host and
# see whether it reaches its boot manager; a broken nested KVM dies with
# "KVM internal error" instead.
detect_domain_type() {
	if [ -n "${PXE2E_DOMAIN_TYPE:-}" ]; then
		echo "$PXE2E_DOMAIN_TYPE"
		return
	fi
	if [ ! -w /dev/kvm ]; then
		echo qemu
		return
	fi
	local d="$STATE/run/kvm-probe" pid result=qemu i
	mkdir -p "$d"
	cp /usr/share/OVMF/OVMF_VARS_4M.fd "$d/vars.fd"
	: >"$d/serial.log"
	# Default CPU model, as a libvirt domain without <cpu> gets. The subshell
	# keeps a crashing qemu's "Aborted" job message in the log.
	(in_host qemu-system-x86_64 -accel kvm -machine q35 -m 256 -nodefaults \
		-display none -no-reboot -nic none \
		-drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd \
		-drive "if=pflash,format=raw,unit=1,file=$d/vars.fd" \
		-serial "file:$d/serial.log" -pidfile "$d/qemu.pid") >"$STATE/logs/kvm-probe.log" 2>&1 &
	pid=$!
	for ((i = 0; i < 300; i++)); do # at most 30 s (TCG needs ~5 s to get there)
		if grep -qaE 'BdsDxe|UEFI Interactive Shell' "$d/serial.log"; then
			result=kvm
			break
		fi
		grep -qE 'KVM internal error|failed to|Assertion' "$STATE/logs/kvm-probe.log" && break
		running "$pid" || break
		sleep 0.1
	done
	[ -f "$d/qemu.pid" ] && kill -KILL "$(cat "$d/qemu.pid")" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	cat "$d/serial.log" >>"$STATE/logs/kvm-probe.log"
	rm -rf "$d"
	echo "$result"
}

# ------------------------------------------------------------------- up ------
host_setup_script() { # runs as the holder: builds the private mount namespace
	cat <<EOF
set -eu
mount --make-rprivate /
# Fresh /run: no system libvirt/dbus/systemd sockets leak into the host.
mount -t tmpfs -o mode=0755 pxe2e-run /run
mkdir -p /run/libvirt /run/sshd /run/lock
mount --bind $STATE/libvirt/run /run/libvirt
mount --bind $STATE/libvirt/etc /etc/libvirt
mount --bind $STATE/libvirt/lib /var/lib/libvirt
mount --bind $STATE/libvirt/cache /var/cache/libvirt
mount --bind $STATE/varlog /var/log
# No upstream DNS on the host: dnsmasq must not forward guests' queries to
# the machine's resolver (a symlink into /run already dangles after the tmpfs).
if [ -f /etc/resolv.conf ] && [ ! -L /etc/resolv.conf ]; then
	echo '# proxy-operator e2e host: no upstream DNS' >$STATE/run/resolv.conf
	mount --bind $STATE/run/resolv.conf /etc/resolv.conf
fi
ip link set lo up
touch $STATE/run/holder.ready
exec -a pxe2e-holder-$1 sleep infinity
EOF
}

write_libvirt_config() { # [ETC_DIR]: the host's, or host B's
	local e=${1:-$STATE/libvirt/etc}
	cp -a /etc/libvirt/. "$e/"
	# Never inherit the package's 'default' network (192.168.122.0/24) or any
	# domain/pool defined on the machine.
	rm -rf "$e/qemu/networks" "$e/qemu/autostart" "$e/storage" "$e"/qemu/*.xml
	cat >"$e/libvirtd.conf" <<'EOF'
# proxy-operator e2e host: root-only unix socket, no polkit (no dbus here).
unix_sock_group = "root"
unix_sock_ro_perms = "0770"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
EOF
	cat >"$e/qemu.conf" <<'EOF'
# proxy-operator e2e host: qemu as root (images live in STATE_DIR), no
# cgroups/AppArmor/per-domain mount namespaces (none of them work in a
# container without systemd, and none matter for the test).
user = "root"
group = "root"
dynamic_ownership = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
EOF
}

cmd_up() {
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	ensure_packages
	mkdir -p "$STATE"
	if holder_pid >/dev/null 2>&1 && pid_alive "$STATE/run/libvirtd.pid" libvirtd; then
		start_sshd
		log "already up ($(state_get NETNS))"
		return 0
	fi
	# Half-started or stale: clean first, then start from scratch.
	[ -f "$STATE/state.env" ] && cmd_down
	local id ns t0
	t0=$(date +%s)
	id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
	ns="pxe2e-$id"
	mkdir -p "$STATE"/{run,logs,pool,varlog/libvirt/qemu} "$STATE"/libvirt/{etc,lib,cache,run}
	: >"$STATE/state.env"
	state_set NETNS "$ns"
	state_set STATE_DIR "$STATE"

	log "namespace $ns"
	ip netns add "$ns"
	write_libvirt_config
	host_setup_script "$ns" >"$STATE/run/holder.sh"
	# `ip netns exec` gives a fresh /sys for the namespace (libvirt reads bridge
	# state there); unshare -m gives the private mount namespace. setsid detaches
	# it from this shell; every step execs, so $! is the holder's PID.
	rm -f "$STATE/run/holder.ready"
	setsid ip netns exec "$ns" unshare --mount --propagation private \
		bash "$STATE/run/holder.sh" "$ns" </dev/null >"$STATE/logs/holder.log" 2>&1 &
	echo $! >"$STATE/run/holder.pid"
	for _ in $(seq 100); do [ -f "$STATE/run/holder.ready" ] && break || sleep 0.1; done
	[ -f "$STATE/run/holder.ready" ] || die "host namespace setup failed: $(cat "$STATE/logs/holder.log")"
	holder_pid >/dev/null || die "holder died: $(cat "$STATE/logs/holder.log")"

	log "virtlogd + libvirtd"
	in_host virtlogd -d -p "$STATE/run/virtlogd.pid"
	in_host libvirtd -d -p "$STATE/run/libvirtd.pid"
	for _ in $(seq 100); do
		in_host virsh -q version >/dev/null 2>&1 && break || sleep 0.2
	done
	in_host virsh -q version >/dev/null || die "libvirtd does not answer (see $STATE/varlog/libvirt/libvirtd.log)"

	log "network $NET_NAME ($GW/24) and pool $POOL_NAME"
	cat >"$STATE/run/net.xml" <<EOF
<network>
  <name>$NET_NAME</name>
  <forward mode='nat'/>
  <bridge name='$BRIDGE' stp='off' delay='0'/>
  <ip address='$GW' netmask='255.255.255.0'>
    <dhcp><range start='$DHCP_START' end='$DHCP_END'/></dhcp>
  </ip>
</network>
EOF
	in_host virsh -q net-define "$STATE/run/net.xml" >/dev/null
	in_host virsh -q net-start "$NET_NAME" >/dev/null
	in_host virsh -q pool-define-as "$POOL_NAME" dir --target "$STATE/pool" >/dev/null
	in_host virsh -q pool-start "$POOL_NAME" >/dev/null
	# As on a real host: a restarted libvirtd brings them back.
	in_host virsh -q net-autostart "$NET_NAME" >/dev/null
	in_host virsh -q pool-autostart "$POOL_NAME" >/dev/null

	log "probe server http://$GW:$PROBE_PORT/ (answers 204; /ip answers the caller's address)"
	cat >"$STATE/run/probe-204.sh" <<'EOF'
#!/bin/bash
# One HTTP exchange: read the request head (bounded), answer, close. /ip
# echoes the caller's address as text, as what-is-my-IP services do (the
# operator records it as the proxy's egress address); the rest is 204.
# Default IFS here: the request line splits into method, path, version.
read -r -t 5 method path _ || exit 0
while IFS= read -r -t 5 line; do
	line=${line%$'\r'}
	[ -z "$line" ] && break
done
if [ "$path" = /ip ]; then
	body=$SOCAT_PEERADDR
	printf 'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s' "${#body}" "$body"
	exit 0
fi
printf 'HTTP/1.1 204 No Content\r\nConnection: close\r\nContent-Length: 0\r\n\r\n'
EOF
	chmod +x "$STATE/run/probe-204.sh"
	# sh records its own PID, then execs (setsid does not fork here): the PID
	# file names the socat listener itself.
	in_host sh -c 'echo $$ >"$1"; exec setsid socat "$2" "$3"' sh "$STATE/run/probe.pid" \
		"TCP-LISTEN:$PROBE_PORT,bind=$GW,reuseaddr,fork" "EXEC:$STATE/run/probe-204.sh" \
		</dev/null >>"$STATE/logs/probe.log" 2>&1 &
	for _ in $(seq 50); do pid_alive "$STATE/run/probe.pid" "TCP-LISTEN:$PROBE_PORT" && break || sleep 0.1; done
	pid_alive "$STATE/run/probe.pid" "TCP-LISTEN:$PROBE_PORT" || die "probe server did not start (see $STATE/logs/probe.log)"
	state_set PROBE_URL "http://$GW:$PROBE_PORT/"
	state_set GATEWAY "$GW"

	log "ssh keys and sshd"
	rm -f "$STATE"/id_ed25519* "$STATE"/ssh_host_ed25519_key*
	ssh-keygen -q -t ed25519 -N '' -C "pxe2e-client-$id" -f "$STATE/id_ed25519"
	ssh-keygen -q -t ed25519 -N '' -C "pxe2e-host-$id" -f "$STATE/ssh_host_ed25519_key"
	cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
	local port
	port=$(free_port)
	state_set SSH_PORT "$port"
	echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub")" >"$STATE/known_hosts"
	cat >"$STATE/sshd_config" <<EOF
# proxy-operator e2e host sshd: inside netns $ns, reached via 127.0.0.1:$port.
ListenAddress 127.0.0.1:22
HostKey $STATE/ssh_host_ed25519_key
PidFile $STATE/run/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# No PAM/logind/dbus inside the host namespace; keys are in a non-home dir.
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
# The operator may hold several connections at once.
MaxStartups 100:30:200
MaxSessions 100
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
	start_sshd

	log "detecting KVM (real OVMF boot)"
	state_set DOMAIN_TYPE "$(detect_domain_type)"
	state_set UP 1
	log "up in $(($(date +%s) - t0)) s: ns=$ns ssh=127.0.0.1:$port domain_type=$(state_get DOMAIN_TYPE)"
}

# ----------------------------------------------------------------- down ------
cmd_down() {
	[ -d "$STATE" ] || return 0
	local ns p i
	ns=$(state_get NETNS)
	if holder_pid b >/dev/null 2>&1 && pid_alive "$HOSTB/run/libvirtd.pid" libvirtd; then
		for d in $(in_hostb virsh -q list --all --name 2>/dev/null); do
			in_hostb virsh -q destroy "$d" >/dev/null 2>&1 || true
			in_hostb virsh -q undefine "$d" --nvram --managed-save --snapshots-metadata >/dev/null 2>&1 ||
				in_hostb virsh -q undefine "$d" >/dev/null 2>&1 || true
		done
	fi
	if holder_pid >/dev/null 2>&1 && pid_alive "$STATE/run/libvirtd.pid" libvirtd; then
		# Every domain of this private libvirtd is ours.
		for d in $(in_host virsh -q list --all --name 2>/dev/null); do
			in_host virsh -q destroy "$d" >/dev/null 2>&1 || true
			in_host virsh -q undefine "$d" --nvram --managed-save --snapshots-metadata >/dev/null 2>&1 ||
				in_host virsh -q undefine "$d" >/dev/null 2>&1 || true
		done
		in_host virsh -q net-destroy "$NET_NAME" >/dev/null 2>&1 || true
		in_host virsh -q pool-destroy "$POOL_NAME" >/dev/null 2>&1 || true
	fi
	stop_sshd
	stop_pid "$STATE/run/probe.pid" "TCP-LISTEN:$PROBE_PORT"
	stop_pid "$STATE/run/libvirtd.pid" libvirtd
	stop_pid "$STATE/run/virtlogd.pid" virtlogd
	# Whatever still runs in the namespace (qemu or dnsmasq if libvirtd was
	# gone, probe children) was started by us: end it by PID.
	if [ -n "$ns" ] && ip netns list | grep -qw "$ns"; then
		local holder left
		holder=$(cat "$STATE/run/holder.pid" 2>/dev/null || true)
		ns_leftovers() { # running PIDs in the namespace, holder excepted
			for p in $(ip netns pids "$ns" 2>/dev/null); do
				[ "$p" != "$holder" ] && running "$p" && echo "$p"
			done
			return 0
		}
		for sig in TERM KILL; do
			left=$(ns_leftovers)
			[ -z "$left" ] && break
			log "ending leftover processes in $ns ($sig): $left"
			kill -"$sig" $left 2>/dev/null || true
			for ((i = 0; i < 50; i++)); do
				[ -z "$(ns_leftovers)" ] && break
				sleep 0.1
			done
		done
	fi
	[ -n "$ns" ] && stop_pid "$STATE/run/holder.pid" "pxe2e-holder-$ns"
	if [ -n "$ns" ] && ip netns list | grep -qw "$ns"; then
		ip netns del "$ns"
	fi
	# Keep logs/ for post-mortems; drop the rest (images, keys, libvirt state).
	rm -rf --one-file-system "$STATE/pool" "$STATE/libvirt" "$STATE/varlog" "$STATE/run" "$HOSTB" \
		"$STATE"/id_ed25519* "$STATE"/ssh_host_ed25519_key* "$STATE/known_hosts" \
		"$STATE/authorized_keys" "$STATE/sshd_config" "$STATE/state.env"
	[ -n "$ns" ] && log "down: $ns removed" || true
}

cmd_env() {
	[ "$(state_get UP)" = 1 ] || die "hypervisor in $STATE is not up"
	local k v
	while read -r k v; do
		printf 'export %s=%q\n' "$k" "$v"
	done <<EOF
KVM_TEST_ADDRESS 127.0.0.1:$(state_get SSH_PORT)
KVM_TEST_USER root
KVM_TEST_KEY $STATE/id_ed25519
KVM_TEST_KNOWN_HOSTS $STATE/known_hosts
KVM_TEST_SOCKET /var/run/libvirt/libvirt-sock
KVM_TEST_POOL $POOL_NAME
KVM_TEST_POOL_PATH $STATE/pool
KVM_TEST_NETWORK $NET_NAME
KVM_TEST_DOMAIN_TYPE $(state_get DOMAIN_TYPE)
KVM_TEST_NETNS $(state_get NETNS)
KVM_TEST_ECHO_URL $(state_get PROBE_URL)ip
KVM_TEST_PROBE_URL $(state_get PROBE_URL)
KVM_TEST_STATE_DIR $STATE
KVM_TEST_HYPERVISOR_SH $SELF
EOF
}

# ----------------------------------------------------- fault injection -------
# cmd_libvirtd stop|cont|kill|start: what the fault tests do to the daemon.
# stop (SIGSTOP) wedges it with sshd and every socket alive; kill (SIGKILL)
# ends it as a crash would, leaving its guests (qemu) and dnsmasq running;
# start runs it again, as after `systemctl restart libvirtd`.
cmd_libvirtd() {
	local pidf=$STATE/run/libvirtd.pid pid
	holder_pid >/dev/null || die "hypervisor in $STATE is not up"
	case "${1:-}" in
	stop | cont | kill)
		pid_alive "$pidf" libvirtd || die "libvirtd is not running"
		pid=$(cat "$pidf")
		kill -"$(echo "$1" | tr a-z A-Z)" "$pid"
		if [ "$1" = kill ]; then
			for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
			rm -f "$pidf"
		fi
		;;
	start)
		if ! pid_alive "$pidf" libvirtd; then
			rm -f "$pidf"
			in_host libvirtd -d -p "$pidf"
		fi
		for _ in $(seq 150); do
			in_host virsh -q version >/dev/null 2>&1 && return 0
			sleep 0.2
		done
		die "libvirtd does not answer after start (see $STATE/varlog/libvirt/libvirtd.log)"
		;;
	*) usage ;;
	esac
}

# cmd_rotate_host_key: the host is reinstalled, as far as SSH can tell: a new
# host key, sshd restarted with it (established sessions end). known_hosts in
# STATE_DIR follows; whoever holds the old line must be told.
cmd_rotate_host_key() {
	local port
	holder_pid >/dev/null || die "hypervisor in $STATE is not up"
	port=$(state_get SSH_PORT)
	rm -f "$STATE/run/hostkey.new" "$STATE/run/hostkey.new.pub"
	ssh-keygen -q -t ed25519 -N '' -C "pxe2e-host-rotated" -f "$STATE/run/hostkey.new"
	stop_sshd
	mv -f "$STATE/run/hostkey.new" "$STATE/ssh_host_ed25519_key"
	mv -f "$STATE/run/hostkey.new.pub" "$STATE/ssh_host_ed25519_key.pub"
	echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub")" >"$STATE/known_hosts"
	start_sshd
	cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub"
}

# cmd_tmpfs_pool NAME MIB: a directory pool on a size-limited tmpfs mounted
# only in the host's mount namespace (under STATE_DIR/run, which `down`
# removes; the mount dies with the namespace). Called again, it resizes.
cmd_tmpfs_pool() {
	local name=${1:-} mib=${2:-} dir
	[ -n "$name" ] && [[ "$mib" =~ ^[0-9]+$ ]] || usage
	dir=$STATE/run/pools/$name
	holder_pid >/dev/null || die "hypervisor in $STATE is not up"
	mkdir -p "$dir"
	if in_host mountpoint -q "$dir"; then
		in_host mount -o "remount,size=${mib}m" "$dir"
	else
		in_host mount -t tmpfs -o "size=${mib}m,mode=0755" "pxe2e-pool-$name" "$dir"
		in_host virsh -q pool-define-as "$name" dir --target "$dir" >/dev/null
		in_host virsh -q pool-start "$name" >/dev/null
	fi
	# libvirt refuses to refresh a pool while a volume upload into it runs
	# (the operator retries its image upload whenever it likes): wait for
	# the upload to end, up to two minutes.
	local out tries=0
	until out=$(in_host virsh -q pool-refresh "$name" 2>&1); do
		case "$out" in
		*"asynchronous jobs running"*) ;;
		*) die "pool-refresh $name: $out" ;;
		esac
		tries=$((tries + 1))
		[ "$tries" -lt 240 ] || die "pool-refresh $name: an upload was still running after 2 minutes: $out"
		sleep 0.5
	done
	in_host df -m --output=size,avail "$dir" | tail -n1
}

# ----------------------------------------------------------------- host B ---
# A second hypervisor on the same machine, as the operator sees one: a
# KVMHost whose socketPath is host B's libvirt socket, reached over the same
# sshd. Its libvirtd and virtlogd run in the host's network namespace but in
# a mount namespace of their own (holder "pxe2e-hostb-<id>"), where
# libvirt's directories are HOSTB's: its own domains, pool "e2e-b" and
# socket. Its guests join the host's bridge (networkMode bridge, pxbr0), so
# they get the host network's DHCP and reach its probe server, and the
# manager's probes reach them. Wedging one daemon leaves the other
# answering. `down` removes it with the rest.
cmd_hostb_up() {
	local ns h
	ns=$(state_get NETNS)
	h=$(holder_pid) || die "hypervisor in $STATE is not up"
	if ! holder_pid b >/dev/null 2>&1; then
		mkdir -p "$HOSTB"/{run,pool,varlog/libvirt/qemu} "$HOSTB"/libvirt/{etc,lib,cache,run}
		write_libvirt_config "$HOSTB/libvirt/etc"
		cat >"$HOSTB/run/holder.sh" <<EOF
set -eu
mount --make-rprivate /
mount --bind $HOSTB/libvirt/run /run/libvirt
mount --bind $HOSTB/libvirt/etc /etc/libvirt
mount --bind $HOSTB/libvirt/lib /var/lib/libvirt
mount --bind $HOSTB/libvirt/cache /var/cache/libvirt
mount --bind $HOSTB/varlog /var/log
touch $HOSTB/run/holder.ready
exec -a pxe2e-hostb-$ns sleep infinity
EOF
		rm -f "$HOSTB/run/holder.ready"
		# Inside the host's namespaces, a mount namespace of host B's own;
		# as for the host's holder, every step execs, so $! is the holder.
		setsid nsenter --target "$h" --mount --net -- unshare --mount --propagation private \
			bash "$HOSTB/run/holder.sh" </dev/null >"$STATE/logs/hostb-holder.log" 2>&1 &
		echo $! >"$HOSTB/run/holder.pid"
		for _ in $(seq 100); do [ -f "$HOSTB/run/holder.ready" ] && break || sleep 0.1; done
		holder_pid b >/dev/null || die "host B's namespace setup failed: $(cat "$STATE/logs/hostb-holder.log")"
	fi
	if ! pid_alive "$HOSTB/run/libvirtd.pid" libvirtd; then
		# Not on our stdout: whoever reads it (the fault suite) would wait
		# for the daemons.
		in_hostb virtlogd -d -p "$HOSTB/run/virtlogd.pid" </dev/null >>"$STATE/logs/hostb-daemons.log" 2>&1
		in_hostb libvirtd -d -p "$HOSTB/run/libvirtd.pid" </dev/null >>"$STATE/logs/hostb-daemons.log" 2>&1
		for _ in $(seq 100); do
			in_hostb virsh -q version >/dev/null 2>&1 && break || sleep 0.2
		done
		in_hostb virsh -q version >/dev/null || die "host B's libvirtd does not answer (see $HOSTB/varlog/libvirt/libvirtd.log)"
		if ! in_hostb virsh -q pool-info "$HOSTB_POOL" >/dev/null 2>&1; then
			in_hostb virsh -q pool-define-as "$HOSTB_POOL" dir --target "$HOSTB/pool" >/dev/null
			in_hostb virsh -q pool-autostart "$HOSTB_POOL" >/dev/null
		fi
		in_hostb virsh -q pool-start "$HOSTB_POOL" >/dev/null 2>&1 || true
	fi
	log "host B up: libvirt socket $HOSTB/libvirt/run/libvirt-sock, pool $HOSTB_POOL, bridge $BRIDGE"
	echo "$HOSTB/libvirt/run/libvirt-sock"
}

cmd_hostb() {
	case "${1:-}" in
	up) cmd_hostb_up ;;
	exec)
		shift
		[ "${1:-}" = -- ] && shift
		[ $# -ge 1 ] || usage
		in_hostb "$@"
		;;
	*) usage ;;
	esac
}

case "$CMD" in
up) cmd_up ;;
down) cmd_down ;;
env) cmd_env ;;
status) holder_pid >/dev/null && pid_alive "$STATE/run/libvirtd.pid" libvirtd ;;
exec)
	[ "${1:-}" = -- ] && shift
	[ $# -ge 1 ] || usage
	in_host "$@"
	;;
stop-sshd) stop_sshd ;;
libvirtd) cmd_libvirtd "$@" ;;
rotate-host-key) cmd_rotate_host_key ;;
tmpfs-pool) cmd_tmpfs_pool "$@" ;;
host-b) cmd_hostb "$@" ;;
start-sshd)
	holder_pid >/dev/null || die "hypervisor in $STATE is not up"
	start_sshd
	;;
*) usage ;;
esac
