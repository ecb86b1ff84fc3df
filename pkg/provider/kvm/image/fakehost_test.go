package image

import (
	"sync"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt"
	"crawl.example.com/proxy-operator/pkg/provider/kvm/virt/fake"
)

// fakeHost is the shared fake libvirt daemon plus what these tests need on
// top: the XML each volume was created with (the fake grows raw volumes to
// fit uploads, so what Ensure declared is kept here) and volume listing for
// Prune, which neither virt.Client nor the fake offer yet. The list is the
// volumes created through fakeHost that the fake still holds.
type fakeHost struct {
	*fake.Fake

	mu      sync.Mutex
	created map[string]libvirtxml.StorageVolume // "pool/name"
}

var (
	_ virt.Client  = (*fakeHost)(nil)
	_ VolumeLister = (*fakeHost)(nil)
)

func newFakeHost(opts ...fake.Option) *fakeHost {
	return &fakeHost{Fake: fake.New(opts...), created: map[string]libvirtxml.StorageVolume{}}
}

func (h *fakeHost) addPool(t testing.TB, name string) libvirt.StoragePool {
	t.Helper()
	h.AddPool(name, 1<<40, true)
	p, err := h.StoragePoolLookupByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (h *fakeHost) StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	v, err := h.Fake.StorageVolCreateXML(pool, xml, flags)
	if err == nil {
		var d libvirtxml.StorageVolume
		_ = d.Unmarshal(xml)
		h.mu.Lock()
		h.created[pool.Name+"/"+v.Name] = d
		h.mu.Unlock()
	}
	return v, err
}

func (h *fakeHost) StoragePoolListAllVolumes(pool libvirt.StoragePool, _ int32, _ uint32) ([]libvirt.StorageVol, uint32, error) {
	// Go through the fake once so pool errors and faults apply.
	if _, _, _, _, err := h.StoragePoolGetInfo(pool); err != nil {
		return nil, 0, err
	}
	var out []libvirt.StorageVol
	for _, name := range h.volumeNames(pool.Name) {
		if info, ok := h.Volume(pool.Name, name); ok {
			out = append(out, libvirt.StorageVol{Pool: pool.Name, Name: name, Key: info.Path})
		}
	}
	return out, uint32(len(out)), nil
}

// volumeNames returns the volumes of pool that exist.
func (h *fakeHost) volumeNames(pool string) []string {
	h.mu.Lock()
	var names []string
	for k, d := range h.created {
		if k == pool+"/"+d.Name {
			names = append(names, d.Name)
		}
	}
	h.mu.Unlock()
	var out []string
	for _, n := range names {
		if _, ok := h.Volume(pool, n); ok {
			out = append(out, n)
		}
	}
	return out
}

// volumeSHA256 returns the digest and size of a volume's content.
func (h *fakeHost) volumeSHA256(pool, name string) (string, int64, bool) {
	info, ok := h.Volume(pool, name)
	if !ok {
		return "", 0, false
	}
	sum, err := h.VolumeSHA256(pool, name)
	if err != nil {
		return "", 0, false
	}
	return sum, int64(info.Size), true
}

func (h *fakeHost) volumeContent(pool, name string) []byte {
	b, _ := h.VolumeBytes(pool, name)
	return b
}

// volumeDecl returns the format and capacity a volume was created with.
func (h *fakeHost) volumeDecl(pool, name string) (format string, capacity uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.created[pool+"/"+name]
	if !ok {
		return "", 0
	}
	if d.Target != nil && d.Target.Format != nil {
		format = d.Target.Format.Type
	}
	if d.Capacity != nil {
		capacity = d.Capacity.Value
	}
	return format, capacity
}
