package domxml

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func baseParams() Params {
	return Params{
		Name:        "default.web",
		VCPUs:       2,
		MemoryBytes: 1 << 30,
		Firmware:    FirmwareUEFI,
		DiskPath:    "/var/lib/libvirt/images/proxy-6f1c-disk.qcow2",
		SeedPath:    "/var/lib/libvirt/images/proxy-6f1c-seed.iso",
		Network:     Network{Type: NetworkTypeNetwork, Name: "default"},
		Metadata:    Metadata{ManagedBy: ManagedBy, Namespace: "default", Name: "web", UID: "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", Tag: "prod"},
	}
}

// domainCases are shared with the libvirtschema test.
func domainCases() []struct {
	name string
	edit func(*Params)
} {
	return []struct {
		name string
		edit func(*Params)
	}{
		{"uefi kvm network", func(*Params) {}},
		{"bios qemu bridge", func(p *Params) {
			p.Firmware, p.DomainType = FirmwareBIOS, DomainTypeQEMU
			p.Network = Network{Type: NetworkTypeBridge, Name: "br0"}
		}},
		{"defaults", func(p *Params) {
			p.Firmware, p.DomainType, p.Network.Type, p.Metadata.ManagedBy = "", "", "", ""
		}},
		{"uuid and mac", func(p *Params) {
			p.UUID, p.MAC = "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", "52:54:00:AB:cd:EF"
		}},
		{"odd metadata", func(p *Params) {
			p.Metadata.Tag = `a<b>&"c' ]]>`
			p.Metadata.Name = "ünïcode"
		}},
		{"odd memory", func(p *Params) { p.MemoryBytes = 512<<20 + 1 }},
	}
}

func TestDomain(t *testing.T) {
	for _, tc := range domainCases() {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			tc.edit(&p)
			s, err := Domain(p)
			if err != nil {
				t.Fatalf("Domain: %v", err)
			}
			// Volume or pool references would escape virt-aa-helper.
			for _, bad := range []string{`type="volume"`, "pool=", "<graphics", "<video", "<nvram"} {
				if strings.Contains(s, bad) {
					t.Errorf("domain XML contains %q:\n%s", bad, s)
				}
			}

			var d libvirtxml.Domain
			if err := d.Unmarshal(s); err != nil {
				t.Fatalf("libvirtxml cannot parse the result: %v\n%s", err, s)
			}
			wantType := p.DomainType
			if wantType == "" {
				wantType = DomainTypeKVM
			}
			if d.Type != wantType || d.Name != p.Name || d.UUID != p.UUID {
				t.Errorf("type/name/uuid = %q/%q/%q", d.Type, d.Name, d.UUID)
			}
			if d.OS == nil || d.OS.Type == nil || d.OS.Type.Machine != "q35" || d.OS.Type.Arch != "x86_64" || d.OS.Type.Type != "hvm" {
				t.Errorf("os type = %+v, want hvm x86_64 q35", d.OS.Type)
			}
			if d.Features == nil || d.Features.ACPI == nil || d.Features.APIC == nil {
				t.Error("acpi/apic missing")
			}
			checkFirmware(t, p, d.OS)
			if wantCPU := map[string]string{DomainTypeKVM: "host-passthrough", DomainTypeQEMU: "maximum"}[wantType]; d.CPU == nil || d.CPU.Mode != wantCPU {
				t.Errorf("cpu = %+v, want mode %s", d.CPU, wantCPU)
			}
			wantKiB := uint((p.MemoryBytes + 1023) / 1024)
			if d.Memory.Value != wantKiB || d.Memory.Unit != "KiB" || d.CurrentMemory.Value != wantKiB {
				t.Errorf("memory = %+v / %+v, want %d KiB", d.Memory, d.CurrentMemory, wantKiB)
			}
			if d.VCPU.Value != uint(p.VCPUs) {
				t.Errorf("vcpus = %d", d.VCPU.Value)
			}
			if d.OnCrash != "destroy" || d.OnPoweroff != "destroy" || d.OnReboot != "restart" {
				t.Errorf("lifecycle = %s/%s/%s", d.OnPoweroff, d.OnReboot, d.OnCrash)
			}
			checkDisks(t, p, d.Devices.Disks)
			checkDevices(t, p, d.Devices)

			// Metadata round trip, both from the element and from the
			// whole domain.
			wantMeta := p.Metadata
			if wantMeta.ManagedBy == "" {
				wantMeta.ManagedBy = ManagedBy
			}
			if d.Metadata == nil {
				t.Fatal("no metadata")
			}
			if got, err := ParseMetadata(d.Metadata.XML); err != nil || got != wantMeta {
				t.Errorf("ParseMetadata = %+v, %v; want %+v", got, err, wantMeta)
			}
			if got, found, err := MetadataFromDomainXML(s); err != nil || !found || got != wantMeta {
				t.Errorf("MetadataFromDomainXML = %+v, %v, %v; want %+v", got, found, err, wantMeta)
			}
		})
	}
}

