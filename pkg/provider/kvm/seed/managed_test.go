package seed

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/guestsquid"
	"crawl.example.com/proxy-operator/pkg/squid"
)

const squidPassword = "correct-horse-battery-staple-42"

// managedMachine has a managed squid, the guest-agent installer and the
// user's own user-data and vendor-data.
func managedMachine() *provider.Machine {
	return &provider.Machine{
		Namespace: "crawl", Name: "eu-1", UID: "6f1c2c8e-6c6b-4a43-9d1f-0a8f5f0c9b11", Port: 3128,
		UserData:          []byte("#cloud-config\nlocale: C.UTF-8\n"),
		VendorData:        []byte("#cloud-config\nruncmd: [[echo, vendor]]\n"),
		InstallGuestAgent: true,
		Squid: &squid.Config{
			AllowedSourceCIDRs: []string{"192.0.2.0/24"},
			Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword},
		},
	}
}

// squidFilesPart returns the boothook part of a managed vendor-data.
func squidFilesPart(t *testing.T, vendorData []byte) mimePart {
	t.Helper()
	doc := parseMIME(t, vendorData)
	for _, p := range doc.children {
		if p.contentType == "text/cloud-boothook" {
			return p
		}
	}
	t.Fatalf("no text/cloud-boothook part in vendor-data:\n%s", vendorData)
	return mimePart{}
}

func TestMachineVendorDataWithManagedSquid(t *testing.T) {
	m := managedMachine()
	vd, err := MachineVendorData(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(vd, []byte(squidPassword)) {
		t.Fatal("vendor-data holds the password in clear")
	}
	doc := parseMIME(t, vd)
	var types []string
	for _, p := range doc.children {
		types = append(types, p.contentType)
	}
	if strings.Join(types, " ") != "text/cloud-boothook text/x-shellscript text/x-shellscript text/plain" {
		t.Fatalf("parts %v, want squid's boothook, squid's script, the guest agent's, the user's", types)
	}
	boothook, final, agent, user := doc.children[0], doc.children[1], doc.children[2], doc.children[3]
	if !bytes.HasPrefix(boothook.body, []byte("#cloud-boothook\n#!/bin/sh\n")) || !bytes.Contains(boothook.body, []byte("stage=early\n")) {
		t.Errorf("boothook part:\n%.200s", boothook.body)
	}
	if !bytes.HasPrefix(final.body, []byte("#!/bin/sh\n")) || !bytes.Contains(final.body, []byte("stage=final\n")) {
		t.Errorf("final part:\n%.200s", final.body)
	}
	if string(agent.body) != GuestAgentScript || !bytes.Equal(user.body, m.VendorData) {
		t.Error("the guest agent's or the user's part changed")
	}

	// Unmanaged: exactly what VendorData gives.
	m.Squid = nil
	if vd, err := MachineVendorData(m); err != nil || !bytes.Equal(vd, VendorData(true, m.VendorData)) {
		t.Errorf("unmanaged vendor-data differs from VendorData (%v)", err)
	}

	// Squid alone: its two parts.
	m = managedMachine()
	m.InstallGuestAgent, m.VendorData = false, nil
	vd, err = MachineVendorData(m)
	if err != nil {
		t.Fatal(err)
	}
	if doc := parseMIME(t, vd); len(doc.children) != 2 {
		t.Errorf("squid alone: %d parts, want 2", len(doc.children))
	}

	m.Squid.AllowedSourceCIDRs = []string{"192.0.2.1/24"}
	if _, err := MachineVendorData(m); provider.Class(err) != provider.ClassPermanent || !strings.Contains(err.Error(), "spec.access.allowedSourceCIDRs[0]") {
		t.Errorf("invalid config: %v, want a permanent error naming the field", err)
	}
}

// The seed of a managed Proxy carries the user's user-data byte for byte
// (the password nowhere in it) and the squid parts in vendor-data, read
// back with the library's reader and xorriso, an independent one.
func TestManagedSeedReadBackWithXorriso(t *testing.T) {
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		t.Fatal("xorriso not on PATH (apt-get install xorriso, or make test-deps)")
	}
	m := managedMachine()
	in, err := ForMachine(m)
	if err != nil {
		t.Fatal(err)
	}
	iso, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(iso, []byte(squidPassword)) {
		t.Fatal("the seed holds the password in clear")
	}
	_, files := readISO(t, iso)
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := os.WriteFile(path, iso, 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, name := range []string{UserDataFile, VendorDataFile} {
		dst := filepath.Join(out, name)
		if b, err := exec.Command(xorriso, "-osirrox", "on", "-indev", path, "-extract", "/"+name, dst).CombinedOutput(); err != nil {
			t.Fatalf("xorriso -extract %s: %v\n%s", name, err, b)
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, files[name]) {
			t.Errorf("xorriso and the library read %s differently", name)
		}
	}
	if !bytes.Equal(files[UserDataFile], m.UserData) {
		t.Errorf("user-data = %q, want the user's bytes", files[UserDataFile])
	}
	squidFilesPart(t, files[VendorDataFile])
}

// runBoothook runs the squid files part of vendor-data as cloud-init would
// (its "#cloud-boothook" line stripped, the rest executed), against a
// fake root, with a systemctl stub saying squid is not running yet.
func runBoothook(t *testing.T, vendorData []byte, root string) {
	t.Helper()
	body := string(squidFilesPart(t, vendorData).body)
	script, ok := strings.CutPrefix(body, "#cloud-boothook\n")
	if !ok {
		t.Fatal("boothook part does not start with #cloud-boothook")
	}
	bin := t.TempDir()
	stub := "#!/bin/sh\n[ \"$1\" = is-active ] && echo inactive\nexit 0\n"
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "logger"), []byte(guestsquid.LoggerStub), 0o755); err != nil {
		t.Fatal(err)
	}
	script = strings.Replace(script, guestsquid.PathLine, "PATH="+bin+":/usr/bin:/bin; export PATH", 1)
	script = strings.Replace(script, guestsquid.RootLine, "root="+root, 1)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("boothook: %v\n%s", err, out)
	}
}
