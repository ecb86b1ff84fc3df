package seed

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
	yaml "go.yaml.in/yaml/v3"

	"crawl.example.com/proxy-operator/pkg/provider"
)

const sectorSize = 2048

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// readISO returns the label and the root files of an ISO image, read back
// with the iso9660 library's reader.
func readISO(t *testing.T, iso []byte) (string, map[string][]byte) {
	t.Helper()
	img, err := iso9660.OpenImage(bytes.NewReader(iso))
	if err != nil {
		t.Fatalf("OpenImage: %v", err)
	}
	label, err := img.Label()
	if err != nil {
		t.Fatalf("Label: %v", err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatalf("RootDir: %v", err)
	}
	children, err := root.GetChildren()
	if err != nil {
		t.Fatalf("GetChildren: %v", err)
	}
	files := map[string][]byte{}
	for _, c := range children {
		if c.IsDir() {
			t.Errorf("unexpected directory %q in seed", c.Name())
			continue
		}
		data, err := io.ReadAll(c.Reader())
		if err != nil {
			t.Fatalf("reading %s: %v", c.Name(), err)
		}
		files[c.Name()] = data
	}
	return label, files
}

func sectors(n int) int { return (n + sectorSize - 1) / sectorSize }

func TestBuild(t *testing.T) {
	mime := "Content-Type: multipart/mixed; boundary=\"XYZ\"\nMIME-Version: 1.0\n\n" +
		"--XYZ\nContent-Type: text/cloud-config\n\nruncmd: [a]\n--XYZ--\n"
	tests := []struct {
		name string
		in   Input
	}{
		{"cloud-config", Input{
			InstanceID: "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", Hostname: "squid-1",
			UserData: []byte("#cloud-config\npackages: [squid]\n"),
		}},
		{"jinja", Input{
			InstanceID: "uid-jinja", Hostname: "j",
			UserData: []byte("## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n"),
		}},
		{"script without final newline", Input{
			InstanceID: "uid-script", Hostname: "s",
			UserData: []byte("#!/bin/sh\r\necho hi"),
		}},
		{"mime multipart", Input{InstanceID: "uid-mime", Hostname: "m", UserData: []byte(mime)}},
		{"gzip", Input{InstanceID: "uid-gz", Hostname: "g", UserData: gzipped(t, "#cloud-config\n{}\n")}},
		{"binary with NULs", Input{InstanceID: "uid-bin", Hostname: "b", UserData: []byte{0, 0xff, 0x1f, 0x8b, 0, '\n'}}},
		{"empty user-data", Input{InstanceID: "uid-empty", Hostname: "e"}},
		{"large user-data spans sectors", Input{
			InstanceID: "uid-large", Hostname: "l",
			UserData: bytes.Repeat([]byte("#cloud-config\n"), 1000),
		}},
		{"with vendor-data", Input{
			InstanceID: "uid-vd", Hostname: "v",
			UserData:   []byte("#cloud-config\n{}\n"),
			VendorData: VendorData(true, []byte("#cloud-config\nruncmd: [b]\n")),
		}},
		{"odd hostname", Input{InstanceID: "uid: \"x\"\n#", Hostname: "a: b\n- c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			iso, err := Build(tt.in)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}

			label, files := readISO(t, iso)
			if label != VolumeLabel {
				t.Errorf("label = %q, want %q", label, VolumeLabel)
			}
			want := map[string][]byte{
				MetaDataFile:   MetaData(tt.in.InstanceID, tt.in.Hostname),
				UserDataFile:   tt.in.UserData,
				VendorDataFile: tt.in.VendorData,
			}
			var gotNames, wantNames []string
			for n := range files {
				gotNames = append(gotNames, n)
			}
			for n := range want {
				wantNames = append(wantNames, n)
			}
			sort.Strings(gotNames)
			sort.Strings(wantNames)
			if strings.Join(gotNames, ",") != strings.Join(wantNames, ",") {
				t.Fatalf("files = %v, want %v", gotNames, wantNames)
			}
			for n, w := range want {
				if !bytes.Equal(files[n], w) {
					t.Errorf("%s differs:\n got %q\nwant %q", n, files[n], w)
				}
			}

			// Layout: 16 system sectors, the primary and terminator
			// descriptors, one root directory sector, then each file padded
			// to whole sectors. Compare sizes, not bytes: the writer stamps
			// the build time.
			wantSectors := 16 + 2 + 1
			for _, w := range want {
				wantSectors += sectors(len(w))
			}
			if len(iso)%sectorSize != 0 || len(iso)/sectorSize != wantSectors {
				t.Errorf("image is %d bytes (%d sectors), want %d sectors", len(iso), len(iso)/sectorSize, wantSectors)
			}
		})
	}
}

// TestBuildIsoinfo cross-checks one seed with genisoimage's isoinfo, an
// independent ISO 9660 reader (`make test` installs it: hack/test-deps.sh).
func TestBuildIsoinfo(t *testing.T) {
	isoinfo, err := exec.LookPath("isoinfo")
	if err != nil {
		t.Fatal("isoinfo not on PATH (apt-get install genisoimage, or make test-deps)")
	}
	in := Input{InstanceID: "uid-isoinfo", Hostname: "web-1", UserData: []byte("#cloud-config\n{}\n"), VendorData: []byte("#!/bin/sh\n")}
	iso, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := os.WriteFile(path, iso, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(isoinfo, append([]string{"-i", path}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("isoinfo %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	if d := run("-d"); !strings.Contains(d, "Volume id: "+VolumeLabel+"\n") {
		t.Errorf("isoinfo -d does not show volume id %q:\n%s", VolumeLabel, d)
	}
	// Raw ISO 9660 identifiers: lower case, hyphen kept, version ";1" that
	// Linux isofs strips. No Joliet/Rock Ridge names to fall back on.
	listing := run("-l")
	for _, name := range []string{MetaDataFile, UserDataFile, VendorDataFile} {
		if !strings.Contains(listing, " "+name+";1") {
			t.Errorf("isoinfo -l lacks %s;1:\n%s", name, listing)
		}
	}
	if got, want := run("-x", "/"+MetaDataFile+";1"), string(MetaData(in.InstanceID, in.Hostname)); got != want {
		t.Errorf("isoinfo -x meta-data = %q, want %q", got, want)
	}
	if got := run("-x", "/"+UserDataFile+";1"); got != string(in.UserData) {
		t.Errorf("isoinfo -x user-data = %q, want %q", got, in.UserData)
	}
}

func TestBuildCleansStaging(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	if _, err := Build(Input{InstanceID: "uid", UserData: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("staging left behind in TMPDIR: %v", entries)
	}
}

func TestBuildErrors(t *testing.T) {
	t.Run("empty instance-id is permanent", func(t *testing.T) {
		_, err := Build(Input{Hostname: "x"})
		if provider.Class(err) != provider.ClassPermanent {
			t.Errorf("err = %v (class %q), want permanent", err, provider.Class(err))
		}
	})
	t.Run("unusable TMPDIR is transient", func(t *testing.T) {
		t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
		_, err := Build(Input{InstanceID: "uid"})
		if provider.Class(err) != provider.ClassTransient || !provider.HasClass(err) {
			t.Errorf("err = %v (class %q), want transient", err, provider.Class(err))
		}
	})
}

func TestMetaData(t *testing.T) {
	tests := []struct {
		name, id, host string
	}{
		{"plain", "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", "squid-1"},
		{"no hostname", "uid", ""},
		{"numeric-looking", "0123", "1e3"},
		{"yaml syntax", "a: b", "- [x] # {y}"},
		{"quotes and backslashes", `"\'`, `\n`},
		{"newlines and controls", "a\nb: c", "x\ty\x00z\x7f"},
		{"yaml booleans", "yes", "off"},
		{"unicode", "ünï", "日本"},
		{"invalid utf-8", "\xff\xfe", "a\xc3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := MetaData(tt.id, tt.host)
			var got map[string]any
			if err := yaml.Unmarshal(doc, &got); err != nil {
				t.Fatalf("meta-data is not YAML: %v\n%s", err, doc)
			}
			want := map[string]any{"instance-id": tt.id}
			if tt.host != "" {
				want["local-hostname"] = tt.host
			}
			if strings.ToValidUTF8(tt.id, "") != tt.id || strings.ToValidUTF8(tt.host, "") != tt.host {
				// Invalid bytes are escaped, so they come back as other
				// code points; what matters is one valid key per field.
				if len(got) != len(want) {
					t.Errorf("keys = %v, want %v", got, want)
				}
				return
			}
			if len(got) != len(want) {
				t.Fatalf("got %v, want %v", got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %#v, want %#v", k, got[k], v)
				}
			}
		})
	}
}

func TestForMachine(t *testing.T) {
	m := &provider.Machine{
		Namespace: "ns", Name: "web", UID: "uid-1",
		UserData: []byte("#cloud-config\n{}\n"), VendorData: []byte("#cloud-config\nruncmd: [x]\n"),
		InstallGuestAgent: true,
	}
	in, err := ForMachine(m)
	if err != nil {
		t.Fatal(err)
	}
	if in.InstanceID != "uid-1" || in.Hostname != "web" || !bytes.Equal(in.UserData, m.UserData) {
		t.Errorf("ForMachine = %+v", in)
	}
	if !bytes.Equal(in.VendorData, VendorData(true, m.VendorData)) {
		t.Errorf("vendor-data is not VendorData(true, user's)")
	}
}