func checkFirmware(t *testing.T, p Params, os *libvirtxml.DomainOS) {
	t.Helper()
	if p.Firmware == FirmwareBIOS {
		if os.Firmware != "" || os.FirmwareInfo != nil || os.Loader != nil {
			t.Errorf("bios: os = firmware %q %+v loader %+v, want none", os.Firmware, os.FirmwareInfo, os.Loader)
		}
		return
	}
	if os.Firmware != "efi" {
		t.Errorf("uefi: firmware = %q, want efi", os.Firmware)
	}
	features := map[string]string{}
	if os.FirmwareInfo != nil {
		for _, f := range os.FirmwareInfo.Features {
			features[f.Name] = f.Enabled
		}
	}
	if features["secure-boot"] != "no" || features["enrolled-keys"] != "no" || len(features) != 2 {
		t.Errorf("uefi: firmware features = %v, want secure-boot and enrolled-keys off", features)
	}
	if os.Loader != nil || os.NVRam != nil {
		t.Errorf("uefi: loader %+v nvram %+v, want libvirt to choose", os.Loader, os.NVRam)
	}
}

func checkDisks(t *testing.T, p Params, disks []libvirtxml.DomainDisk) {
	t.Helper()
	if len(disks) != 2 {
		t.Fatalf("%d disks, want 2", len(disks))
	}
	for _, disk := range disks {
		if disk.Source == nil || disk.Source.File == nil || disk.Source.Volume != nil || disk.Source.Block != nil || disk.Source.Network != nil {
			t.Errorf("disk %+v: source is not a plain file", disk.Target)
		}
	}
	root, seed := disks[0], disks[1]
	if root.Device != "disk" || root.Source.File.File != p.DiskPath || root.Target.Dev != DiskTarget || root.Target.Bus != "virtio" ||
		root.Driver.Type != FormatQCOW2 || root.Boot == nil || root.Boot.Order != 1 || root.ReadOnly != nil {
		t.Errorf("root disk = %+v target %+v driver %+v", root, root.Target, root.Driver)
	}
	if seed.Device != "cdrom" || seed.Source.File.File != p.SeedPath || seed.Target.Dev != SeedTarget || seed.Target.Bus != "sata" ||
		seed.Driver.Type != FormatRaw || seed.ReadOnly == nil || seed.Boot != nil {
		t.Errorf("seed = %+v target %+v driver %+v", seed, seed.Target, seed.Driver)
	}
}

