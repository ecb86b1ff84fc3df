package domxml

import (
	"strings"
	"testing"
)

func TestDomainName(t *testing.T) {
	long63 := strings.Repeat("n", 63)
	tests := []struct {
		ns, name, want string
	}{
		{"default", "web", "default.web"},
		{"team-a", "squid-1", "team-a.squid-1"},
		{long63, long63, long63 + "." + long63},
	}
	for _, tt := range tests {
		if got := DomainName(tt.ns, tt.name); got != tt.want {
			t.Errorf("DomainName(%q, %q) = %q, want %q", tt.ns, tt.name, got, tt.want)
		}
	}

	// Same name in two namespaces: two domains.
	if DomainName("a", "web") == DomainName("b", "web") {
		t.Error("namespaces collide")
	}
	// Over-long input (not valid Kubernetes names) is capped, stays
	// deterministic and unique.
	a, b := strings.Repeat("x", 150), strings.Repeat("y", 150)
	n1, n2 := DomainName(a, a+"1"), DomainName(a, a+"2")
	if len(n1) != MaxDomainNameLen || len(n2) != MaxDomainNameLen || n1 == n2 || n1 != DomainName(a, a+"1") {
		t.Errorf("capped names %q, %q", n1, n2)
	}
	if n := DomainName(b, b); strings.Contains(n, "/") || len(n) > MaxDomainNameLen {
		t.Errorf("capped name %q", n)
	}
}

func TestVolumeNames(t *testing.T) {
	const uid = "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11"
	if got, want := DiskVolumeName(uid), "proxy-"+uid+"-disk.qcow2"; got != want {
		t.Errorf("DiskVolumeName = %q, want %q", got, want)
	}
	if got, want := SeedVolumeName(uid), "proxy-"+uid+"-seed.iso"; got != want {
		t.Errorf("SeedVolumeName = %q, want %q", got, want)
	}

	tests := []struct {
		volume, uid string
		ok          bool
	}{
		{DiskVolumeName(uid), uid, true},
		{SeedVolumeName(uid), uid, true},
		{"proxy--disk.qcow2", "", false},
		{"proxy-" + uid + "-disk.raw", "", false},
		{"image-x-0123456789ab.qcow2", "", false},
		{"other.qcow2", "", false},
	}
	for _, tt := range tests {
		uid, ok := VolumeOwnerUID(tt.volume)
		if uid != tt.uid || ok != tt.ok {
			t.Errorf("VolumeOwnerUID(%q) = %q, %v; want %q, %v", tt.volume, uid, ok, tt.uid, tt.ok)
		}
	}
}
