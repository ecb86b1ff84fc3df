package domxml

import (
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
)

const sum = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

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

func TestImageVolumeName(t *testing.T) {
	tests := []struct {
		name, image, checksum, format string
		want                          string
	}{
		{"qcow2", "debian-12", sum, FormatQCOW2, "image-debian-12-0123456789ab.qcow2"},
		{"raw", "debian-12", sum, FormatRaw, "image-debian-12-0123456789ab.raw"},
		{"upper-case checksum", "debian-12", strings.ToUpper(sum[:7]) + strings.ToUpper(sum[7:]), FormatQCOW2, ""},
		{"upper-case hex", "debian-12", "sha256:" + strings.ToUpper(sum[7:]), FormatQCOW2, "image-debian-12-0123456789ab.qcow2"},
		{"direct url", "", sum, FormatQCOW2, "image-url-0123456789ab.qcow2"},
		{"dotted name", "debian.12.cloud", sum, FormatQCOW2, "image-debian.12.cloud-0123456789ab.qcow2"},
		{"odd characters", "a/b c", sum, FormatQCOW2, "image-a-b-c-0123456789ab.qcow2"},
		{"bad prefix", "x", "md5:" + sum[7:], FormatQCOW2, ""},
		{"short", "x", sum[:70], FormatQCOW2, ""},
		{"not hex", "x", sum[:70] + "zz", FormatQCOW2, ""},
		{"bad format", "x", sum, "vmdk", ""},
		{"empty format", "x", sum, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ImageVolumeName(tt.image, tt.checksum, tt.format)
			if tt.want == "" {
				if err == nil || provider.Class(err) != provider.ClassPermanent {
					t.Errorf("= %q, %v; want a permanent error", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("= %q, %v; want %q", got, err, tt.want)
			}
			marker, err := ImageMarkerName(tt.image, tt.checksum, tt.format)
			if err != nil || marker != tt.want+".verified" {
				t.Errorf("ImageMarkerName = %q, %v; want %q", marker, err, tt.want+".verified")
			}
		})
	}

	// A new checksum is a new volume and a new marker.
	other := sum[:len(sum)-64] + "f" + sum[len(sum)-63:]
	a, _ := ImageVolumeName("img", sum, FormatQCOW2)
	b, _ := ImageVolumeName("img", other, FormatQCOW2)
	if a == b {
		t.Errorf("checksum change kept volume %q", a)
	}
	// Long KVMImage names (up to 253) keep the file name short.
	long, err := ImageMarkerName(strings.Repeat("a", 253), sum, FormatQCOW2)
	if err != nil || len(long) > 230 || validVolumeName(long) != nil {
		t.Errorf("long name marker %q (%d), %v", long, len(long), err)
	}
}
