package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// proxyVolumes returns which of uid's two volumes are in the test pool.
func proxyVolumes(f *fake.Fake, uid string) []string {
	var out []string
	for _, v := range []string{domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)} {
		if _, ok := f.Volume(kvmtest.PoolName, v); ok {
			out = append(out, v)
		}
	}
	return out
}

// A domain of this install undefined outside the operator leaves its
// overlay and seed behind; once its Proxy is gone they are swept after the
// grace period, never before, and only they: volumes of another install's
// Proxy, of a UID this manager never saw, attached to any domain, backing
// another volume, or whose Proxy exists all stay.
func TestSweepDeletesVolumesOfDomainsUndefinedOutside(t *testing.T) {
	const (
		gone     = "5a1e0000-0000-4000-8000-000000000001" // domain undefined, Proxy gone
		live     = "5a1e0000-0000-4000-8000-000000000002" // domain undefined, Proxy exists
		attached = "5a1e0000-0000-4000-8000-000000000003" // disk used by a domain made by hand
		backing  = "5a1e0000-0000-4000-8000-000000000004" // disk backs a volume made by hand
		other    = "9e0d0000-0000-4000-8000-000000000001" // another install's, undefined, Proxy gone
		unseen   = "0000dead-0000-4000-8000-000000000001" // volume of a UID never listed
	)
	conns, hosts := kvmtest.NewConns(), kvmtest.NewHosts("hv1")
	host := kvmtest.NewHost()
	conns.Add("hv1", host)
	staging, production := newSweepInstall(t, "staging-cluster"), newSweepInstall(t, "production-cluster")
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
	staging.gc.Clock, production.gc.Clock = clk, clk
	staging.gc.VolumeGrace, production.gc.VolumeGrace = 10*time.Minute, 10*time.Minute
	sk, pk := staging.withKVM(conns, hosts), production.withKVM(conns, hosts)
	staging.proxy(sk, "hv1", "crawl", "gone", gone)
	staging.proxy(sk, "hv1", "crawl", "live", live)
	staging.proxy(sk, "hv1", "crawl", "attached", attached)
	staging.proxy(sk, "hv1", "crawl", "backing", backing)
	production.proxy(pk, "hv1", "web", "other", other)
	c := host.Connect()
	pool, err := c.StoragePoolLookupByName(kvmtest.PoolName)
	if err != nil {
		t.Fatal(err)
	}
	unseenXML, err := domxml.RawVolume(domxml.SeedVolumeName(unseen), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StorageVolCreateXML(pool, unseenXML, 0); err != nil {
		t.Fatal(err)
	}
	// Both installs list, so staging remembers its four UIDs.
	if n := staging.sweep() + production.sweep(); n != 0 {
		t.Fatalf("swept %d, want 0", n)
	}

	for _, d := range []string{"crawl.gone", "crawl.live", "crawl.attached", "crawl.backing", "web.other"} {
		kvmtest.UndefineOutside(t, host, d)
	}
	attachedDisk, _ := host.Volume(kvmtest.PoolName, domxml.DiskVolumeName(attached))
	byHand, err := domxml.Domain(domxml.Params{Name: "by-hand", DomainType: domxml.DomainTypeKVM, VCPUs: 1, MemoryBytes: 256 << 20,
		DiskPath: attachedDisk.Path, SeedPath: "/var/lib/libvirt/images/by-hand.iso",
		Network:  domxml.Network{Type: domxml.NetworkTypeNetwork, Name: kvmtest.NetworkName},
		Metadata: domxml.Metadata{Namespace: "x", Name: "y", UID: "0c7f0d0e-dead-4bee-8000-000000000009", Tag: "someone-else"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.AddDomain(byHand, true); err != nil {
		t.Fatal(err)
	}
	backingDisk, _ := host.Volume(kvmtest.PoolName, domxml.DiskVolumeName(backing))
	cloneXML, err := domxml.OverlayVolume("clone.qcow2", 1<<30, backingDisk.Path, "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StorageVolCreateXML(pool, cloneXML, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"gone", "attached", "backing"} {
		staging.forget("crawl", p)
	}
	production.forget("web", "other")

	all := func(uid string) []string { return []string{domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)} }
	want := func(when string, uid string, vols ...string) {
		t.Helper()
		if got := proxyVolumes(host, uid); !slices.Equal(got, vols) {
			t.Errorf("%s: volumes of %s are %v, want %v", when, uid, got, vols)
		}
	}
	// The first pass finds the volumes unused; the grace period starts.
	if n := staging.sweep(); n != 0 {
		t.Errorf("first pass swept %d, want 0", n)
	}
	clk.SetTime(clk.Now().Add(10*time.Minute - time.Second))
	if n := staging.sweep(); n != 0 {
		t.Errorf("pass before the grace period swept %d, want 0", n)
	}
	want("before the grace period", gone, all(gone)...)

	clk.SetTime(clk.Now().Add(time.Second))
	if n := staging.sweep(); n != 3 {
		t.Errorf("pass after the grace period swept %d, want 3 (gone's disk and seed, backing's seed)", n)
	}
	want("after the grace period", gone)
	want("after the grace period", live, all(live)...)
	want("after the grace period", attached, all(attached)...)
	want("after the grace period", backing, domxml.DiskVolumeName(backing))
	want("after the grace period", other, all(other)...)
	if _, ok := host.Volume(kvmtest.PoolName, domxml.SeedVolumeName(unseen)); !ok {
		t.Error("the volume of a UID never seen was deleted")
	}
	var swept []string
	for _, e := range staging.events.events {
		if e.reason == OrphanDeletedReason && strings.Contains(e.message, "volume") {
			swept = append(swept, e.message)
		}
	}
	if len(swept) != 3 || !strings.Contains(swept[0], "crawl/gone") {
		t.Errorf("volume events %q, want 3 naming the Proxy", swept)
	}
	// The other install's volumes are its own to sweep, after its own
	// grace period; it never touches staging's.
	if n := production.sweep(); n != 0 {
		t.Errorf("production's first pass swept %d, want 0", n)
	}
	clk.SetTime(clk.Now().Add(10 * time.Minute))
	if n := production.sweep(); n != 2 {
		t.Errorf("production swept %d, want its 2", n)
	}
	want("after production's sweep", other)
	want("after production's sweep", attached, all(attached)...)
	want("after production's sweep", backing, domxml.DiskVolumeName(backing))
}
