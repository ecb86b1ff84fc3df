#!/usr/bin/env bash
# guest-image.sh OUTDIR
#
# Builds, offline from Debian bookworm packages, the squid guest image the e2e
# boots on the test hypervisor (see hypervisor.sh), and prints its path.
#
#   * root filesystem: mmdebstrap --variant=minbase (kernel, systemd, cloud-init
#     with NoCloud, qemu-guest-agent, squid, systemd-networkd DHCP);
#   * disk: GPT made with sgdisk (1 MiB bios_grub, 64 MiB ESP, ext4 root); the ESP
#     is built with mkfs.vfat + mtools and the root with `mkfs.ext4 -d DIR`, both
#     written into the raw disk with dd: no loop devices, no mounts;
#   * boot: grub-mkimage images, no grub-install. UEFI: EFI/BOOT/BOOTX64.EFI (the
#     removable path, so no NVRAM entry is needed). BIOS: i386-pc core.img in the
#     bios_grub partition and boot.img in the MBR, patched the way grub-bios-setup
#     would patch them. Both read one grub.cfg on the ESP; console=ttyS0;
#   * output: `qemu-img convert -c -O qcow2` (compressed, zlib: readable by any
#     qemu-img) at OUTDIR/<hash>.qcow2, <hash> being the sha256 of this script
#     (which holds the package list). An existing OUTDIR/<hash>.qcow2 is reused.
#     OUTDIR/<hash>.qcow2.sha256 holds its sha256 in `sha256sum` format.
#
# stdout: only the qcow2 path. Progress goes to stderr. Needs root (mmdebstrap
# root mode, apt-get). Measured on the 2-core build machine: ~3 minutes cold,
# 0 s cached (see README.md).
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi
OUTDIR=$1

# Everything that shapes the image is in this file, so hashing this file is
# hashing the recipe. Keep it that way: no environment overrides.
SUITE=bookworm
DISK_SIZE_MIB=2048
ESP_SIZE_MIB=64
# Packages of the guest. cloud-init pulls isc-dhcp-client, locales, gdisk.
GUEST_PACKAGES=(
	linux-image-amd64 initramfs-tools
	systemd-sysv udev dbus iproute2 systemd-resolved
	cloud-init cloud-guest-utils
	qemu-guest-agent
	squid
	e2fsprogs
	grub-efi-amd64-bin grub-pc-bin
)
# Tools this script runs on the build machine.
HOST_PACKAGES=(mmdebstrap gdisk dosfstools mtools e2fsprogs qemu-utils
	grub-efi-amd64-bin grub-pc-bin grub-common debian-archive-keyring coreutils util-linux)

log() { echo "guest-image: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
	echo "guest-image: must run as root (mmdebstrap root mode)" >&2
	exit 1
fi

# Install only what is missing; apt-get update only when something is.
missing=()
for p in "${HOST_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
fi

mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
HASH=$( { cat "${BASH_SOURCE[0]}"; printf '%s\n' "${GUEST_PACKAGES[@]}"; } | sha256sum | cut -c1-16)
OUT="$OUTDIR/$HASH.qcow2"

write_sum() { (cd "$OUTDIR" && sha256sum "$HASH.qcow2" > "$HASH.qcow2.sha256.tmp" && mv "$HASH.qcow2.sha256.tmp" "$HASH.qcow2.sha256"); }

# One build at a time per OUTDIR; a second caller waits and then reuses.
exec 9>"$OUTDIR/.build.lock"
flock 9
if [ -f "$OUT" ]; then
	[ -f "$OUT.sha256" ] || write_sum
	log "cached: $OUT"
	echo "$OUT"
	exit 0
fi

WORK=$(mktemp -d "$OUTDIR/.build.XXXXXX")
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT
ROOT="$WORK/root"
START=$(date +%s)

# Fixed identities chosen now, so grub.cfg and fstab can name them before the
# filesystems exist.
ROOT_UUID=$(cat /proc/sys/kernel/random/uuid)
ESP_ID=$(od -An -N4 -tx4 /dev/urandom | tr -d ' ' | tr a-f A-F) # FAT volume id, 8 hex
ESP_UUID="${ESP_ID:0:4}-${ESP_ID:4:4}"                       # how GRUB/blkid print it

# Use the machine's Debian sources when it has them (they may name a mirror).
MIRRORS=()
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
	MIRRORS=(/etc/apt/sources.list.d/debian.sources)
else
	MIRRORS=("deb http://deb.debian.org/debian $SUITE main"
		"deb http://deb.debian.org/debian $SUITE-updates main"
		"deb http://deb.debian.org/debian-security $SUITE-security main")
fi

log "mmdebstrap $SUITE (minbase) -> $ROOT"
# unshare -m: the /proc, /sys, /dev mounts mmdebstrap makes in the chroot die
# with it, even if it is killed (so the cleanup's rm -rf can never meet them).
# eatmydata hook: no fsync while dpkg unpacks (it is a throw-away tree).
# setup-hook: initramfs settings must exist before the kernel's postinst builds
# the initramfs (RESUME=none: no wait for a swap device at boot). MODULES=list:
# only the drivers that mount the root file system from the virtio disk every
# e2e domain has, and those of the CD-ROM that carries the NoCloud seed (so it
# is there before cloud-init's first stage looks for it, as with every
# driver), instead of most of the kernel's: under TCG the kernel spent 6 s
# unpacking that initramfs and its udev seconds more.
# dpkgopt: drop docs/man pages: smaller image, faster mkfs and compression.
unshare --mount --propagation private \
mmdebstrap --variant=minbase --mode=root --format=directory \
	--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata \
	--components=main \
	--aptopt='APT::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" && echo RESUME=none > "$1/etc/initramfs-tools/conf.d/resume"' \
	--setup-hook='echo MODULES=list > "$1/etc/initramfs-tools/conf.d/modules" && printf "%s\n" virtio_pci virtio_blk virtio_scsi sd_mod ext4 crc32c_generic ahci ata_piix sr_mod > "$1/etc/initramfs-tools/modules"' \
	--include="$(
		IFS=,
		echo "${GUEST_PACKAGES[*]}"
	)" \
	"$SUITE" "$ROOT" "${MIRRORS[@]}" >&2
