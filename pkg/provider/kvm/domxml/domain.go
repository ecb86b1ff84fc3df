// Package domxml builds the libvirt XML the KVM provider defines: the proxy
// VM's domain, its storage volumes, and the metadata element that records
// which Proxy owns a domain. Everything is built with libvirt.org/go/libvirtxml
// and is pure: no libvirt connection is needed.
package domxml

import (
	"net"
	"strings"

	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
)

// Domain types.
const (
	DomainTypeKVM  = "kvm"  // hardware virtualisation (default)
	DomainTypeQEMU = "qemu" // TCG emulation, for hosts without /dev/kvm
)

// Firmware values, as on KVMImage.
const (
	FirmwareUEFI = "uefi"
	FirmwareBIOS = "bios"
)

// Network source types.
const (
	NetworkTypeNetwork = "network" // a libvirt virtual network, e.g. "default"
	NetworkTypeBridge  = "bridge"  // a host bridge, e.g. "br0"
)

// Guest-visible device names.
const (
	DiskTarget        = "vda"
	SeedTarget        = "sdb"
	GuestAgentChannel = "org.qemu.guest_agent.0"
)

// Network says where the VM's single NIC is plugged.
type Network struct {
	// Type is NetworkTypeNetwork (default) or NetworkTypeBridge.
	Type string
	// Name of the libvirt network or of the host bridge.
	Name string
}

// Params describe one proxy VM.
type Params struct {
	// Name of the domain; see DomainName.
	Name string
	// UUID of the domain; libvirt generates one when empty.
	UUID string
	// DomainType is DomainTypeKVM (default) or DomainTypeQEMU.
	DomainType string
	VCPUs      int32
	// MemoryBytes is rounded up to whole KiB.
	MemoryBytes int64
	// Firmware is FirmwareUEFI (default, as the API defaults) or FirmwareBIOS.
	Firmware string
	// DiskPath is the qcow2 overlay's path (StorageVolGetPath).
	DiskPath string
	// SeedPath is the seed ISO's path (StorageVolGetPath).
	SeedPath string
	Network  Network
	// MAC of the NIC; libvirt generates one when empty.
	MAC string
	// Metadata records the owner; UID is required, ManagedBy defaults to
	// ManagedBy.
	Metadata Metadata
}

// Domain returns the domain XML for p. Invalid parameters are permanent
// errors.
//
// Choices:
//   - q35 machine, x86_64, headless (no graphics or video, no USB).
//   - Disks are <disk type="file"> with <source file=PATH>, never volume or
//     pool references: AppArmor's virt-aa-helper grants a domain access to
//     the paths it sees in the XML (following qcow2 backing chains), not to
//     pool volumes.
//   - Root disk: virtio-blk vda, qcow2, discard=unmap so the overlay stays
//     thin; it is the only boot device.
//   - Seed: SATA cdrom sdb, raw, readonly (q35 has no IDE bus).
//   - One virtio NIC; a qemu-guest-agent channel (the agent reports the
//     addresses); a serial console on a pty (virsh console, boot logs);
//     virtio memballoon; virtio RNG from /dev/urandom, so cloud-init and
//     squid do not wait for entropy on first boot.
//   - CPU: host-passthrough under kvm; under TCG "maximum" (libvirt >= 7.1),
//     as the default qemu64 model lacks x86-64-v2 that EL9 needs.
//   - UEFI: <os firmware="efi"> with secure-boot and enrolled-keys off, and
//     no loader or nvram: libvirt picks the firmware from its descriptors
//     and creates the NVRAM file itself (undefine with
//     VIR_DOMAIN_UNDEFINE_NVRAM to remove it). BIOS: no firmware attribute.
//   - on_poweroff/on_crash destroy (a crash shows as shut off/crashed for
//     the provider to report), on_reboot restart.
func Domain(p Params) (string, error) {
	if err := p.validate(); err != nil {
		return "", err
	}
	meta := p.Metadata
	if meta.ManagedBy == "" {
		meta.ManagedBy = ManagedBy
	}

	domainType := p.DomainType
	if domainType == "" {
		domainType = DomainTypeKVM
	}
	cpu := &libvirtxml.DomainCPU{Mode: "host-passthrough"}
	if domainType == DomainTypeQEMU {
		cpu = &libvirtxml.DomainCPU{Mode: "maximum"}
	}

	osDef := &libvirtxml.DomainOS{
		Type: &libvirtxml.DomainOSType{Type: "hvm", Arch: "x86_64", Machine: "q35"},
	}
	if p.Firmware != FirmwareBIOS {
		osDef.Firmware = "efi"
		osDef.FirmwareInfo = &libvirtxml.DomainOSFirmwareInfo{
			Features: []libvirtxml.DomainOSFirmwareFeature{
				{Name: "secure-boot", Enabled: "no"},
				{Name: "enrolled-keys", Enabled: "no"},
			},
		}
	}

	port0 := uint(0)
	memKiB := uint((p.MemoryBytes + 1023) / 1024)
	dom := &libvirtxml.Domain{
		Type:          domainType,
		Name:          p.Name,
		UUID:          p.UUID,
		Metadata:      &libvirtxml.DomainMetadata{XML: meta.XML()},
		Memory:        &libvirtxml.DomainMemory{Value: memKiB, Unit: "KiB"},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Value: memKiB, Unit: "KiB"},
		VCPU:          &libvirtxml.DomainVCPU{Placement: "static", Value: uint(p.VCPUs)},
		OS:            osDef,
		Features: &libvirtxml.DomainFeatureList{
			ACPI: &libvirtxml.DomainFeature{},
			APIC: &libvirtxml.DomainFeatureAPIC{},
		},
		CPU: cpu,
		Clock: &libvirtxml.DomainClock{
			Offset: "utc",
			Timer: []libvirtxml.DomainTimer{
				{Name: "rtc", TickPolicy: "catchup"},
				{Name: "pit", TickPolicy: "delay"},
				{Name: "hpet", Present: "no"},
			},
		},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		PM: &libvirtxml.DomainPM{
			SuspendToMem:  &libvirtxml.DomainPMPolicy{Enabled: "no"},
			SuspendToDisk: &libvirtxml.DomainPMPolicy{Enabled: "no"},
		},
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: FormatQCOW2, Discard: "unmap"},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: p.DiskPath}},
					Target: &libvirtxml.DomainDiskTarget{Dev: DiskTarget, Bus: "virtio"},
					Boot:   &libvirtxml.DomainDeviceBoot{Order: 1},
				},
				{
					Device:   "cdrom",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: FormatRaw},
					Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: p.SeedPath}},
					Target:   &libvirtxml.DomainDiskTarget{Dev: SeedTarget, Bus: "sata"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Controllers: []libvirtxml.DomainController{
				{Type: "usb", Model: "none"},
			},
			Interfaces: []libvirtxml.DomainInterface{p.iface()},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port0},
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port0},
			}},
			Channels: []libvirtxml.DomainChannel{{
				// No path: libvirt creates the socket under its channel
				// directory, where its security drivers expect it.
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: GuestAgentChannel}},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "virtio"},
			RNGs: []libvirtxml.DomainRNG{{
				Model:   "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
			}},
		},
	}
	s, err := dom.Marshal()
	if err != nil {
		return "", provider.Permanentf("domain %q: encoding XML: %w", p.Name, err)
	}
	return s, nil
}

