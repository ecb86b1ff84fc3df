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
		name                   string
		img                    provider.Image
		wantVol, errHas        string
		wantLegacy, legacyHead string
	}{
		{name: "kvmimage", img: provider.Image{Name: "ubuntu-24.04", Checksum: sum, Format: "qcow2"}, wantVol: "image-sha256_" + digest + ".qcow2", wantLegacy: "image-ubuntu-24.04-9f86d081884c.qcow2"},
		{name: "raw", img: provider.Image{Name: "deb", Checksum: sum, Format: "raw"}, wantVol: "image-sha256_" + digest + ".raw", wantLegacy: "image-deb-9f86d081884c.raw"},
		{name: "direct URL shares the volume", img: provider.Image{URL: "https://example.com/a.img", Checksum: sum, Format: "raw"}, wantVol: "image-sha256_" + digest + ".raw", legacyHead: "image-url_"},
		{name: "long name", img: provider.Image{Name: long, Checksum: sum, Format: "raw"}, wantVol: "image-sha256_" + digest + ".raw", legacyHead: "image-" + long[:51] + "_"},
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
			if vol != tc.wantVol || marker != vol+".sha256" {
				t.Errorf("VolumeName, MarkerName = %s, %s; want %s and its .sha256", vol, marker, tc.wantVol)
			}
			n, _ := namesOf(tc.img)
			if tc.wantLegacy != "" && n.legacyVolume != tc.wantLegacy || !strings.HasPrefix(n.legacyVolume, tc.legacyHead) {
				t.Errorf("legacy volume = %s, want %s%s", n.legacyVolume, tc.wantLegacy, tc.legacyHead)
			}
			if want := n.legacyVolume + "." + digest + ".sha256"; n.legacyMarker != want || len(want) > 200 {
				t.Errorf("legacy marker = %s, want %s (at most 200 bytes)", n.legacyMarker, want)
			}
			// Prune recognises all four names, with their digests.
			for _, c := range []struct {
				name, image, digest string
				marker, legacy      bool
			}{
				{vol, vol, digest, false, false},
				{marker, vol, digest, true, false},
				{n.legacyVolume, n.legacyVolume, "", false, true},
				{n.legacyMarker, n.legacyVolume, digest, true, true},
			} {
				p, ok := parseName(c.name)
				if !ok || p.image != c.image || p.digest != c.digest || p.marker != c.marker || p.legacy != c.legacy || p.short != digest[:12] || p.holder != "" {
					t.Errorf("parseName(%s) = %+v, %v; want %+v", c.name, p, ok, c)
				}
			}
			// And the claims of installs, with or without an id.
			for id, holder := range map[string]string{"install-a": "install-a", "5a1e0000-0000-4000-8000-000000000001": "5a1e0000-0000-4000-8000-000000000001", "": noInstall} {
				c := claimName(vol, id)
				p, ok := parseName(c)
				if !ok || p.image != vol || p.digest != digest || p.marker || p.legacy || p.holder != holder {
					t.Errorf("parseName(%s) = %+v, %v; want the claim of %q on %s", c, p, ok, holder, vol)
				}
			}
		})
	}
}

func TestDirectURLLegacyNamesDiffer(t *testing.T) {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	a, _ := namesOf(provider.Image{URL: "https://a.example/x.img", Checksum: sum, Format: "raw"})
	b, _ := namesOf(provider.Image{URL: "https://b.example/x.img", Checksum: sum, Format: "raw"})
	if a.legacyVolume == b.legacyVolume || a.volume != b.volume {
		t.Errorf("direct URLs: legacy %s, %s must differ; shared %s, %s must not", a.legacyVolume, b.legacyVolume, a.volume, b.volume)
	}
}

func TestParseNameRejectsOthers(t *testing.T) {
	const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for _, n := range []string{
		"image-deb-9f86d081884c.vmdk",
		"image-deb-9f86d081884.raw",
		"image-deb-9F86D081884C.raw",
		"image-deb-9f86d081884c.raw.bak",
		"image-deb-9f86d081884c.raw.0123.sha256",
		"image-deb-9f86d081884c.raw." + strings.Replace(digest, "9f", "00", 1) + ".sha256", // marker of another digest
		"image-deb.9f86d081884c.raw",
		"image--9f86d081884c.raw",
		"image-De b-9f86d081884c.raw",
		"proxy-deb-9f86d081884c.raw",
		"image-sha256_" + digest[:63] + ".raw",
		"image-sha256_" + digest + ".vmdk",
		"image-sha256_" + digest + ".raw.bak",
		"image-sha256_" + digest + ".raw." + digest + ".sha256",
		"image-sha256_" + strings.ToUpper(digest) + ".raw",
		"image-sha256_" + digest + ".raw.held-by-",
		"image-sha256_" + digest + ".raw.held-by-Install",
		"image-sha256_" + digest + ".raw.held-by-a_b",
		"image-sha256_" + digest + ".raw.held-by--a",
		"image-sha256_" + digest + ".raw.held-by-a.sha256",
		"image-sha256_" + digest + ".raw.sha256.held-by-a",
		"image-deb-9f86d081884c.raw.held-by-a",
	} {
		if p, ok := parseName(n); ok {
			t.Errorf("parseName(%q) = %+v, want not ours", n, p)
		}
	}
}
