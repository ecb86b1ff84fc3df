package seed

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FuzzBuildUserData: whatever bytes a user puts in user-data (and
// vendor-data) come back byte for byte when the ISO is read by xorriso
// (libisofs), a reader independent of the library that wrote it. The
// operator promises never to parse or rewrite user content.
func FuzzBuildUserData(f *testing.F) {
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		f.Fatal("xorriso not on PATH (apt-get install xorriso, or make test-deps)")
	}
	f.Add([]byte("#cloud-config\npackages: [squid]\n"), []byte("#!/bin/sh\necho hi\n"))
	f.Add([]byte{}, []byte{})
	f.Add([]byte("\x1f\x8b\x08\x00binary\x00\xff"), []byte("Content-Type: multipart/mixed; boundary=x\n\n--x--\n"))
	f.Add(bytes.Repeat([]byte("a"), 2048), bytes.Repeat([]byte{0}, 2049))
	f.Fuzz(func(t *testing.T, userData, vendorData []byte) {
		iso, err := Build(Input{InstanceID: "uid-fuzz", Hostname: "p", UserData: userData, VendorData: vendorData})
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "seed.iso")
		if err := os.WriteFile(path, iso, 0o600); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string][]byte{UserDataFile: userData, VendorDataFile: vendorData} {
			out := filepath.Join(dir, name)
			cmd := exec.Command(xorriso, "-abort_on", "FAILURE", "-indev", path, "-osirrox", "on", "-extract", "/"+name, out)
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("xorriso -extract /%s: %v\n%s", name, err, msg)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s read back by xorriso: %d bytes, want the %d given (first difference at %d)", name, len(got), len(want), firstDiff(got, want))
			}
		}
	})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