func (p Params) iface() libvirtxml.DomainInterface {
	iface := libvirtxml.DomainInterface{
		Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	}
	if p.Network.Type == NetworkTypeBridge {
		iface.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: p.Network.Name}}
	} else {
		iface.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: p.Network.Name}}
	}
	if p.MAC != "" {
		iface.MAC = &libvirtxml.DomainInterfaceMAC{Address: strings.ToLower(p.MAC)}
	}
	return iface
}

// validate checks p before any XML is made, in the order the domain
// reads: identity, machine, disks, network, owner, MAC.
func (p Params) validate() error {
	for _, check := range []func() error{p.checkIdentity, p.checkMachine, p.checkDisks, p.checkNetwork, p.checkOwner, p.checkMAC} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// invalid is a permanent error about domain p.Name.
func (p Params) invalid(format string, a ...any) error {
	return provider.Permanentf("domain %q: "+format, append([]any{p.Name}, a...)...)
}

func (p Params) checkIdentity() error {
	switch {
	case p.Name == "" || strings.ContainsAny(p.Name, "/\x00") || len(p.Name) > MaxDomainNameLen:
		return p.invalid("name must be 1-%d characters without '/'", MaxDomainNameLen)
	case p.UUID != "" && !validUUID(p.UUID):
		return p.invalid("UUID %q is not a UUID", p.UUID)
	case p.DomainType != "" && p.DomainType != DomainTypeKVM && p.DomainType != DomainTypeQEMU:
		return p.invalid("domain type %q: want %s or %s", p.DomainType, DomainTypeKVM, DomainTypeQEMU)
	}
	return nil
}

func (p Params) checkMachine() error {
	switch {
	case p.VCPUs < 1:
		return p.invalid("%d vCPUs: want at least 1", p.VCPUs)
	case p.MemoryBytes < 1<<20:
		return p.invalid("memory %d bytes: want at least 1MiB", p.MemoryBytes)
	case p.Firmware != "" && p.Firmware != FirmwareUEFI && p.Firmware != FirmwareBIOS:
		return p.invalid("firmware %q: want %s or %s", p.Firmware, FirmwareUEFI, FirmwareBIOS)
	}
	return nil
}

func (p Params) checkDisks() error {
	switch {
	case !strings.HasPrefix(p.DiskPath, "/"):
		return p.invalid("disk path %q is not an absolute file path", p.DiskPath)
	case !strings.HasPrefix(p.SeedPath, "/"):
		return p.invalid("seed path %q is not an absolute file path", p.SeedPath)
	}
	return nil
}

func (p Params) checkNetwork() error {
	switch {
	case p.Network.Type != "" && p.Network.Type != NetworkTypeNetwork && p.Network.Type != NetworkTypeBridge:
		return p.invalid("network type %q: want %s or %s", p.Network.Type, NetworkTypeNetwork, NetworkTypeBridge)
	case p.Network.Name == "":
		return p.invalid("no network or bridge name")
	}
	return nil
}

func (p Params) checkOwner() error {
	if p.Metadata.UID == "" {
		return p.invalid("metadata has no owner UID")
	}
	return nil
}

func (p Params) checkMAC() error {
	if p.MAC == "" {
		return nil
	}
	if hw, err := net.ParseMAC(p.MAC); err != nil || len(hw) != 6 {
		return p.invalid("MAC %q is not a 48-bit MAC address", p.MAC)
	}
	return nil
}

// validUUID accepts what libvirt's virUUIDParse does in practice: 32 hex
// digits, optionally grouped 8-4-4-4-12.
func validUUID(s string) bool {
	hex := strings.ReplaceAll(s, "-", "")
	if len(hex) != 32 || (len(s) != 32 && len(s) != 36) {
		return false
	}
	if len(s) == 36 && (s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-') {
		return false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