func checkDevices(t *testing.T, p Params, dev *libvirtxml.DomainDeviceList) {
	t.Helper()
	if len(dev.Interfaces) != 1 {
		t.Fatalf("%d interfaces, want 1", len(dev.Interfaces))
	}
	nic := dev.Interfaces[0]
	if nic.Model == nil || nic.Model.Type != "virtio" {
		t.Errorf("nic model = %+v", nic.Model)
	}
	switch p.Network.Type {
	case NetworkTypeBridge:
		if nic.Source.Bridge == nil || nic.Source.Bridge.Bridge != p.Network.Name {
			t.Errorf("nic source = %+v, want bridge %s", nic.Source, p.Network.Name)
		}
	default:
		if nic.Source.Network == nil || nic.Source.Network.Network != p.Network.Name {
			t.Errorf("nic source = %+v, want network %s", nic.Source, p.Network.Name)
		}
	}
	if p.MAC == "" && nic.MAC != nil || p.MAC != "" && (nic.MAC == nil || nic.MAC.Address != strings.ToLower(p.MAC)) {
		t.Errorf("mac = %+v, want %q", nic.MAC, p.MAC)
	}

	var agent bool
	for _, ch := range dev.Channels {
		if ch.Source != nil && ch.Source.UNIX != nil && ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == GuestAgentChannel {
			agent = true
		}
	}
	if !agent {
		t.Errorf("no unix/virtio %s channel: %+v", GuestAgentChannel, dev.Channels)
	}
	if len(dev.Serials) != 1 || dev.Serials[0].Source == nil || dev.Serials[0].Source.Pty == nil {
		t.Errorf("serials = %+v, want one pty", dev.Serials)
	}
	if len(dev.Consoles) != 1 || dev.Consoles[0].Source.Pty == nil || dev.Consoles[0].Target.Type != "serial" {
		t.Errorf("consoles = %+v, want one pty on serial", dev.Consoles)
	}
	if dev.MemBalloon == nil || dev.MemBalloon.Model != "virtio" {
		t.Errorf("memballoon = %+v", dev.MemBalloon)
	}
	if len(dev.RNGs) != 1 || dev.RNGs[0].Model != "virtio" || dev.RNGs[0].Backend.Random == nil || dev.RNGs[0].Backend.Random.Device != "/dev/urandom" {
		t.Errorf("rngs = %+v", dev.RNGs)
	}
	if len(dev.Graphics) != 0 || len(dev.Videos) != 0 {
		t.Error("graphics or video present")
	}
}

func TestDomainInvalid(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Params)
	}{
		{"no name", func(p *Params) { p.Name = "" }},
		{"slash in name", func(p *Params) { p.Name = "ns/web" }},
		{"long name", func(p *Params) { p.Name = strings.Repeat("a", MaxDomainNameLen+1) }},
		{"bad uuid", func(p *Params) { p.UUID = "not-a-uuid" }},
		{"uuid bad grouping", func(p *Params) { p.UUID = "6f1c2c8e6-c6b-4a43-9d1f-0a8f5f0c9b11" }},
		{"domain type", func(p *Params) { p.DomainType = "xen" }},
		{"no vcpus", func(p *Params) { p.VCPUs = 0 }},
		{"no memory", func(p *Params) { p.MemoryBytes = 0 }},
		{"firmware", func(p *Params) { p.Firmware = "coreboot" }},
		{"relative disk", func(p *Params) { p.DiskPath = "proxy-disk.qcow2" }},
		{"no disk", func(p *Params) { p.DiskPath = "" }},
		{"pool reference as disk", func(p *Params) { p.DiskPath = "default/proxy-disk.qcow2" }},
		{"relative seed", func(p *Params) { p.SeedPath = "seed.iso" }},
		{"network type", func(p *Params) { p.Network.Type = "direct" }},
		{"no network", func(p *Params) { p.Network.Name = "" }},
		{"bad mac", func(p *Params) { p.MAC = "52:54:00:zz:00:01" }},
		{"eui-64 mac", func(p *Params) { p.MAC = "02:00:5e:10:00:00:00:01" }},
		{"no owner uid", func(p *Params) { p.Metadata.UID = "" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := baseParams()
			tt.edit(&p)
			s, err := Domain(p)
			if err == nil {
				t.Fatalf("Domain accepted %+v:\n%s", p, s)
			}
			if provider.Class(err) != provider.ClassPermanent {
				t.Errorf("err %v is %q, want permanent", err, provider.Class(err))
			}
		})
	}
}
