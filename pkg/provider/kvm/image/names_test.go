package image

import (
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
)

func TestNames(t *testing.T) {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	long := strings.Repeat("a", 200)
	for _, tc := range []struct {
		name             string
		img              provider.Image
		wantVol, errHas  string
		wantVolHasPrefix string
	}{
		{name: "kvmimage", img: provider.Image{Name: "ubuntu-24.04", Checksum: sum, Format: "qcow2"}, wantVol: "image-ubuntu-24.04-9f86d081884c.qcow2"},
		{name: "raw", img: provider.Image{Name: "deb", Checksum: sum, Format: "raw"}, wantVol: "image-deb-9f86d081884c.raw"},
		{name: "direct URL", img: provider.Image{URL: "https://example.com/a.img", Checksum: sum, Format: "raw"}, wantVolHasPrefix: "image-url_"},
		{name: "long name", img: provider.Image{Name: long, Checksum: sum, Format: "raw"}, wantVolHasPrefix: "image-" + long[:51] + "_"},
		{name: "slash", img: provider.Image{Name: "../etc", Checksum: sum, Format: "raw"}, errHas: `character '/'`},
		{name: "upper case", img: provider.Image{Name: "Deb", Checksum: sum, Format: "raw"}, errHas: `character 'D'`},
		{name: "format", img: provider.Image{Name: "deb", Checksum: sum, Format: "iso"}, errHas: `format "iso"`},
		{name: "checksum", img: provider.Image{Name: "deb", Checksum: "sha256:x", Format: "raw"}, errHas: "digest has"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol, err := VolumeName(tc.img)
			marker, merr := MarkerName(tc.img)
			if tc.errHas != "" {
				if err == nil || merr == nil || !strings.Contains(err.Error(), tc.errHas) || provider.Class(err) != provider.ClassPermanent {
					t.Fatalf("VolumeName error = %v, want permanent mentioning %q", err, tc.errHas)
				}
				return
			}
			if err != nil || merr != nil {
				t.Fatal(err, merr)
			}
			if tc.wantVol != "" && vol != tc.wantVol {
				t.Errorf("VolumeName = %s, want %s", vol, tc.wantVol)
			}
			if !strings.HasPrefix(vol, tc.wantVolHasPrefix) {
				t.Errorf("VolumeName = %s, want prefix %s", vol, tc.wantVolHasPrefix)
			}
			if want := vol + "." + digest + ".sha256"; marker != want {
				t.Errorf("MarkerName = %s, want %s", marker, want)
			}
			if len(marker) > 200 {
				t.Errorf("marker name is %d bytes long", len(marker))
			}
			// Prune recognises both names, with their digests.
			comp, _ := nameComponent(tc.img)
			if p, ok := parseName(vol, comp); !ok || p.marker || p.short != digest[:12] {
				t.Errorf("parseName(%s) = %+v, %v", vol, p, ok)
			}
			if p, ok := parseName(marker, comp); !ok || !p.marker || p.digest != digest {
				t.Errorf("parseName(%s) = %+v, %v", marker, p, ok)
			}
			if got := imageVolumeOf(marker); got != vol {
				t.Errorf("imageVolumeOf(marker) = %s, want %s", got, vol)
			}
		})
	}
}

func TestDirectURLNamesDiffer(t *testing.T) {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	a, _ := VolumeName(provider.Image{URL: "https://a.example/x.img", Checksum: sum, Format: "raw"})
	b, _ := VolumeName(provider.Image{URL: "https://b.example/x.img", Checksum: sum, Format: "raw"})
	if a == b {
		t.Errorf("two direct URLs share volume %s", a)
	}
}

func TestParseNameRejectsOthers(t *testing.T) {
	for _, n := range []string{
		"image-deb-extra-9f86d081884c.raw", // image "deb-extra"
		"image-deb-9f86d081884c.vmdk",
		"image-deb-9f86d081884.raw",
		"image-deb-9F86D081884C.raw",
		"image-deb-9f86d081884c.raw.bak",
		"image-deb-9f86d081884c.raw.0123.sha256",
		"image-deb.9f86d081884c.raw",
		"proxy-deb-9f86d081884c.raw",
	} {
		if p, ok := parseName(n, "deb"); ok {
			t.Errorf("parseName(%q) = %+v, want not ours", n, p)
		}
	}
}
