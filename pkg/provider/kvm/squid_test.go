package kvm_test

import (
	"bytes"
	"context"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/seed"
	"crawl.example.com/proxy-operator/pkg/squid"
)

const squidPassword = "correct-horse-battery-staple-42"

func managedSquid() *squid.Config {
	return &squid.Config{
		AllowedSourceCIDRs: []string{"192.0.2.0/24"},
		Auth:               squid.Auth{Type: squid.AuthBasic, Username: "crawler", Password: squidPassword},
	}
}

// seedFiles reads the seed volume Create uploaded.
func seedFiles(t *testing.T, e *env, host, uid string) map[string][]byte {
	t.Helper()
	files, err := kvmtest.SeedFiles(e.fakes[host], uid)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A managed squid travels in the seed's vendor-data (its boothook and
// script), the user's user-data byte for byte, the password in clear
// nowhere.
func TestCreateDeliversTheManagedSquidInVendorData(t *testing.T) {
	e := newEnv(t, "hv1")
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	m.UserData = []byte("#cloud-config\nruncmd: [[echo, mine]]\n")
	m.Squid = managedSquid()
	if _, err := e.prov.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	files := seedFiles(t, e, "hv1", "uid-1")
	if !bytes.Equal(files[seed.UserDataFile], m.UserData) {
		t.Errorf("user-data = %q, want the user's bytes", files[seed.UserDataFile])
	}
	vd := files[seed.VendorDataFile]
	for _, want := range []string{"Content-Type: text/cloud-boothook", "filename=\"proxy-operator-squid-files.sh\"", "filename=\"proxy-operator-squid.sh\"", "filename=\"proxy-operator-guest-agent.sh\""} {
		if !bytes.Contains(vd, []byte(want)) {
			t.Errorf("vendor-data lacks %q", want)
		}
	}
	for name, b := range files {
		if bytes.Contains(b, []byte(squidPassword)) {
			t.Errorf("%s holds the password in clear", name)
		}
	}
}

// An invalid managed config fails Create permanently, naming the field,
// before anything is downloaded or made.
func TestCreateRefusesAnInvalidManagedSquidFirst(t *testing.T) {
	e := newEnv(t, "hv1")
	m := e.machine("hv1", "crawl", "p1", "uid-1")
	m.Squid = managedSquid()
	m.Squid.AllowedSourceCIDRs = nil
	_, err := e.prov.Create(context.Background(), m)
	if provider.Class(err) != provider.ClassPermanent || !bytes.Contains([]byte(err.Error()), []byte("spec.access.allowedSourceCIDRs")) {
		t.Fatalf("Create: %v, want a permanent error naming spec.access.allowedSourceCIDRs", err)
	}
	if disk, seedVol := volumes(e.fakes["hv1"], "uid-1"); disk || seedVol || e.img.Downloads() != 0 {
		t.Errorf("made volumes (disk %v, seed %v) or downloaded (%d) anyway", disk, seedVol, e.img.Downloads())
	}
}
