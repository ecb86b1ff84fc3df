package domxml

import (
	"testing"

	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func parseVolume(t *testing.T, s string) libvirtxml.StorageVolume {
	t.Helper()
	var v libvirtxml.StorageVolume
	if err := v.Unmarshal(s); err != nil {
		t.Fatalf("libvirtxml cannot parse the volume: %v\n%s", err, s)
	}
	return v
}

func TestVolumes(t *testing.T) {
	const backing = "/var/lib/libvirt/images/image-debian-12-0123456789ab.qcow2"
	tests := []struct {
		name        string
		xml         func() (string, error)
		wantName    string
		wantBytes   uint64
		wantFormat  string
		wantBacking string
		backingFmt  string
	}{
		{"overlay on qcow2", func() (string, error) { return OverlayVolume("proxy-u-disk.qcow2", 10<<30, backing, FormatQCOW2) },
			"proxy-u-disk.qcow2", 10 << 30, FormatQCOW2, backing, FormatQCOW2},
		{"overlay on raw", func() (string, error) { return OverlayVolume("proxy-u-disk.qcow2", 1, "/img/base.raw", FormatRaw) },
			"proxy-u-disk.qcow2", 1, FormatQCOW2, "/img/base.raw", FormatRaw},
		{"seed", func() (string, error) { return RawVolume("proxy-u-seed.iso", 47104) },
			"proxy-u-seed.iso", 47104, FormatRaw, "", ""},
		{"marker", func() (string, error) { return RawVolume("image-x-0123456789ab.qcow2.verified", 0) },
			"image-x-0123456789ab.qcow2.verified", 0, FormatRaw, "", ""},
		{"qcow2 image", func() (string, error) { return ImageVolume("image-x-0123456789ab.qcow2", 600<<20, FormatQCOW2) },
			"image-x-0123456789ab.qcow2", 600 << 20, FormatQCOW2, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.xml()
			if err != nil {
				t.Fatal(err)
			}
			v := parseVolume(t, s)
			if v.Name != tt.wantName {
				t.Errorf("name = %q", v.Name)
			}
			if v.Capacity == nil || v.Capacity.Value != tt.wantBytes || v.Capacity.Unit != "bytes" {
				t.Errorf("capacity = %+v, want %d bytes", v.Capacity, tt.wantBytes)
			}
			if v.Target == nil || v.Target.Format == nil || v.Target.Format.Type != tt.wantFormat {
				t.Errorf("target = %+v, want format %s", v.Target, tt.wantFormat)
			}
			switch {
			case tt.wantBacking == "" && v.BackingStore != nil:
				t.Errorf("unexpected backing store %+v", v.BackingStore)
			case tt.wantBacking != "" && (v.BackingStore == nil || v.BackingStore.Path != tt.wantBacking ||
				v.BackingStore.Format == nil || v.BackingStore.Format.Type != tt.backingFmt):
				t.Errorf("backing store = %+v, want %s (%s)", v.BackingStore, tt.wantBacking, tt.backingFmt)
			}
		})
	}
}

func TestVolumesInvalid(t *testing.T) {
	tests := []struct {
		name string
		xml  func() (string, error)
	}{
		{"overlay without capacity", func() (string, error) { return OverlayVolume("d.qcow2", 0, "/b.qcow2", FormatQCOW2) }},
		{"overlay relative backing", func() (string, error) { return OverlayVolume("d.qcow2", 1, "b.qcow2", FormatQCOW2) }},
		{"overlay backing format", func() (string, error) { return OverlayVolume("d.qcow2", 1, "/b.vmdk", "vmdk") }},
		{"overlay path as name", func() (string, error) { return OverlayVolume("../d.qcow2", 1, "/b.qcow2", FormatQCOW2) }},
		{"empty name", func() (string, error) { return RawVolume("", 1) }},
		{"dot-dot name", func() (string, error) { return RawVolume("..", 1) }},
		{"negative capacity", func() (string, error) { return RawVolume("s.iso", -1) }},
		{"image format", func() (string, error) { return ImageVolume("i", 1, "iso") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.xml()
			if err == nil || provider.Class(err) != provider.ClassPermanent {
				t.Errorf("= %q, %v; want a permanent error", s, err)
			}
		})
	}
}
