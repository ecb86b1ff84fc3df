#!/usr/bin/env bash
# smoke.sh [WORKDIR]   (default /tmp/pxe2e-smoke; needs root)
#
# End-to-end proof of the real-hypervisor test infrastructure, the way the
# operator will use it:
#   1. build (or reuse) the guest image          guest-image.sh WORKDIR/images
#   2. start the test hypervisor                 hypervisor.sh up WORKDIR/hv
#   3. reach libvirt as the operator does: SSH to KVM_TEST_ADDRESS with the key
#      and known_hosts, unix-socket forwarding of KVM_TEST_SOCKET; all virsh
#      calls below go through that forwarded socket;
#   4. upload the image and a NoCloud seed into pool e2e, boot a qcow2 overlay
#      with <os firmware='efi'> (secure boot off), domain type KVM_TEST_DOMAIN_TYPE;
#   5. wait for the guest agent (virsh domifaddr --source agent), then for a
#      request through squid GUESTIP:3128 to the probe URL (run inside the
#      namespace with `hypervisor.sh exec`) to answer 204;
#   6. boot the same image under SeaBIOS (BIOS_CHECK=0 skips) up to the agent;
#   7. stop-sshd must make SSH fail, start-sshd must bring it back;
#   8. `hypervisor.sh down`, and check nothing is left (namespace, processes).
# Prints the timings. KEEP=1 leaves the hypervisor up for inspection.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${1:-/tmp/pxe2e-smoke}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
HV="$HERE/hypervisor.sh"
STATE="$WORK/hv"
DOM=pxe2e-smoke
AGENT_TIMEOUT=${AGENT_TIMEOUT:-600}
SQUID_TIMEOUT=${SQUID_TIMEOUT:-300}

