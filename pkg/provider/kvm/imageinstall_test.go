package kvm_test

import (
	"context"
	"testing"

	"crawl.example.com/proxy-operator/pkg/provider/kvm"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/image"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/kvmtest"
)

// Fault 12 of the fault suite, on the fake: two installs cache the same
// image (same KVMImage name, same digest) on one shared host. Install B
// stops wanting it and prunes; install A, which still wants it and has no
// overlay on it, keeps its cached volume and marker, and serves it without
// downloading again. Once A stops wanting it too, A's prune removes it.
func TestPruneImagesNeverDeletesAnotherInstallsImage(t *testing.T) {
	e := newEnv(t, "hv1")
	ctx := context.Background()
	f := e.fakes["hv1"]
	a := kvm.New(kvm.Options{InstallID: "install-a", Hosts: e.hosts, Pool: e.conns})
	b := kvm.New(kvm.Options{InstallID: "install-b", Hosts: e.hosts, Pool: e.conns})
	img := e.img.Image
	img.Name = "debian"
	vol, err := image.VolumeName(img)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := image.MarkerName(img)
	if err != nil {
		t.Fatal(err)
	}
	keepNone := func(string) bool { return false }
	keepAll := func(string) bool { return true }

	for _, p := range []*kvm.Provider{a, b} {
		if _, err := p.EnsureImage(ctx, "hv1", img, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.img.Downloads(); n != 1 {
		t.Fatalf("downloads = %d, want 1: the installs share one cached volume", n)
	}
	// A's own pass keeps what A wants and leaves B's holding alone.
	if res, err := a.PruneImages(ctx, "hv1", keepAll); err != nil || len(res.Deleted) != 0 {
		t.Fatalf("A's PruneImages keeping everything = %+v, %v; want nothing deleted", res, err)
	}

	// B deleted its KVMImage: B wants nothing.
	res, err := b.PruneImages(ctx, "hv1", keepNone)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{vol, marker} {
		if _, ok := f.Volume(kvmtest.PoolName, v); !ok {
			t.Errorf("B's prune (deleted %v) removed %s, which install A still holds", res.Deleted, v)
		}
	}
	if got, err := a.EnsureImage(ctx, "hv1", img, nil); err != nil || got.Volume != vol || got.Bytes != 0 {
		t.Fatalf("A's EnsureImage after B's prune = %+v, %v; want the cached %s", got, err, vol)
	}
	if n := e.img.Downloads(); n != 1 {
		t.Errorf("downloads = %d after B's prune, want still 1", n)
	}
	// A Proxy of A boots on it.
	m := e.machine("hv1", "crawl", "p1", "uid-a1")
	if _, err := a.Create(ctx, m); err != nil {
		t.Fatalf("A's Create after B's prune: %v", err)
	}
	if err := a.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}

	// Now A lets go too: the last holder removes the volume and its marker.
	res, err = a.PruneImages(ctx, "hv1", keepNone)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{vol, marker} {
		if _, ok := f.Volume(kvmtest.PoolName, v); ok {
			t.Errorf("after the last holder's prune (deleted %v), %s is left behind", res.Deleted, v)
		}
	}
	pool, err := f.StoragePoolLookupByName(kvmtest.PoolName)
	if err != nil {
		t.Fatal(err)
	}
	left, _, err := f.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range left {
		t.Errorf("volume %s left in the pool", v.Name)
	}
}