log "rootfs done after $(($(date +%s) - START)) s"

KVER=$(basename "$(ls -1 "$ROOT"/boot/vmlinuz-* | sort -V | tail -n1)")
KVER=${KVER#vmlinuz-}
[ -f "$ROOT/boot/initrd.img-$KVER" ] || {
	echo "guest-image: no initramfs for $KVER" >&2
	exit 1
}

# --- guest configuration -----------------------------------------------------
cat >"$ROOT/etc/fstab" <<EOF
UUID=$ROOT_UUID / ext4 errors=remount-ro 0 1
EOF
echo "e2e-guest" >"$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\te2e-guest\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT/etc/hosts"
# DNS through systemd-resolved (DHCP-provided servers; the own hostname is
# always answered locally). Never the build machine's resolv.conf, which
# mmdebstrap leaves in the tree: squid stalls its start on unreachable DNS.
ln -sfn ../run/systemd/resolve/stub-resolv.conf "$ROOT/etc/resolv.conf"
# Each guest must make its own machine-id at first boot (DHCP DUIDs and
# journald derive from it; a shared one gives every guest the same lease).
: >"$ROOT/etc/machine-id"
rm -f "$ROOT/var/lib/dbus/machine-id"
# Only C.UTF-8 exists in a minbase image (no locale-gen); say so everywhere.
echo 'LANG=C.UTF-8' >"$ROOT/etc/default/locale"

# cloud-init: NoCloud (CIDATA seed ISO / smbios), and a locale that needs no
# generation, so the locale module cannot fail whatever the user-data says.
cat >"$ROOT/etc/cloud/cloud.cfg.d/90-e2e-image.cfg" <<'EOF'
datasource_list: [ NoCloud, None ]
locale: C.UTF-8
# hostname -> 127.0.1.1 in /etc/hosts: squid resolves its own name at start.
manage_etc_hosts: true
# A throw-away guest on a TCG host: no growpart and resize2fs of the root
# file system in the init stage, which squid (after network-online) waits
# for (9 s under TCG); the proxy needs no more than the image's 2 GiB.
growpart: { mode: "off" }
resize_rootfs: false
# No openssh-server in this image: make no host keys. An ssh_keys map,
# even empty, is cloud-init's documented way to generate none
# (ssh_genkeytypes: [] does the same but fails its schema, minItems 1).
ssh_keys: {}
EOF

# Modules udev's coldplug loads for devices a proxy guest never uses (the
# nested KVM the TCG CPU model offers, wireless regulatory, watchdog, PC
# speaker, cpufreq): seconds of TCG CPU each, taken while cloud-init's
# first stage, which networking waits for, runs.
cat >"$ROOT/etc/modprobe.d/e2e-guest.conf" <<'EOF'
blacklist kvm_amd
blacklist kvm_intel
blacklist kvm
blacklist cfg80211
blacklist iTCO_wdt
blacklist iTCO_vendor_support
blacklist pcspkr
blacklist powernow_k8
blacklist acpi_cpufreq
EOF

# Networking: systemd-networkd. cloud-init renders its own .network file (it
# picks networkd because ifupdown is absent); this catch-all DHCP file makes
# the NIC come up even without any cloud-init network config.
mkdir -p "$ROOT/etc/systemd/network"
cat >"$ROOT/etc/systemd/network/99-e2e-dhcp.network" <<'EOF'
[Match]
Name=en* eth*
Type=ether

[Network]
DHCP=yes

[DHCPv4]
ClientIdentifier=mac
EOF
# Don't let one slow link hold boot (and cloud-init) for the default 2 min.
mkdir -p "$ROOT/etc/systemd/system/systemd-networkd-wait-online.service.d"
cat >"$ROOT/etc/systemd/system/systemd-networkd-wait-online.service.d/10-e2e.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=30
EOF

# qemu-guest-agent, started as early as systemd allows. Debian's unit is
# started by udev when the agent's virtio port shows up and binds to that
# udev device, so it waits for udevd, which starts only once the root file
# system is writable and then loads every module of the coldplug: under TCG
# the agent came ~35 s after local-fs.target on a loaded machine. Instead,
# systemd-modules-load loads virtio_console with the early static modules,
# the kernel creates the port's node itself (/dev/vportNpM, devtmpfs), and
# this unit runs qemu-ga on it right after, before udev and before the root
# file system is remounted (qemu-ga writes only its pid file, in /run). The
# unit replaces Debian's (a drop-in cannot remove its BindsTo=); Debian's
# udev rule still starts it should the port appear only later.
mkdir -p "$ROOT/etc/modules-load.d" "$ROOT/usr/local/sbin"
echo virtio_console >"$ROOT/etc/modules-load.d/qemu-guest-agent.conf"
cat >"$ROOT/usr/local/sbin/qemu-ga-early" <<'GA_EOF'
#!/bin/sh
# Runs qemu-ga on the kernel's node of the org.qemu.guest_agent.0 virtio
# port, waiting up to 30 s for it (the host announces ports after the driver
# loads). No port: exit 0; udev starts the unit again if one appears.
i=0
while [ "$i" -lt 300 ]; do
	for n in /sys/class/virtio-ports/*/name; do
		[ -r "$n" ] && [ "$(cat "$n")" = org.qemu.guest_agent.0 ] || continue
		exec /usr/sbin/qemu-ga --method=virtio-serial --path="/dev/$(basename "$(dirname "$n")")"
	done
	sleep 0.1
	i=$((i + 1))
done
echo "qemu-ga-early: no org.qemu.guest_agent.0 virtio port" >&2
exit 0
GA_EOF
chmod 0755 "$ROOT/usr/local/sbin/qemu-ga-early"
cat >"$ROOT/etc/systemd/system/qemu-guest-agent.service" <<'GA_EOF'
[Unit]
Description=QEMU Guest Agent (started before udev, on the port's kernel node)
DefaultDependencies=no
After=systemd-modules-load.service systemd-journald.socket
Conflicts=shutdown.target
Before=sysinit.target shutdown.target

[Service]
ExecStart=/usr/local/sbin/qemu-ga-early
Restart=on-failure
RestartSec=1

[Install]
WantedBy=sysinit.target
GA_EOF
chroot "$ROOT" systemctl enable qemu-guest-agent.service >&2

chroot "$ROOT" systemctl enable systemd-networkd.service systemd-resolved.service >&2
chroot "$ROOT" systemctl enable squid.service >&2 || true
# Timers that only cost CPU in a short-lived test guest.
for t in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer logrotate.timer; do
	chroot "$ROOT" systemctl disable "$t" >/dev/null 2>&1 || true
done
echo "$HASH" >"$ROOT/etc/proxy-operator-e2e-image"
# Package lists are useless offline and large.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb

# --- GRUB ----------------------------------------------------------------------
# Both firmwares run an embedded early config that finds the ESP by its volume
# id and reads EFI/BOOT/grub.cfg from it.
cat >"$WORK/early.cfg" <<EOF
search --no-floppy --fs-uuid --set=root $ESP_UUID
set prefix=(\$root)/EFI/BOOT
EOF
cat >"$WORK/grub.cfg" <<EOF
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set timeout=0
set default=0
menuentry 'Debian $SUITE (proxy-operator e2e guest, $KVER)' {
	search --no-floppy --fs-uuid --set=root $ROOT_UUID
	linux /boot/vmlinuz-$KVER root=UUID=$ROOT_UUID ro console=tty0 console=ttyS0,115200n8
	initrd /boot/initrd.img-$KVER
}
EOF
GRUB_MODS=(part_gpt part_msdos fat ext2 normal linux search search_fs_uuid
	configfile echo test serial terminal ls cat boot reboot halt sleep)
grub-mkimage -O x86_64-efi -o "$WORK/BOOTX64.EFI" -c "$WORK/early.cfg" -p /EFI/BOOT \
	"${GRUB_MODS[@]}" all_video efi_gop
grub-mkimage -O i386-pc -o "$WORK/core.img" -c "$WORK/early.cfg" -p /EFI/BOOT \
	"${GRUB_MODS[@]}" biosdisk

# --- disk ----------------------------------------------------------------------
DISK="$WORK/disk.raw"
truncate -s "${DISK_SIZE_MIB}M" "$DISK"
BIOS_START=2048                                     # 1 MiB
ESP_START=4096                                      # 2 MiB
ESP_END=$((ESP_START + ESP_SIZE_MIB * 2048 - 1))
ROOT_START=$((ESP_END + 1))
sgdisk -Z \
	-n 1:$BIOS_START:$((ESP_START - 1)) -t 1:EF02 -c 1:bios_grub \
	-n 2:$ESP_START:$ESP_END -t 2:EF00 -c 2:ESP \
	-n 3:$ROOT_START:0 -t 3:8304 -c 3:root \
	"$DISK" >&2
ROOT_END=$(sgdisk -i 3 "$DISK" | awk '/^Last sector:/ {print $3}')
ROOT_SECTORS=$((ROOT_END - ROOT_START + 1))

# ESP: FAT with the fixed volume id, filled with mtools.
ESP="$WORK/esp.img"
mkfs.vfat -C -i "$ESP_ID" -n ESP "$ESP" $((ESP_SIZE_MIB * 1024)) >&2
mmd -i "$ESP" ::/EFI ::/EFI/BOOT
mcopy -i "$ESP" "$WORK/BOOTX64.EFI" "$WORK/grub.cfg" ::/EFI/BOOT/
dd if="$ESP" of="$DISK" bs=512 seek=$ESP_START conv=notrunc,sparse status=none

# Root: ext4 populated from the directory, then placed.
ROOTFS="$WORK/root.img"
truncate -s $((ROOT_SECTORS * 512)) "$ROOTFS"
mkfs.ext4 -q -F -L root -U "$ROOT_UUID" -d "$ROOT" "$ROOTFS"
dd if="$ROOTFS" of="$DISK" bs=4M seek=$((ROOT_START * 512)) oflag=seek_bytes conv=notrunc,sparse status=none
rm -f "$ROOTFS"

# BIOS boot, as grub-bios-setup does it for a core.img embedded contiguously
# in the bios_grub partition:
#  - core.img's first sector (diskboot) ends with a blocklist {u64 start,
#    u16 len, u16 segment} naming the rest of core.img;
#  - boot.img (first 440 bytes of the MBR, the partition table stays) holds at
#    0x5c the LBA of core.img's first sector; the 2-byte `jmp` at 0x66 becomes
#    two NOPs, enabling the boot-drive check (grub-bios-setup's default for
#    hard disks; a single NOP would leave a broken instruction).
CORE_SECTORS=$((($(stat -c %s "$WORK/core.img") + 511) / 512))
[ $CORE_SECTORS -le $((ESP_START - BIOS_START)) ] || {
	echo "guest-image: core.img too large" >&2
	exit 1
}
le() { # le VALUE BYTES -> little-endian bytes on stdout
	local v=$1 n=$2 i
	for ((i = 0; i < n; i++)); do
		printf "\\$(printf '%03o' $((v & 255)))"
		v=$((v >> 8))
	done
}
{ le $((BIOS_START + 1)) 8; le $((CORE_SECTORS - 1)) 2; le $((0x820)) 2; } |
	dd of="$WORK/core.img" bs=1 seek=500 conv=notrunc status=none
dd if="$WORK/core.img" of="$DISK" bs=512 seek=$BIOS_START conv=notrunc status=none
cp /usr/lib/grub/i386-pc/boot.img "$WORK/boot.img"
le $BIOS_START 8 | dd of="$WORK/boot.img" bs=1 seek=$((0x5c)) conv=notrunc status=none
printf '\x90\x90' | dd of="$WORK/boot.img" bs=1 seek=$((0x66)) conv=notrunc status=none
dd if="$WORK/boot.img" of="$DISK" bs=440 count=1 conv=notrunc status=none
log "disk assembled after $(($(date +%s) - START)) s"

qemu-img convert -c -O qcow2 "$DISK" "$WORK/out.qcow2"
mv "$WORK/out.qcow2" "$OUT"
write_sum
log "built $OUT in $(($(date +%s) - START)) s ($(du -h "$OUT" | cut -f1), kernel $KVER)"
echo "$OUT"
