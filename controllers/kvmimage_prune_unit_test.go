package controllers

import (
	"slices"
	"testing"

	crawlv1 "crawl.example.com/proxy-operator/api/v1alpha1"
)

func TestRecordChecksumKeepsRetainNewestFirst(t *testing.T) {
	for _, tc := range []struct {
		name        string
		retain      int32
		checksum    string
		had, want   []string
		wantChanged bool
	}{
		{name: "first record", retain: 1, checksum: "sha256:a", want: []string{"sha256:a"}, wantChanged: true},
		{name: "unchanged", retain: 1, checksum: "sha256:a", had: []string{"sha256:a"}, want: []string{"sha256:a"}},
		{name: "superseded, retain 1", retain: 1, checksum: "sha256:b", had: []string{"sha256:a"}, want: []string{"sha256:b"}, wantChanged: true},
		{name: "superseded, retain 2", retain: 2, checksum: "sha256:b", had: []string{"sha256:a"}, want: []string{"sha256:b", "sha256:a"}, wantChanged: true},
		{name: "third of retain 2", retain: 2, checksum: "sha256:c", had: []string{"sha256:b", "sha256:a"}, want: []string{"sha256:c", "sha256:b"}, wantChanged: true},
		{name: "rolled back", retain: 2, checksum: "sha256:a", had: []string{"sha256:b", "sha256:a"}, want: []string{"sha256:a", "sha256:b"}, wantChanged: true},
		{name: "retain unset means 1", retain: 0, checksum: "sha256:b", had: []string{"sha256:a"}, want: []string{"sha256:b"}, wantChanged: true},
		{name: "retain lowered", retain: 1, checksum: "sha256:c", had: []string{"sha256:c", "sha256:b"}, want: []string{"sha256:c"}, wantChanged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := &crawlv1.KVMImage{Spec: crawlv1.KVMImageSpec{Checksum: tc.checksum, Retain: tc.retain}, Status: crawlv1.KVMImageStatus{Checksums: tc.had}}
			changed := recordChecksum(img)
			if !slices.Equal(img.Status.Checksums, tc.want) || changed != tc.wantChanged {
				t.Errorf("checksums %v, changed %v; want %v, %v", img.Status.Checksums, changed, tc.want, tc.wantChanged)
			}
		})
	}
}