say() { echo "smoke: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
FWD_PID=
cleanup() {
	local rc=$?
	[ -n "$FWD_PID" ] && kill "$FWD_PID" 2>/dev/null || true
	rm -f "$WORK/libvirt.sock"
	if [ "${KEEP:-0}" = 1 ]; then
		say "KEEP=1: hypervisor left up; stop it with: $HV down $STATE"
	else
		"$HV" down "$STATE" || rc=1
	fi
	exit $rc
}
trap cleanup EXIT

T0=$(now)
IMAGE=$("$HERE/guest-image.sh" "$WORK/images")
T_IMAGE=$(since "$T0")
say "image $IMAGE ($T_IMAGE s)"

T1=$(now)
"$HV" up "$STATE"
T_UP=$(since "$T1")
eval "$("$HV" env "$STATE")"
NS=$KVM_TEST_NETNS
say "hypervisor up ($T_UP s): $KVM_TEST_ADDRESS netns=$NS type=$KVM_TEST_DOMAIN_TYPE"

# --- the operator's path: SSH + unix socket forwarding ----------------------
SSH_OPTS=(-o BatchMode=yes -o StrictHostKeyChecking=yes -o "UserKnownHostsFile=$KVM_TEST_KNOWN_HOSTS"
	-o ConnectTimeout=10 -i "$KVM_TEST_KEY" -p "${KVM_TEST_ADDRESS##*:}")
ssh_host() { ssh "${SSH_OPTS[@]}" "$KVM_TEST_USER@${KVM_TEST_ADDRESS%:*}" "$@"; }
LSOCK="$WORK/libvirt.sock"
rm -f "$LSOCK"
ssh "${SSH_OPTS[@]}" -N -o ExitOnForwardFailure=yes -o StreamLocalBindUnlink=yes \
	-L "$LSOCK:$KVM_TEST_SOCKET" "$KVM_TEST_USER@${KVM_TEST_ADDRESS%:*}" &
FWD_PID=$!
for _ in $(seq 100); do [ -S "$LSOCK" ] && break || sleep 0.1; done
[ -S "$LSOCK" ] || { say "socket forward failed"; exit 1; }
v() { virsh -q -c "qemu:///system?socket=$LSOCK" "$@"; }
v version >/dev/null
say "libvirt reached through SSH socket forwarding"

# --- volumes -----------------------------------------------------------------
T2=$(now)
size=$(stat -c %s "$IMAGE")
v vol-create-as "$KVM_TEST_POOL" base.qcow2 "$size" --format raw >/dev/null
v vol-upload --pool "$KVM_TEST_POOL" base.qcow2 "$IMAGE"
v pool-refresh "$KVM_TEST_POOL" >/dev/null
T_UPLOAD=$(since "$T2")

cat >"$WORK/user-data" <<'EOF'
#cloud-config
locale: C.UTF-8
write_files:
  # Only additions: the image's squid.conf already has http_port 3128.
  - path: /etc/squid/conf.d/e2e.conf
    content: |
      acl e2e_net src 10.77.0.0/24
      http_access allow e2e_net
      shutdown_lifetime 1 seconds
runcmd:
  - [systemctl, reload-or-restart, squid]
EOF
printf 'instance-id: %s-%s\nlocal-hostname: %s\n' "$DOM" "$(date +%s)" "$DOM" >"$WORK/meta-data"
cloud-localds "$WORK/seed.iso" "$WORK/user-data" "$WORK/meta-data"
v vol-create-as "$KVM_TEST_POOL" "$DOM-seed.iso" "$(stat -c %s "$WORK/seed.iso")" --format raw >/dev/null
v vol-upload --pool "$KVM_TEST_POOL" "$DOM-seed.iso" "$WORK/seed.iso"
v vol-create-as "$KVM_TEST_POOL" "$DOM.qcow2" 4G --format qcow2 \
	--backing-vol base.qcow2 --backing-vol-format qcow2 >/dev/null

cat >"$WORK/domain.xml" <<EOF
<domain type='$KVM_TEST_DOMAIN_TYPE'>
  <name>$DOM</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>2</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='q35'>hvm</type>
    <firmware>
      <feature enabled='no' name='secure-boot'/>
      <feature enabled='no' name='enrolled-keys'/>
    </firmware>
    <boot dev='hd'/>
  </os>
  <features><acpi/><apic/></features>
  <devices>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source pool='$KVM_TEST_POOL' volume='$DOM.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='volume' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source pool='$KVM_TEST_POOL' volume='$DOM-seed.iso'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <interface type='network'>
      <source network='$KVM_TEST_NETWORK'/>
      <model type='virtio'/>
    </interface>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <serial type='pty'>
      <log file='/var/log/libvirt/qemu/$DOM-serial.log' append='off'/>
    </serial>
    <console type='pty'/>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>
EOF
v define "$WORK/domain.xml" >/dev/null
T3=$(now)
v start "$DOM" >/dev/null
say "domain $DOM started; waiting for the guest agent (<= $AGENT_TIMEOUT s)"

# --- guest agent -----------------------------------------------------------------
GUESTIP=
T_AGENT_PING=
deadline=$(($(date +%s) + AGENT_TIMEOUT))
while [ "$(date +%s)" -lt "$deadline" ]; do
	if [ -z "$T_AGENT_PING" ] && v qemu-agent-command "$DOM" '{"execute":"guest-ping"}' --timeout 2 >/dev/null 2>&1; then
		T_AGENT_PING=$(since "$T3")
		say "guest agent answers after $T_AGENT_PING s"
	fi
	if [ -n "$T_AGENT_PING" ]; then
		GUESTIP=$(v domifaddr "$DOM" --source agent 2>/dev/null |
			awk '$3 == "ipv4" && $4 !~ /^127\./ { sub(/\/.*/, "", $4); print $4; exit }')
		[ -n "$GUESTIP" ] && break
	fi
	sleep 1
done
[ -n "$GUESTIP" ] || {
	say "no guest address from the agent; serial log: $STATE/varlog/libvirt/qemu/$DOM-serial.log"
	exit 1
}
T_AGENT_IP=$(since "$T3")
say "guest IP $GUESTIP (agent) after $T_AGENT_IP s"

# --- squid ---------------------------------------------------------------------
code=
deadline=$(($(date +%s) + SQUID_TIMEOUT))
while [ "$(date +%s)" -lt "$deadline" ]; do
	code=$("$HV" exec "$STATE" -- curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
		-x "http://$GUESTIP:3128" "$KVM_TEST_PROBE_URL" 2>/dev/null || true)
	[ "$code" = 204 ] && break
	sleep 1
done
[ "$code" = 204 ] || {
	say "squid never answered 204 (last: '$code')"
	exit 1
}
T_SQUID=$(since "$T3")
say "request through squid $GUESTIP:3128 -> $KVM_TEST_PROBE_URL: 204 after $T_SQUID s"
# The same request as an operator in the root namespace would make it: a TCP
# forward (direct-tcpip) through the SSH connection to GUESTIP:3128.
LPORT=$(( $(date +%N | sed 's/^0*//') % 20000 + 40000 ))
ssh "${SSH_OPTS[@]}" -N -o ExitOnForwardFailure=yes -L "127.0.0.1:$LPORT:$GUESTIP:3128" \
	"$KVM_TEST_USER@${KVM_TEST_ADDRESS%:*}" &
TCP_FWD=$!
code=
for _ in $(seq 50); do
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -x "http://127.0.0.1:$LPORT" "$KVM_TEST_PROBE_URL" || true)
	[ "$code" = 204 ] && break
	sleep 0.2
