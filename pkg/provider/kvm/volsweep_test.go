package kvm_test

import (
	"context"
	"slices"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/domxml"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// addHandMadeDomain defines a running domain the operator did not make,
// with disk and metadata UID as given.
func addHandMadeDomain(t *testing.T, f *fake.Fake, name, diskPath, uid string) {
	t.Helper()
	xml, err := domxml.Domain(domxml.Params{Name: name, DomainType: domxml.DomainTypeKVM, VCPUs: 1, MemoryBytes: 256 << 20,
		DiskPath: diskPath, SeedPath: "/var/lib/libvirt/images/" + name + ".iso",
		Network:  domxml.Network{Type: domxml.NetworkTypeNetwork, Name: kvmtest.NetworkName},
		Metadata: domxml.Metadata{Namespace: "other", Name: name, UID: uid, Tag: "someone-else"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.AddDomain(xml, true); err != nil {
		t.Fatal(err)
	}
}

// SweepVolumes deletes a UID's volumes only when no domain of any kind
// mentions the UID or uses them, no volume is backed by them, and collect
// accepts the UID; a host it cannot read fully loses nothing.
func TestSweepVolumesDeletesOnlyUnusedVolumesOfAcceptedUIDs(t *testing.T) {
	const uid = "5a1e0000-0000-4000-8000-0000000000a1"
	disk, seed := domxml.DiskVolumeName(uid), domxml.SeedVolumeName(uid)
	for _, tc := range []struct {
		name           string
		arrange        func(t *testing.T, f *fake.Fake, diskPath string)
		accept         bool
		wantCandidates []string
		wantDeleted    []string
		wantErr        bool
	}{
		{name: "unused volumes of an accepted UID go", accept: true,
			arrange:        func(*testing.T, *fake.Fake, string) {},
			wantCandidates: []string{uid}, wantDeleted: []string{disk, seed}},
		{name: "a UID collect refuses keeps its volumes",
			arrange:        func(*testing.T, *fake.Fake, string) {},
			wantCandidates: []string{uid}},
		{name: "a domain of another install with the UID in its metadata keeps them", accept: true,
			arrange: func(t *testing.T, f *fake.Fake, _ string) {
				addHandMadeDomain(t, f, "elsewhere", "/var/lib/libvirt/images/elsewhere.qcow2", uid)
			}},
		{name: "a domain using the disk keeps them", accept: true,
			arrange: func(t *testing.T, f *fake.Fake, diskPath string) {
				addHandMadeDomain(t, f, "by-hand", diskPath, "0c7f0d0e-dead-4bee-8000-000000000009")
			}},
		{name: "a volume backed by the disk keeps the disk", accept: true,
			arrange: func(t *testing.T, f *fake.Fake, diskPath string) {
				c := f.Connect()
				pool, err := c.StoragePoolLookupByName(kvmtest.PoolName)
				if err != nil {
					t.Fatal(err)
				}
				xml, err := domxml.OverlayVolume("clone.qcow2", 1<<30, diskPath, "qcow2")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.StorageVolCreateXML(pool, xml, 0); err != nil {
					t.Fatal(err)
				}
			},
			wantCandidates: []string{uid}, wantDeleted: []string{seed}},
		{name: "an unreadable domain deletes nothing", accept: true,
			arrange: func(t *testing.T, f *fake.Fake, _ string) {
				addHandMadeDomain(t, f, "unrelated", "/var/lib/libvirt/images/unrelated.qcow2", "0c7f0d0e-dead-4bee-8000-000000000009")
				f.FailNext(virt.RPCDomainGetXMLDesc, virt.NewError(libvirt.ErrOperationFailed, "operation failed"))
			},
			wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "hv1")
			f := e.fakes["hv1"]
			ctx := context.Background()
			if _, err := e.prov.Create(ctx, e.machine("hv1", "crawl", "p1", uid)); err != nil {
				t.Fatal(err)
			}
			kvmtest.UndefineOutside(t, f, "crawl.p1")
			d, _ := f.Volume(kvmtest.PoolName, disk)
			tc.arrange(t, f, d.Path)
			var offered []string
			candidates, deleted, err := e.prov.SweepVolumes(ctx, "hv1", func(u string) bool {
				offered = append(offered, u)
				return tc.accept
			})
			if (err != nil) != tc.wantErr {
				t.Fatalf("SweepVolumes error %v, want error: %v", err, tc.wantErr)
			}
			if !slices.Equal(candidates, tc.wantCandidates) || !slices.Equal(offered, tc.wantCandidates) {
				t.Errorf("candidates %v (offered %v), want %v", candidates, offered, tc.wantCandidates)
			}
			if !slices.Equal(deleted, tc.wantDeleted) {
				t.Errorf("deleted %v, want %v", deleted, tc.wantDeleted)
			}
			for _, v := range []string{disk, seed} {
				_, present := f.Volume(kvmtest.PoolName, v)
				if present == slices.Contains(tc.wantDeleted, v) {
					t.Errorf("volume %s present=%v after the sweep", v, present)
				}
			}
		})
	}
}

// A host that is not configured holds nothing to sweep.
func TestSweepVolumesOfAnUnknownHostIsEmpty(t *testing.T) {
	e := newEnv(t, "hv1")
	c, d, err := e.prov.SweepVolumes(context.Background(), "gone", func(string) bool { return true })
	if err != nil || c != nil || d != nil {
		t.Fatalf("SweepVolumes = %v, %v, %v; want nothing", c, d, err)
	}
}