done
kill "$TCP_FWD" 2>/dev/null || true
[ "$code" = 204 ] || {
	say "request through the SSH tcp forward failed (last: '$code')"
	exit 1
}
say "same request from the root namespace through an SSH direct-tcpip forward: 204"
ci=$(v qemu-agent-command "$DOM" --timeout 10 \
	'{"execute":"guest-exec","arguments":{"path":"/usr/bin/cloud-init","arg":["status","--wait"],"capture-output":true}}' 2>/dev/null |
	sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
if [ -n "$ci" ]; then
	for _ in $(seq 120); do
		out=$(v qemu-agent-command "$DOM" "{\"execute\":\"guest-exec-status\",\"arguments\":{\"pid\":$ci}}" 2>/dev/null || true)
		echo "$out" | grep -q '"exited":true' && break
		sleep 1
	done
	T_CLOUDINIT=$(since "$T3")
	status=$(echo "$out" | sed -n 's/.*"out-data":"\([^"]*\)".*/\1/p' | base64 -d 2>/dev/null | tr -d '.\n' || true)
	say "cloud-init: ${status:-unknown} (returned after $T_CLOUDINIT s)"
fi

# --- BIOS boot of the same image (SeaBIOS, i440fx) ----------------------------------
# The UEFI guest is stopped first: two TCG guests on 2 cores skew the timings.
if [ "${BIOS_CHECK:-1}" = 1 ]; then
	v destroy "$DOM" >/dev/null
	v vol-create-as "$KVM_TEST_POOL" "$DOM-bios.qcow2" 4G --format qcow2 \
		--backing-vol base.qcow2 --backing-vol-format qcow2 >/dev/null
	sed -e "s/<name>$DOM</<name>$DOM-bios</" \
		-e "s/volume='$DOM.qcow2'/volume='$DOM-bios.qcow2'/" \
		-e "s/$DOM-serial.log/$DOM-bios-serial.log/" \
		-e "s/<os firmware='efi'>/<os>/" -e "s/machine='q35'/machine='pc'/" \
		-e '/<firmware>/,/<\/firmware>/d' -e "s/bus='sata'/bus='ide'/" -e "s/dev='sda'/dev='hdc'/" \
		"$WORK/domain.xml" >"$WORK/domain-bios.xml"
	v define "$WORK/domain-bios.xml" >/dev/null
	T5=$(now)
	v start "$DOM-bios" >/dev/null
	T_BIOS=
	deadline=$(($(date +%s) + AGENT_TIMEOUT))
	while [ "$(date +%s)" -lt "$deadline" ]; do
		if v qemu-agent-command "$DOM-bios" '{"execute":"guest-ping"}' --timeout 2 >/dev/null 2>&1; then
			T_BIOS=$(since "$T5")
			break
		fi
		sleep 1
	done
	[ -n "$T_BIOS" ] || {
		say "BIOS guest never answered; serial log: $STATE/varlog/libvirt/qemu/$DOM-bios-serial.log"
		exit 1
	}
	say "BIOS boot: guest agent answers after $T_BIOS s"
	v destroy "$DOM-bios" >/dev/null
fi

# --- SSH outage --------------------------------------------------------------------
kill "$FWD_PID" 2>/dev/null || true
FWD_PID=
rm -f "$LSOCK"
ssh_host true
"$HV" stop-sshd "$STATE"
if ssh_host true 2>/dev/null; then
	say "ssh still works after stop-sshd"
	exit 1
fi
"$HV" start-sshd "$STATE"
ssh_host 'virsh -q -c qemu:///system list --all --name' | grep -qx "$DOM"
say "stop-sshd/start-sshd: SSH went away and came back"

# --- down, and nothing left ----------------------------------------------------
trap - EXIT
T4=$(now)
"$HV" down "$STATE"
"$HV" down "$STATE" # twice is fine
T_DOWN=$(since "$T4")
left=0
if ip netns list | grep -qw "$NS"; then
	say "namespace $NS still exists"
	left=1
fi
if pgrep -f "pxe2e-holder-$NS|$STATE/|guest=$DOM" >/dev/null; then
	say "processes left: $(pgrep -af "pxe2e-holder-$NS|$STATE/|guest=$DOM")"
	left=1
fi
if ss -Hltn "sport = :${KVM_TEST_ADDRESS##*:}" | grep -q .; then
	say "port ${KVM_TEST_ADDRESS##*:} still listening"
	left=1
fi
[ $left = 0 ] || exit 1

cat <<EOF
smoke: PASS
  image build/reuse        ${T_IMAGE} s   ($IMAGE)
  hypervisor up            ${T_UP} s   (domain type $KVM_TEST_DOMAIN_TYPE)
  image+seed upload (ssh)  ${T_UPLOAD} s
  start -> agent ping      ${T_AGENT_PING} s
  start -> agent IP        ${T_AGENT_IP} s   ($GUESTIP)
  start -> squid 204       ${T_SQUID} s
  start -> cloud-init done ${T_CLOUDINIT:-?} s   (${status:-unknown})
  BIOS start -> agent ping ${T_BIOS:-skipped} s
  down (x2)                ${T_DOWN} s
EOF
